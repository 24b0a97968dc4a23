"""The feed-forward sub-layer: BERT's dense-GELU-dense, or a gated GLU variant (GeGLU).

GeGLU (Shazeer 2020; Mosaic BERT, ModernBERT, Cramming) multiplies the activation by a second,
linear projection. The two projections are one matrix (`input` produces [value | gate]) so a single
matmul feeds both, in the order Hugging Face's ModernBERT uses (`Wi(x).chunk(2)` = input, gate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.models.config import EncoderConfig

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


class DenseMLP(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.input = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.bias)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.bias)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(self.activation(self.input(hidden)))


class GatedMLP(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.input = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.bias)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.bias)
        self.activation = ACTIVATIONS[config.activation]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        value, gate = self.input(hidden).chunk(2, dim=-1)
        return self.output(self.activation(value) * gate)


def build_mlp(config: EncoderConfig) -> nn.Module:
    return GatedMLP(config) if config.mlp == "geglu" else DenseMLP(config)
