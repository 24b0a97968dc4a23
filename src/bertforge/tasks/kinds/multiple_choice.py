"""Multiple choice (a context and N candidate answers, one right): the `multiple_choice` kind's record."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.tasks.kinds import classification
from bertforge.tasks.kinds.kind import TaskKind
from bertforge.tasks.multiple_choice import (
    METRICS,
    BertforgeForMultipleChoice,
    MultipleChoiceTask,
    collate_choices,
    load_choice_data,
)

if TYPE_CHECKING:
    from torch import nn

    from bertforge.config import Config, FinetuneSection
    from bertforge.data.labels import LabeledSplit
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions
    from bertforge.tasks.evaluation import EvaluationReport
    from bertforge.train.task import Task


def task(config: Config) -> Task:
    return MultipleChoiceTask(config)


def metric_names(section: FinetuneSection, data: Any) -> set[str]:
    return set(METRICS)


def _choice_columns(loaded: LoadedModel) -> list[str]:
    """The run's finetune.multiple_choice.choice_columns, else the default `choices` list column."""
    from bertforge.config import FinetuneSection

    return list((loaded.run_settings or FinetuneSection()).multiple_choice.choice_columns)


def evaluate(loaded: LoadedModel, args: argparse.Namespace) -> EvaluationReport:
    """Accuracy (and mean cross-entropy) of the right choice over a labeled file."""
    from bertforge.engine import settings_of
    from bertforge.locate import resolve_data_file
    from bertforge.tasks.multiple_choice import evaluate_choice_split, read_choice_split

    split = read_choice_split(resolve_data_file(str(args.data)) or str(args.data), context_column=args.text_column,
                              choice_columns=_choice_columns(loaded), label_column=args.label_column,
                              delimiter=args.delimiter, split=args.split_name, cli_flags=True)
    return evaluate_choice_split(loaded.model, split, loaded.tokenizer(), loaded.max_length, args.split_name,
                                 settings_of(args, "evaluating"))


def predict(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings) -> Predictions:
    """The chosen candidate per question. The command's reader gives the contexts; their candidates are read from
    the same file's rows."""
    from bertforge.locate import resolve_data_file
    from bertforge.tasks.multiple_choice import choice_rows, with_choices

    path = resolve_data_file(split.source) or split.source
    if split.text_pairs is not None or not Path(path).is_file():
        raise BertforgeError(f"{loaded.name} is a multiple-choice model: give --input FILE with the context column and "
                             f"the candidate answers ({', '.join(_choice_columns(loaded))}); --text and --text-pair "
                             "cannot hold them")
    choices = with_choices(path, split.texts, _choice_columns(loaded))
    return choice_rows(loaded.model, choices, loaded.tokenizer(), loaded.max_length, settings)


def model_of(loaded: LoadedModel) -> nn.Module | None:
    return loaded.model if type(loaded.model) is BertforgeForMultipleChoice else None


def for_onnx(model: nn.Module) -> tuple[nn.Module, str | None]:
    raise BertforgeError("ONNX export of a multiple-choice model is not supported (its inputs are [questions, "
                         "choices, tokens]); export it with --format hf (a BertForMultipleChoice)")


KIND = TaskKind(
    name="multiple_choice", task_types=("multiple_choice",), settings="multiple_choice",
    serve_routes=(),  # its inputs (a context and its candidates) have no route: bertforge serve refuses it
    shared_keys=frozenset({"text_column", "label_column", "delimiter"}), model_class=BertforgeForMultipleChoice,
    task=task, read=load_choice_data, collate=collate_choices, metric_names=metric_names, evaluate=evaluate,
    predict=predict, model_of=model_of, export=classification.export, for_onnx=for_onnx,
    from_onnx=None)  # a stock *ForMultipleChoice
