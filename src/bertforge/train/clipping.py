"""Gradient-norm clipping, folded into fused AdamW's step where it can be.

`torch.nn.utils.clip_grad_norm_` reads every gradient to take the norm, then multiplies every
gradient by the clip coefficient, by 1.0 when nothing is clipped: a second pass over all the
gradients (90 MB for MiniLM) every step. On CPU that pass is a few milliseconds of a
short-sentence tagger's ~140 ms step, paid whether or not anything is clipped. Fused AdamW reads
each gradient once anyway and divides it by its `grad_scale` (the hook AMP's `GradScaler` uses), so
the inverse coefficient goes there instead: the same update up to float rounding (g / (1/c) against
g * c; exactly the same when nothing is clipped), one pass fewer.

Only where that hook means what it says here: `torch.optim.AdamW` / `Adam` with `fused=True`, no
AMP `GradScaler` (it owns `grad_scale`), and unsharded gradients (FSDP's norm is a DTensor). Every
other optimizer (LAMB, StableAdamW, ZeRO-1's wrapper, foreach AdamW) clips with
`clip_grad_norm_` as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

EPS = 1e-6  # clip_grad_norm_'s: the coefficient is max_norm / (norm + 1e-6)


def folds_into(optimizer: torch.optim.Optimizer, *, amp_scaler: bool, sharded: bool) -> bool:
    """Whether `optimizer`'s step can apply the clip coefficient itself (see the module docstring)."""
    return (isinstance(optimizer, torch.optim.Adam) and not amp_scaler and not sharded
            and all(group.get("fused") for group in optimizer.param_groups))


class GradientClipping:
    def __init__(self, max_norm: float, *, fold: bool) -> None:
        self.max_norm, self.fold = max_norm, fold
        self._grad_scale: torch.Tensor | None = None

    def clip(self, model: nn.Module) -> torch.Tensor:
        """The total gradient norm; the gradients are clipped to `max_norm`, now or (folded) by the next `step`."""
        if not self.fold:
            return torch.nn.utils.clip_grad_norm_(model.parameters(), self.max_norm)
        norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        # >= 1, so a norm under max_norm leaves the gradients as they are; a tensor, so no device sync
        self._grad_scale = torch.clamp((norm + EPS) / self.max_norm, min=1.0).to(torch.float32)
        return norm

    @contextmanager
    def step(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Around `optimizer.step()`: hands it the pending scale, and takes it back whatever happens."""
        if self._grad_scale is None:
            yield
            return
        optimizer.grad_scale = self._grad_scale  # type: ignore[attr-defined]  # read by torch's fused step
        try:
            yield
        finally:
            del optimizer.grad_scale  # type: ignore[attr-defined]
            self._grad_scale = None
