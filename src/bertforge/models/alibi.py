"""ALiBi (Press et al.): a per-head linear distance penalty instead of position embeddings.

Mosaic BERT uses the symmetric form, `-slope_h * |i - j|`, which flash-attn's `alibi_slopes`
also computes for non-causal attention; the SDPA and eager backends add it as a float bias.
"""

from __future__ import annotations

import math

import torch


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The paper's geometric slopes; for a head count that is not a power of two, its interleaving rule."""

    def power_of_two_slopes(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two_slopes(num_heads)
    else:
        closest = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two_slopes(closest) + power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32)
