"""Token embeddings on packed input: word + (learned position) + (token type), then a norm.

With `position = rope | alibi` positions enter inside attention instead, and ModernBERT has no token
types (`type_vocab_size = 0`); the norm and dropout are common to all variants.
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.dropout import Dropout


def layer_norm(config: EncoderConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.bias)


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, config.hidden_size)
                                    if config.position == "learned" else None)
        self.token_type_embeddings = (nn.Embedding(config.type_vocab_size, config.hidden_size)
                                      if config.type_vocab_size > 0 else None)
        self.norm = layer_norm(config)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                max_seqlen: int) -> torch.Tensor:
        """[tokens] ids -> [tokens, hidden]."""
        hidden = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            if max_seqlen > self.config.max_position_embeddings:
                raise BertforgeError(
                    f"a sequence of {max_seqlen} tokens exceeds the model's {self.config.max_position_embeddings} "
                    "learned positions; lower data.seq_len / finetune.max_length or raise "
                    "model.max_position_embeddings (before pre-training)")
            hidden = hidden + self.position_embeddings(position_ids)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            hidden = hidden + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.norm(hidden))
