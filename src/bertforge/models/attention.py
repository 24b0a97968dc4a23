"""Attention over packed sequences: every query sees only the keys of its own sequence.

The encoder carries all tokens of a micro-batch as one flat [tokens, heads, head_dim] tensor with
`cu_seqlens` boundaries. Four backends turn that into attention (`models/attention_backends.py`
chooses among them, a pure function tested on CPU):

- `varlen`: PyTorch's own `varlen_attn` (FlashAttention inside torch) consumes the packed layout
  directly, with sliding windows: the GPU default (fp16/bf16, no ALiBi, no attention dropout).
- `flash`: the optional flash-attn package's varlen kernel, for what `varlen_attn` lacks: ALiBi
  slopes and attention dropout (GPU, fp16/bf16).
- `sdpa`: PyTorch's `scaled_dot_product_attention` needs a [rows, heads, len, head_dim] layout, so we
  place the sequences into as few rows of `max_seqlen` slots as fit (first-fit decreasing) and
  give SDPA a block-diagonal boolean mask. Measured on CPU (docs/benchmarks.md, "Attention on CPU")
  against padding every sequence to the longest, length bucketing, nested jagged tensors and
  FlexAttention, this was the fastest correct option: fewer rows than padding (short sequences
  share a row) and one batched kernel call. Rows that hold exactly one full-length sequence need
  no mask at all, which lets SDPA take its unmasked fast path. With attention dropout on a CPU,
  SDPA can only take its math path, which draws the dropout mask with `bernoulli_`; there we run
  the same computation ourselves with `models.dropout`'s cheaper mask and an additive mask built
  once per forward (`attention_with_dropout`).
- `eager`: a plain per-sequence softmax(QKᵀ)V loop — the reference the tests compare against.

The row placement and the masks depend only on the sequence boundaries, so they are built once
per forward in `PackedAttention` and shared by every layer (one mask per distinct window).

A learned additive bias (MPNet's relative positions, `models/relative_position.py`) is a
[heads, L, L] matrix over key-query offsets; neither FlashAttention kernel takes one, so such layers
run SDPA with the block-diagonal mask folded into the bias (or eager, per sequence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bertforge.console import log
from bertforge.models.attention_backends import (
    AvailableKernels,
    BackendChoice,
    LayerNeeds,
    available_kernels,
    choose_backend,
    flash_attn_arguments,
    varlen_attn_arguments,
)
from bertforge.models.compile_boundaries import eager_under_compile
from bertforge.models.dropout import dropout

MASKED_SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

_kernels_by_device: dict[torch.device, AvailableKernels] = {}
_logged_choices: set[BackendChoice] = set()


def backend_for(requested: str, query: torch.Tensor, *, window: int | None, alibi: bool,
                dropout_p: float, bias: bool = False) -> BackendChoice:
    """`choose_backend` for this query's device and dtype; an `auto` fallback on a GPU is logged once."""
    if query.device not in _kernels_by_device:
        _kernels_by_device[query.device] = available_kernels(query.device)
    needs = LayerNeeds(query.device.type, query.dtype, dropout_p, alibi, window, query.shape[-1], bias)
    choice = choose_backend(requested, needs, _kernels_by_device[query.device])
    log_fallback_once(choice)
    return choice


def log_fallback_once(choice: BackendChoice) -> None:
    """Warn once per distinct fallback and reason, not once per layer and step."""
    if choice.fallback and choice not in _logged_choices:
        _logged_choices.add(choice)
        log.warning(f"attention: {choice.backend} instead of varlen_attn: {choice.reason}")


@dataclass(frozen=True)
class RowPlacement:
    """Where each packed token sits when the sequences are laid out in rows of `row_length` slots."""

    num_rows: int
    row_length: int
    slot_of_token: torch.Tensor  # [tokens] flat index into num_rows * row_length
    sequence_of_slot: torch.Tensor  # [num_rows, row_length]; -1 for empty slots
    is_identity: bool  # one full-length sequence per row, in order: no copy, no mask needed
    token_of_slot: torch.Tensor | None = None  # [num_rows * row_length] the token each slot reads; None if identity


@eager_under_compile
def place_in_rows(cu_seqlens: torch.Tensor, max_seqlen: int) -> RowPlacement:
    """First-fit decreasing: short sequences share rows, so SDPA computes fewer padded slots.

    Python bookkeeping over the batch's lengths, kept out of `torch.compile`: traced, every length
    became a guard and each new batch recompiled. Run eagerly, it costs one graph break per forward.
    """
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    total_tokens = int(cu_seqlens[-1])
    device = cu_seqlens.device
    if all(length == max_seqlen for length in lengths):
        slots = torch.arange(total_tokens, device=device)
        sequence_ids = torch.arange(len(lengths), device=device).repeat_interleave(max_seqlen)
        return RowPlacement(len(lengths), max_seqlen, slots, sequence_ids.view(len(lengths), max_seqlen), True)

    row_fill: list[int] = []
    row_of_sequence = [0] * len(lengths)
    offset_of_sequence = [0] * len(lengths)
    for sequence in sorted(range(len(lengths)), key=lambda s: -lengths[s]):
        length = lengths[sequence]
        row = next((r for r, fill in enumerate(row_fill) if fill + length <= max_seqlen), len(row_fill))
        if row == len(row_fill):
            row_fill.append(0)
        row_of_sequence[sequence] = row
        offset_of_sequence[sequence] = row_fill[row]
        row_fill[row] += length

    lengths_t = torch.tensor(lengths, device=device)
    sequence_of_token = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths_t)
    start_slot = (torch.tensor(row_of_sequence, device=device) * max_seqlen
                  + torch.tensor(offset_of_sequence, device=device) - cu_seqlens[:-1].long())
    slot_of_token = start_slot[sequence_of_token] + torch.arange(total_tokens, device=device)
    num_rows = len(row_fill)
    sequence_of_slot = torch.full((num_rows * max_seqlen,), -1, dtype=torch.long, device=device)
    sequence_of_slot[slot_of_token] = sequence_of_token
    # An empty slot reads token 0: any finite row will do, since the masks keep real queries off empty slots
    # (and empty queries' outputs are dropped). One gather fills the rows, instead of zeroing them and scattering.
    token_of_slot = torch.zeros(num_rows * max_seqlen, dtype=torch.long, device=device)
    token_of_slot[slot_of_token] = torch.arange(total_tokens, device=device)
    return RowPlacement(num_rows, max_seqlen, slot_of_token, sequence_of_slot.view(num_rows, max_seqlen), False,
                        token_of_slot)


class PackedAttention:
    """Sequence-boundary bookkeeping for one forward pass, shared by all layers."""

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int, backend: str = "auto"):
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = int(max_seqlen)
        self.backend = backend
        self._placement: RowPlacement | None = None
        self._masks: dict[int | None, torch.Tensor | None] = {}  # one per distinct window
        self._additive_masks: dict[tuple[int | None, torch.dtype], torch.Tensor | None] = {}
        self._alibi_biases: dict[int | None, torch.Tensor] = {}

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, window: int | None = None,
               alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0,
               bias: torch.Tensor | None = None, fused: torch.Tensor | None = None) -> torch.Tensor:
        """[tokens, heads, head_dim] in and out. `window`: keys at most this many positions away on each side.
        `bias`: [heads, max_seqlen, max_seqlen] added to the scores, a function of the key-query offset only.
        `fused`: the [tokens, 3, heads, head_dim] tensor that query, key and value are the views of, if they are
        (the fused projection, no rotary applied): SDPA's rows then take all three in one gather, a third of the
        time of three gathers of strided views (measured on MiniLM's shapes)."""
        backend = backend_for(self.backend, query, window=window, alibi=alibi_slopes is not None,
                              dropout_p=dropout_p, bias=bias is not None).backend
        if backend == "varlen":
            return varlen_attention(query, key, value, self.cu_seqlens, self.max_seqlen, window=window)
        if backend == "flash":
            return flash_varlen_attention(query, key, value, self.cu_seqlens, self.max_seqlen, window=window,
                                          alibi_slopes=alibi_slopes, dropout_p=dropout_p)
        if backend == "eager":
            return eager_attention(query, key, value, self.cu_seqlens, window=window, alibi_slopes=alibi_slopes,
                                   dropout_p=dropout_p, bias=bias)
        return self._sdpa(query, key, value, window=window, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                          bias=bias, fused=fused)

    @property
    def placement(self) -> RowPlacement:
        if self._placement is None:
            self._placement = place_in_rows(self.cu_seqlens, self.max_seqlen)
        return self._placement

    def _boolean_mask(self, window: int | None) -> torch.Tensor | None:
        """[rows, 1, len, len] True where attention is allowed; None when nothing needs masking."""
        if window not in self._masks:
            placement = self.placement
            if placement.is_identity and window is None:
                self._masks[window] = None
            else:
                # Empty slots "belong" to sequence -1 and attend among themselves, so no query row
                # is fully masked (that would put NaNs into the discarded outputs' gradients).
                owner = placement.sequence_of_slot
                allowed = owner[:, :, None] == owner[:, None, :]
                if window is not None:
                    allowed = allowed & (_slot_distance(placement.row_length, owner.device) <= window)
                self._masks[window] = allowed[:, None]
        return self._masks[window]

    def _additive_mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor | None:
        """`_boolean_mask` as 0 / -inf to add to the scores."""
        if (window, dtype) not in self._additive_masks:
            allowed = self._boolean_mask(window)
            self._additive_masks[window, dtype] = None if allowed is None else torch.zeros(
                allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))
        return self._additive_masks[window, dtype]

    def _alibi_bias(self, window: int | None, slopes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[rows or 1, heads, len, len] float bias: -slope·distance where allowed, -inf elsewhere."""
        if window not in self._alibi_biases:
            distance = _slot_distance(self.placement.row_length, slopes.device)
            bias = (-slopes.float()[:, None, None] * distance)[None]
            allowed = self._boolean_mask(window)
            self._alibi_biases[window] = bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))
        return self._alibi_biases[window].to(dtype)

    def _learned_bias(self, window: int | None, bias: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """[rows or 1, heads, len, len]: the learned bias where attention is allowed, -inf elsewhere. Not cached:
        it carries the gradient of this forward's bias table (the boolean mask under it is cached)."""
        allowed = self._boolean_mask(window)
        bias = bias.to(dtype)[None]
        return bias if allowed is None else bias.masked_fill(~allowed, float("-inf"))

    def _sdpa(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, window: int | None,
              alibi_slopes: torch.Tensor | None, dropout_p: float, bias: torch.Tensor | None = None,
              fused: torch.Tensor | None = None) -> torch.Tensor:
        placement = self.placement
        own_dropout = dropout_p > 0 and query.device.type == "cpu"
        if bias is not None:
            mask = self._learned_bias(window, bias, query.dtype)
        elif alibi_slopes is not None:
            mask = self._alibi_bias(window, alibi_slopes, query.dtype)
        elif own_dropout:
            mask = self._additive_mask(window, query.dtype)
        else:
            mask = self._boolean_mask(window)
        rows = _fused_to_rows(fused, placement) if fused is not None else [_to_rows(x, placement)
                                                                           for x in (query, key, value)]
        if own_dropout:
            output = attention_with_dropout(*rows, mask, dropout_p)
        elif mask is not None and query.is_cuda:
            # the memory-efficient kernel (math as a fallback), not SDPA's own choice: on an H200 (torch 2.11)
            # that choice cost 209 ms a call when the shapes change, as a batch's rows and lengths do every step,
            # against 0.64 ms for this kernel (benchmarks/attention_dropout_paths.py, docs/scaling.md)
            with sdpa_kernel(MASKED_SDPA_BACKENDS):
                output = F.scaled_dot_product_attention(*rows, attn_mask=mask, dropout_p=dropout_p)
        else:
            output = F.scaled_dot_product_attention(*rows, attn_mask=mask, dropout_p=dropout_p)
        heads, head_dim = query.shape[1:]
        output = output.transpose(1, 2).reshape(placement.num_rows * placement.row_length, heads, head_dim)
        return output if placement.is_identity else output.index_select(0, placement.slot_of_token)


def attention_with_dropout(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
                           dropout_p: float) -> torch.Tensor:
    """SDPA's math path ([..., len, head_dim] in and out; `bias` added to the scores), `models.dropout`'s mask."""
    scale = query.shape[-1] ** -0.5
    scores = query @ key.transpose(-1, -2)
    scores = scores.mul_(scale) if bias is None else torch.add(bias, scores, alpha=scale)
    return dropout(scores.softmax(dim=-1), dropout_p) @ value


def _slot_distance(row_length: int, device: torch.device) -> torch.Tensor:
    positions = torch.arange(row_length, device=device)
    return (positions[:, None] - positions[None, :]).abs()


def _to_rows(x: torch.Tensor, placement: RowPlacement) -> torch.Tensor:
    """[tokens, heads, head_dim] -> [rows, heads, row_length, head_dim]."""
    heads, head_dim = x.shape[1:]
    if placement.token_of_slot is not None:
        x = x.index_select(0, placement.token_of_slot)
    return x.view(placement.num_rows, placement.row_length, heads, head_dim).transpose(1, 2)


def _fused_to_rows(qkv: torch.Tensor, placement: RowPlacement) -> list[torch.Tensor]:
    """[tokens, 3, heads, head_dim] -> query, key and value as [rows, heads, row_length, head_dim] views of one
    gathered tensor (SDPA reads them through their strides)."""
    _, three, heads, head_dim = qkv.shape
    if placement.token_of_slot is not None:
        qkv = qkv.index_select(0, placement.token_of_slot)
    return list(qkv.view(placement.num_rows, placement.row_length, three, heads, head_dim).permute(2, 0, 3, 1, 4)
                .unbind(0))


def eager_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, *,
                    window: int | None = None, alibi_slopes: torch.Tensor | None = None,
                    dropout_p: float = 0.0, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The textbook computation, one sequence at a time: slow, obviously correct."""
    scale = query.shape[-1] ** -0.5
    outputs = []
    boundaries = cu_seqlens.tolist()
    for start, end in zip(boundaries[:-1], boundaries[1:], strict=True):
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))  # [heads, n, head_dim]
        scores = (q @ k.transpose(-1, -2)).float() * scale
        positions = torch.arange(end - start, device=query.device)
        distance = (positions[:, None] - positions[None, :]).abs()
        if alibi_slopes is not None:
            scores = scores - alibi_slopes.float()[:, None, None] * distance
        if bias is not None:  # a function of the offset alone: its top-left block is this sequence's
            scores = scores + bias[:, :end - start, :end - start].float()
        if window is not None:
            scores = scores.masked_fill(distance > window, float("-inf"))
        probabilities = F.dropout(scores.softmax(dim=-1), p=dropout_p).to(v.dtype)
        outputs.append((probabilities @ v).transpose(0, 1))
    return torch.cat(outputs, dim=0)


def varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, *, window: int | None = None) -> torch.Tensor:
    """PyTorch's varlen_attn on the packed layout: no padding, no mask tensors (CUDA only, fp16/bf16)."""
    from torch.nn.attention.varlen import varlen_attn

    args, kwargs = varlen_attn_arguments(query, key, value, cu_seqlens, max_seqlen, window)
    return varlen_attn(*args, **kwargs)  # type: ignore[no-any-return]


def flash_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                           max_seqlen: int, *, window: int | None = None, alibi_slopes: torch.Tensor | None = None,
                           dropout_p: float = 0.0) -> torch.Tensor:
    """flash-attn 2 on the packed layout, for ALiBi or attention dropout (CUDA only, fp16/bf16)."""
    from flash_attn import flash_attn_varlen_func

    args, kwargs = flash_attn_arguments(query, key, value, cu_seqlens, max_seqlen, window, alibi_slopes, dropout_p)
    return flash_attn_varlen_func(*args, **kwargs)  # type: ignore[no-any-return]
