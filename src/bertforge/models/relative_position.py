"""MPNet's relative position bias: one learned bias per head for each bucket of key-query offsets.

T5's bidirectional bucketing (which MPNet inherits): half the buckets hold keys before the query,
half after; within each half, offsets below a quarter of the buckets get a bucket each and longer
ones share logarithmically wider buckets up to `MAX_DISTANCE`, beyond which all share the last.
The table ([buckets, heads]) is shared by every layer, so the bias is looked up once per forward.

The bias depends only on the offset between key and query inside one sequence, so one
[heads, L, L] matrix over offsets 0..L-1 serves every packed sequence: the top-left n x n block
of it is a sequence of n tokens' bias, and a row of slots holding several sequences back to back
(SDPA's layout) reads it unchanged, since slot offsets equal position offsets within a sequence.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bertforge.models.config import EncoderConfig

MAX_DISTANCE = 128  # offsets this far and beyond share the last bucket (MPNet, T5: 128)


def relative_position_bucket(offset: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """The bucket of each key-minus-query offset (any integer tensor shape)."""
    half = num_buckets // 2
    before = -offset  # > 0 for a key before the query
    side = (before < 0).long() * half  # keys after the query use the upper half
    distance = before.abs()
    exact = half // 2
    # the same float32 operations, in the same order, as transformers' MPNet: a bucket edge that falls
    # on a rounding (offset 16: exactly 2.0 here) lands in the same bucket as the checkpoint was trained with
    wide = exact + (torch.log(distance.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).long()
    wide = wide.clamp(max=half - 1)
    return side + torch.where(distance < exact, distance, wide)


class RelativePositionBias(nn.Module):
    """The learned table and its lookup: [heads, L, L] bias for offsets within sequences up to L tokens."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.num_buckets = config.relative_attention_buckets
        self.embedding = nn.Embedding(config.relative_attention_buckets, config.num_heads)

    def forward(self, max_seqlen: int) -> torch.Tensor:
        positions = torch.arange(max_seqlen, device=self.embedding.weight.device)
        buckets = relative_position_bucket(positions[None, :] - positions[:, None], self.num_buckets)
        return self.embedding(buckets).permute(2, 0, 1)
