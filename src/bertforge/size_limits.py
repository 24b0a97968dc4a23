"""Sizes checked before anything is allocated: a vocabulary to train, a model to build from its config.

A typo (`--vocab-size 1000000000`, `num_hidden_layers: 1000000` in a downloaded config.json) must
not abort in Rust, hang with memory growing for minutes, or die in a raw `MemoryError`. So sizes
are checked from numbers alone, first: a vocabulary against `MAX_VOCAB_SIZE`, a model's layers
against `MAX_LAYERS` and its fp32 weights (its parameter count, from its config, times 4 bytes)
against the machine's memory. The weights alone are a lower bound of what loading or training
needs, so that refusal is never wrong about the model not fitting.

`bertforge --no-size-limits <command>` lifts both (for a machine with more swap than memory, or a
vocabulary larger than any BERT's); it sets BERTFORGE_NO_SIZE_LIMITS=1, which the processes a
command starts (torchrun workers) inherit.
"""

from __future__ import annotations

import os

import psutil

from bertforge.errors import ConfigError

LIFT_VARIABLE = "BERTFORGE_NO_SIZE_LIMITS"
LIFT_FLAG = "--no-size-limits"
# 4x the largest vocabularies in use (XLM-R 250k, Gemma 256k); the tokenizer trainer panics long before 2**32
MAX_VOCAB_SIZE = 1 << 20
BYTES_PER_PARAMETER = 4  # fp32 weights: how every model is built before any cast
MAX_LAYERS = 1024  # 20x the deepest BERT-family encoder


def limits_lifted() -> bool:
    return os.environ.get(LIFT_VARIABLE) == "1"


def lift_limits() -> None:
    """`--no-size-limits`: for this process and the ones it starts."""
    os.environ[LIFT_VARIABLE] = "1"


def check_vocab_size(vocab_size: int, setting: str = "--vocab-size") -> None:
    if vocab_size > MAX_VOCAB_SIZE and not limits_lifted():
        raise ConfigError(f"{setting} {vocab_size:,} is more than {MAX_VOCAB_SIZE:,} tokens, the limit bertforge "
                          f"checks (the largest BERT-family vocabularies have about 250,000); give a smaller size, or "
                          f"run `bertforge {LIFT_FLAG} ...` to lift the limit")


def _gigabytes(size: float) -> str:
    return f"{size / 1e9:,.1f} GB"


def check_model_fits(parameters: int, layers: int, source: str, layers_key: str = "num_layers") -> None:
    """Refuse a model whose fp32 weights alone exceed this machine's memory, or with more than `MAX_LAYERS`
    layers (a million narrow layers fit in memory but take hours to build), before building it."""
    if layers > MAX_LAYERS and not limits_lifted():
        raise ConfigError(f"{source}: `{layers_key}` is {layers:,}, more than {MAX_LAYERS:,} layers, the limit bertforge "
                          f"checks (the deepest BERT-family encoders have 48); fix the value, or run "
                          f"`bertforge {LIFT_FLAG} ...` to lift the limit")
    needed = parameters * BYTES_PER_PARAMETER
    total = psutil.virtual_memory().total
    if needed > total and not limits_lifted():
        raise ConfigError(f"{source}: the model has about {parameters:,} parameters, {_gigabytes(needed)} of fp32 "
                          f"weights alone, more than this machine's {_gigabytes(total)} of memory; check its sizes "
                          f"(layers, hidden size, vocabulary), or run `bertforge {LIFT_FLAG} ...` to try anyway")
