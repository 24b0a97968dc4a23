"""The token classification model (NER, supersense tagging): encoder + a per-token linear head.

Only the first sub-word of each word carries a label (the `run_ner.py` convention), so a batch
names those tokens (`rows`) and the encoder's last layer computes only them (`BertforgeModel.encode`
with rows): on supersense tagging about 70% of the tokens are labeled, and [CLS], [SEP] and the
continuation pieces skip the last layer's MLP. The head is `BertForTokenClassification`'s — dropout,
then one linear layer — so the model exports to that stock class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.errors import ConfigError
from bertforge.models.classification import label_config, labels_from_hf
from bertforge.models.config import EncoderConfig
from bertforge.models.dropout import Dropout
from bertforge.models.encoder import BertforgeModel, pack_inputs
from bertforge.models.init import init_head
from bertforge.models.serialization import SavableModel

IGNORED_LABEL = -100  # a token that is not the first piece of a word (torch's and transformers' convention)


@dataclass
class TokenClassifierOutput:
    logits: torch.Tensor  # [rows, num_labels]: the `rows` asked for, or every token
    loss_sum: torch.Tensor | None = None  # summed cross-entropy over the labeled rows
    correct: torch.Tensor | None = None  # labeled rows predicted right


class BertforgeForTokenClassification(SavableModel, nn.Module):
    def __init__(self, config: EncoderConfig, num_labels: int, label_names: list[str] | None = None):
        super().__init__()
        if num_labels < 2:
            raise ConfigError(f"token classification needs at least 2 tags, got {num_labels}; check the tags of "
                              "finetune.train_file or finetune.labels")
        if label_names is not None and len(label_names) != num_labels:
            raise ConfigError(f"{len(label_names)} tag names for {num_labels} tags; give one name per tag")
        self.config = config
        self.num_labels = num_labels
        self.label_names = list(label_names) if label_names is not None else None
        self.encoder = BertforgeModel(config)
        self.dropout = Dropout(config.token_dropout)  # the rate the family's HF token classifier takes
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_head(self.classifier, config)

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                rows: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, num_samples: int | None = None) -> TokenClassifierOutput:
        """Logits of the tokens in `rows` (indices into the unpadded tokens; None = every token).

        `labels` has one entry per returned row; IGNORED_LABEL entries count in neither loss nor
        accuracy. `num_samples` is unused (a batch field the trainer passes through).
        """
        packed = pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids, attention_mask)
        hidden = self.encoder.encode(packed, rows)
        logits = self.classifier(self.dropout(hidden))
        output = TokenClassifierOutput(logits)
        if labels is None:
            return output
        output.loss_sum = F.cross_entropy(logits.float(), labels, ignore_index=IGNORED_LABEL, reduction="sum")
        labeled = labels != IGNORED_LABEL
        output.correct = (logits.argmax(dim=-1)[labeled] == labels[labeled]).sum()
        return output

    head_kind = "token_classification"
    hf_suffixes = ("ForTokenClassification",)

    @classmethod
    def for_head(cls, config: EncoderConfig, *, num_labels: int | None = None, label_names: list[str] | None = None,
                 **_: object) -> BertforgeForTokenClassification:
        if not label_names and num_labels is None:
            raise ConfigError("a token classifier needs its tags: set finetune.labels or let them be read from the "
                              "train file")
        return cls(config, num_labels or len(label_names or []), label_names)

    @classmethod
    def options_from_hf(cls, hf_config: Any) -> dict[str, object]:
        return labels_from_hf(hf_config)

    def _copy_own_head(self, source: BertforgeForTokenClassification) -> None:
        self.classifier.load_state_dict(source.classifier.state_dict())

    def hf_config_extras(self) -> dict[str, object]:
        return label_config(self.label_names, self.num_labels)

    def head_arguments(self) -> dict[str, object]:
        return {"num_labels": self.num_labels, "label_names": self.label_names}
