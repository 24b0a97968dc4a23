"""DeBERTa's disentangled attention on the packed layout: content and relative position scored apart.

Each score of a query i and key j is the sum of up to three terms, all scaled by 1/sqrt(head_dim x terms):

- content-to-content: q_i . k_j (as every attention);
- content-to-position (`c2p`): q_i . K_r[d(i, j)], the query against the key projection of the relative
  embedding of the distance d(i, j) = bucket(pos_i - pos_j);
- position-to-content (`p2c`): k_j . Q_r[d(j, i) mirrored], the key against the query projection of the
  relative embedding of the distance seen from the key.

The relative embeddings are one table for the whole encoder (2 x span rows, optionally normed), projected
by each layer's own query/key matrices (`share_att_key`, DeBERTa-v3) or by layer-own position projections.
Distances beyond `position_buckets / 2` share log-spaced buckets, up to `max_relative_positions`.

Why not the varlen / SDPA kernels: the c2p and p2c terms are a bias that depends on each pair's distance
and on the query and key themselves, which no fused kernel here takes. So the scores are computed
explicitly, on the same rows `PackedAttention` lays the sequences out in for SDPA (first-fit: short
sequences share a row, a block-diagonal mask keeps them apart), with each slot's distance taken from the
tokens' own positions within their sequence, so sharing a row changes nothing. Only the relative rows a
batch can reach are projected and gathered: at 128 tokens with 256 buckets, 255 of the 512 rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.models.attention import PackedAttention, _to_rows
from bertforge.models.compile_boundaries import eager_under_compile
from bertforge.models.config import DisentangledAttention, EncoderConfig
from bertforge.models.dropout import Dropout


def log_bucket(distance: torch.Tensor, buckets: int, max_distance: int) -> torch.Tensor:
    """Signed distances -> DeBERTa's buckets: exact within +-buckets/2, log-spaced beyond, up to max_distance.

    The float32 operations follow `transformers`' in order, so a distance on a bucket edge lands where
    it lands there (the log ratio is rounded up).
    """
    middle = buckets // 2
    magnitude = distance.abs()
    near = magnitude <= middle
    # near distances are masked out below; the placeholder keeps the log finite
    far_magnitude = torch.where((distance < middle) & (distance > -middle), torch.tensor(middle - 1), magnitude)
    log_ratio = torch.log(far_magnitude / middle) / torch.log(torch.tensor((max_distance - 1) / middle))
    far = torch.ceil(log_ratio * (middle - 1)) + middle
    return torch.where(near, distance.to(far.dtype), far * torch.sign(distance)).long()


def bucket_lookup(max_seqlen: int, settings: DisentangledAttention) -> torch.Tensor:
    """[2 * max_seqlen - 1] bucket of each distance -(max_seqlen - 1) .. max_seqlen - 1 (index distance + max_seqlen - 1)."""
    distances = torch.arange(-(max_seqlen - 1), max_seqlen)
    if settings.position_buckets > 0:
        return log_bucket(distances, settings.position_buckets, settings.max_relative_positions)
    return distances


class RelativeEmbeddings(nn.Module):
    """The encoder's one table of relative-distance embeddings, and the norm DeBERTa-v3 puts on it."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        settings = config.disentangled_attention
        assert settings is not None
        self.embeddings = nn.Embedding(2 * settings.span, config.hidden_size)
        self.norm = (nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
                     if settings.norm_relative_embeddings else None)

    def forward(self, rows: slice) -> torch.Tensor:
        table = self.embeddings.weight[rows]
        return self.norm(table) if self.norm is not None else table


@dataclass
class RelativeLayout:
    """What every layer of one forward shares: the rows, the mask, and each slot pair's relative-row index."""

    attention: PackedAttention
    allowed: torch.Tensor | None  # [rows, 1, len, len] True within a sequence; None: one full sequence per row
    c2p_index: torch.Tensor  # [rows, 1, len, len] the relative row of each (query, key) slot pair, within `table_rows`
    p2c_index: torch.Tensor  # [rows, 1, len, len] for key slot k and query slot q at [k, q]: the key's view
    table_rows: slice  # the part of the relative table this batch reaches
    relative: torch.Tensor  # [table rows, hidden] those embeddings (normed)

    @classmethod
    @eager_under_compile  # bookkeeping over the batch's lengths, as `place_in_rows`: no guard per length
    def build(cls, attention: PackedAttention, position_ids: torch.Tensor, relative_embeddings: RelativeEmbeddings,
              settings: DisentangledAttention) -> RelativeLayout:
        placement = attention.placement
        length = placement.row_length
        device = position_ids.device
        slot_positions = torch.zeros(placement.num_rows * length, dtype=torch.long, device=device)
        slot_positions[placement.slot_of_token] = position_ids.long()
        slot_positions = slot_positions.view(placement.num_rows, length)
        lookup = bucket_lookup(length, settings).to(device)
        span = settings.span
        # every pair's distance lies within +-(length - 1), so only these relative rows can be read
        farthest = int(lookup.abs().max())
        first, last = max(span - farthest, 0), min(span + farthest, 2 * span - 1)
        distance = slot_positions[:, :, None] - slot_positions[:, None, :]  # query minus key
        c2p = (lookup[distance + length - 1] + span).clamp(0, 2 * span - 1) - first
        # p2c reads, for key slot k and query slot q, the row of minus the distance from k to q
        p2c = (-lookup[distance + length - 1] + span).clamp(0, 2 * span - 1) - first
        owner = placement.sequence_of_slot
        allowed = None if placement.is_identity else (owner[:, :, None] == owner[:, None, :])[:, None]
        rows = slice(first, last + 1)
        return cls(attention, allowed, c2p[:, None], p2c[:, None], rows, relative_embeddings(rows))


class DisentangledSelfAttention(nn.Module):
    """`SelfAttention`'s interface ([tokens, hidden] in and out, fused qkv), with DeBERTa's scores."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        settings = config.disentangled_attention
        assert settings is not None
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        self.terms = settings.terms
        self.scale = (self.head_dim * (1 + len(settings.terms))) ** -0.5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.bias)
        self.output = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        # without share_att_key each term has its own projection of the relative table (DeBERTa-v2)
        self.position_key = (nn.Linear(config.hidden_size, config.hidden_size)
                             if not settings.share_att_key and "c2p" in self.terms else None)
        self.position_query = (nn.Linear(config.hidden_size, config.hidden_size)
                               if not settings.share_att_key and "p2c" in self.terms else None)
        self.share_att_key = settings.share_att_key
        self.relative_dropout = Dropout(config.hidden_dropout)  # DeBERTa's pos_dropout, each layer its own draw
        self.attention_dropout = Dropout(config.attention_dropout)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [heads, n, head_dim]."""
        return x.view(x.shape[0], self.num_heads, self.head_dim).transpose(0, 1)

    def _relative_projections(self, relative: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The relative rows as keys (for c2p) and as queries (for p2c), [heads, rows, head_dim] each."""
        hidden = relative.shape[1]
        weight, bias = self.qkv.weight, self.qkv.bias
        if self.share_att_key:
            as_query = F.linear(relative, weight[:hidden], bias[:hidden] if bias is not None else None)
            as_key = F.linear(relative, weight[hidden:2 * hidden], bias[hidden:2 * hidden] if bias is not None else None)
        else:
            as_key = self.position_key(relative) if self.position_key is not None else None
            as_query = self.position_query(relative) if self.position_query is not None else None
        return (self._heads(as_key) if "c2p" in self.terms and as_key is not None else None,
                self._heads(as_query) if "p2c" in self.terms and as_query is not None else None)

    rope_theta = None  # positions enter through the relative terms only

    def forward(self, hidden: torch.Tensor, layout: RelativeLayout, rotary: None = None,
                rows: torch.Tensor | None = None, bias: None = None) -> torch.Tensor:
        """[tokens, hidden] -> [tokens, hidden], or only the `rows` given (every token still attends)."""
        tokens = hidden.shape[0]
        placement = layout.attention.placement
        query, key, value = self.qkv(hidden).view(tokens, 3, self.num_heads, self.head_dim).unbind(dim=1)
        # [rows, heads, len, head_dim]: the slots SDPA would see
        query, key, value = (_to_rows(x, placement) for x in (query, key, value))
        scores = query @ key.transpose(-1, -2)
        position_key, position_query = self._relative_projections(self.relative_dropout(layout.relative))
        if position_key is not None:  # content-to-position: each query against the key row of its distance
            c2p = query @ position_key.transpose(-1, -2)
            scores = scores + c2p.gather(-1, layout.c2p_index.expand(*c2p.shape[:3], c2p.shape[2]))
        if position_query is not None:  # position-to-content: each key against the query row of its distance
            p2c = key @ position_query.transpose(-1, -2)
            scores = scores + p2c.gather(-1, layout.p2c_index.expand(*p2c.shape[:3], p2c.shape[2])).transpose(-1, -2)
        scores = scores * self.scale
        if layout.allowed is not None:
            scores = scores.masked_fill(~layout.allowed, float("-inf"))
        context = self.attention_dropout(scores.softmax(dim=-1)) @ value
        context = context.transpose(1, 2).reshape(placement.num_rows * placement.row_length, self.num_heads,
                                                  self.head_dim)
        if not placement.is_identity:
            context = context.index_select(0, placement.slot_of_token)
        if rows is not None:
            context = context.index_select(0, rows)
        return self.output(context.reshape(context.shape[0], self.num_heads * self.head_dim))

