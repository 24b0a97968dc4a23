"""StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language
models", Algorithm 2; the optimizer ModernBERT trains with): AdamW plus Adafactor's update clipping,
per tensor.

Where a tensor's gradient is suddenly large against its running second moment, Adam's update for
that tensor is large too (the second moment lags); StableAdamW divides that tensor's learning rate
by RMS_t = sqrt(mean(g^2 / u_t)) when it exceeds 1 — about 1 for a steady gradient. The moments use
the debiased betas of the paper (beta_hat = beta (1 - beta^(t-1)) / (1 - beta^t)), which makes
them Adam's bias-corrected moments, so without clipping a step is AdamW's. Weight decay is
decoupled and uses the unclipped learning rate, as in the paper and its reference code.
"""

from __future__ import annotations

from typing import Any

import torch

from bertforge.train.adam_moments import AdamMomentsOptimizer


class StableAdamW(AdamMomentsOptimizer):
    def update(self, parameter: torch.Tensor, grad: torch.Tensor, state: dict[str, Any],
               group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
        step = state["step"]
        beta1_hat = beta1 * (1 - beta1 ** (step - 1)) / (1 - beta1 ** step)
        beta2_hat = beta2 * (1 - beta2 ** (step - 1)) / (1 - beta2 ** step)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1_hat).add_(grad, alpha=1 - beta1_hat)
        exp_avg_sq.mul_(beta2_hat).addcmul_(grad, grad, value=1 - beta2_hat)
        # update clipping: a tensor whose gradient outruns its second moment takes a smaller step
        rms = (grad.square() / exp_avg_sq.clamp_min(eps * eps)).mean().sqrt()
        clipped_lr = lr / rms.clamp_min(1.0)
        if weight_decay:
            parameter.mul_(1 - lr * weight_decay)
        parameter.sub_(clipped_lr * exp_avg / (exp_avg_sq.sqrt() + eps))
