"""The contract of model references: every shape a user can name resolves to one model directory,
and every command that takes a model accepts every shape.

Shapes: a run directory (its final/, else its newest checkpoint), a checkpoint (it holds a complete
model directory, `step-N/model/`), a bertforge model directory, a Hugging Face model directory, and
the name of a packaged model (all-MiniLM-L6-v2).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.finetuning import finetune, minilm_dir, supersense_files

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.data.bundled import corpus_path
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.errors import BertforgeError
from bertforge.locate import resolve_model
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.trainer import Trainer

QUIET = ["data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false", "train.log_every=1"]


@pytest.fixture(scope="module")
def minilm_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 KJV chapters prepared with all-MiniLM-L6-v2's own tokenizer, for continued pre-training."""
    text = gzip.open(corpus_path(), "rt", encoding="utf-8").read()
    corpus = tmp_path_factory.mktemp("corpus") / "kjv.txt"
    corpus.write_text("\n\n".join(text.split("\n\n")[:120]) + "\n", encoding="utf-8")
    out = tmp_path_factory.mktemp("data") / "minilm"
    prepare_pretraining_data([str(corpus)], minilm_dir(), out, PrepareSettings(seq_len=64, split=(900.0, 100.0)),
                             workers=1)
    return out


def pretrain(data: Path, run_dir: Path, init_from: str | Path, steps: int) -> list[dict]:
    # 8 x 64 tokens a step and 16 validation samples: the test's margins at this size (measured) are a loss that
    # falls by 6.1 over 6 steps, continued runs starting 3.6 below the bound and validating 0.83 under it
    config = load_config(None, [f"data.path={data}", f"model.init_from={init_from}", "data.seq_len=64",
                                "optim.lr=5e-4", "schedule.warmup=2", "train.micro_batch_size=8",
                                "train.global_batch_size=8", f"train.max_steps={steps}", f"train.eval_every={steps}",
                                f"train.checkpoint_every={steps}", "data.validation_samples=16",
                                f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *QUIET])
    Trainer(config, PretrainTask(config)).fit()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# --- one resolver --------------------------------------------------------------------------------


def test_every_shape_resolves_to_one_model_directory(tiny_classifier: Path, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    checkpoint = tiny_classifier / "checkpoints" / "step-00000002"
    assert resolve_model("all-MiniLM-L6-v2").path == minilm_dir() and resolve_model(minilm_dir()).format == "hf"
    assert resolve_model(tiny_classifier).path == tiny_classifier / "final"
    assert resolve_model(tiny_classifier / "final").run_dir == tiny_classifier.resolve()
    for shape in (checkpoint, checkpoint / "model"):
        location = resolve_model(shape)
        assert (location.path, location.format) == (checkpoint / "model", "bertforge")
        assert location.run_dir == tiny_classifier.resolve()
    # a run still training (no final/ yet) gives its newest checkpoint, and says so
    training = tmp_path / "training"
    shutil.copytree(tiny_classifier, training, ignore=shutil.ignore_patterns("final"))
    with caplog.at_level("WARNING"):
        assert resolve_model(training).path == training / "checkpoints" / "step-00000004" / "model"
    assert any("no final/ model yet" in record.getMessage() for record in caplog.records)


def test_what_is_not_a_model_gets_one_error_listing_the_shapes(tiny_classifier: Path, tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(BertforgeError, match=r"is not a model; give a bertforge run directory, .* all-MiniLM-L6-v2"):
        resolve_model(tmp_path / "notes")
    with pytest.raises(BertforgeError, match="no such file or directory; give a bertforge run directory"):
        resolve_model(tmp_path / "missing")
    # a checkpoint that holds only a state dict (a user Task without save_model) names what to do
    legacy = tmp_path / "run" / "checkpoints" / "step-00000002"
    shutil.copytree(tiny_classifier / "checkpoints" / "step-00000002", legacy, ignore=shutil.ignore_patterns("model"))
    with pytest.raises(BertforgeError, match=r"checkpoint without a model directory \(model/\).*final/"):
        resolve_model(legacy)


# --- every command, every shape -------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["run", "final", "checkpoint", "checkpoint model"])
def test_predict_evaluate_and_export_accept_every_shape_of_a_fine_tuned_model(
        tiny_classifier: Path, shape: str, tmp_path: Path) -> None:
    reference = {"run": tiny_classifier, "final": tiny_classifier / "final",
                 "checkpoint": tiny_classifier / "checkpoints" / "step-00000004",
                 "checkpoint model": tiny_classifier / "checkpoints" / "step-00000004" / "model"}[shape]
    data = str(tiny_classifier.parent / "data" / "supersense-test-16.jsonl")
    assert main(["predict", str(reference), "--input", data, "--out", str(tmp_path / "p.jsonl")]) == 0
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 16
    assert main(["evaluate", str(reference), "--data", data]) == 0
    assert main(["export", str(reference), "--out", str(tmp_path / "exported")]) == 0
    from transformers import AutoModelForSequenceClassification

    assert AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").num_labels == 45


def test_finetune_starts_from_a_checkpoint_a_run_and_the_packaged_model_name(tiny_classifier: Path, tmp_path: Path) -> None:
    files = supersense_files(tmp_path / "data", train=32, validation=16, test=16)
    for name, reference in (("from-checkpoint", tiny_classifier / "checkpoints" / "step-00000002"),
                            ("from-run", tiny_classifier)):
        result = finetune(tmp_path / name, *files, f"model.init_from={reference}", "finetune.max_length=32",
                          "train.max_steps=1", "train.micro_batch_size=16", "train.global_batch_size=16")
        assert result.state.step == 1 and (tmp_path / name / "final" / "config.json").is_file()
    result = finetune(tmp_path / "from-minilm", *files, "model.init_from=all-MiniLM-L6-v2", "finetune.max_length=32",
                      "train.max_steps=1", "train.micro_batch_size=16", "train.global_batch_size=16")
    assert result.state.step == 1
    config = json.loads((tmp_path / "from-minilm" / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and len(config["id2label"]) == 45
    assert (config["hidden_size"], config["num_hidden_layers"]) == (384, 6)


def test_glue_jobs_start_from_a_run_directory_and_from_a_checkpoint(tiny_classifier: Path, glue_dir: Path,
                                                                    tmp_path: Path) -> None:
    from bertforge.tasks.glue_runner import run_glue

    checkpoint = tiny_classifier / "checkpoints" / "step-00000002"
    config = load_config(None, [
        f"run.output_dir={tmp_path}", "run.name=glue", "glue.tasks=[rte, mrpc]", "glue.seeds=1", *QUIET,
        "glue.overrides={all: [train.max_steps=1, finetune.max_length=32, train.micro_batch_size=16, "
        f"train.global_batch_size=16], rte: [model.init_from={tiny_classifier}], "
        f"mrpc: [model.init_from={checkpoint}]}}"])
    run_glue(config, glue_dir, jobs=2)
    for task in ("rte", "mrpc"):
        (run_dir,) = (tmp_path / "glue" / task).glob("seed-*")
        exported = json.loads((run_dir / "final" / "config.json").read_text())
        # the reference's 2 layers of 64 (a fresh model would be the default preset's) and a new 2-class head
        assert (exported["hidden_size"], exported["num_hidden_layers"], len(exported["id2label"])) == (64, 2, 2)


def test_pretraining_continues_from_minilm_then_from_its_run_and_its_checkpoint(
        minilm_corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = pretrain(minilm_corpus, tmp_path / "adapted", "all-MiniLM-L6-v2", steps=6)
    train = [r["loss"] for r in first if r["split"] == "train"]
    validation = [r["mlm_loss"] for r in first if r["split"] == "validation"]
    # MiniLM has no MLM head: a fresh one, tied to its embeddings, learns quickly on its own tokenizer
    assert sum(train[-3:]) < sum(train[:3])
    checkpoint = tmp_path / "adapted" / "checkpoints" / "step-00000006"
    assert (checkpoint / "model" / "bertforge_model.json").is_file()
    for name, reference in (("from-run", tmp_path / "adapted"), ("from-checkpoint", checkpoint)):
        records = pretrain(minilm_corpus, tmp_path / name, reference, steps=1)
        continued = [r for r in records if r["split"] == "train"]
        # it starts where the first run ended, not from MiniLM's fresh head
        assert continued[0]["loss"] < train[0] - 1.0, (name, continued[0]["loss"], train[0])
        assert [r["mlm_loss"] for r in records if r["split"] == "validation"][-1] < validation[-1] + 0.5
    for reference in (tmp_path / "adapted", tmp_path / "adapted" / "final", checkpoint, checkpoint / "model"):
        capsys.readouterr()
        assert main(["fill-mask", str(reference), "in the beginning god created the [MASK] and the earth"]) == 0
        assert "[MASK]" not in capsys.readouterr().out.splitlines()[-1], reference
    # a token classifier starts from the same run with the run's encoder, every weight of it
    from bertforge.models.loading import load_for_task, load_model_directory

    run_model = resolve_model(tmp_path / "adapted").path  # the run's final/
    tagger = load_for_task(run_model, "token_classification", label_names=["O", "B-noun", "I-noun"])
    pretrained = load_model_directory(tmp_path / "adapted" / "final").encoder.state_dict()
    for name, weight in tagger.encoder.state_dict().items():
        assert torch.equal(weight, pretrained[name]), name
    # and so does a sentence embedder, pooling by the token mean (a pre-training run has no pooling of its own)
    embedder = load_for_task(run_model, "embedding")
    assert embedder.config.pooling == "mean"
    for name, weight in embedder.encoder.state_dict().items():
        assert torch.equal(weight, pretrained[name]), name


# --- nothing lost in conversion -------------------------------------------------------------------


def test_exporting_minilm_keeps_every_tensor_its_pooler_included(tmp_path: Path) -> None:
    from transformers import AutoModel

    assert main(["export", "all-MiniLM-L6-v2", "--out", str(tmp_path / "exported")]) == 0
    source = AutoModel.from_pretrained(minilm_dir()).eval()
    exported, loading = AutoModel.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    theirs, ours = source.state_dict(), exported.eval().state_dict()
    assert theirs.keys() == ours.keys() and "pooler.dense.weight" in ours
    assert all(torch.equal(theirs[key], ours[key]) for key in theirs)
    ids = torch.tensor([[101, 1996, 3737, 1997, 2108, 2204, 102]])
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).pooler_output, source(ids).pooler_output, rtol=0, atol=1e-6)
    for name in ("tokenizer.json", "vocab.txt"):
        assert (tmp_path / "exported" / name).read_bytes() == (minilm_dir() / name).read_bytes()


def test_a_fine_tuned_classifier_round_trips_every_tensor_through_stock_transformers(tiny_classifier: Path,
                                                                                     tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification

    from bertforge.models.hf import load_hf_checkpoint
    from bertforge.models.loading import load_model_directory

    checkpoint_model = tiny_classifier / "checkpoints" / "step-00000004" / "model"
    assert main(["export", str(checkpoint_model), "--out", str(tmp_path / "exported")]) == 0
    _, loading = AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported", output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    ours = load_model_directory(checkpoint_model).state_dict()
    back = load_hf_checkpoint(tmp_path / "exported").state_dict()
    assert ours.keys() == back.keys()
    assert all(torch.equal(ours[key], back[key]) for key in ours)
