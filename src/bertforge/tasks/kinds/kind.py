"""The record of one fine-tuning task kind: everything bertforge needs to know about it, in one place.

A command, the loader or the exporter looks a kind up (`bertforge.tasks.kinds`) and calls its
record's parts; none of them branches on a kind's name. Each part is a plain function in the
kind's own record module (`kinds/classification.py`, ...), so reading a kind is reading one file.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from bertforge.config import Config, FinetuneSection
    from bertforge.data.labels import LabeledSplit
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions
    from bertforge.tasks.evaluation import EvaluationReport
    from bertforge.train.task import Task


@dataclass(frozen=True)
class TaskKind:
    name: str  # the record's name
    task_types: tuple[str, ...]  # the finetune.task_type values it serves (classification: also regression)
    serve_routes: tuple[str, ...]  # the `bertforge serve` routes that answer with a model of this kind (bertforge.serving)
    settings: str | None  # its sub-section of `finetune:` (finetune.<settings>.*), None if it has none
    shared_keys: frozenset[str]  # the optional shared finetune.* keys it reads; setting another is an error
    model_class: type[nn.Module]  # its head: the model class a run of this kind trains
    task: Callable[[Config], Task]  # the fine-tuning Task
    read: Callable[[FinetuneSection], Any]  # the reader of finetune.train_file / validation_file / test_file
    collate: Callable[[list[dict[str, Any]]], dict[str, Any]]  # its examples -> one unpadded batch
    # what its evaluation reports (train.best_metric's choices), given the section and what `read` returned
    metric_names: Callable[[FinetuneSection, Any], set[str]]
    evaluate: Callable[[LoadedModel, argparse.Namespace], EvaluationReport]  # `bertforge evaluate MODEL --data FILE`
    # `bertforge predict`: one row per text, through the inference engine (bertforge.engine) run as the settings say
    predict: Callable[[LoadedModel, LabeledSplit, EngineSettings], Predictions]
    model_of: Callable[[LoadedModel], nn.Module | None]  # the model of this kind a loaded directory holds, or None
    export: Callable[[nn.Module, Path | None, Path, int], Any]  # final/ and `export --format hf`: the format its users load
    for_onnx: Callable[[nn.Module], tuple[nn.Module, str | None]]  # what `export --format onnx` traces, and a note
    # `--backend onnx`: what the model's forward returns, from its graph's output on an engine batch (the graph's
    # per-token outputs already unpadded to the batch's tokens) and the batch; None: the kind has no ONNX graph
    from_onnx: Callable[[nn.Module, torch.Tensor, dict[str, Any]], Any] | None
    # the `bertforge serve` routes only a model fine-tuned on text pairs answers (its run set finetune.text_pair_column)
    pair_routes: tuple[str, ...] = ()
