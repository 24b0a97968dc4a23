"""The inference engine's settings (`--max-batch-tokens`, `--batch-size`, `--backend`), apart from the engine.

`bertforge.engine` imports torch; these checks do not need it, so a command refuses a bad flag before it
pays for that import (`bertforge.commands.preflight`). The engine re-exports every name here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bertforge.errors import BertforgeError

# benchmarks/engine_budget.py (all-MiniLM-L6-v2, 1,500 glosses of 18 tokens on average, 2 threads, a shared
# machine, two runs): with no count cap, 16,384 tokens gave 144 and 57 texts/s, 4,096 gave 83 and 48, 1,024 gave
# 33 and 30; with --batch-size 64 every budget gave 30-73 (the count binds first on short texts). The largest
# budget tried is the default; its activations stay small on a CPU (bert-base: about 200 MB in the MLP).
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_BATCH_SIZE = 64  # inputs per batch at most (the token budget usually binds first)
BACKENDS = ("torch", "onnx", "onnx-int8")  # what may run the model: bertforge.backends builds each


@dataclass(frozen=True)
class EngineSettings:
    """How the engine batches (`--max-batch-tokens`, `--batch-size`), what its progress bar says, and what runs
    the model (`--backend`: `bertforge.backends`)."""

    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    batch_size: int = DEFAULT_BATCH_SIZE
    label: str = "predicting"
    backend: str = "torch"  # torch | onnx | onnx-int8 (bertforge.backends.BACKENDS)

    def __post_init__(self) -> None:
        for flag, value in (("--max-batch-tokens", self.max_batch_tokens), ("--batch-size", self.batch_size)):
            if value < 1:
                raise BertforgeError(f"{flag} is {value}; give at least 1")
        if self.backend not in BACKENDS:
            raise BertforgeError(f"--backend {self.backend!r} is not one of {', '.join(BACKENDS)}")


def settings_of(args: argparse.Namespace, label: str) -> EngineSettings:
    """The engine settings of a command's `--max-batch-tokens`, `--batch-size` and `--backend`."""
    return EngineSettings(args.max_batch_tokens, args.batch_size, label, args.backend)
