"""Sequence classification and regression (one text or a pair): the `classification` kind's record."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.data.labeled import collate_unpadded
from bertforge.data.labels import load_labeled_data
from bertforge.errors import BertforgeError
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.tasks.kinds.kind import TaskKind

if TYPE_CHECKING:
    import torch
    from torch import nn

    from bertforge.config import Config, FinetuneSection
    from bertforge.data.labels import LabeledSplit
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions
    from bertforge.tasks.evaluation import EvaluationReport
    from bertforge.train.task import Task


def task(config: Config) -> Task:
    from bertforge.tasks.classify import ClassificationTask

    return ClassificationTask(config)


def metric_names(section: FinetuneSection, data: Any) -> set[str]:
    from bertforge.tasks.metrics import metric_names as names

    return names(data.task_type, data.num_labels) | {"loss"}


def evaluate(loaded: LoadedModel, args: argparse.Namespace) -> EvaluationReport:
    from bertforge.engine import settings_of
    from bertforge.tasks.classify import evaluate_file

    if Path(args.data).suffix == ".txt":
        raise BertforgeError(f"{args.data}: a .txt file holds texts without labels; evaluate a csv/tsv/jsonl/"
                             "parquet file with a label column (--label-column), or get the model's predictions "
                             f"with `bertforge predict {args.model} --input {args.data}`")
    label_map = loaded.run_settings.classification.label_map if loaded.run_settings is not None else None
    return evaluate_file(loaded, args.data, split=args.split_name, text_column=args.text_column,
                         text_pair_column=args.text_pair_column, label_column=args.label_column,
                         label_map=label_map, delimiter=args.delimiter,
                         settings=settings_of(args, "evaluating"))


def predict(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings) -> Predictions:
    from bertforge.tasks.classify import prediction_rows

    return prediction_rows(loaded, split, settings)


def model_of(loaded: LoadedModel) -> nn.Module | None:
    return loaded.model if type(loaded.model) is BertforgeForSequenceClassification else None


def export(model: nn.Module, tokenizer_dir: Path | None, out_dir: Path, max_length: int) -> Any:
    """A stock `*ForSequenceClassification` with the label names: `transformers.pipeline` runs it as is."""
    from bertforge.models.hf import export_hf

    return export_hf(model, tokenizer_dir, out_dir)  # type: ignore[arg-type]


def for_onnx(model: nn.Module) -> tuple[nn.Module, str | None]:
    return model, None


def from_onnx(model: nn.Module, logits: torch.Tensor, batch: dict[str, Any]) -> Any:
    """The graph's [sequences, outputs] logits are the forward's."""
    from bertforge.models.classification import SequenceClassifierOutput

    return SequenceClassifierOutput(logits)


KIND = TaskKind(
    name="classification", task_types=("classification", "regression"), settings="classification",
    serve_routes=("/predict",), pair_routes=("/rerank",),  # /rerank: a model fine-tuned on pairs scores (query, text)
    shared_keys=frozenset({"text_column", "text_pair_column", "label_column", "labels", "delimiter"}),
    model_class=BertforgeForSequenceClassification, task=task, read=load_labeled_data, collate=collate_unpadded,
    metric_names=metric_names, evaluate=evaluate, predict=predict, model_of=model_of, export=export, for_onnx=for_onnx,
    from_onnx=from_onnx)
