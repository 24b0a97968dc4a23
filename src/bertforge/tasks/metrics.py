"""Evaluation metrics for classification and regression, plus the per-class report and confusion matrix.

Why our own code: `evaluate.load(...)` fetches metric scripts from the hub and fails offline, and
scikit-learn is not a dependency. Every metric here is a few lines over a confusion matrix; Pearson
and Spearman come from scipy. Definitions follow scikit-learn's, so numbers are comparable with
published GLUE results: macro F1 averages over the classes that occur in the labels or the
predictions, Matthews correlation is the multi-class R_K statistic, and a metric whose denominator
is zero (a model that predicts one class, a constant regression output) is 0.0, not NaN, so that
best-checkpoint selection keeps working.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

LOWER_IS_BETTER = frozenset({"mse", "loss"})


def _as_class_ids(predictions: Any) -> np.ndarray:
    """Class ids from ids [N] or from logits/probabilities [N, C]."""
    array = np.asarray(predictions)
    return array.argmax(axis=-1) if array.ndim == 2 else array.astype(np.int64)


def _as_values(values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array.reshape(-1) if array.ndim == 2 and array.shape[1] == 1 else array


def _check_lengths(predictions: np.ndarray, labels: np.ndarray) -> None:
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels")
    if len(labels) == 0:
        raise ValueError("no examples to compute metrics on")


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator / denominator) if denominator else 0.0


def confusion_matrix(predictions: Any, labels: Any, num_classes: int | None = None) -> np.ndarray:
    """counts[true class, predicted class]."""
    predicted, true = _as_class_ids(predictions), np.asarray(labels, dtype=np.int64)
    _check_lengths(predicted, true)
    size = num_classes if num_classes is not None else int(max(predicted.max(), true.max())) + 1
    counts = np.zeros((size, size), dtype=np.int64)
    np.add.at(counts, (true, predicted), 1)
    return counts


def accuracy(predictions: Any, labels: Any) -> float:
    predicted, true = _as_class_ids(predictions), np.asarray(labels, dtype=np.int64)
    _check_lengths(predicted, true)
    return float(np.mean(predicted == true))


def _per_class_f1(matrix: np.ndarray) -> np.ndarray:
    true_positives = np.diag(matrix).astype(np.float64)
    predicted = matrix.sum(axis=0)
    actual = matrix.sum(axis=1)
    denominator = predicted + actual  # F1 = 2TP / (2TP + FP + FN) = 2TP / (predicted + actual)
    return np.divide(2 * true_positives, denominator, out=np.zeros_like(true_positives), where=denominator > 0)


def f1_macro(predictions: Any, labels: Any) -> float:
    """Unweighted mean of per-class F1 over the classes present in the labels or the predictions."""
    matrix = confusion_matrix(predictions, labels)
    present = (matrix.sum(axis=0) + matrix.sum(axis=1)) > 0
    return float(_per_class_f1(matrix)[present].mean())


def f1_binary(predictions: Any, labels: Any, positive: int = 1) -> float:
    """F1 of the positive class (GLUE's MRPC and QQP F1 use class 1)."""
    predicted, true = _as_class_ids(predictions), np.asarray(labels, dtype=np.int64)
    _check_lengths(predicted, true)
    true_positives = int(np.sum((predicted == positive) & (true == positive)))
    return _ratio(2 * true_positives, int(np.sum(predicted == positive)) + int(np.sum(true == positive)))


def matthews_correlation(predictions: Any, labels: Any) -> float:
    """Matthews correlation, Gorodkin's multi-class R_K (equals the binary MCC for two classes)."""
    matrix = confusion_matrix(predictions, labels).astype(np.float64)
    total = matrix.sum()
    correct = np.trace(matrix)
    predicted = matrix.sum(axis=0)
    actual = matrix.sum(axis=1)
    covariance = correct * total - predicted @ actual
    denominator = math.sqrt((total**2 - predicted @ predicted) * (total**2 - actual @ actual))
    return _ratio(covariance, denominator)


def pearson(predictions: Any, labels: Any) -> float:
    from scipy.stats import pearsonr

    x, y = _as_values(predictions), _as_values(labels)
    _check_lengths(x, y)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0  # undefined for a constant input: no linear relation can be measured
    return float(pearsonr(x, y).statistic)


def spearman(predictions: Any, labels: Any) -> float:
    from scipy.stats import spearmanr

    x, y = _as_values(predictions), _as_values(labels)
    _check_lengths(x, y)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return 0.0
    return float(spearmanr(x, y).statistic)


def mean_squared_error(predictions: Any, labels: Any) -> float:
    x, y = _as_values(predictions), _as_values(labels)
    _check_lengths(x, y)
    return float(np.mean((x - y) ** 2))


def compute_metrics(task_type: str, predictions: Any, labels: Any,
                    label_names: Sequence[str] = ()) -> dict[str, float]:
    """All metrics of a task type: classification takes ids or logits, regression takes values.

    Classification: accuracy, f1_macro, matthews, and f1 (of class 1) when there are two classes.
    Regression: pearson, spearman, mse.
    """
    if task_type == "regression":
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels),
                "mse": mean_squared_error(predictions, labels)}
    if task_type != "classification":
        raise ValueError(f"unknown task type {task_type!r}")
    metrics = {"accuracy": accuracy(predictions, labels), "f1_macro": f1_macro(predictions, labels),
               "matthews": matthews_correlation(predictions, labels)}
    if len(label_names) == 2:
        metrics["f1"] = f1_binary(predictions, labels)
    return metrics


def metric_names(task_type: str, num_labels: int) -> set[str]:
    """The keys `compute_metrics` returns for a task, known before any evaluation (to check train.best_metric)."""
    if task_type == "regression":
        return {"pearson", "spearman", "mse"}
    return {"accuracy", "f1_macro", "matthews"} | ({"f1"} if num_labels == 2 else set())


def best_mode(metric: str) -> str:
    """"max" or "min": the direction in which `metric` improves (for best checkpoints and early stopping)."""
    return "min" if metric in LOWER_IS_BETTER or metric.endswith("loss") else "max"


# ---------------------------------------------------------------------------------------------
# per-class report and confusion matrix


@dataclass(frozen=True)
class ClassReport:
    """Precision, recall and F1 of one class; support = its number of true examples."""

    name: str
    precision: float
    recall: float
    f1: float
    support: int


def per_class_report(predictions: Any, labels: Any, label_names: Sequence[str]) -> list[ClassReport]:
    matrix = confusion_matrix(predictions, labels, num_classes=len(label_names))
    f1 = _per_class_f1(matrix)
    reports = []
    for index, name in enumerate(label_names):
        true_positives = int(matrix[index, index])
        reports.append(ClassReport(name, _ratio(true_positives, int(matrix[:, index].sum())),
                                   _ratio(true_positives, int(matrix[index].sum())), float(f1[index]),
                                   int(matrix[index].sum())))
    return reports


@dataclass(frozen=True)
class GroupReport:
    """Accuracy on the rows of one group (a language, a source), beside the constant answer's: its most
    frequent true class in these rows and the accuracy of always giving it, the score to beat."""

    name: str
    examples: int
    accuracy: float
    majority_class: str
    majority_accuracy: float


def group_report(name: str, predictions: np.ndarray, labels: np.ndarray, label_names: Sequence[str]) -> GroupReport:
    counts = np.bincount(labels, minlength=len(label_names))
    majority = int(counts.argmax())  # ties go to the first class in label order
    return GroupReport(name, len(labels), accuracy(predictions, labels), label_names[majority],
                       _ratio(int(counts[majority]), len(labels)))


def per_group_report(predictions: Any, labels: Any, groups: Sequence[str],
                     label_names: Sequence[str]) -> list[GroupReport]:
    """One `GroupReport` per group, in sorted order, then `all` for every row together."""
    predicted, true = _as_class_ids(predictions), _as_values(labels).astype(np.int64)
    _check_lengths(predicted, true)
    if len(groups) != len(true):
        raise ValueError(f"{len(groups)} groups for {len(true)} labels")
    names = np.asarray(groups, dtype=object)
    reports = [group_report(name, predicted[names == name], true[names == name], label_names)
               for name in sorted(set(groups))]
    return [*reports, group_report("all", predicted, true, label_names)]


def per_group_table(reports: Sequence[GroupReport], column: str, title: str) -> Table:
    table = Table(title=title)
    for header in (column, "examples", "accuracy", "majority class", "majority accuracy"):
        table.add_column(header, justify="left" if header in (column, "majority class") else "right")
    for r in reports:
        table.add_row(r.name, f"{r.examples:,}", f"{r.accuracy:.4f}", r.majority_class, f"{r.majority_accuracy:.4f}")
    return table


def per_class_table(reports: Sequence[ClassReport], title: str = "per-class metrics") -> Table:
    table = Table(title=title)
    table.add_column("class")
    for column in ("precision", "recall", "f1", "support"):
        table.add_column(column, justify="right")
    for report in reports:
        table.add_row(report.name, f"{report.precision:.3f}", f"{report.recall:.3f}", f"{report.f1:.3f}",
                      f"{report.support:,}")
    return table


def confusion_table(matrix: np.ndarray, label_names: Sequence[str], title: str = "confusion matrix") -> Table:
    """Rows are true classes, columns predicted classes; the diagonal (correct) is bold."""
    table = Table(title=title, caption="rows: true class · columns: predicted class")
    table.add_column("true \\ predicted")
    for name in label_names:
        table.add_column(name, justify="right")
    for row, name in enumerate(label_names):
        cells = [f"[bold]{count}[/]" if column == row else str(count) for column, count in enumerate(matrix[row])]
        table.add_row(name, *cells)
    return table


# a matrix this small gets its counts written in the cells; a larger one would be a wall of numbers (and 2,025 text
# artists at 45 classes): its counts are in the report and the results JSON
COUNTS_IN_CELLS_UP_TO = 12
CONFUSION_DPI = 120


def save_confusion_matrix_png(matrix: np.ndarray, label_names: Sequence[str], path: str | Path,
                              title: str = "confusion matrix") -> Path:
    """A heat map, normalised per true class so rare classes stay readable; counts in small matrices."""
    figure = confusion_matrix_figure(matrix, label_names, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    try:
        figure.savefig(partial, format="png")
        os.replace(partial, path)  # never leave a half-written PNG under the final name
    finally:
        partial.unlink(missing_ok=True)
    return path


def confusion_matrix_figure(matrix: np.ndarray, label_names: Sequence[str], title: str) -> Any:
    """The heat map `save_confusion_matrix_png` writes, as a matplotlib Figure."""
    # a bare Figure renders with Agg and leaves pyplot's global backend and figure list alone
    from matplotlib.figure import Figure

    counts = np.asarray(matrix, dtype=np.float64)
    rows = counts.sum(axis=1, keepdims=True)
    normalised = np.divide(counts, rows, out=np.zeros_like(counts), where=rows > 0)
    label_size = 7 if len(label_names) > COUNTS_IN_CELLS_UP_TO else 9
    size, margins = _confusion_layout(label_names, label_size)
    figure = Figure(figsize=size, dpi=CONFUSION_DPI)
    figure.subplots_adjust(**margins)
    axes = figure.subplots()
    image = axes.imshow(normalised, cmap="Blues", vmin=0.0, vmax=1.0)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04, label="fraction of the true class")
    ticks = np.arange(len(label_names))
    axes.set_xticks(ticks, labels=label_names, rotation=90, fontsize=label_size)
    axes.set_yticks(ticks, labels=label_names, fontsize=label_size)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    axes.set_title(title)
    if len(label_names) <= COUNTS_IN_CELLS_UP_TO:
        for (row, column), count in np.ndenumerate(matrix):
            axes.text(column, row, str(count), ha="center", va="center",
                      color="white" if normalised[row, column] > 0.5 else "black", fontsize=8)
    return figure


def _confusion_layout(label_names: Sequence[str],
                      label_size: float) -> tuple[tuple[float, float], dict[str, float]]:
    """(figure width and height in inches, the margins as figure fractions): a square of cells 0.32 in a class
    (at least 2.4 in), with room around it for the class names, axis labels, title and colour bar.

    The room is measured from the names' own widths (font metrics, nothing drawn): `tight_layout` finds it by
    laying out every artist once more before `savefig` draws them, a third of the CPU a 45-class matrix takes."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    inch = 72.0  # points
    axis_label = 10 * 1.2 + 4 + 3.5 + 3.5 + 8  # rcParams' 10 pt axis label line, its pad, tick pad and length, room
    title = 12 * 1.2 + 6 + 8  # the 12 pt title line, its pad, room
    colour_bar = 10 * 1.2 + 4 + 3 * 10 * 0.6 + 3.5 + 3.5 + 8  # its label, pad, "0.8"-wide tick labels, ticks, room
    font = FontProperties(size=label_size)
    widest = max(TextToPath().get_text_width_height_descent(str(name), font, ismath=False)[0] for name in label_names)
    names = (widest + axis_label) / inch
    cells = max(2.4, 0.32 * len(label_names))
    # the colour bar takes 0.046 + 0.04 (its width, its pad) of the axes' width beside the square of cells
    width, height = names + cells * 1.1 + colour_bar / inch, names + cells + title / inch
    return (width, height), {"left": names / width, "bottom": names / height, "right": 1.0 - colour_bar / inch / width,
                             "top": 1.0 - title / inch / height}
