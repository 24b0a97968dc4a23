"""The GLUE task table: every task's parser on a GLUE-layout directory of real text, its official
metrics, and the final results table beside the published BERT-base numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from glue_layout import Expected

from bertforge.errors import ConfigError, DataError
from bertforge.tasks.glue_tasks import (
    GLUE_TASKS,
    STAND_IN_FILE,
    get_glue_task,
    glue_results_markdown,
    read_glue_split,
    stand_in_tasks,
    summarize_glue,
    write_glue_results,
)
from bertforge.tasks.metrics import compute_metrics

ALL_SPLITS = [(task.name, split) for task in GLUE_TASKS.values() for split in ("train", *task.eval_splits)]


def copy_task(glue_dir: Path, tmp_path: Path, title: str) -> Path:
    shutil.copytree(glue_dir / title, tmp_path / title)
    return tmp_path


# ---------------------------------------------------------------------------------------------
# the table


def test_the_table_holds_the_eight_tasks_of_the_mosaic_runner() -> None:
    assert list(GLUE_TASKS) == ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]
    assert {t.name for t in GLUE_TASKS.values() if t.small} == {"cola", "mrpc", "stsb", "rte"}
    assert {t.name for t in GLUE_TASKS.values() if t.from_mnli} == {"rte", "mrpc", "stsb"}
    assert get_glue_task("SST-2") is get_glue_task("sst2") is get_glue_task("Sst2")
    assert get_glue_task("STS-B").task_type == "regression" and get_glue_task("sts-b").num_labels == 1
    assert get_glue_task("mnli").eval_splits == ("dev_matched", "dev_mismatched")
    official = {t.name: [metric for _, metric in t.official] for t in GLUE_TASKS.values()}
    assert official == {"cola": ["matthews"], "sst2": ["accuracy"], "mrpc": ["f1", "accuracy"],
                        "stsb": ["pearson", "spearman"], "qqp": ["accuracy", "f1"], "mnli": ["accuracy", "accuracy"],
                        "qnli": ["accuracy"], "rte": ["accuracy"]}
    for task in GLUE_TASKS.values():
        assert len(task.reference) == len(task.official)
        assert task.hyperparameters.lr > 0 and task.hyperparameters.epochs >= 3


def test_wnli_and_unknown_tasks_are_explained() -> None:
    with pytest.raises(ConfigError, match="WNLI is left out"):
        get_glue_task("wnli")
    with pytest.raises(ConfigError, match=r"unknown GLUE task 'squad'; choose from cola, sst2"):
        get_glue_task("squad")


# ---------------------------------------------------------------------------------------------
# parsers


@pytest.mark.parametrize(("name", "split"), ALL_SPLITS)
def test_every_task_parser_reads_its_files_exactly(glue_layout: tuple[Path, Expected], name: str,
                                                   split: str) -> None:
    root, written = glue_layout
    task = GLUE_TASKS[name]
    expected = written[task.title][split]
    parsed = read_glue_split(task, root, split)
    assert len(parsed) == len(expected)
    assert parsed.texts == [text for text, _, _ in expected]
    assert parsed.text_pairs == (None if expected[0][1] is None else [pair for _, pair, _ in expected])
    if task.task_type == "regression":
        assert parsed.labels == [float(label) for _, _, label in expected]
        assert 0.0 <= min(parsed.labels) and max(parsed.labels) <= 5.0
    else:
        # files hold 0/1 ids (CoLA, SST-2, MRPC, QQP) or names (MNLI, QNLI, RTE)
        as_written = [label if label in task.label_names else task.label_names[int(label)] for _, _, label in expected]
        assert [task.label_names[i] for i in parsed.labels] == as_written  # type: ignore[union-attr]
        assert set(parsed.labels) == set(range(task.num_labels))  # type: ignore[arg-type]
    assert parsed.label_names == list(task.label_names)


def test_cola_has_no_header_and_its_quoted_sentences_are_read_with_quoting_off(glue_dir: Path) -> None:
    rows = [line.split("\t") for line in (glue_dir / "CoLA" / "train.tsv").read_text(encoding="utf-8").splitlines()]
    parsed = read_glue_split("cola", glue_dir, "train")
    assert len(parsed) == len(rows) and parsed.texts[0] == rows[0][3]  # line 1 is a row, not a header
    assert sum(text.startswith('"') for text in parsed.texts) > 100  # a csv reader would have merged these
    starred = [i for i, fields in enumerate(rows) if fields[2] == "*"]
    assert starred and all(parsed.labels[i] == 0 for i in starred)  # type: ignore[index]


def test_mrpc_byte_order_mark_is_dropped(glue_dir: Path) -> None:
    assert (glue_dir / "MRPC" / "train.tsv").read_bytes().startswith(b"\xef\xbb\xbfQuality\t")
    assert len(read_glue_split("mrpc", glue_dir, "dev")) == 100


def test_mnli_label_is_the_gold_label_not_the_first_annotator(glue_dir: Path) -> None:
    rows = [line.split("\t") for line in (glue_dir / "MNLI" / "dev_matched.tsv").read_text().splitlines()[1:]]
    assert all(len(fields) == 16 for fields in rows)
    dissenting = [i for i, fields in enumerate(rows) if fields[10] != fields[-1]]
    assert dissenting  # the fixture makes label1 disagree on some rows
    parsed = read_glue_split("mnli", glue_dir, "dev_matched")
    names = GLUE_TASKS["mnli"].label_names
    assert [names[parsed.labels[i]] for i in dissenting] == [rows[i][-1] for i in dissenting]  # type: ignore[index]
    train_columns = (glue_dir / "MNLI" / "train.tsv").read_text().splitlines()[0].split("\t")
    assert len(train_columns) == 12 and train_columns[-2:] == ["label1", "gold_label"]


def test_qqp_skips_malformed_rows_as_hugging_face_does(glue_dir: Path, tmp_path: Path) -> None:
    root = copy_task(glue_dir, tmp_path, "QQP")
    with (root / "QQP" / "dev.tsv").open("a", encoding="utf-8") as f:
        f.write("100\t1\t2\tWhat is a question cut by a stray newline\n?\t0\n")
    assert len(read_glue_split("qqp", root, "dev")) == 100


def test_damaged_rows_wrong_files_and_missing_files_are_named(glue_dir: Path, tmp_path: Path) -> None:
    root = copy_task(glue_dir, tmp_path, "RTE")
    with (root / "RTE" / "dev.tsv").open("a", encoding="utf-8") as f:
        f.write("100\tonly one sentence\n")
    with pytest.raises(DataError, match=r"RTE/dev.tsv:102: 2 tab-separated fields, RTE rows have at least 3"):
        read_glue_split("rte", root, "dev")

    (root / "QNLI").mkdir()
    shutil.copy(glue_dir / "SST-2" / "train.tsv", root / "QNLI" / "train.tsv")
    with pytest.raises(DataError, match=r"QNLI/train.tsv:1: expected a QNLI header with 'question' in column 1"):
        read_glue_split("qnli", root, "train")

    (root / "SST-2").mkdir()
    (root / "SST-2" / "dev.tsv").write_text("sentence\tlabel\nfine words \t2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"SST-2/dev.tsv:2: SST-2 label '2' is not one of negative, positive"):
        read_glue_split("sst2", root, "dev")

    with pytest.raises(DataError, match=r"CoLA/train.tsv: GLUE file not found; point --data-dir at the GLUE root"):
        read_glue_split("cola", root, "train")
    with pytest.raises(ConfigError, match=r"MNLI has no split 'dev'; use train or dev_matched, dev_mismatched"):
        read_glue_split("mnli", root, "dev")


# ---------------------------------------------------------------------------------------------
# official metrics on the parsed dev sets


def test_official_metrics_of_simple_predictors_match_hand_computed_values(glue_dir: Path) -> None:
    for task in GLUE_TASKS.values():
        for split in task.eval_splits:
            dev = read_glue_split(task, glue_dir, split)
            if task.task_type == "regression":
                metrics = compute_metrics("regression", dev.labels, dev.labels)
                assert metrics["pearson"] == pytest.approx(1.0) and metrics["spearman"] == pytest.approx(1.0)
                continue
            always_one = [1] * len(dev)
            metrics = compute_metrics("classification", always_one, dev.labels, task.label_names)
            share = sum(label == 1 for label in dev.labels) / len(dev)  # type: ignore[union-attr]
            assert metrics["accuracy"] == pytest.approx(share)
            assert metrics["matthews"] == 0.0  # a constant predictor carries no information
            if "f1" in metrics:  # F1 of class 1 when every prediction is 1: 2p / (1 + p)
                assert metrics["f1"] == pytest.approx(2 * share / (1 + share))
            for official_split, metric in task.official:
                assert official_split in task.eval_splits and metric in metrics


# ---------------------------------------------------------------------------------------------
# the final table


def fake_results() -> dict[str, list[dict[str, dict[str, float]]]]:
    """Per-seed dev metrics (0-1 scale), as the runner collects them."""
    return {
        "CoLA": [{"dev": {"matthews": m, "accuracy": 0.8}} for m in (0.50, 0.56, 0.54, 0.40)],
        "sst2": [{"dev": {"accuracy": 0.9}}],
        "mrpc": [{"dev": {"f1": f1, "accuracy": acc}} for f1, acc in ((0.88, 0.84), (0.86, 0.80), (0.90, 0.82),
                                                                        (0.70, 0.70), (0.89, 0.85))],
        "stsb": [{"dev": {"pearson": 0.88, "spearman": 0.87, "mse": 0.5}}] * 5,
        "qqp": [{"dev": {"accuracy": 0.90, "f1": 0.87}}],
        "mnli": [{"dev_matched": {"accuracy": 0.84}, "dev_mismatched": {"accuracy": 0.8451}}],
        "qnli": [{"dev": {"accuracy": 0.91}}],
        "rte": [{"dev": {"accuracy": a}} for a in (0.60, 0.70, 0.65, 0.62, 0.66)],
    }


def test_results_table_reports_seed_medians_task_scores_and_the_glue_average(tmp_path: Path) -> None:
    summary = summarize_glue(fake_results())
    tasks = summary["tasks"]
    assert list(tasks) == list(GLUE_TASKS) and summary["tasks_run"] == 8
    assert tasks["cola"]["values"] == {"dev/matthews": pytest.approx(52.0)}  # median of 40, 50, 54, 56
    assert tasks["mrpc"]["values"] == {"dev/f1": pytest.approx(88.0), "dev/accuracy": pytest.approx(82.0)}
    assert tasks["mrpc"]["score"] == pytest.approx(85.0) and tasks["mrpc"]["seeds"] == 5
    assert tasks["mnli"]["score"] == pytest.approx(84.255)
    assert tasks["rte"]["per_seed"][1] == {"dev/accuracy": pytest.approx(70.0)}
    scores = [52.0, 90.0, 85.0, 87.5, 88.5, 84.255, 91.0, 65.0]
    assert summary["glue_average"] == pytest.approx(sum(scores) / 8)
    # HF README numbers: 56.53, 92.32, (88.85+84.07)/2, (88.64+88.48)/2, (90.71+87.49)/2, (83.91+84.10)/2, 90.66, 65.70
    reference = [56.53, 92.32, 86.46, 88.56, 89.10, 84.005, 90.66, 65.70]
    assert summary["reference_glue_average"] == pytest.approx(sum(reference) / 8)

    markdown = glue_results_markdown(summary)
    lines = markdown.splitlines()
    assert lines[0].startswith("| Task | Metric | bertforge | BERT-base")
    assert "| MRPC | F1/Accuracy | 88.00/82.00 | 88.85/84.07 | -1.46 | 5 (median) |" in lines
    assert "| MNLI | Matched acc./Mismatched acc. | 84.00/84.51 | 83.91/84.10 | +0.25 | 1 |" in lines
    assert lines[-1].startswith(f"| **GLUE average** | mean of 8 task scores | **{sum(scores) / 8:.2f}** | "
                                f"{sum(reference) / 8:.2f} |")

    markdown_path, json_path = write_glue_results(summary, tmp_path / "results")
    assert markdown_path.read_text(encoding="utf-8") == markdown
    assert json.loads(json_path.read_text(encoding="utf-8")) == json.loads(json.dumps(summary))
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["glue_results.json", "glue_results.md"]


def test_stand_in_tasks_are_marked_and_never_set_against_bert_base(glue_dir: Path, tmp_path: Path) -> None:
    """tests/glue_layout.py's WordNet tasks printed a Δ against BERT-base's real GLUE numbers as if comparable."""
    stand_ins = stand_in_tasks(list(GLUE_TASKS.values()), glue_dir)
    assert list(stand_ins) == list(GLUE_TASKS) and "WordNet" in stand_ins["cola"]
    real = tmp_path / "real"  # the same files without the marker: GLUE's own layout
    shutil.copytree(glue_dir, real, ignore=shutil.ignore_patterns(STAND_IN_FILE))
    assert stand_in_tasks(list(GLUE_TASKS.values()), real) == {}

    summary = summarize_glue(fake_results(), {"cola": stand_ins["cola"], "SST-2": stand_ins["sst2"]})
    assert summary["stand_in_tasks"] == ["cola", "sst2"]
    assert summary["tasks"]["cola"]["stand_in"] == stand_ins["cola"] and summary["tasks"]["mrpc"]["stand_in"] is None
    markdown = glue_results_markdown(summary)
    assert "| CoLA (stand-in) | Matthews corr | 52.00 | 56.53 | n/a | 4 (median) |" in markdown
    assert "| SST-2 (stand-in) |" in markdown and "| MRPC | F1/Accuracy | 88.00/82.00 | 88.85/84.07 | -1.46 |" in markdown
    average = next(line for line in markdown.splitlines() if line.startswith("| **GLUE average**"))
    assert average.endswith("| n/a | |")
    assert "**Stand-ins, not GLUE:** CoLA, SST-2" in markdown and f"- CoLA: {stand_ins['cola']}" in markdown
    assert "stand-in" not in glue_results_markdown(summarize_glue(fake_results())).lower()


def test_partial_runs_are_compared_with_the_reference_on_the_same_tasks() -> None:
    summary = summarize_glue({"rte": [{"dev": {"accuracy": 0.7}}], "sst2": [{"dev": {"accuracy": 0.9}}]})
    assert list(summary["tasks"]) == ["sst2", "rte"] and summary["tasks_run"] == 2
    assert summary["reference_glue_average"] == pytest.approx((92.32 + 65.70) / 2)
    assert "mean of 2 task scores" in glue_results_markdown(summary)


def test_results_missing_an_official_metric_or_naming_a_task_twice_are_rejected() -> None:
    with pytest.raises(KeyError, match="mrpc results lack dev/f1"):
        summarize_glue({"mrpc": [{"dev": {"accuracy": 0.8}}]})
    with pytest.raises(ConfigError, match="both name GLUE task sst2"):
        summarize_glue({"sst2": [{"dev": {"accuracy": 0.9}}], "SST-2": [{"dev": {"accuracy": 0.9}}]})
