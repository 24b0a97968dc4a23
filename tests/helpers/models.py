"""Tiny encoders and packed batches for the model tests (packing, dropout), and tiny encoders over MiniLM's
vocabulary for the inference tests (engine, backends, parts)."""

from __future__ import annotations

import torch

from bertforge.models import EncoderConfig

VARIANTS = {
    "classic": dict(),
    "alibi-geglu": dict(position="alibi", mlp="geglu"),
    "modern-local": dict(position="rope", mlp="geglu", norm="pre", bias=False, type_vocab_size=0,
                         local_attention_window=6, global_every_n=2),
    "alibi-local": dict(position="alibi", local_attention_window=4, global_every_n=3),
}


def tiny_config(**switches: object) -> EncoderConfig:
    values: dict[str, object] = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
                                     max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0,
                                     initializer_range=0.2)
    values.update(switches)
    return EncoderConfig(**values)  # type: ignore[arg-type]


MINILM_TINY_LENGTH = 40  # learned positions of `minilm_sized_config`'s encoders: longer texts are truncated


def minilm_sized_config(**changes: object) -> EncoderConfig:
    """A 2-layer, 32-wide random encoder over all-MiniLM-L6-v2's vocabulary (its tokenizer serves it), texts up to
    MINILM_TINY_LENGTH tokens."""
    values: dict[str, object] = dict(vocab_size=30528, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                     max_position_embeddings=MINILM_TINY_LENGTH, hidden_dropout=0.0,
                                     attention_dropout=0.0, initializer_range=0.2)
    values.update(changes)
    return EncoderConfig(**values)  # type: ignore[arg-type]


def packed_batch(lengths: list[int], seed: int = 0) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {"input_ids": torch.randint(0, 64, (sum(lengths),), generator=generator), "cu_seqlens": cu_seqlens,
            "max_seqlen": max(lengths)}
