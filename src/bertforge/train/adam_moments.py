"""The part LAMB and StableAdamW share: Adam's two moments kept per tensor, and a per-tensor update rule.

torch has neither optimizer; each subclass writes only `update`, its rule for one tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class AdamMomentsOptimizer(torch.optim.Optimizer):
    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                state = self.state[parameter]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(parameter)
                    state["exp_avg_sq"] = torch.zeros_like(parameter)
                state["step"] += 1
                self.update(parameter, parameter.grad, state, group)
        return loss

    def update(self, parameter: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
               group: dict[str, Any]) -> None:
        """Update the moments in `state` (its "step" already counts this step) and `parameter`."""
        raise NotImplementedError
