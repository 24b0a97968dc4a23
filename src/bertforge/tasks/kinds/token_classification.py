"""Token classification (NER-style tagging, one tag per word): the `token_classification` kind's record."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from bertforge.data.aligned import collate_tagged
from bertforge.data.tagged import load_tagged_data
from bertforge.errors import BertforgeError
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.tasks.kinds import classification
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
    from bertforge.tasks.tagging import TokenClassificationTask

    return TokenClassificationTask(config)


def metric_names(section: FinetuneSection, data: Any) -> set[str]:
    from bertforge.tasks.entity_metrics import ENTITY_METRICS

    return set(ENTITY_METRICS) | {"loss"}


def evaluate(loaded: LoadedModel, args: argparse.Namespace) -> EvaluationReport:
    """seqeval's entity-level precision/recall/F1, word accuracy and the per-type table."""
    from bertforge.engine import settings_of
    from bertforge.tasks.tagging import evaluate_tagged_file

    return evaluate_tagged_file(loaded, args.data, split=args.split_name, tokens_column=args.tokens_column,
                                tags_column=args.tags_column, settings=settings_of(args, "evaluating"))


def predict(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings) -> Predictions:
    """Entities with their character spans and scores per text."""
    from bertforge.tasks.tagging import entity_rows

    if split.text_pairs is not None:
        raise BertforgeError(f"{loaded.name} tags single texts; drop --text-pair-column / --text-pair")
    return entity_rows(loaded, split.texts, settings)


def model_of(loaded: LoadedModel) -> nn.Module | None:
    return loaded.model if type(loaded.model) is BertforgeForTokenClassification else None


def from_onnx(model: nn.Module, logits: torch.Tensor, batch: dict[str, Any]) -> Any:
    """The graph tags every token; the forward returns those of the batch's `rows` (each word's first piece,
    `collate_tagged`)."""
    from bertforge.models.token_classification import TokenClassifierOutput

    return TokenClassifierOutput(logits[batch["rows"]])


KIND = TaskKind(
    name="token_classification", task_types=("token_classification",), settings="tagging", serve_routes=("/tag",),
    shared_keys=frozenset({"labels"}), model_class=BertforgeForTokenClassification, task=task, read=load_tagged_data,
    collate=collate_tagged, metric_names=metric_names, evaluate=evaluate, predict=predict, model_of=model_of,
    export=classification.export, for_onnx=classification.for_onnx,
    from_onnx=from_onnx)  # a stock *ForTokenClassification
