"""Metrics against values computed by hand (worked out in the comments), not against another library."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from bertforge.tasks.metrics import (
    accuracy,
    best_mode,
    compute_metrics,
    confusion_matrix,
    confusion_table,
    f1_binary,
    f1_macro,
    matthews_correlation,
    metric_names,
    pearson,
    per_class_report,
    per_class_table,
    save_confusion_matrix_png,
    spearman,
)

# binary: TP=3 FN=1 FP=1 TN=5
BINARY_LABELS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
BINARY_PREDICTIONS = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]
# three classes: confusion [[1, 1, 0], [0, 2, 0], [1, 0, 1]] (rows true, columns predicted)
MULTI_LABELS = [0, 0, 1, 1, 2, 2]
MULTI_PREDICTIONS = [0, 1, 1, 1, 2, 0]


def test_binary_metrics_match_the_hand_computed_values() -> None:
    assert accuracy(BINARY_PREDICTIONS, BINARY_LABELS) == pytest.approx(8 / 10)
    assert f1_binary(BINARY_PREDICTIONS, BINARY_LABELS) == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))  # 0.75
    # F1 of class 0 is 2*5 / (2*5 + 1 + 1) = 10/12
    assert f1_macro(BINARY_PREDICTIONS, BINARY_LABELS) == pytest.approx((0.75 + 10 / 12) / 2)
    # (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (15 - 1) / sqrt(4*4*6*6)
    assert matthews_correlation(BINARY_PREDICTIONS, BINARY_LABELS) == pytest.approx(14 / 24)


def test_multiclass_metrics_match_the_hand_computed_values() -> None:
    assert confusion_matrix(MULTI_PREDICTIONS, MULTI_LABELS, 3).tolist() == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert accuracy(MULTI_PREDICTIONS, MULTI_LABELS) == pytest.approx(4 / 6)
    # per-class F1 = 2TP / (predicted + actual): 2/4, 4/5, 2/3
    assert f1_macro(MULTI_PREDICTIONS, MULTI_LABELS) == pytest.approx((0.5 + 0.8 + 2 / 3) / 3)
    # R_K: (correct*total - sum p_k t_k) / sqrt((total^2 - sum p_k^2)(total^2 - sum t_k^2))
    #    = (4*6 - (2*2 + 3*2 + 1*2)) / sqrt((36 - 14) * (36 - 12))
    assert matthews_correlation(MULTI_PREDICTIONS, MULTI_LABELS) == pytest.approx(12 / np.sqrt(22 * 24))


def test_macro_f1_averages_only_over_classes_that_occur() -> None:
    # class 1 appears in neither labels nor predictions: F1(0) = 2/3, F1(2) = 0, mean over {0, 2}
    assert f1_macro([0, 2], [0, 0]) == pytest.approx(1 / 3)


def test_correlations_match_the_hand_computed_values() -> None:
    x, y = [1, 2, 3, 4, 5], [2, 4, 5, 4, 5]
    # deviations (-2,-1,0,1,2) and (-2,0,1,0,1): 6 / sqrt(10 * 6)
    assert pearson(x, y) == pytest.approx(6 / np.sqrt(60))
    # ranks of y with ties averaged: (1, 2.5, 4.5, 2.5, 4.5); Pearson of the ranks = 7 / sqrt(10 * 9)
    assert spearman(x, y) == pytest.approx(7 / np.sqrt(90))
    assert pearson([[1.0], [2.0], [3.0]], [3, 2, 1]) == pytest.approx(-1.0)  # [N, 1] model outputs


def test_degenerate_predictions_score_zero_instead_of_nan() -> None:
    assert matthews_correlation([1, 1, 1, 1], [0, 1, 0, 1]) == 0.0
    assert f1_binary([0, 0, 0], [0, 0, 0]) == 0.0
    assert pearson([2.5, 2.5, 2.5], [1.0, 2.0, 3.0]) == 0.0
    assert spearman([2.5, 2.5, 2.5], [1.0, 2.0, 3.0]) == 0.0


def test_compute_metrics_takes_ids_or_logits_and_adds_binary_f1_for_two_classes() -> None:
    logits = np.eye(2)[BINARY_PREDICTIONS] * 3.0 - 1.0
    from_logits = compute_metrics("classification", logits, BINARY_LABELS, ["neg", "pos"])
    from_ids = compute_metrics("classification", BINARY_PREDICTIONS, BINARY_LABELS, ["neg", "pos"])
    assert from_logits == from_ids
    assert set(from_ids) == {"accuracy", "f1_macro", "matthews", "f1"}
    assert "f1" not in compute_metrics("classification", MULTI_PREDICTIONS, MULTI_LABELS, ["a", "b", "c"])
    regression = compute_metrics("regression", [1.0, 2.0, 4.0], [1.0, 2.0, 3.0])
    assert set(regression) == {"pearson", "spearman", "mse"}
    assert regression["mse"] == pytest.approx(1 / 3) and regression["spearman"] == pytest.approx(1.0)


def test_mismatched_lengths_are_rejected() -> None:
    with pytest.raises(ValueError, match="3 predictions for 2 labels"):
        accuracy([0, 1, 1], [0, 1])


def test_best_mode_says_which_direction_improves() -> None:
    assert best_mode("accuracy") == "max" and best_mode("spearman") == "max"
    assert best_mode("mse") == "min" and best_mode("eval_loss") == "min"


def test_per_class_report_and_tables() -> None:
    names = ["act", "animal", "plant"]
    report = per_class_report(MULTI_PREDICTIONS, MULTI_LABELS, names)
    assert [(r.name, r.support) for r in report] == [("act", 2), ("animal", 2), ("plant", 2)]
    assert [r.precision for r in report] == pytest.approx([1 / 2, 2 / 3, 1.0])
    assert [r.recall for r in report] == pytest.approx([1 / 2, 1.0, 1 / 2])
    assert [r.f1 for r in report] == pytest.approx([0.5, 0.8, 2 / 3])

    console = Console(record=True, width=120)
    console.print(per_class_table(report))
    console.print(confusion_table(confusion_matrix(MULTI_PREDICTIONS, MULTI_LABELS, 3), names))
    text = console.export_text()
    assert "animal" in text and "0.800" in text and "true \\ predicted" in text


def test_confusion_matrix_png_is_written_whole(tmp_path: Path) -> None:
    small = save_confusion_matrix_png(confusion_matrix(MULTI_PREDICTIONS, MULTI_LABELS, 3), ["a", "b", "c"],
                                      tmp_path / "plots" / "confusion.png")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 45, size=500)
    large = save_confusion_matrix_png(confusion_matrix(labels, labels, 45), [f"class.{i}" for i in range(45)],
                                      tmp_path / "confusion45.png")
    for path in (small, large):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["confusion.png", "confusion45.png"]


@pytest.mark.parametrize("task_type,num_labels", [("classification", 2), ("classification", 5), ("regression", 1)])
def test_metric_names_known_before_evaluation_are_the_keys_evaluation_returns(task_type: str, num_labels: int) -> None:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, num_labels, 40) if task_type == "classification" else rng.random(40)
    predictions = rng.random((40, num_labels)) if task_type == "classification" else rng.random(40)
    names = [f"label{i}" for i in range(num_labels)]
    assert set(compute_metrics(task_type, predictions, labels, names)) == metric_names(task_type, num_labels)
