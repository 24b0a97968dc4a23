"""Rotary position embeddings (RoPE) on packed tokens.

The angles come from each token's own `position_ids` (its index within its sequence), so packing
several sequences into one row needs no special care. We use the "rotate half" layout of
Hugging Face (GPT-NeoX style), so ModernBERT weights load without permuting any projection.
"""

from __future__ import annotations

import torch


def rotary_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and sin of shape [tokens, 1, head_dim], broadcasting over heads."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids.device)
                                / head_dim))
    angles = position_ids.to(torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)[:, None, :]
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys [tokens, heads, head_dim]; computed in fp32 like HF, returned in x's dtype."""
    x32 = x.float()
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)
