"""The pre-training model: encoder + MLM head (masked rows only) + optional NSP head.

Losses are returned as sums (over masked tokens, over sequences) so the trainer can normalise by
the masked tokens of the whole global batch — with gradient accumulation and several ranks, a mean
per micro-batch would weight micro-batches with few masked tokens too heavily. They are computed
inside `forward` so that DDP/FSDP wrappers see them (calling a submodule directly skips the
gradient all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel, pack_inputs
from bertforge.models.heads import MaskedLMHead, NextSentenceHead
from bertforge.models.init import init_weights
from bertforge.models.serialization import SavableModel

IGNORE_INDEX = -100


@dataclass
class PreTrainingOutput:
    mlm_logits: torch.Tensor  # [masked, vocab] (all tokens when no masked_positions were given)
    nsp_logits: torch.Tensor | None  # [sequences, 2]
    mlm_loss_sum: torch.Tensor | None = None  # summed cross-entropy over masked tokens
    nsp_loss_sum: torch.Tensor | None = None  # summed cross-entropy over sequences
    mlm_correct: torch.Tensor | None = None  # masked tokens predicted exactly
    nsp_correct: torch.Tensor | None = None
    num_masked: int = 0


class BertforgeForPreTraining(SavableModel, nn.Module):
    def __init__(self, config: EncoderConfig, nsp: bool = False):
        super().__init__()
        self.config = config
        self.encoder = BertforgeModel(config)
        self.mlm_head = MaskedLMHead(config, self.encoder.embeddings.word_embeddings)
        self.nsp_head = NextSentenceHead(config) if nsp else None
        init_weights(self.mlm_head, config)  # when tied, re-draws the shared word embeddings: harmless
        if self.nsp_head is not None:
            init_weights(self.nsp_head, config)

    @property
    def nsp(self) -> bool:
        return self.nsp_head is not None

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                masked_positions: torch.Tensor | None = None, masked_labels: torch.Tensor | None = None,
                next_sentence_label: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                num_samples: int | None = None) -> PreTrainingOutput:
        """The unpadded batch's fields (`num_samples` is accepted so `model(**batch)` works, and unused).

        With a padded [batch, len] input and `attention_mask`, the tokens are unpadded first and
        `masked_positions` index the unpadded (row-major, real-token) order.
        """
        packed = pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids, attention_mask)
        if masked_positions is None:  # logits for every token
            masked_hidden = hidden = self.encoder.encode(packed)
            first_hidden = hidden.index_select(0, packed.first_token_index)
        else:  # the encoder's last layer computes only the rows the heads read: masked tokens, [CLS] for NSP
            rows = masked_positions if self.nsp_head is None else torch.cat((masked_positions,
                                                                            packed.first_token_index))
            hidden = self.encoder.encode(packed, rows)
            masked_hidden, first_hidden = hidden[:masked_positions.numel()], hidden[masked_positions.numel():]
        mlm_logits = self.mlm_head(masked_hidden)
        nsp_logits = self.nsp_head(first_hidden) if self.nsp_head is not None else None
        output = PreTrainingOutput(mlm_logits, nsp_logits, num_masked=mlm_logits.shape[0])
        if masked_labels is not None:
            output.mlm_loss_sum = F.cross_entropy(mlm_logits.float(), masked_labels, reduction="sum",
                                                  ignore_index=IGNORE_INDEX)
            output.mlm_correct = (mlm_logits.argmax(dim=-1) == masked_labels).sum()
        if nsp_logits is not None and next_sentence_label is not None:
            output.nsp_loss_sum = F.cross_entropy(nsp_logits.float(), next_sentence_label, reduction="sum")
            output.nsp_correct = (nsp_logits.argmax(dim=-1) == next_sentence_label).sum()
        return output

    head_kind = "pretraining"
    hf_suffixes = ("ForPreTraining", "ForMaskedLM")  # masked LM + next-sentence prediction, masked LM alone

    @classmethod
    def for_head(cls, config: EncoderConfig, *, nsp: bool = False, **_: object) -> BertforgeForPreTraining:
        return cls(config, nsp=nsp)

    @property  # type: ignore[override]
    def output_name(self) -> str:  # BertForPreTraining's output names the MLM logits prediction_logits
        return "prediction_logits" if self.nsp else "logits"

    def hf_suffix(self) -> str:
        return "ForPreTraining" if self.nsp else "ForMaskedLM"

    def pooler_module(self) -> nn.Module | None:
        return self.nsp_head.pooler if self.nsp_head is not None else None

    def copy_head_from(self, source: object) -> None:
        """The MLM head always (its shape follows the encoder's), the NSP head when both have one."""
        if not isinstance(source, BertforgeForPreTraining):
            return
        self.mlm_head.load_state_dict(source.mlm_head.state_dict())
        if source.nsp_head is not None and self.nsp_head is not None:
            self.nsp_head.load_state_dict(source.nsp_head.state_dict())

    def head_arguments(self) -> dict[str, object]:
        return {"nsp": self.nsp}

