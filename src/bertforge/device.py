"""Where a model runs and how a batch gets there: one helper for the trainer, the evaluators and inference.

Loaders and evaluation splits build their batches on the CPU; each consumer moves the tensors to the
model's device just before the forward (`Trainer` for training steps, each task's `evaluate` for its
validation batches, the evaluators and `engine.torch_backend` for scoring and inference).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def batch_on_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors on `device` (the batch itself on the CPU, where they already are)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's (first) parameters: where its inputs must be."""
    return next(model.parameters()).device
