"""Evaluating a classifier: its outputs over unpadded batches, metrics, and the evaluation report.

The report (metrics, per-class precision/recall, confusion matrix as markdown and PNG) is written by
the fine-tuning task's final test evaluation and by `bertforge evaluate` (through
`bertforge.inference`), so both write the same files. Training code imports this module, never
`bertforge.inference`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.batch import model_inputs
from bertforge.data.labeled import LabeledDataset, collate_unpadded
from bertforge.device import batch_on_device, model_device
from bertforge.errors import BertforgeError
from bertforge.run_directory import evaluation_file_names
from bertforge.tasks.metrics import (
    ClassReport,
    GroupReport,
    compute_metrics,
    confusion_matrix,
    per_class_report,
    per_group_report,
    save_confusion_matrix_png,
)
from bertforge.train.map_style import iterate_once

DEFAULT_BATCH_SIZE = 64


def batches_of(dataset: LabeledDataset, batch_size: int) -> Iterable[dict[str, Any]]:
    return iterate_once(dataset, collate_unpadded, batch_size)


@torch.no_grad()
def outputs_of(model: nn.Module, batches: Iterable[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [examples, outputs] of a classifier over the batches, and the labels when the batches have them."""
    logits: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    device = model_device(model)
    for batch in batches:
        logits.append(model(**batch_on_device(model_inputs(batch), device)).logits.float().cpu())
        if "labels" in batch:
            labels.append(batch["labels"])
    return torch.cat(logits), (torch.cat(labels) if labels else None)


def classification_loss(task_type: str, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean cross-entropy, or mean squared error for regression (what the training loss measures)."""
    if task_type == "regression":
        return float((logits.squeeze(-1) - labels.float()).pow(2).mean())
    return float(nn.functional.cross_entropy(logits, labels))



@dataclass
class EvaluationReport:
    split: str  # a name for the data: test, validation, dev_matched, ...
    source: str  # the file it came from
    task_type: str
    label_names: list[str]
    metrics: dict[str, float]
    per_class: list[ClassReport]  # empty for regression
    confusion: np.ndarray | None  # counts[true, predicted]; None for regression
    subset: dict[str, Any] | None = None  # the validation rows that chose the checkpoint: ValidationSubset.describe()
    checkpoint: dict[str, Any] | None = None  # the weights scored, at the end of a run: Task.final_checkpoint
    group_column: str | None = None  # finetune.classification.group_column, when set
    per_group: list[GroupReport] | None = None  # accuracy and the majority class of each of its values, then `all`

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "source": self.source, "task_type": self.task_type,
                "label_names": self.label_names, "metrics": self.metrics,
                "per_class": [asdict(report) for report in self.per_class],
                "confusion_matrix": self.confusion.tolist() if self.confusion is not None else None} | (
                    {"subset": self.subset} if self.subset is not None else {}) | (
                    {"checkpoint": self.checkpoint} if self.checkpoint is not None else {}) | (
                    {"per_group": {"column": self.group_column, "groups": [asdict(r) for r in self.per_group]}}
                    if self.per_group is not None else {})


def evaluate_dataset(model: nn.Module, dataset: LabeledDataset, split: str, batch_size: int = DEFAULT_BATCH_SIZE,
                     ) -> EvaluationReport:
    """Metrics of `model` on a labeled dataset (`compute_metrics` + loss), per-class report, confusion matrix."""
    logits, labels = outputs_of(model, batches_of(dataset, batch_size))
    if labels is None:
        raise BertforgeError(f"{dataset.source} was read without labels; it cannot be evaluated")
    return report_of_logits(logits, labels, split, dataset.source, dataset.task_type, dataset.label_names,
                            dataset.groups, dataset.group_column)


def report_of_logits(logits: torch.Tensor, labels: torch.Tensor, split: str, source: str, task_type: str,
                     label_names: list[str], groups: list[str] | None = None,
                     group_column: str | None = None) -> EvaluationReport:
    """The report of a classifier's (or regressor's) logits [examples, outputs] against the labels."""
    if task_type == "regression":
        predictions = logits.squeeze(-1).numpy()
    else:
        predictions = logits.numpy()
    metrics = compute_metrics(task_type, predictions, labels.numpy(), label_names)
    metrics["loss"] = classification_loss(task_type, logits, labels)
    metrics["examples"] = float(len(labels))
    if task_type == "regression":
        return EvaluationReport(split, source, task_type, [], metrics, [], None)
    names = label_names
    per_group = (per_group_report(predictions, labels.numpy(), groups, names)
                 if groups is not None else None)
    return EvaluationReport(split, source, task_type, names, metrics,
                            per_class_report(predictions, labels.numpy(), names),
                            confusion_matrix(predictions, labels.numpy(), num_classes=len(names)),
                            group_column=group_column, per_group=per_group)


def report_markdown(report: EvaluationReport) -> str:
    """Metrics, per-class precision/recall/F1 and the confusion matrix as one markdown document."""
    lines = [f"# {report.split} evaluation", "", f"Data: `{report.source}`", ""]
    if report.checkpoint is not None:
        lines += [checkpoint_sentence(report.checkpoint), ""]
    if report.subset is not None:
        lines += [subset_sentence(report.subset), ""]
    lines += ["| metric | value |", "|---|---:|"]
    lines += [f"| {name} | {value:.4f} |" if name != "examples" else f"| examples | {int(value):,} |"
              for name, value in report.metrics.items()]
    if report.per_group is not None:
        lines += ["", f"## Per {report.group_column}", "",
                  "The majority class is the group's most frequent true class in this data; its accuracy is what "
                  "always answering it scores.", "",
                  f"| {report.group_column} | examples | accuracy | majority class | majority accuracy |",
                  "|---|---:|---:|---|---:|"]
        lines += [f"| {r.name} | {r.examples:,} | {r.accuracy:.4f} | {r.majority_class} | {r.majority_accuracy:.4f} |"
                  for r in report.per_group]
    if report.per_class:
        lines += ["", "## Per class", "", "| class | precision | recall | f1 | support |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {r.name} | {r.precision:.3f} | {r.recall:.3f} | {r.f1:.3f} | {r.support:,} |"
                  for r in report.per_class]
    if report.confusion is not None:
        names = report.label_names
        lines += ["", "## Confusion matrix", "", "Rows: true class · columns: predicted class.", "",
                  "| true \\ predicted | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines += [f"| {name} | " + " | ".join(str(c) for c in report.confusion[row]) + " |"
                  for row, name in enumerate(names)]
    return "\n".join(lines) + "\n"


def checkpoint_sentence(checkpoint: dict[str, Any]) -> str:
    """Which weights a report scored (`Task.final_checkpoint`), in words."""
    which = checkpoint["which"]
    if which == "best":
        return (f"Scored with the best checkpoint, step {checkpoint['step']:,} ({checkpoint['best_metric']} "
                f"{checkpoint['best_value']:.4f} on validation).")
    if which == "ema":
        return f"Scored with the moving average of the weights at step {checkpoint['step']:,} (train.ema)."
    if which == "average_of_checkpoints":
        return f"Scored with the mean weights of {', '.join(checkpoint['checkpoints'])} (train.average_last_k)."
    return f"Scored with the last weights, step {checkpoint['step']:,}."


def subset_sentence(subset: dict[str, Any]) -> str:
    """What the evaluations during training scored (`ValidationSubset.describe()`), in words."""
    if subset["rows"] == subset["of"]:
        rows = f"all {subset['of']:,} rows"
    else:
        how = f" stratified by {subset['stratified_by']}" if subset["stratified_by"] else ""
        rows = (f"{subset['rows']:,} of its {subset['of']:,} rows, a seeded sample{how} (data.validation_samples, "
                f"seed {subset['seed']})")
    return f"The evaluations during training scored {rows}; they chose this checkpoint."


def write_evaluation(report: EvaluationReport, directory: str | Path, picture: bool = True) -> list[Path]:
    """`<split>_results.json`, `<split>_report.md` and (classification, when `picture`) `<split>_confusion_matrix.png`
    (the matrix itself is in both other files)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    results_name, report_name, confusion_name = evaluation_file_names(report.split)
    for name, text in ((results_name, json.dumps(report.to_json(), indent=2) + "\n"),
                       (report_name, report_markdown(report))):
        partial = directory / f".{name}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, directory / name)
        written.append(directory / name)
    if report.confusion is not None and picture:
        written.append(save_confusion_matrix_png(report.confusion, report.label_names,
                                                 directory / confusion_name,
                                                 title=f"{report.split} confusion matrix"))
    return written


def metrics_line(metrics: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "examples")
