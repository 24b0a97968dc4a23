"""Inference with a trained model: predict, evaluate, fill-mask — batched and unpadded.

The same unpadded path as training: examples are tokenized once (`LabeledDataset`), batched by
`collate_unpadded` and run through the packed encoder, so a batch of short texts costs its real
tokens only. Any `MODEL` shape `bertforge.locate` understands works (run directory, final/,
checkpoint, bertforge or Hugging Face directory). The evaluation report (metrics, per-class
precision/recall, confusion matrix as markdown and PNG) is shared by `bertforge evaluate` and the
fine-tuning task's final test evaluation, so both write the same files.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.batch import model_inputs
from bertforge.console import log
from bertforge.data.labeled import (
    Columns,
    LabeledDataset,
    LabeledSplit,
    LabelSet,
    collate_unpadded,
    read_labeled_split,
)
from bertforge.errors import BertforgeError, first_line
from bertforge.locate import ModelLocation, resolve_model, tokenizer_dir_for
from bertforge.models.serialization import CORRUPT_FILE_MARKS, DAMAGED_WEIGHTS_ERRORS
from bertforge.tasks.metrics import (
    ClassReport,
    compute_metrics,
    confusion_matrix,
    per_class_report,
    save_confusion_matrix_png,
)
from bertforge.train.map_style import iterate_once

DEFAULT_MAX_LENGTH = 512
DEFAULT_BATCH_SIZE = 64


# ---------------------------------------------------------------------------------------------
# loading


def quiet_transformers() -> None:
    """For the CLI: no `transformers` progress bars ("Loading weights", "Writing model shards") among ours."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


@dataclass
class LoadedModel:
    model: nn.Module  # a bertforge model in eval mode
    location: ModelLocation
    tokenizer_dir: Path | None
    max_length: int  # tokens per example: the fine-tuning run's finetune.max_length, else the model's limit

    @property
    def name(self) -> str:
        return str(self.location.path)

    def tokenizer(self) -> Path:
        if self.tokenizer_dir is None:
            raise BertforgeError(f"no tokenizer found for {self.name}: it has no tokenizer.json/vocab.txt and no run "
                                 "directory naming one; copy the tokenizer files into the model directory")
        return self.tokenizer_dir

    def classifier(self) -> nn.Module:
        from bertforge.models import BertforgeForSequenceClassification

        if not isinstance(self.model, BertforgeForSequenceClassification):
            raise BertforgeError(f"{self.name} is a {type(self.model).__name__} without a classification head; "
                                 "fine-tune it first (`bertforge finetune`) and use the fine-tuned model")
        return self.model


def load_model(reference: str | Path) -> LoadedModel:
    """Load any model `bertforge.locate` understands, on the CPU, in eval mode."""
    from bertforge.models.loading import load_model_directory

    location = resolve_model(reference)
    try:
        model = load_model_directory(location.path)
    except DAMAGED_WEIGHTS_ERRORS as error:
        if isinstance(error, RuntimeError | ValueError) and not any(
                mark in str(error) for mark in CORRUPT_FILE_MARKS):
            raise  # not a damaged file: a bug to report, not the user's to fix
        raise BertforgeError(f"{location.path}: the model's weights cannot be read ({first_line(error)}); the file is "
                             "truncated or corrupt: copy or export the model again") from None
    model.eval()
    limit = model.config.max_position_embeddings if model.config.position == "learned" else DEFAULT_MAX_LENGTH
    max_length = min(DEFAULT_MAX_LENGTH, limit)
    if location.run_dir is not None:
        from bertforge.config import load_run_config

        max_length = min(load_run_config(location.run_dir / "config.yaml").finetune.max_length, limit)
    return LoadedModel(model, location, tokenizer_dir_for(location), max_length)


# ---------------------------------------------------------------------------------------------
# running the model


def batches_of(dataset: LabeledDataset, batch_size: int) -> Iterable[dict[str, Any]]:
    return iterate_once(dataset, collate_unpadded, batch_size)


@torch.no_grad()
def outputs_of(model: nn.Module, batches: Iterable[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [examples, outputs] of a classifier over the batches, and the labels when the batches have them."""
    logits: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    device = next(model.parameters()).device
    for batch in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in model_inputs(batch).items()}
        logits.append(model(**inputs).logits.float().cpu())
        if "labels" in batch:
            labels.append(batch["labels"])
    return torch.cat(logits), (torch.cat(labels) if labels else None)


def classification_loss(task_type: str, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean cross-entropy, or mean squared error for regression (what the training loss measures)."""
    if task_type == "regression":
        return float((logits.squeeze(-1) - labels.float()).pow(2).mean())
    return float(nn.functional.cross_entropy(logits, labels))


# ---------------------------------------------------------------------------------------------
# predict


def read_inputs(source: str | Path, *, text_column: str = "text", text_pair_column: str | None = None,
                delimiter: str | None = None) -> LabeledSplit:
    """Texts to predict on, from any file `bertforge.data.labeled` reads (labels, if any, are ignored)."""
    from bertforge.locate import resolve_data_file

    return read_labeled_split(resolve_data_file(str(source)) or str(source), with_labels=False,
                              columns=Columns(text_column, text_pair_column), delimiter=delimiter, split="input",
                              cli_flags=True)  # predict's options: errors name --text-column, not finetune.*


def prediction_rows(loaded: LoadedModel, split: LabeledSplit, batch_size: int = DEFAULT_BATCH_SIZE) -> list[dict[str, Any]]:
    """One dict per input text: the label and its probability, all probabilities (or the regression value)."""
    classifier = loaded.classifier()
    dataset = LabeledDataset(split, loaded.tokenizer(), loaded.max_length)
    logits, _ = outputs_of(classifier, batches_of(dataset, batch_size))
    rows: list[dict[str, Any]] = []
    names = classifier.label_names or [f"LABEL_{i}" for i in range(classifier.num_labels)]
    probabilities = torch.softmax(logits, dim=-1) if classifier.problem_type == "classification" else None
    for index, text in enumerate(split.texts):
        row: dict[str, Any] = {"text": text}
        if split.text_pairs is not None:
            row["text_pair"] = split.text_pairs[index]
        if probabilities is None:
            row["score"] = float(logits[index, 0])
        else:
            best = int(probabilities[index].argmax())
            row["label"] = names[best]
            row["label_id"] = best
            row["score"] = float(probabilities[index, best])
            row["probabilities"] = {name: float(p) for name, p in zip(names, probabilities[index], strict=True)}
        rows.append(row)
    return rows


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines under a temporary name, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------------------------
# evaluate


@dataclass
class EvaluationReport:
    split: str  # a name for the data: test, validation, dev_matched, ...
    source: str  # the file it came from
    task_type: str
    label_names: list[str]
    metrics: dict[str, float]
    per_class: list[ClassReport]  # empty for regression
    confusion: np.ndarray | None  # counts[true, predicted]; None for regression

    def to_json(self) -> dict[str, Any]:
        return {"split": self.split, "source": self.source, "task_type": self.task_type,
                "label_names": self.label_names, "metrics": self.metrics,
                "per_class": [asdict(report) for report in self.per_class],
                "confusion_matrix": self.confusion.tolist() if self.confusion is not None else None}


def evaluate_dataset(model: nn.Module, dataset: LabeledDataset, split: str, batch_size: int = DEFAULT_BATCH_SIZE,
                     ) -> EvaluationReport:
    """Metrics of `model` on a labeled dataset (`compute_metrics` + loss), per-class report, confusion matrix."""
    logits, labels = outputs_of(model, batches_of(dataset, batch_size))
    if labels is None:
        raise BertforgeError(f"{dataset.source} was read without labels; it cannot be evaluated")
    task_type = dataset.task_type
    if task_type == "regression":
        predictions = logits.squeeze(-1).numpy()
    else:
        predictions = logits.numpy()
    metrics = compute_metrics(task_type, predictions, labels.numpy(), dataset.label_names)
    metrics["loss"] = classification_loss(task_type, logits, labels)
    metrics["examples"] = float(len(dataset))
    if task_type == "regression":
        return EvaluationReport(split, dataset.source, task_type, [], metrics, [], None)
    names = dataset.label_names
    return EvaluationReport(split, dataset.source, task_type, names, metrics,
                            per_class_report(predictions, labels.numpy(), names),
                            confusion_matrix(predictions, labels.numpy(), num_classes=len(names)))


def evaluate_file(loaded: LoadedModel, data: str | Path, *, split: str = "evaluation", text_column: str = "text",
                  text_pair_column: str | None = None, label_column: str = "label",
                  label_map: dict[str, str] | None = None, delimiter: str | None = None,
                  batch_size: int = DEFAULT_BATCH_SIZE) -> EvaluationReport:
    """Read a labeled file against the model's own labels (an unknown label is an error naming its line)."""
    from bertforge.locate import resolve_data_file

    classifier = loaded.classifier()
    task_type = classifier.problem_type
    labels = None
    if task_type == "classification":
        names = classifier.label_names or [str(i) for i in range(classifier.num_labels)]
        labels = LabelSet(names, origin=f"the model's labels ({loaded.name})")
    labeled = read_labeled_split(resolve_data_file(str(data)) or str(data), task_type=task_type, labels=labels,
                                 columns=Columns(text_column, text_pair_column, label_column), label_map=label_map,
                                 delimiter=delimiter, split=split, cli_flags=True)
    dataset = LabeledDataset(labeled, loaded.tokenizer(), loaded.max_length)
    return evaluate_dataset(classifier, dataset, split, batch_size)


def report_markdown(report: EvaluationReport) -> str:
    """Metrics, per-class precision/recall/F1 and the confusion matrix as one markdown document."""
    lines = [f"# {report.split} evaluation", "", f"Data: `{report.source}`", "", "| metric | value |", "|---|---:|"]
    lines += [f"| {name} | {value:.4f} |" if name != "examples" else f"| examples | {int(value):,} |"
              for name, value in report.metrics.items()]
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


def write_evaluation(report: EvaluationReport, directory: str | Path) -> list[Path]:
    """`<split>_results.json`, `<split>_report.md` and (classification) `<split>_confusion_matrix.png`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in ((f"{report.split}_results.json", json.dumps(report.to_json(), indent=2) + "\n"),
                       (f"{report.split}_report.md", report_markdown(report))):
        partial = directory / f".{name}.partial"
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, directory / name)
        written.append(directory / name)
    if report.confusion is not None:
        written.append(save_confusion_matrix_png(report.confusion, report.label_names,
                                                 directory / f"{report.split}_confusion_matrix.png",
                                                 title=f"{report.split} confusion matrix"))
    return written


def metrics_line(metrics: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "examples")


# ---------------------------------------------------------------------------------------------
# fill-mask


@dataclass(frozen=True)
class MaskPrediction:
    """One candidate for one [MASK], shaped like a `transformers` fill-mask pipeline result."""

    score: float
    token: int
    token_str: str
    sequence: str


@torch.no_grad()
def fill_mask(loaded: LoadedModel, text: str, top_k: int = 5) -> list[list[MaskPrediction]]:
    """The `top_k` most likely tokens for each [MASK] in `text` (one list per mask, left to right)."""
    from bertforge.data.labeled import bert_tokenizer
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.models import BertforgeForPreTraining

    model = loaded.model
    if not isinstance(model, BertforgeForPreTraining):
        raise BertforgeError(f"{loaded.name} is a {type(model).__name__} without a masked-language-model head; "
                             "fill-mask needs a pre-trained model (a `bertforge pretrain` run or an HF *ForMaskedLM)")
    if top_k < 1:
        raise BertforgeError(f"--top-k is {top_k}; give at least 1")
    special = load_tokenizer(loaded.tokenizer())
    tokenizer = bert_tokenizer(loaded.tokenizer(), loaded.max_length)
    mask_token = special.special_tokens["mask"]
    encoding = tokenizer.encode(text)
    ids = torch.tensor(encoding.ids, dtype=torch.long)
    masked_positions = (ids == special.mask_id).nonzero().flatten()
    written = text.count(mask_token)
    if written > masked_positions.numel():  # truncation to the model's length cut them off
        cut = written - masked_positions.numel()
        message = (f"{cut} of the {written} {mask_token} tokens lie beyond the model's limit of {loaded.max_length} "
                   "tokens and were cut off; shorten the text before them")
        if masked_positions.numel() == 0:
            raise BertforgeError(message)
        log.warning(message)
    if masked_positions.numel() == 0:
        raise BertforgeError(f"the text has no {mask_token} token to fill; write e.g. \"the {mask_token} of the law\"")
    output = model(input_ids=ids, token_type_ids=torch.tensor(encoding.type_ids, dtype=torch.long),
                   masked_positions=masked_positions)
    probabilities = torch.softmax(output.mlm_logits.float(), dim=-1)
    k = min(top_k, probabilities.shape[-1])
    results = []
    for row, position in enumerate(masked_positions.tolist()):
        scores, candidates = probabilities[row].topk(k)
        predictions = []
        for score, token in zip(scores.tolist(), candidates.tolist(), strict=True):
            filled = ids.clone()
            filled[position] = token
            sequence = tokenizer.decode(filled.tolist(), skip_special_tokens=masked_positions.numel() == 1)
            token_str = tokenizer.decode([token], skip_special_tokens=False)
            predictions.append(MaskPrediction(score, token, token_str, sequence))
        results.append(predictions)
    return results
