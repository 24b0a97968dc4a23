"""`bertforge export`: a run or a checkpoint becomes a directory stock `transformers` loads, or an ONNX
graph that onnxruntime runs with the same outputs as the PyTorch model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from helpers.finetuning import TINY_MODEL, finetune, minilm_dir, supersense_files

from bertforge.cli import main
from bertforge.data.labeled import LabeledDataset, collate_padded
from bertforge.data.labels import LabeledSplit
from bertforge.errors import BertforgeError
from bertforge.export import export_model
from bertforge.inference import load_model
from bertforge.models import BertforgeForPreTraining, EncoderConfig, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.tasks.classify import prediction_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    run = tmp_path_factory.mktemp("runs") / "supersense"
    finetune(run, *TINY_MODEL, *supersense_files(data_dir, train=256, validation=32, test=32),
             f"model.tokenizer={minilm_dir()}", "finetune.max_length=64", "optim.lr=2e-3",
             "train.micro_batch_size=32", "train.global_batch_size=32", "train.max_steps=8",
             "train.checkpoint_every=4", "train.keep_last=3")
    return run


def texts_split(texts: list[str]) -> LabeledSplit:
    return LabeledSplit.unlabeled("texts", texts)


def padded_batch(texts: list[str]) -> dict[str, torch.Tensor]:
    dataset = LabeledDataset(texts_split(texts), minilm_dir(), 64)
    batch = collate_padded([dataset[i] for i in range(len(dataset))], pad_token_id=dataset.pad_token_id)
    return {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids")}


TEXTS = ["a small domesticated carnivore", "to move fast on foot; faster than walking", "red"]


def test_a_checkpoint_exports_to_a_directory_transformers_loads_with_equal_logits(run_dir: Path,
                                                                                 tmp_path: Path) -> None:
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "exported")]) == 0
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "exported")).eval()
    assert hf.config.id2label[0] == "adj.all"
    ours = load_model(checkpoint).model
    batch = padded_batch(TEXTS)
    with torch.no_grad():
        assert torch.allclose(hf(**batch).logits, ours(**batch).logits, atol=1e-5)
    # the checkpoint is not the final model: it was trained 4 steps less
    final = load_model(run_dir).model
    with torch.no_grad():
        assert not torch.allclose(final(**batch).logits, ours(**batch).logits, atol=1e-5)
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "exported"))("red")["input_ids"] == [101, 2417, 102]


def test_onnx_export_runs_in_onnxruntime_with_the_probabilities_of_bertforge_predict(run_dir: Path,
                                                                                    tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    summary = export_model(run_dir, tmp_path / "onnx", "onnx")
    assert summary.max_abs_difference is not None and summary.max_abs_difference < 1e-4
    inputs = json.loads((tmp_path / "onnx" / "onnx_inputs.json").read_text())["inputs"]
    assert inputs == ["input_ids", "attention_mask", "token_type_ids"]
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    batch = padded_batch(TEXTS)
    logits = session.run(None, {name: batch[name].numpy() for name in inputs})[0]
    probabilities = torch.softmax(torch.from_numpy(logits), dim=-1)
    rows = prediction_rows(load_model(run_dir), texts_split(TEXTS)).rows
    names = json.loads((tmp_path / "onnx" / "config.json").read_text())["id2label"]
    for row, probs in zip(rows, probabilities, strict=True):
        assert names[str(int(probs.argmax()))] == row["label"]
        assert np.allclose(probs.numpy(), list(row["probabilities"].values()), atol=1e-4)


def test_onnx_export_of_a_masked_language_model_is_checked_token_by_token(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = BertforgeForPreTraining(EncoderConfig(vocab_size=30528, hidden_size=32, num_layers=1, num_heads=2,
                                                  intermediate_size=64))
    save_bertforge_model(model, tmp_path / "mlm", minilm_dir())
    summary = export_model(tmp_path / "mlm", tmp_path / "onnx", "onnx")
    assert summary.format == "onnx" and summary.max_abs_difference < 1e-4
    assert json.loads((tmp_path / "onnx" / "onnx_inputs.json").read_text())["output"] == "logits"


def test_a_mean_pooling_classifier_exports_to_onnx_with_its_head_and_label_names(tmp_path: Path) -> None:
    """No stock class holds BERT with mean pooling: `hf` writes bertforge's format, `onnx` the stock encoder with
    our head in one graph, whose logits are ours on padded text (the mean over the real tokens only)."""
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30528, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           pooling="mean", initializer_range=0.2)
    model = BertforgeForSequenceClassification(config, 3, "classification", ["noun.act", "noun.animal", "verb.motion"])
    save_bertforge_model(model.eval(), tmp_path / "mean", minilm_dir())
    assert export_model(tmp_path / "mean", tmp_path / "hf").format == "bertforge"
    summary = export_model(tmp_path / "mean", tmp_path / "onnx", "onnx")
    assert summary.format == "onnx" and summary.max_abs_difference < 1e-4
    assert "BertModel with bertforge's mean-pooling head" in summary.message
    session = ort.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    batch = padded_batch(TEXTS)  # texts of different lengths: the shorter ones padded
    inputs = json.loads((tmp_path / "onnx" / "onnx_inputs.json").read_text())["inputs"]
    logits = session.run(None, {name: batch[name].numpy() for name in inputs})[0]
    with torch.no_grad():
        ours = model(**batch).logits.numpy()
    assert logits.shape == (3, 3) and np.abs(logits - ours).max() < 1e-4
    assert json.loads((tmp_path / "onnx" / "config.json").read_text())["id2label"]["1"] == "noun.animal"


def test_architectures_without_a_stock_class_export_in_bertforge_format_but_not_to_onnx(tmp_path: Path) -> None:
    model = BertforgeForPreTraining(EncoderConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2,
                                                  intermediate_size=64, position="alibi", mlp="geglu"))
    save_bertforge_model(model, tmp_path / "alibi")
    summary = export_model(tmp_path / "alibi", tmp_path / "out")
    assert summary.format == "bertforge" and "no stock transformers class" in summary.message
    with pytest.raises(BertforgeError, match="no stock transformers class"):
        export_model(tmp_path / "alibi", tmp_path / "onnx", "onnx")
    assert not (tmp_path / "onnx").exists()


def test_unknown_format_and_missing_model_are_user_errors(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BertforgeError, match="--format 'tflite'"):
        export_model(run_dir, tmp_path / "x", "tflite")
    with pytest.raises(BertforgeError, match="no such file or directory"):
        export_model(tmp_path / "missing", tmp_path / "x")


# --- the destination: an export never destroys what it was not asked to replace ------------------


def export_exit_code(model: Path, out: Path, *extra: str) -> int:
    return main(["export", str(model), "--out", str(out), *extra])


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_export_refuses_the_run_its_parents_a_file_and_a_foreign_directory_and_changes_nothing(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot(run_dir)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("three years of work", encoding="utf-8")
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"\0" * 16)
    cases = {run_dir: "is the model being exported", run_dir / "final": "is the model being exported",
             run_dir.parent: "contains the model being exported", foreign: "is not empty and is not an earlier export",
             a_file: "is a file, not a directory"}
    for out, message in cases.items():
        capsys.readouterr()
        assert export_exit_code(run_dir, out) == 2, out
        error = capsys.readouterr().err.strip()
        assert message in error and str(out) in error and "Traceback" not in error
    assert snapshot(run_dir) == before
    assert (foreign / "thesis.tex").read_text(encoding="utf-8") == "three years of work"
    assert a_file.read_bytes() == b"\0" * 16
    # a checkpoint's own run is its parent too
    assert export_exit_code(run_dir / "checkpoints" / "step-00000004", run_dir) == 2
    assert snapshot(run_dir) == before


def test_an_earlier_export_is_replaced_only_with_overwrite_and_an_empty_directory_is_used(
        run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_exit_code(run_dir / "checkpoints" / "step-00000004", empty) == 0
    first = snapshot(empty)
    capsys.readouterr()
    assert export_exit_code(run_dir, empty) == 2
    error = capsys.readouterr().err
    assert "holds an earlier export" in error and "pass --overwrite" in error
    assert snapshot(empty) == first
    assert export_exit_code(run_dir, empty, "--overwrite") == 0
    assert snapshot(empty) != first  # the final model, not checkpoint 4
    # an earlier export with a user's file added is no longer only an export: kept, even with --overwrite
    (empty / "notes.md").write_text("my notes", encoding="utf-8")  # (README.md is the export's model card)
    assert export_exit_code(run_dir, empty, "--overwrite") == 2
    assert (empty / "notes.md").read_text(encoding="utf-8") == "my notes"
