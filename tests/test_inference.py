"""`bertforge predict`, `evaluate` and `fill-mask` agree with stock `transformers` pipelines on the exported
models, and refuse models or data they cannot use with one clear line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from helpers.cli import error_line
from helpers.finetuning import TINY_MODEL, finetune, minilm_dir, supersense_files

from bertforge.cli import main
from bertforge.engine import EngineSettings
from bertforge.errors import BertforgeError
from bertforge.inference import fill_mask, load_model, read_inputs
from bertforge.models import BertforgeForPreTraining, EncoderConfig, save_bertforge_model
from bertforge.models.hf import export_hf
from bertforge.tasks.classify import prediction_rows

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "supersense"
    finetune(run_dir, *TINY_MODEL, *supersense_files(data_dir, train=256, validation=64, test=64),
             f"model.tokenizer={minilm_dir()}", "finetune.max_length=64", "optim.lr=2e-3",
             "train.micro_batch_size=32", "train.global_batch_size=32", "train.max_steps=16")
    return run_dir


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory: pytest.TempPathFactory, glue_dir: Path) -> tuple[Path, Path]:
    run_dir = tmp_path_factory.mktemp("runs") / "nli"
    finetune(run_dir, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", f"finetune.train_file={glue_dir / 'RTE' / 'train.tsv'}",
             "finetune.text_column=sentence1", "finetune.text_pair_column=sentence2", "finetune.max_length=128",
             "optim.lr=1e-3", "train.micro_batch_size=20", "train.global_batch_size=20", "train.max_steps=4")
    return run_dir, glue_dir / "RTE" / "dev.tsv"


@pytest.fixture(scope="module")
def mlm_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny MLM with the MiniLM vocabulary in bertforge's format, and its Hugging Face export."""
    torch.manual_seed(0)
    config = EncoderConfig(vocab_size=30528, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                           initializer_range=0.2)
    model = BertforgeForPreTraining(config).eval()
    root = tmp_path_factory.mktemp("mlm")
    ours = save_bertforge_model(model, root / "bertforge", minilm_dir())
    exported = export_hf(model, minilm_dir(), root / "hf").directory
    return ours, exported


def test_predictions_equal_the_transformers_pipeline_on_the_exported_model(classifier_run: Path, data_dir: Path,
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "preds.jsonl"
    test_file = data_dir / "supersense-test-64.jsonl"
    assert main(["predict", str(classifier_run), "--input", str(test_file), "--out", str(out), "--batch-size", "7"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 64 and {"text", "label", "label_id", "score", "probabilities"} <= rows[0].keys()
    pipeline = transformers.pipeline("text-classification", model=str(classifier_run / "final"), top_k=None)
    for row, theirs in zip(rows, pipeline([row["text"] for row in rows]), strict=True):
        assert theirs[0]["label"] == row["label"]
        by_label = {entry["label"]: entry["score"] for entry in theirs}
        assert by_label.keys() == row["probabilities"].keys()
        for label, probability in row["probabilities"].items():
            assert by_label[label] == pytest.approx(probability, abs=1e-4)


def test_pair_predictions_equal_the_pipeline_given_text_pairs(pair_run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, dev = pair_run
    loaded = load_model(run_dir)
    split = read_inputs(dev, text_column="sentence1", text_pair_column="sentence2")
    split.texts, split.text_pairs = split.texts[:24], split.text_pairs[:24]  # type: ignore[index]
    rows = prediction_rows(loaded, split, EngineSettings(batch_size=16)).rows
    pipeline = transformers.pipeline("text-classification", model=str(run_dir / "final"), top_k=None)
    theirs = pipeline([{"text": row["text"], "text_pair": row["text_pair"]} for row in rows])
    for row, scores in zip(rows, theirs, strict=True):
        by_label = {entry["label"]: entry["score"] for entry in scores}
        assert by_label == pytest.approx(row["probabilities"], abs=1e-4)


def test_predict_reads_csv_columns_and_writes_nothing_on_error(classifier_run: Path, tmp_path: Path) -> None:
    texts = tmp_path / "texts.csv"
    texts.write_text("id,sentence\n1,a small domesticated carnivore\n2,\"to move fast, on foot\"\n")
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(classifier_run), "--input", str(texts), "--text-column", "sentence",
                 "--out", str(out)]) == 0
    assert [json.loads(line)["text"] for line in out.read_text().splitlines()] == [
        "a small domesticated carnivore", "to move fast, on foot"]
    missing = tmp_path / "nothing.jsonl"
    assert main(["predict", str(classifier_run), "--input", str(texts), "--out", str(missing)]) == 2
    assert not missing.exists() and not list(tmp_path.glob(".*partial"))


def test_evaluate_reports_the_same_metrics_as_the_run_and_writes_the_report(classifier_run: Path, data_dir: Path,
                                                                          tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    test_file = data_dir / "supersense-test-64.jsonl"
    assert main(["evaluate", str(classifier_run / "final"), "--data", str(test_file), "--split-name", "heldout",
                 "--out-dir", str(tmp_path)]) == 0
    assert "accuracy" in capsys.readouterr().out
    ours = json.loads((tmp_path / "heldout_results.json").read_text())["metrics"]
    during_training = json.loads((classifier_run / "test_results.json").read_text())["metrics"]
    for metric in ("accuracy", "f1_macro", "matthews", "loss"):
        assert ours[metric] == pytest.approx(during_training[metric], abs=1e-6)
    assert (tmp_path / "heldout_confusion_matrix.png").is_file() and (tmp_path / "heldout_report.md").is_file()


def test_evaluate_names_the_line_of_a_label_the_model_does_not_know(classifier_run: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "labeled.tsv"
    data.write_text("text\tlabel\na small domesticated carnivore\tnoun.animal\nto move fast\tverb.running\n")
    error = error_line(capsys, "evaluate", str(classifier_run), "--data", str(data))  # exit 2, one line, no traceback
    assert f"{data}:3: label 'verb.running'" in error and "the model's labels" in error


def test_fill_mask_equals_the_transformers_pipeline_on_the_exported_model(mlm_model: tuple[Path, Path]) -> None:
    ours_dir, exported = mlm_model
    text = "the [MASK] of the law"
    pipeline = transformers.pipeline("fill-mask", model=str(exported), top_k=5)
    theirs = pipeline(text)
    for model_dir in (ours_dir, exported):
        ours = fill_mask(load_model(model_dir), text, top_k=5)
        assert len(ours) == 1
        assert [p.token for p in ours[0]] == [t["token"] for t in theirs]
        assert [p.token_str for p in ours[0]] == [t["token_str"] for t in theirs]
        assert [p.sequence for p in ours[0]] == [t["sequence"] for t in theirs]
        assert [p.score for p in ours[0]] == pytest.approx([t["score"] for t in theirs], abs=1e-5)


def test_fill_mask_cli_prints_one_list_per_mask(mlm_model: tuple[Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fill-mask", str(mlm_model[0]), "[MASK] of the [MASK]", "--top-k", "3", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [len(row) for row in results] == [3, 3]
    assert all("[MASK]" in p["sequence"] for row in results for p in row)  # the other mask stays


def test_models_without_the_needed_head_are_refused_with_what_to_do(mlm_model: tuple[Path, Path],
                                                                   classifier_run: Path) -> None:
    with pytest.raises(BertforgeError, match="without a masked-language-model head"):
        fill_mask(load_model("all-MiniLM-L6-v2"), "the [MASK] of the law")
    with pytest.raises(BertforgeError, match="without a classification head; fine-tune it first"):
        prediction_rows(load_model(mlm_model[0]), read_inputs("bundled:supersense/test"))
    with pytest.raises(BertforgeError, match="no \\[MASK\\] token"):
        fill_mask(load_model(mlm_model[0]), "nothing to fill")
    loaded = load_model(mlm_model[0])
    too_long = " ".join(["word"] * (loaded.max_length + 10)) + " the [MASK] of the law"
    with pytest.raises(BertforgeError, match=rf"1 of the 1 \[MASK\] tokens lie beyond the model's limit of "
                                             rf"{loaded.max_length} tokens and were cut off"):
        fill_mask(loaded, too_long)
    with pytest.raises(BertforgeError, match="is not a model"):
        load_model(classifier_run / "checkpoints")
