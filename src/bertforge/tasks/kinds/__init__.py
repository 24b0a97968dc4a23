"""The fine-tuning task kinds bertforge knows, one record each (`kinds/kind.py: TaskKind`).

`finetune`, `evaluate`, `predict`, `export` and the final evaluation of a run look a kind up here,
by `finetune.task_type` or by the model a directory holds; adding a kind is one record module
(its parts: settings, reader, collate, head, Task, metrics, outputs, export) plus its line below.
"""

from __future__ import annotations

from typing import Any

from bertforge.errors import ConfigError
from bertforge.tasks.kinds import classification, embedding, multiple_choice, token_classification
from bertforge.tasks.kinds.kind import TaskKind

KINDS: tuple[TaskKind, ...] = (classification.KIND, token_classification.KIND, embedding.KIND, multiple_choice.KIND)


def kind_named(task_type: str) -> TaskKind:
    """The kind that serves `finetune.task_type`."""
    for kind in KINDS:
        if task_type in kind.task_types:
            return kind
    known = [name for kind in KINDS for name in kind.task_types]
    raise ConfigError(f"finetune.task_type {task_type!r} is not one of {', '.join(known)}")


def kind_of_model(model: Any) -> TaskKind | None:
    """The kind whose head `model` is, or None (a bare encoder, a pre-training model)."""
    return next((kind for kind in KINDS if type(model) is kind.model_class), None)


__all__ = ["KINDS", "TaskKind", "kind_named", "kind_of_model"]
