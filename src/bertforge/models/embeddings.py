"""Token embeddings on packed input: word + (learned position) + (token type), then a norm.

With `position = rope | alibi` positions enter inside attention instead, and ModernBERT has no token
types (`type_vocab_size = 0`); the norm and dropout are common to all variants. ELECTRA's embeddings
are narrower than the encoder (`embedding_size`): they are summed and normalised at their own width,
then a linear layer (`project`) widens them to hidden_size.

The word-embedding gradient can be added in place into a kept `.grad` (`accumulate_word_gradient_in_place`,
which the trainer sets for single-process CPU runs: `bertforge.train.kept_gradients`). Why: autograd's embedding
backward returns a fresh dense [vocab, hidden] tensor every step (47 MB for MiniLM's 30,522 x 384)
while a step touches a few hundred rows; on CPU glibc hands a block that large straight back to the
kernel, so each step pays page faults to map and zero it again: 12 ms against 1.5 ms for zeroing a
kept buffer and adding the rows (2 threads), ~8% of a short-sentence fine-tuning step.
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.dropout import Dropout


def layer_norm(config: EncoderConfig, width: int | None = None) -> nn.LayerNorm:
    return nn.LayerNorm(width or config.hidden_size, eps=config.norm_eps, bias=config.bias)


class _LookupAddingIntoGrad(torch.autograd.Function):
    """`F.embedding` whose backward adds the looked-up rows' gradients into `weight.grad` in place (created
    zeroed when missing) and hands autograd nothing for the weight, so no dense gradient is allocated."""

    @staticmethod
    def forward(ctx, input_ids: torch.Tensor, weight: nn.Parameter) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(input_ids)
        ctx.weight = weight
        return torch.nn.functional.embedding(input_ids, weight)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[None, None]:  # type: ignore[override]
        (input_ids,) = ctx.saved_tensors
        weight = ctx.weight
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, input_ids.reshape(-1).long(),
                               grad_output.reshape(-1, weight.shape[1]).to(weight.grad.dtype))
        return None, None


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        width = config.embedding_width
        self.word_embeddings = nn.Embedding(config.vocab_size, width)
        self.accumulate_word_gradient_in_place = False  # set by the trainer (see the module docstring)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, width)
                                    if config.position == "learned" else None)
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, width)
                                      if config.type_vocab_size > 0 else None)
        self.norm = layer_norm(config, width)
        self.dropout = Dropout(config.hidden_dropout)
        # ELECTRA: after the dropout, as `ElectraModel.embeddings_project` is applied to the embeddings' output
        self.project = nn.Linear(width, config.hidden_size) if config.projects_embeddings else None

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                max_seqlen: int) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden]."""
        weight = self.word_embeddings.weight
        if self.accumulate_word_gradient_in_place and torch.is_grad_enabled() and weight.requires_grad:
            hidden = _LookupAddingIntoGrad.apply(input_ids, weight)
        else:
            hidden = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            if max_seqlen > self.config.max_sequence_length:
                raise BertforgeError(
                    f"a sequence of {max_seqlen} tokens exceeds the model's {self.config.max_sequence_length} "
                    "learned positions; lower data.seq_len / finetune.max_length or raise "
                    "model.max_position_embeddings (before pre-training)")
            # RoBERTa numbers a sequence's tokens from padding_idx + 1: the offset is added to each sequence's own
            # count, so packed sequences start there too (HF derives it from the padded ids, which we do not have)
            offset = self.config.position_offset
            hidden = hidden + self.position_embeddings(position_ids + offset if offset else position_ids)
        if self.config.type_vocab_size == 1:  # one segment type (RoBERTa): every token adds the same row
            hidden = hidden + self.token_type_embeddings.weight[0]
        elif self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        hidden = self.dropout(self.norm(hidden))
        return self.project(hidden) if self.project is not None else hidden
