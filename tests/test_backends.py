"""`--backend torch | onnx | onnx-int8` (`bertforge.backends`): ONNX Runtime on the model's export gives every kind
the torch backend's outputs within float error; int8 stays close; the export is cached outside the model's
directory and redone when the model changes; a kind without a graph and a missing onnxruntime are one-line errors."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.finetuning import minilm_dir
from helpers.models import MINILM_TINY_LENGTH, minilm_sized_config

from bertforge.backends import backend_for, model_digest, onnx_cache_dir
from bertforge.cli import main
from bertforge.data.labels import LabeledSplit
from bertforge.embed import Embedder, embed_run, load_embedder
from bertforge.engine import EngineSettings
from bertforge.errors import BertforgeError
from bertforge.inference import load_model, read_inputs
from bertforge.models import save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.tasks.classify import classifier_logits
from bertforge.tasks.multiple_choice import BertforgeForMultipleChoice, ChoiceSplit, choice_rows
from bertforge.tasks.tagging import entity_rows

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

MAX_LENGTH = MINILM_TINY_LENGTH
BUDGET = 160  # tokens per batch: several batches of different widths, so padding is exercised
ONNX = EngineSettings(max_batch_tokens=BUDGET, backend="onnx")
INT8 = EngineSettings(max_batch_tokens=BUDGET, backend="onnx-int8")
TORCH = EngineSettings(max_batch_tokens=BUDGET)
LONG = ("the gradual decline in the quality of the soil of a region that is brought about by the removal of its "
        "covering vegetation by wind and by water over a long period of time")



@pytest.fixture(scope="module", autouse=True)
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The graphs go to a cache of this module's own, not the user's ~/.cache."""
    cache = tmp_path_factory.mktemp("bertforge-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BERTFORGE_CACHE", str(cache))
        yield cache


@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real glosses of different lengths, one over the tiny models' length (truncated)."""
    mixed = [*read_inputs("bundled:supersense/test").texts[:40], LONG, "a", "to run"]
    random.Random(0).shuffle(mixed)
    return mixed


@pytest.fixture(scope="module")
def minilm() -> Embedder:
    """all-MiniLM-L6-v2 (mean pooling, unit length): real weights, as users embed and quantize them."""
    return load_embedder(minilm_dir())


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("backend-models")
    built = {"classification": BertforgeForSequenceClassification(minilm_sized_config(), 3, "classification",
                                                                  ["noun.act", "noun.animal", "verb.motion"]),
             "tagging": BertforgeForTokenClassification(minilm_sized_config(), 3, ["O", "B-X", "I-X"]),
             **{f"classification-{pooling}": BertforgeForSequenceClassification(
                 minilm_sized_config(pooling=pooling), 3, "classification") for pooling in ("mean", "last")},
             "choice": BertforgeForMultipleChoice(minilm_sized_config()),
             "cls": BertforgeForEmbedding(minilm_sized_config(pooling="cls"), normalize=True)}
    return {name: save_bertforge_model(model.eval(), root / name, minilm_dir()) for name, model in built.items()}


@pytest.mark.parametrize("name", ["classification", "classification-mean", "classification-last"])
def test_onnx_logits_equal_torchs_for_texts_and_pairs(models: dict[str, Path], texts: list[str], name: str) -> None:
    """BERT's pooler (a stock class), and the mean and last-token poolings (the stock encoder with our head)."""
    loaded = load_model(models[name])
    split = LabeledSplit.unlabeled("texts", texts)
    ours, truncated = classifier_logits(loaded, split, TORCH)
    onnx, onnx_truncated = classifier_logits(loaded, split, ONNX)
    assert onnx.shape == ours.shape == (len(texts), 3) and onnx_truncated == truncated >= 1
    assert (onnx - ours).abs().max() <= 1e-4
    pairs = LabeledSplit.unlabeled("pairs", texts, list(reversed(texts)))  # token types 1 in the second text
    assert (classifier_logits(loaded, pairs, ONNX)[0] - classifier_logits(loaded, pairs, TORCH)[0]).abs().max() <= 1e-4


def test_onnx_tags_equal_torchs(models: dict[str, Path], texts: list[str]) -> None:
    loaded = load_model(models["tagging"])
    ours, onnx = entity_rows(loaded, texts, TORCH).rows, entity_rows(loaded, texts, ONNX).rows
    assert sum(len(row["entities"]) for row in ours) > 0
    for mine, theirs in zip(onnx, ours, strict=True):
        assert [(e["entity_group"], e["start"], e["end"]) for e in mine["entities"]] == [
            (e["entity_group"], e["start"], e["end"]) for e in theirs["entities"]]
        assert [e["score"] for e in mine["entities"]] == pytest.approx([e["score"] for e in theirs["entities"]],
                                                                       abs=1e-4)


def test_onnx_vectors_equal_torchs_for_mean_and_cls_pooling(models: dict[str, Path], minilm: Embedder,
                                                            texts: list[str]) -> None:
    tiny = Embedder(load_model(models["cls"]).model, minilm_dir(), MAX_LENGTH, "cls")
    for embedder in (minilm, tiny):
        ours, onnx = embed_run(embedder, texts, TORCH), embed_run(embedder, texts, ONNX)
        assert onnx.truncated == ours.truncated
        assert np.abs(onnx.vectors - ours.vectors).max() <= 1e-4


def test_int8_answers_stay_close_to_fp32(models: dict[str, Path], minilm: Embedder, texts: list[str]) -> None:
    """Quantization changes the numbers a little: the same class on most texts, vectors pointing the same way
    (the measured cost on real tasks is in docs/benchmarks.md); garbage (a wrong layout, lost rows) fails this."""
    loaded = load_model(models["classification"])
    split = LabeledSplit.unlabeled("texts", texts)
    ours, int8 = classifier_logits(loaded, split, TORCH)[0], classifier_logits(loaded, split, INT8)[0]
    assert (int8.argmax(-1) == ours.argmax(-1)).float().mean() >= 0.9
    fp32, quantized = embed_run(minilm, texts, TORCH).vectors, embed_run(minilm, texts, INT8).vectors
    cosines = (fp32 * quantized).sum(-1) / np.linalg.norm(fp32, axis=-1) / np.linalg.norm(quantized, axis=-1)
    assert cosines.min() > 0.95 and 0 < np.abs(fp32 - quantized).max() < 0.1


def test_the_export_is_cached_outside_the_model_and_redone_when_the_model_changes(models: dict[str, Path],
                                                                                   onnx_cache: Path) -> None:
    directory = models["cls"]
    before = sorted(path.name for path in directory.iterdir())
    model = load_model(directory).model
    backend_for("onnx", model, minilm_dir(), MAX_LENGTH)
    graph = onnx_cache_dir(model) / "model.onnx"
    assert graph.is_relative_to(onnx_cache) and graph.is_file()
    written = graph.stat().st_mtime_ns
    backend_for("onnx", model, minilm_dir(), MAX_LENGTH)
    assert graph.stat().st_mtime_ns == written  # reused, not exported again
    assert sorted(path.name for path in directory.iterdir()) == before  # nothing written beside the user's model
    digest = model_digest(model)
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    assert model_digest(model) != digest  # a changed model gets a graph of its own


def test_multiple_choice_on_onnx_is_a_one_line_error(models: dict[str, Path], texts: list[str]) -> None:
    loaded = load_model(models["choice"])
    split = ChoiceSplit("memory", texts[:2], [[texts[2], texts[3]], [texts[4], texts[5]]], None)
    with pytest.raises(BertforgeError, match="--backend onnx cannot run a multiple_choice model") as caught:
        choice_rows(loaded.model, split, minilm_dir(), MAX_LENGTH, ONNX)
    assert "\n" not in str(caught.value) and "--backend torch" in str(caught.value)


def test_without_onnxruntime_the_backend_is_a_one_line_error_naming_the_extra(
        models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    data = tmp_path / "texts.txt"
    data.write_text("a text\nanother text\n")
    assert main(["embed", str(models["cls"]), "--input", str(data), "--out", str(tmp_path / "v.npy"),
                 "--backend", "onnx"]) == 2
    error = capsys.readouterr().err.strip()
    assert "--backend onnx needs onnxruntime" in error and "pip install 'bertforge[onnx]'" in error
    assert len(error.splitlines()) == 1 and "Traceback" not in error
    assert not (tmp_path / "v.npy").exists()


def test_predict_evaluate_and_embed_take_the_backend_flag(models: dict[str, Path], texts: list[str],
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["noun.act", "noun.animal", "verb.motion"]
    data = tmp_path / "labeled.jsonl"
    data.write_text("".join(json.dumps({"text": text, "label": names[i % 3]}) + "\n" for i, text in enumerate(texts)))
    model = str(models["classification"])
    for backend in ("torch", "onnx"):
        assert main(["predict", model, "--input", str(data), "--out", str(tmp_path / f"{backend}.jsonl"),
                     "--backend", backend]) == 0
        assert main(["evaluate", model, "--data", str(data), "--backend", backend, "--split-name", backend]) == 0
        assert main(["embed", str(models["cls"]), "--input", str(data), "--out", str(tmp_path / f"{backend}.npy"),
                     "--backend", backend]) == 0
    rows = {backend: [json.loads(line) for line in (tmp_path / f"{backend}.jsonl").read_text().splitlines()]
            for backend in ("torch", "onnx")}
    assert [row["label"] for row in rows["onnx"]] == [row["label"] for row in rows["torch"]]
    assert [row["probabilities"]["noun.act"] for row in rows["onnx"]] == pytest.approx(
        [row["probabilities"]["noun.act"] for row in rows["torch"]], abs=1e-4)
    assert np.abs(np.load(tmp_path / "onnx.npy") - np.load(tmp_path / "torch.npy")).max() <= 1e-4
    printed = capsys.readouterr().out
    accuracies = [line.split()[-2] for line in printed.splitlines() if "accuracy" in line]
    assert len(accuracies) == 2 and accuracies[0] == accuracies[1]
    with pytest.raises(SystemExit) as exited:
        main(["predict", model, "--text", "a cat", "--backend", "int4"])
    assert exited.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


def test_a_second_backend_of_an_unchanged_model_reuses_its_digest_and_its_session(
        models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A server builds a backend per merged batch of /predict or /tag: rehashing the weights and building a new
    ONNX Runtime session each time cost 0.6 s a batch for all-MiniLM-L6-v2; an in-place weight change is still a
    new digest."""
    import onnxruntime

    import bertforge.backends as backends

    model = load_model(models["classification"]).model
    backend_for("onnx", model, minilm_dir(), MAX_LENGTH)  # exported (or found in this module's cache) and digested
    sessions, hashes = [], []
    real_session, real_blake2b = onnxruntime.InferenceSession, backends.hashlib.blake2b
    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **k: sessions.append(1) or real_session(*a, **k))
    monkeypatch.setattr(backends.hashlib, "blake2b", lambda *a, **k: hashes.append(1) or real_blake2b(*a, **k))
    backend_for("onnx", model, minilm_dir(), MAX_LENGTH)
    assert (sessions, hashes) == ([], [])
    digest = model_digest(model)
    with torch.no_grad():
        next(model.parameters())[0, 0] += 1.0
    assert model_digest(model) != digest and hashes == [1]
