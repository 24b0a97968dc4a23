"""Dropout that is cheap on CPUs: the distribution of `F.dropout`, under half its cost.

Why our own: on a CPU, dropout's cost is drawing the mask. `F.dropout` fills a float tensor with
`bernoulli_`, one generator call per element; on 2 cores that took 9.3 ms forward + backward for
one bert-base hidden state of 1,818 tokens, and dropout (two hidden dropouts and the attention
probabilities per layer) was 6.7% of a bert-base training step (docs/benchmarks.md).

Here one generator call gives 64 random bits for four elements: `random_` over the full int64
range, viewed as int16, and an element is kept when its 16 bits are at or above p·2^16 − 2^15.
So p is rounded to a multiple of 2^-16 (0.1 → 0.1000061; a p below 2^-17, which would round to 0,
is left to `F.dropout`) and kept values are scaled by 1/(1 − p_rounded), which keeps the
expectation exact. The bool mask is saved for backward and applied with `torch.where`, which is
vectorised for a bool condition where `x * bool_mask` is not. Measured: see `benchmarks/dropout_cpu.py` for the per-call times and `benchmarks/model_step.py` for the step.

On other devices `F.dropout` is used: CUDA's is a fused Philox kernel already.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

MASK_BITS = 16
MASK_LEVELS = 1 << MASK_BITS


def cpu_keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool mask, True with probability 1 − p (p rounded to 2^-16), from the default generator."""
    count = 1
    for size in shape:
        count *= size
    dropped_levels = round(p * MASK_LEVELS)
    words = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(1 << 63), None)
    return (words.view(torch.int16)[:count] >= dropped_levels - MASK_LEVELS // 2).view(shape)


def keep_scale(p: float) -> float:
    """1 / (the probability of keeping an element), for p as `cpu_keep_mask` rounds it."""
    return MASK_LEVELS / (MASK_LEVELS - round(p * MASK_LEVELS))


class _MaskedScale(torch.autograd.Function):
    """x · keep · scale, saving only the bool mask for backward."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, keep: torch.Tensor,
                scale: float) -> torch.Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale  # type: ignore[attr-defined]
        return torch.where(keep, x, 0).mul_(scale)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (keep,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.where(keep, grad, 0).mul_(ctx.scale), None, None  # type: ignore[attr-defined]


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)`, with the cheaper mask on CPU tensors."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or round(p * MASK_LEVELS) == 0:
        return F.dropout(x, p, training)
    return _MaskedScale.apply(x, cpu_keep_mask(x.shape, p, x.device), keep_scale(p))


class Dropout(nn.Module):
    """`nn.Dropout` with `dropout` above; the same `p` attribute and `extra_repr`."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
