"""Weight averaging for `final/`: an exponential moving average of the weights, or the mean of the last
K checkpoints (Composer's EMA; mmBERT's merging of its last checkpoints).

Both average a model's floating-point parameters and buffers by name (`named_parameters` lists a
tied weight once); integer buffers (position ids) are left as they are. The EMA is updated after
every optimizer step and saved in every checkpoint (`ema.safetensors`), so a resumed run continues
the same average bitwise. `final/origin.json` says which weights `final/` holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

EMA_FILE = "ema.safetensors"
ORIGIN_FILE = "origin.json"


def averaged_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors an average covers: every parameter (a tied one once) and every floating-point buffer."""
    tensors = dict(model.named_parameters())
    tensors.update((name, buffer) for name, buffer in model.named_buffers() if buffer.is_floating_point())
    return tensors


class WeightEMA:
    """`shadow = decay * shadow + (1 - decay) * weights` after each optimizer step, starting from the
    initial weights."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {name: tensor.detach().clone() for name, tensor in averaged_tensors(model).items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, tensor in averaged_tensors(model).items():
            self.shadow[name].mul_(self.decay).add_(tensor.detach(), alpha=1.0 - self.decay)

    def save(self, path: Path) -> None:
        save_file({name: tensor.contiguous().cpu() for name, tensor in self.shadow.items()}, str(path))

    def load(self, path: Path) -> None:
        saved = load_file(str(path))
        if saved.keys() != self.shadow.keys():
            raise KeyError(f"{path} holds the average of other weights ({sorted(saved.keys() ^ self.shadow.keys())[:3]})")
        for name, tensor in saved.items():
            self.shadow[name].copy_(tensor)

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        for name, tensor in averaged_tensors(model).items():
            tensor.copy_(self.shadow[name])


@torch.no_grad()
def average_checkpoints(model: nn.Module, checkpoints: list[Path], load_weights: Callable[[Path, nn.Module], None]) -> None:
    """Put into `model` the mean of the weights of `checkpoints` (each read by `load_weights`): summed in
    the checkpoints' order, then divided by their number."""
    total: dict[str, torch.Tensor] = {}
    for path in checkpoints:
        load_weights(path, model)
        for name, tensor in averaged_tensors(model).items():
            if name in total:
                total[name].add_(tensor)
            else:
                total[name] = tensor.detach().clone()
    for name, tensor in averaged_tensors(model).items():
        tensor.copy_(total[name] / len(checkpoints))


def write_origin(directory: Path, origin: dict[str, object]) -> None:
    """`final/origin.json`: which weights `final/` holds (an EMA, an average of checkpoints)."""
    (directory / ORIGIN_FILE).write_text(json.dumps(origin, indent=2) + "\n", encoding="utf-8")
