"""Tasks used by the trainer tests: the bag-of-words example task with test-only twists.

They live in a file (not in the test module) because `bertforge train --task FILE:CLASS` and
torchrun workers load them by path, exactly as they load a user's task.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import torch
from torch import nn

from bertforge.errors import DataError
from bertforge.train.task import Batch, TaskData
from bertforge.train.user_task import load_task_class

# the example is a user's task file, not an importable module: load it by path, as `--task FILE:CLASS` does
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "bag_of_words.py"
BagOfWordsSupersense = load_task_class(f"{EXAMPLE}:BagOfWordsSupersense")


class NoDropout(BagOfWordsSupersense):
    """Deterministic across process counts: no dropout, so 1 and 2 ranks see the same function."""

    dropout = 0.0
    train_rows = 1024


class SmallWithDropout(BagOfWordsSupersense):
    """Dropout on, so exact resume also needs the RNG states restored."""

    dropout = 0.3
    train_rows = 1024


class StopsItselfWithSigterm(SmallWithDropout):
    """Sends itself SIGTERM during the forward pass of step `BERTFORGE_TEST_SIGTERM_AT`."""

    calls = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        StopsItselfWithSigterm.calls += 1
        if model.training and StopsItselfWithSigterm.calls == int(os.environ["BERTFORGE_TEST_SIGTERM_AT"]):
            os.kill(os.getpid(), signal.SIGTERM)
        return super().forward_step(batch, model)


class InjectsNaN(SmallWithDropout):
    """Returns a NaN loss at training micro-batch number `BERTFORGE_TEST_NAN_AT` (1-based)."""

    calls = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().forward_step(batch, model)
        if model.training:
            InjectsNaN.calls += 1
            if InjectsNaN.calls == int(os.environ["BERTFORGE_TEST_NAN_AT"]):
                loss = loss * float("nan")
        return loss, metrics


class CrashesOnceAtStep4(NoDropout):
    """Kills its own process (no clean-up) at step 4 of the first attempt; a restart runs normally."""

    calls = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        marker = Path(os.environ["BERTFORGE_TEST_CRASH_MARKER"])
        if model.training:
            CrashesOnceAtStep4.calls += 1
            if CrashesOnceAtStep4.calls == 2 * 4 and not marker.exists():
                if int(os.environ.get("RANK", "0")) == 1:
                    marker.write_text("crashed")
                    os._exit(1)
        return super().forward_step(batch, model)


class CorruptRowInWorker(NoDropout):
    """Its training rows raise a DataError when read, as a corrupt shard does inside a loader worker."""

    def build_datasets(self) -> TaskData:
        data = super().build_datasets()
        data.train = _CorruptRows(len(data.train))
        return data


class _CorruptRows:
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        raise DataError("shard-00000: checksum mismatch; re-run `bertforge prepare`")


class NaNLossFromStep(SmallWithDropout):
    """Every training micro-batch from number `BERTFORGE_TEST_NAN_FROM` (1-based) on has a NaN loss: a run
    that has diverged for good."""

    calls = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().forward_step(batch, model)
        if model.training:
            NaNLossFromStep.calls += 1
            if NaNLossFromStep.calls >= int(os.environ["BERTFORGE_TEST_NAN_FROM"]):
                loss = loss * float("nan")
        return loss, metrics


class _NaNGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, loss: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return loss.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return grad * float("nan")


class NaNGradients(SmallWithDropout):
    """Finite losses whose gradients are NaN: no step is skipped, the weights turn non-finite."""

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = super().forward_step(batch, model)
        return (_NaNGradient.apply(loss) if model.training else loss), metrics
