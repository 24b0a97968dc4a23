"""The unpadded encoder: all tokens of a micro-batch in one flat [tokens, hidden] tensor.

Padding is removed once, before the embeddings (or never exists, when the data loader packs), and
`cu_seqlens` travels through every layer, so the linear layers — nearly all of the FLOPs — run on
real tokens only. Attention respects the sequence boundaries through `PackedAttention`, built once
per forward. Positions are each token's index within its own sequence (`position_ids`), which is
all learned positions and RoPE need; ALiBi and MPNet's relative position bias use distances
within a sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.models.alibi import alibi_slopes
from bertforge.models.attention import PackedAttention
from bertforge.models.config import EncoderConfig
from bertforge.models.disentangled_attention import (
    DisentangledSelfAttention,
    RelativeEmbeddings,
    RelativeLayout,
)
from bertforge.models.dropout import Dropout
from bertforge.models.embeddings import Embeddings, layer_norm
from bertforge.models.heads import Pooler
from bertforge.models.init import init_weights
from bertforge.models.mlp import build_mlp
from bertforge.models.relative_position import RelativePositionBias
from bertforge.models.rotary import apply_rotary, rotary_cos_sin
from bertforge.models.serialization import SavableModel


@dataclass
class PackedInputs:
    """The model-facing fields of an unpadded batch."""

    input_ids: torch.Tensor  # [tokens]
    cu_seqlens: torch.Tensor  # [sequences + 1] int32, starts at 0
    max_seqlen: int
    position_ids: torch.Tensor  # [tokens], index within its own sequence
    token_type_ids: torch.Tensor | None  # [tokens]

    @property
    def num_sequences(self) -> int:
        return self.cu_seqlens.numel() - 1

    @property
    def first_token_index(self) -> torch.Tensor:
        """Index of each sequence's first token ([CLS]) in the flat layout."""
        return self.cu_seqlens[:-1].long()


def unpad_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 token_type_ids: torch.Tensor | None = None) -> PackedInputs:
    """[batch, len] padded tensors -> packed tokens. Positions count real tokens, so any padding side works."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    position_ids = (mask.long().cumsum(dim=1) - 1)[mask]
    return PackedInputs(input_ids[mask], cu_seqlens, int(lengths.max()), position_ids,
                        token_type_ids[mask] if token_type_ids is not None else None)


def pad_tokens(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Packed [tokens, ...] -> [batch, len, ...] with zeros at padding: the inverse of `unpad_inputs`."""
    mask = attention_mask.bool()
    padded = hidden.new_zeros(*mask.shape, *hidden.shape[1:])
    padded[mask] = hidden
    return padded


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths, output_size=total_tokens)
    return torch.arange(total_tokens, device=cu_seqlens.device) - starts


def pack_inputs(input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> PackedInputs:
    """Accept either the unpadded batch fields or a padded [batch, len] layout (with `attention_mask`).

    Missing packed fields are derived: no `cu_seqlens` means one sequence, no `position_ids` means
    0..len-1 within each sequence.
    """
    if attention_mask is not None or input_ids.dim() == 2:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return unpad_inputs(input_ids, attention_mask, token_type_ids)
    total_tokens = input_ids.numel()
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, total_tokens], dtype=torch.int32, device=input_ids.device)
    if max_seqlen is None:
        max_seqlen = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    if position_ids is None:
        position_ids = positions_from_cu_seqlens(cu_seqlens, total_tokens)
    return PackedInputs(input_ids, cu_seqlens, int(max_seqlen), position_ids, token_type_ids)


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig, layer_index: int):
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        # One fused projection instead of BERT's separate query/key/value: one matmul, same maths.
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.bias)
        self.output = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.window = config.layer_window(layer_index)
        self.rope_theta = config.layer_rope_theta(layer_index) if config.position == "rope" else None
        self.alibi_slopes: torch.Tensor | None
        self.register_buffer("alibi_slopes", alibi_slopes(config.num_heads) if config.position == "alibi" else None,
                             persistent=False)
        self.dropout_p = config.attention_dropout

    def forward(self, hidden: torch.Tensor, attention: PackedAttention,
                rotary: tuple[torch.Tensor, torch.Tensor] | None, rows: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """[tokens, hidden] -> [tokens, hidden], or only the `rows` given (every token still attends).
        `bias`: [heads, max_seqlen, max_seqlen] added to the scores (MPNet's relative positions)."""
        tokens = hidden.shape[0]
        fused = self.qkv(hidden).view(tokens, 3, self.num_heads, self.head_dim)
        query, key, value = fused.unbind(dim=1)
        if rotary is not None:
            cos, sin = rotary
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        context = attention.attend(query, key, value, window=self.window, alibi_slopes=self.alibi_slopes,
                                   dropout_p=self.dropout_p if self.training else 0.0, bias=bias,
                                   fused=fused if rotary is None else None)
        if rows is not None:
            context = context.index_select(0, rows)
        return self.output(context.reshape(context.shape[0], self.num_heads * self.head_dim))


class EncoderLayer(nn.Module):
    def __init__(self, config: EncoderConfig, layer_index: int):
        super().__init__()
        self.pre_norm = config.norm == "pre"
        self.attention = (DisentangledSelfAttention(config) if config.disentangled_attention is not None
                          else SelfAttention(config, layer_index))
        self.mlp = build_mlp(config)
        # Pre-norm: the embeddings end in a norm, so the first layer's attention input is already
        # normalised (ModernBERT uses an identity there; we match it so its weights load exactly).
        self.attention_norm = nn.Identity() if self.pre_norm and layer_index == 0 else layer_norm(config)
        self.mlp_norm = layer_norm(config)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, hidden: torch.Tensor, attention: PackedAttention | RelativeLayout,
                rotary: tuple[torch.Tensor, torch.Tensor] | None, rows: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """`rows`: compute the output of these tokens only (see `BertforgeModel.encode`); `bias`: see SelfAttention.
        `attention` is a `RelativeLayout` for DeBERTa's disentangled attention."""
        residual = hidden if rows is None else hidden.index_select(0, rows)
        if self.pre_norm:
            hidden = residual + self.dropout(self.attention(self.attention_norm(hidden), attention, rotary, rows,
                                                            bias))
            return hidden + self.dropout(self.mlp(self.mlp_norm(hidden)))
        hidden = self.attention_norm(residual + self.dropout(self.attention(hidden, attention, rotary, rows, bias)))
        return self.mlp_norm(hidden + self.dropout(self.mlp(hidden)))


class BertforgeModel(SavableModel, nn.Module):
    """The bare encoder: packed token ids in, [tokens, hidden] states out.

    `pooler=True` keeps BERT's pooler beside it, unused by `forward`: a bare HF `BertModel` (e.g.
    all-MiniLM-L6-v2) carries one, and a classifier fine-tuned from it starts from it, as
    `BertForSequenceClassification.from_pretrained` does; an export writes it back.
    """

    def __init__(self, config: EncoderConfig, pooler: bool = False):
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, index) for index in range(config.num_layers))
        # DeBERTa: one relative-distance table for all layers (each projects it with its own matrices)
        self.relative_embeddings = (RelativeEmbeddings(config) if config.disentangled_attention is not None
                                    else None)
        self.final_norm = layer_norm(config) if config.norm == "pre" else None
        # MPNet: one table for all layers, looked up once per forward
        self.relative_position_bias = RelativePositionBias(config) if config.relative_attention_buckets else None
        self.pooler = Pooler(config) if pooler else None
        init_weights(self, config)

    def encode(self, packed: PackedInputs, rows: torch.Tensor | None = None) -> torch.Tensor:
        """[tokens, hidden] final states, or only those of `rows` (token indices, in the order given).

        The heads read few rows — the ~15% masked tokens for MLM, one [CLS] per sequence for a
        classifier — and nothing else depends on the last layer's other outputs. So with `rows`, the
        last layer still attends over every token (its keys and values are needed), but its output
        projection, residual, norms and MLP — about 80% of a layer's FLOPs — run on those rows only:
        on bert-base with 15% masking that skips ~5% of the encoder's work, on a 6-layer model
        pooling [CLS] ~13%. The values are the same as slicing the full output.
        """
        hidden = self.embeddings(packed.input_ids, packed.position_ids, packed.token_type_ids, packed.max_seqlen)
        attention: PackedAttention | RelativeLayout = PackedAttention(packed.cu_seqlens, packed.max_seqlen,
                                                                      self.config.attention_backend)
        if self.relative_embeddings is not None:  # the relative rows and slot distances every layer shares
            assert self.config.disentangled_attention is not None
            attention = RelativeLayout.build(attention, packed.position_ids, self.relative_embeddings,
                                             self.config.disentangled_attention)
        rotary_by_theta = {
            layer.attention.rope_theta: rotary_cos_sin(packed.position_ids, self.config.head_dim,
                                                       layer.attention.rope_theta)
            for layer in self.layers if layer.attention.rope_theta is not None
        }
        bias = self.relative_position_bias(packed.max_seqlen) if self.relative_position_bias is not None else None
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            theta = layer.attention.rope_theta
            hidden = layer(hidden, attention, rotary_by_theta[theta] if theta is not None else None,
                           rows if index == last else None, bias)
        return self.final_norm(hidden) if self.final_norm is not None else hidden

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [tokens, hidden] of the real tokens (see `pad_tokens` to re-pad a padded input)."""
        return self.encode(pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids,
                                       attention_mask))

    head_kind = "base"
    hf_suffixes = ("Model",)
    output_name = "last_hidden_state"

    @classmethod
    def for_head(cls, config: EncoderConfig, *, source_pooler: bool = False, **_: object) -> BertforgeModel:
        return cls(config, pooler=source_pooler)

    def encoder_model(self) -> BertforgeModel:
        return self

    def pooler_module(self) -> nn.Module | None:
        return self.pooler

    def head_arguments(self) -> dict[str, object]:
        return {"pooler": True} if self.pooler is not None else {}
