"""The sequence classification / regression model: encoder + a pooled head.

The loss is a sum over sequences, computed inside `forward` (see `pretraining.py` for why), with
optional per-class weights for imbalanced labels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import ConfigError
from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel, pack_inputs
from bertforge.models.heads import SequenceHead
from bertforge.models.init import init_head
from bertforge.models.serialization import SavableModel

PROBLEM_TYPES = ("classification", "regression")


@dataclass
class SequenceClassifierOutput:
    logits: torch.Tensor  # [sequences, num_labels] (regression: [sequences, 1])
    loss_sum: torch.Tensor | None = None  # summed (weighted) cross-entropy, or summed squared error
    correct: torch.Tensor | None = None  # classification only


class BertforgeForSequenceClassification(SavableModel, nn.Module):
    def __init__(self, config: EncoderConfig, num_labels: int, problem_type: str = "classification",
                 label_names: list[str] | None = None):
        super().__init__()
        if problem_type not in PROBLEM_TYPES:
            raise ConfigError(f"problem type {problem_type!r} is not one of {', '.join(PROBLEM_TYPES)}")
        if problem_type == "regression":
            num_labels = 1
        elif num_labels < 2:
            raise ConfigError(f"classification needs at least 2 labels, got {num_labels}; "
                              "check finetune.labels or use finetune.task_type=regression")
        if label_names is not None and len(label_names) != num_labels:
            raise ConfigError(f"{len(label_names)} label names for {num_labels} labels; give one name per label")
        self.config = config
        self.num_labels = num_labels
        self.problem_type = problem_type
        self.label_names = list(label_names) if label_names is not None else None
        self.encoder = BertforgeModel(config)
        self.head = SequenceHead(config, num_labels, input_dropout=config.effective_classifier_dropout
                                 if config.classifier_input_dropout else 0.0)
        init_head(self.head, config)

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, class_weights: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, num_samples: int | None = None) -> SequenceClassifierOutput:
        """The unpadded batch's fields, or a padded layout with `attention_mask` (`num_samples` is unused)."""
        packed = pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids, attention_mask)
        # the encoder's last layer computes only the rows the head reads ([CLS] unless mean pooling)
        hidden = self.encoder.encode(packed, self.head.input_rows(packed.cu_seqlens))
        logits = self.head(hidden, packed.cu_seqlens)
        output = SequenceClassifierOutput(logits)
        if labels is None:
            return output
        if self.problem_type == "regression":
            output.loss_sum = (logits.float().squeeze(-1) - labels.float()).pow(2).sum()
        else:
            output.loss_sum = F.cross_entropy(logits.float(), labels, weight=class_weights, reduction="sum")
            output.correct = (logits.argmax(dim=-1) == labels).sum()
        return output

    head_kind = "classification"
    hf_suffixes = ("ForSequenceClassification",)

    @classmethod
    def for_head(cls, config: EncoderConfig, *, num_labels: int | None = None, problem_type: str = "classification",
                 label_names: list[str] | None = None, **_: object) -> BertforgeForSequenceClassification:
        if problem_type == "classification" and num_labels is None:
            if not label_names:
                raise ConfigError("a classifier needs its labels: set finetune.labels or let them be read from the "
                                  "train file")
            num_labels = len(label_names)
        return cls(config, num_labels or 1, problem_type, label_names)

    @classmethod
    def options_from_hf(cls, hf_config: Any) -> dict[str, object]:
        """Its labels, and regression where config.json says so or has one label (transformers' own rule)."""
        regression = getattr(hf_config, "problem_type", None) == "regression" or hf_config.num_labels == 1
        return labels_from_hf(hf_config) | {"problem_type": "regression" if regression else "classification"}

    def pooler_module(self) -> nn.Module | None:
        return self.head.pooler

    def copy_head_from(self, source: object) -> None:
        # the head reads what the pooling gives it: a [CLS] head is no mean-pooling head
        if isinstance(source, BertforgeForSequenceClassification) and source.config.pooling == self.config.pooling:
            super().copy_head_from(source)

    def _copy_own_head(self, source: BertforgeForSequenceClassification) -> None:
        self.head.load_state_dict(source.head.state_dict())

    def hf_config_extras(self) -> dict[str, object]:
        return label_config(self.label_names, self.num_labels) | {
            "problem_type": "regression" if self.problem_type == "regression" else "single_label_classification"}

    def head_arguments(self) -> dict[str, object]:
        return {"num_labels": self.num_labels, "problem_type": self.problem_type, "label_names": self.label_names}


def labels_from_hf(hf_config: Any) -> dict[str, object]:
    """`num_labels` and `label_names` of a Hugging Face config (no names where they are transformers' LABEL_i)."""
    names = [hf_config.id2label[i] for i in range(hf_config.num_labels)]
    return {"num_labels": hf_config.num_labels,
            "label_names": None if names == [f"LABEL_{i}" for i in range(len(names))] else names}


def label_config(label_names: list[str] | None, num_labels: int) -> dict[str, object]:
    """`id2label` / `label2id` of a Hugging Face config.json (`LABEL_i` for unnamed labels, as transformers does)."""
    names = label_names or [f"LABEL_{i}" for i in range(num_labels)]
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}

