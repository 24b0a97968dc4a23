"""`bertforge finetune`: classification and regression runs on real data, from MiniLM or from scratch,
with the best checkpoint, early stopping, the test report, and errors that name the file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers.cli import error_line
from helpers.finetuning import (
    TINY_MODEL,
    finetune,
    metrics_records,
    minilm_dir,
    run_cli,
    supersense_files,
)

from bertforge.data.bundled import supersense_labels
from bertforge.inference import load_model, read_inputs
from bertforge.tasks.classify import ClassificationTask, evaluate_file, prediction_rows


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Path:
    """A tiny random BERT fine-tuned on 512 supersense glosses for 2 epochs, validated every 8 steps."""
    run_dir = tmp_path_factory.mktemp("runs") / "tiny"
    finetune(run_dir, *TINY_MODEL, *supersense_files(data_dir), f"model.tokenizer={minilm_dir()}",
             "finetune.max_length=64", "optim.lr=2e-3", "train.micro_batch_size=32", "train.global_batch_size=64",
             "train.max_epochs=2", "train.eval_every=8", "train.best_metric=accuracy", "train.checkpoint_every=8",
             "log.plots=true")  # the confusion-matrix PNG is checked below
    return run_dir


def test_tiny_model_run_directory_holds_metrics_test_report_and_a_labeled_hf_model(tiny_run: Path) -> None:
    train = metrics_records(tiny_run, "train")
    assert train[-1]["loss"] < train[0]["loss"]
    validation = metrics_records(tiny_run, "validation")
    assert {"accuracy", "f1_macro", "matthews", "loss"} <= validation[0].keys()
    results = json.loads((tiny_run / "test_results.json").read_text())
    assert results["split"] == "test" and results["metrics"]["examples"] == 256
    assert len(results["per_class"]) == 45 and len(results["confusion_matrix"]) == 45
    assert sum(map(sum, results["confusion_matrix"])) == 256
    assert (tiny_run / "test_confusion_matrix.png").read_bytes().startswith(b"\x89PNG")
    assert "## Confusion matrix" in (tiny_run / "test_report.md").read_text()
    config = json.loads((tiny_run / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"]["0"] == "adj.all" and len(config["label2id"]) == 45
    assert (tiny_run / "final" / "tokenizer.json").is_file()
    # every checkpoint holds a complete model directory: the description, the weights, the tokenizer
    checkpoint_model = tiny_run / "checkpoints" / (tiny_run / "checkpoints" / "latest").read_text() / "model"
    assert json.loads((checkpoint_model / "bertforge_model.json").read_text())["head_arguments"]["num_labels"] == 45
    assert (checkpoint_model / "model.safetensors").is_file() and (checkpoint_model / "tokenizer.json").is_file()


def test_final_model_is_the_best_checkpoint_and_its_test_metrics_are_reproducible(tiny_run: Path,
                                                                                 data_dir: Path) -> None:
    validation = metrics_records(tiny_run, "validation")
    best = max(validation, key=lambda record: record["accuracy"])
    checkpoints = tiny_run / "checkpoints"
    assert (checkpoints / "best").read_text() == f"step-{best['step']:08d}"
    test_file = data_dir / "supersense-test-256.jsonl"
    from_checkpoint = evaluate_file(load_model(checkpoints / (checkpoints / "best").read_text()), test_file)
    from_final = evaluate_file(load_model(tiny_run), test_file)
    saved = json.loads((tiny_run / "test_results.json").read_text())["metrics"]
    for metric in ("accuracy", "f1_macro", "matthews"):
        assert from_checkpoint.metrics[metric] == pytest.approx(saved[metric], abs=1e-9)
        assert from_final.metrics[metric] == pytest.approx(saved[metric], abs=1e-9)


def test_minilm_fine_tuned_for_a_few_steps_with_a_label_map_beats_the_majority_class(tmp_path: Path,
                                                                                   data_dir: Path) -> None:
    # label_map merges the 45 supersenses into their part of speech: noun.animal -> noun, ...
    label_map = "{" + ", ".join(f'"{name}": {name.split(".")[0]}' for name in supersense_labels()) + "}"
    files = [f for f in supersense_files(data_dir, train=256, validation=64, test=128) if "labels=" not in f]
    run_dir = tmp_path / "minilm"
    # MiniLM was trained on mean-pooled tokens (the warning says so): with BERT's untrained pooler this
    # short run's result hung on the classifier's draw (32 steps, seeds 42, 1, 2, 3: 0.695 = the majority
    # class, 0.805, 0.789, 0.859); with mean pooling seeds 42 and 1 reach 0.953 and 0.906
    finetune(run_dir, "model.init_from=all-MiniLM-L6-v2", "model.pooling=mean", *files,
             f"finetune.classification.label_map={label_map}", "finetune.max_length=48", "optim.lr=5e-4", "train.micro_batch_size=16",
             "train.global_batch_size=16", "train.max_steps=32", "train.best_metric=accuracy")
    results = json.loads((run_dir / "test_results.json").read_text())
    assert results["label_names"] == ["adj", "adv", "noun", "verb"]
    majority = max(report["support"] for report in results["per_class"]) / results["metrics"]["examples"]
    assert results["metrics"]["accuracy"] > majority + 0.05 and results["metrics"]["matthews"] > 0.3
    # no stock transformers class pools a BERT by the mean: final/ is in bertforge's format
    description = json.loads((run_dir / "final" / "bertforge_model.json").read_text())
    encoder = description["encoder_config"]
    assert (encoder["hidden_size"], encoder["num_layers"], encoder["pooling"]) == (384, 6, "mean")
    assert description["head_arguments"]["label_names"] == ["adj", "adv", "noun", "verb"]


def test_early_stopping_ends_the_run_and_reloads_the_best_checkpoint(tmp_path: Path, data_dir: Path) -> None:
    run_dir = tmp_path / "diverges"
    # an absurd learning rate: validation loss stops improving after the first evaluations
    result = finetune(run_dir, *TINY_MODEL, *supersense_files(data_dir), f"model.tokenizer={minilm_dir()}",
                      "finetune.max_length=64", "optim.lr=3.0", "schedule.warmup=0", "train.micro_batch_size=32",
                      "train.global_batch_size=32", "train.max_steps=64", "train.eval_every=2",
                      "train.best_metric=loss", "train.best_mode=min", "train.early_stopping_patience=2")
    assert result.stopped_by == "early_stopping" and result.state.step < 64
    validation = metrics_records(run_dir, "validation")
    best = min(validation, key=lambda record: record["loss"])
    assert result.state.best_step == best["step"]
    assert all(record["loss"] >= best["loss"] for record in validation[-2:])
    final = evaluate_file(load_model(run_dir), data_dir / "supersense-validation-128.jsonl")
    assert final.metrics["loss"] == pytest.approx(best["loss"], rel=1e-5)
    # killed while writing final/: the same command finishes the early-stopped run, it does not train on
    import shutil

    shutil.rmtree(run_dir / "final")
    again = finetune(run_dir, *TINY_MODEL, *supersense_files(data_dir), f"model.tokenizer={minilm_dir()}",
                     "finetune.max_length=64", "optim.lr=3.0", "schedule.warmup=0", "train.micro_batch_size=32",
                     "train.global_batch_size=32", "train.max_steps=64", "train.eval_every=2",
                     "train.best_metric=loss", "train.best_mode=min", "train.early_stopping_patience=2")
    assert again.stopped_by == "early_stopping" and again.state.step == result.state.step
    assert (run_dir / "final").is_dir() and metrics_records(run_dir, "validation") == validation
    # log.plots=false (QUIET_RUN): the reports are written, their confusion-matrix pictures are not
    assert (run_dir / "test_results.json").is_file() and not list(run_dir.glob("*_confusion_matrix.png"))


def test_regression_on_the_glue_layout_sts_b_files_reports_correlations(tmp_path: Path, glue_dir: Path) -> None:
    run_dir = tmp_path / "stsb"
    finetune(run_dir, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", "finetune.task_type=regression",
             f"finetune.train_file={glue_dir / 'STS-B' / 'train.tsv'}",
             f"finetune.validation_file={glue_dir / 'STS-B' / 'dev.tsv'}", "finetune.text_column=sentence1",
             "finetune.text_pair_column=sentence2", "finetune.label_column=score", "finetune.max_length=64",
             "optim.lr=1e-3", "train.micro_batch_size=30", "train.global_batch_size=30", "train.max_steps=6",
             "train.best_metric=pearson")
    report = json.loads((run_dir / "validation_results.json").read_text())
    assert report["task_type"] == "regression" and report["confusion_matrix"] is None
    assert {"pearson", "spearman", "mse", "loss"} <= report["metrics"].keys()
    assert report["metrics"]["mse"] == pytest.approx(report["metrics"]["loss"])
    config = json.loads((run_dir / "final" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    dev = glue_dir / "STS-B" / "dev.tsv"
    rerun = evaluate_file(load_model(run_dir), dev, text_column="sentence1", text_pair_column="sentence2",
                          label_column="score")
    assert rerun.metrics["pearson"] == pytest.approx(report["metrics"]["pearson"], abs=1e-5)
    rows = prediction_rows(load_model(run_dir), read_inputs(dev, text_column="sentence1",
                                                            text_pair_column="sentence2")).rows
    assert len(rows) == 100 and isinstance(rows[0]["score"], float) and "label" not in rows[0]


def test_pair_classification_on_the_mnli_layout_with_class_weights(tmp_path: Path, glue_dir: Path) -> None:
    run_dir = tmp_path / "mnli"
    finetune(run_dir, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", f"finetune.train_file={glue_dir / 'MNLI' / 'train.tsv'}",
             f"finetune.validation_file={glue_dir / 'MNLI' / 'dev_matched.tsv'}",
             f"finetune.test_file={glue_dir / 'MNLI' / 'dev_mismatched.tsv'}", "finetune.text_column=sentence1",
             "finetune.text_pair_column=sentence2", "finetune.label_column=gold_label",
             "finetune.labels=[entailment,neutral,contradiction]", "finetune.classification.class_weights=[1.0,2.0,1.0]",
             "finetune.max_length=128", "optim.lr=1e-3", "train.micro_batch_size=20", "train.global_batch_size=20",
             "train.max_steps=6")
    results = json.loads((run_dir / "test_results.json").read_text())
    assert results["label_names"] == ["entailment", "neutral", "contradiction"]
    assert results["metrics"]["examples"] == 100
    assert json.loads((run_dir / "final" / "config.json").read_text())["id2label"] == {
        "0": "entailment", "1": "neutral", "2": "contradiction"}


def test_class_weights_make_the_loss_a_weighted_mean_over_the_global_batch(tmp_path: Path, data_dir: Path) -> None:
    from helpers.finetuning import run_config

    config = run_config(tmp_path / "weights", *TINY_MODEL, f"model.tokenizer={minilm_dir()}",
                        "finetune.train_file=bundled:supersense/validation", "finetune.classification.class_weights=[" +
                        ",".join(["1.0"] * 44 + ["3.0"]) + "]")
    task = ClassificationTask(config)
    data = task.build_datasets()
    model = task.build_model().eval()
    batch = data.collate([data.train[i] for i in range(40)])
    units = task.loss_units(batch)
    expected_units = float(task.class_weights[batch["labels"]].sum())
    assert units == {"examples": expected_units}
    batch["global_loss_units"] = units
    with torch.no_grad():
        loss, _ = task.forward_step(batch, model)
        logits = model(input_ids=batch["input_ids"], cu_seqlens=batch["cu_seqlens"], max_seqlen=batch["max_seqlen"],
                       position_ids=batch["position_ids"], token_type_ids=batch["token_type_ids"]).logits
    reference = torch.nn.functional.cross_entropy(logits, batch["labels"], weight=task.class_weights)
    assert float(loss) == pytest.approx(float(reference), rel=1e-5)


def test_fine_tuning_starts_from_a_run_directory_or_one_of_its_checkpoints(tmp_path: Path, tiny_run: Path,
                                                                          data_dir: Path) -> None:
    checkpoint = tiny_run / "checkpoints" / (tiny_run / "checkpoints" / "latest").read_text()
    for name, source in (("from-run", tiny_run), ("from-checkpoint", checkpoint)):
        config_overrides = [f"model.init_from={source}", *supersense_files(data_dir, validation=32, test=32),
                            "finetune.max_length=64", "train.micro_batch_size=32", "train.global_batch_size=32",
                            "train.max_steps=1", "optim.lr=1e-9"]
        finetune(tmp_path / name, *config_overrides)
        config = json.loads((tmp_path / name / "final" / "config.json").read_text())
        assert config["hidden_size"] == 64
    # lr 1e-9 for one step: the encoder of the new runs is the source's (the classifier, same labels, too)
    from_run = load_model(tmp_path / "from-run").model.state_dict()
    source = load_model(tiny_run).model.state_dict()
    assert torch.allclose(from_run["encoder.layers.0.attention.qkv.weight"],
                          source["encoder.layers.0.attention.qkv.weight"], atol=1e-6)


def test_a_best_metric_the_task_does_not_report_or_the_wrong_direction_is_a_config_error(tmp_path: Path) -> None:
    from helpers.finetuning import run_config

    from bertforge.errors import ConfigError

    base = [f"model.tokenizer={minilm_dir()}", "finetune.train_file=bundled:supersense/validation"]
    for extra, message in ((["train.best_metric=pearson"], "choose one of accuracy, f1_macro, loss, matthews"),
                           (["train.best_metric=loss"], "set train.best_mode=min"),
                           (["train.best_metric=f1"], "choose one of")):  # binary F1 needs two classes
        with pytest.raises(ConfigError, match=message):
            ClassificationTask(run_config(tmp_path / "x", *base, *extra)).build_datasets()


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs" / "finetune").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_the_shipped_fine_tuning_configs_load(path: Path) -> None:
    """Each recipe resolves, trains on the bundled set or on a task `scripts/build_parity_tasks.py` builds,
    and keeps its best checkpoint by a metric its kind reports, in the direction that metric improves.
    The kind's own record says what it reports, so a new kind's recipe is checked with no edit here."""
    from types import SimpleNamespace

    from bertforge.config import load_config
    from bertforge.tasks.kinds import kind_named
    from bertforge.tasks.metrics import best_mode
    from scripts.build_parity_tasks import TASKS

    config = load_config(path)
    section = config.finetune
    built = {f"~/.cache/bertforge/tasks/{task}/train.jsonl" for task in TASKS}
    assert section.train_file == "bundled:supersense/train" or section.train_file in built, section.train_file
    bundled_supersense = SimpleNamespace(task_type=section.task_type, num_labels=45)  # what a reader gives the kind
    assert config.train.best_metric in kind_named(section.task_type).metric_names(section, bundled_supersense)
    assert config.train.best_mode == best_mode(config.train.best_metric)


# ---------------------------------------------------------------------------------------------
# bad input through the CLI: exit code 2, one line naming the file and line, no traceback


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


BAD_INPUTS = {
    "missing_column": ("train.csv", "sentence,label\nthe law of the land,noun.act\n", [], "train.csv:1: no column 'text'"),
    "unknown_label_in_validation": ("validation.csv", "text,label\na gloss,noun.act\nanother gloss,noun.zzz\n", [],
                                    "validation.csv:3: label 'noun.zzz'"),
    "empty_text": ("train.csv", "text,label\na gloss,noun.act\n  ,noun.act\n", [], "train.csv:3: empty text"),
    "wrong_delimiter": ("train.csv", "text\tlabel\na gloss\tnoun.act\n", [], "train.csv:1: no column.*tab-separated"),
    "non_numeric_regression_label": ("train.csv", "text,label\na gloss,0.5\nanother,high\n",
                                     ["finetune.task_type=regression"], "train.csv:3: regression label 'high'"),
}


# The first case runs as its own process, for the exit code and the stderr a user sees; the others read the same
# one line from `bertforge.cli.main` in this process (a child interpreter per case was most of their time).
PROCESS_CASE = "missing_column"


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_exits_with_code_2_and_one_line_naming_the_file_and_line(tmp_path: Path, case: str,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    name, text, extra, expected = BAD_INPUTS[case]
    good = "text,label\na gloss,noun.act\nanother gloss,noun.state\n"
    files = {"train.csv": good, "validation.csv": good} | {name: text}
    for file_name, content in files.items():
        _write(tmp_path / file_name, content)
    config = _write(tmp_path / "config.yaml", f"""
run: {{name: bad, output_dir: {tmp_path / 'runs'}}}
model: {{preset: bert-tiny, tokenizer: {minilm_dir()}}}
finetune: {{train_file: {tmp_path / 'train.csv'}, validation_file: {tmp_path / 'validation.csv'}}}
train: {{max_steps: 1, micro_batch_size: 1, global_batch_size: 1}}
""")
    if case == PROCESS_CASE:
        result = run_cli("finetune", str(config), *extra)
        assert result.returncode == 2, result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
        error = errors[0]
    else:
        error = error_line(capsys, "finetune", str(config), *extra)
    assert re.search(expected, error), error
    assert str(tmp_path) in error
