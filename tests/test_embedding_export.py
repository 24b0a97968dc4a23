"""Embedding models leave as sentence-transformers directories that the real library loads with our vectors
(within 1e-5), and `bertforge embed` / `evaluate` / `export` take any embedding reference."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.finetuning import QUIET_RUN, TINY_MODEL, minilm_dir
from helpers.pairs import gloss_pairs, write_jsonl

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.embed import embed_texts, load_embedder
from bertforge.engine import EngineSettings
from bertforge.tasks.embedding import EmbeddingTask
from bertforge.train.trainer import Trainer

TEXTS = ["The dog barked at the mailman while the cat slept.", "a place where people live",
         "Wolves hunt in packs during the long winter nights, unaffably, and then they rest.", "x"]


def sentence_transformer(directory: Path):  # type: ignore[no-untyped-def]
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(directory), device="cpu")


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", False), ("cls", True), ("last", False)])
def test_an_export_gives_our_vectors_in_sentence_transformers(pooling: str, normalize: bool, tmp_path: Path) -> None:
    from bertforge.models import BertforgeForEmbedding
    from bertforge.models.config import get_preset
    from bertforge.models.sentence_transformers_format import export_sentence_transformers

    torch.manual_seed(0)
    config = dataclasses.replace(get_preset("bert-tiny"), vocab_size=30528, pooling=pooling)
    model = BertforgeForEmbedding(config, normalize=normalize).eval()
    result = export_sentence_transformers(model, minilm_dir(), tmp_path / "st", max_seq_length=24)
    assert result.format == "sentence-transformers"
    theirs = sentence_transformer(tmp_path / "st").encode(TEXTS, convert_to_numpy=True)
    embedder = load_embedder(tmp_path / "st")  # read back: the pooling and Normalize come from its files
    assert (embedder.model.config.pooling, embedder.model.normalize, embedder.max_length) == (pooling, normalize, 24)
    ours = embed_texts(embedder, TEXTS, EngineSettings(batch_size=3))
    assert np.abs(ours - theirs).max() <= 1e-5
    if normalize:
        assert np.linalg.norm(ours, axis=1) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("source_pooler", [False, True])
def test_an_export_loads_in_sentence_transformers_without_a_missing_weights_report(
        source_pooler: bool, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A model trained here has no BERT pooler; one started from all-MiniLM-L6-v2 keeps the pooler it carries.
    Either way sentence-transformers builds the transformer as exported: no pooler "MISSING ... newly
    initialized" (which read like a broken export), and the vectors stay ours."""
    from transformers.utils import logging as transformers_logging

    from bertforge.models import BertforgeForEmbedding
    from bertforge.models.config import get_preset
    from bertforge.models.sentence_transformers_format import export_sentence_transformers

    torch.manual_seed(0)
    config = dataclasses.replace(get_preset("bert-tiny"), vocab_size=30528, pooling="mean")
    model = BertforgeForEmbedding(config, pooler=source_pooler).eval()
    export_sentence_transformers(model, minilm_dir(), tmp_path / "st", max_seq_length=24)
    shown = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_warning()  # the report is a warning; a CLI run earlier may have hidden them
    try:
        capfd.readouterr()
        loaded = sentence_transformer(tmp_path / "st")
        printed = "".join(capfd.readouterr())
    finally:
        transformers_logging.set_verbosity(shown)
    assert "MISSING" not in printed and "newly initialized" not in printed, printed
    pooler = loaded[0].auto_model.pooler
    if source_pooler:
        assert pooler is not None and torch.equal(pooler.dense.weight, model.encoder.pooler.dense.weight)
    else:
        assert pooler is None
    ours = embed_texts(load_embedder(tmp_path / "st"), TEXTS, EngineSettings(batch_size=3))
    assert np.abs(ours - loaded.encode(TEXTS, convert_to_numpy=True)).max() <= 1e-5


def test_bertforge_embeds_all_minilm_l6_v2_as_sentence_transformers_does(tmp_path: Path) -> None:
    """The reference model's own files: mean pooling, Normalize, max_seq_length 256 (a long text is cut there)."""
    long_text = " ".join(["a very long sentence about dogs and wolves and the winter nights"] * 30)
    embedder = load_embedder("all-MiniLM-L6-v2")
    assert (embedder.model.config.pooling, embedder.model.normalize, embedder.max_length) == ("mean", True, 256)
    ours = embed_texts(embedder, [*TEXTS, long_text])
    theirs = sentence_transformer(minilm_dir()).encode([*TEXTS, long_text], convert_to_numpy=True)
    assert np.abs(ours - theirs).max() <= 1e-5


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("embedding-run")
    train = write_jsonl(root / "train.jsonl", gloss_pairs(32))
    validation = write_jsonl(root / "validation.jsonl", gloss_pairs(16, "validation"))
    config = load_config(None, [f"run.output_dir={root}", "run.name=tiny", *QUIET_RUN, *TINY_MODEL,
                                f"model.tokenizer={minilm_dir()}", "model.pooling=cls", "finetune.task_type=embedding",
                                f"finetune.train_file={train}", f"finetune.validation_file={validation}",
                                "finetune.text_column=anchor", "finetune.text_pair_column=positive",
                                "finetune.embedding.negative_column=negative", "finetune.embedding.normalize=true",
                                "finetune.max_length=40", "train.micro_batch_size=8", "train.global_batch_size=16",
                                "train.max_steps=2", "train.best_metric=mrr_at_10", "train.best_mode=max"])
    assert Trainer(config, EmbeddingTask(config)).fit().exit_code == 0
    return root / "tiny"


def test_an_embedding_runs_final_checkpoint_and_export_give_the_same_vectors(tiny_run: Path, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    report = json.loads((tiny_run / "validation_results.json").read_text())
    assert report["task_type"] == "embedding"
    assert set(report["metrics"]) >= {"mrr_at_10", "recall_at_1", "recall_at_5", "recall_at_10", "ndcg_at_10"}
    theirs = sentence_transformer(tiny_run / "final").encode(TEXTS, convert_to_numpy=True)
    modules = json.loads((tiny_run / "final" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    checkpoint = sorted((tiny_run / "checkpoints").glob("step-*"))[-1]
    for reference in (tiny_run, tiny_run / "final", checkpoint):
        out = tmp_path / f"{reference.name}.npy"
        assert main(["embed", str(reference), "--input", str(_texts_file(tmp_path)), "--out", str(out)]) == 0
        assert np.abs(np.load(out) - theirs).max() <= 1e-5, reference
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "exported")]) == 0
    exported = sentence_transformer(tmp_path / "exported").encode(TEXTS, convert_to_numpy=True)
    assert np.abs(exported - theirs).max() <= 1e-5
    capsys.readouterr()
    assert main(["evaluate", str(tiny_run), "--data", str(tiny_run.parent / "validation.jsonl"), "--text-column",
                 "anchor", "--text-pair-column", "positive", "--negative-column", "negative"]) == 0
    assert "ndcg_at_10" in capsys.readouterr().out


def _texts_file(directory: Path) -> Path:
    path = directory / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_embed_reads_a_column_and_refuses_bad_paths_and_inputs_in_one_line(
        tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("id,sentence\n1,the dog barked\n2,a place where people live\n", encoding="utf-8")
    out = tmp_path / "v.npy"
    assert main(["embed", str(tiny_run), "--input", str(rows), "--text-column", "sentence", "--out", str(out)]) == 0
    assert np.load(out).shape == (2, 64)
    capsys.readouterr()
    cases = [
        (["--input", str(rows), "--text-column", "sentence", "--out", str(out)], "exists; add --overwrite"),
        (["--input", str(rows), "--text-column", "sentence", "--out", str(tmp_path / "v.txt")], "does not end in .npy"),
        (["--input", str(rows), "--out", str(tmp_path / "w.npy")], "no column 'text'"),
    ]
    blank = tmp_path / "blank.txt"
    blank.write_text("one\n\nthree\n", encoding="utf-8")
    cases.append((["--input", str(blank), "--out", str(tmp_path / "w.npy")], f"{blank}:2: empty line"))
    for arguments, message in cases:
        assert main(["embed", str(tiny_run), *arguments]) == 2
        error = capsys.readouterr().err
        assert message in error and "Traceback" not in error
    assert not (tmp_path / "w.npy").exists() and not (tmp_path / "v.txt").exists()
    before = np.load(out)
    assert main(["embed", str(tiny_run), "--input", str(_texts_file(tmp_path)), "--out", str(out), "--overwrite"]) == 0
    assert np.load(out).shape == (len(TEXTS), 64) and before.shape == (2, 64)


def test_the_onnx_export_of_an_embedding_model_is_its_transformer(tiny_run: Path, tmp_path: Path) -> None:
    """sentence-transformers' ONNX backend exports the transformer and pools outside the graph: so do we."""
    pytest.importorskip("onnxruntime")
    assert main(["export", str(tiny_run), "--out", str(tmp_path / "onnx"), "--format", "onnx"]) == 0
    assert json.loads((tmp_path / "onnx" / "onnx_inputs.json").read_text())["output"] == "last_hidden_state"
