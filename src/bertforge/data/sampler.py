"""Which samples each rank reads at each step: a deterministic, resumable distributed order.

Megatron's semantics, kept deliberately simple so that exact resume is a matter of arithmetic:
the order of epoch `e` is a permutation that is a pure function of (seed, e); rank `r` of `W`
reads the r-th contiguous slice of each global batch and splits it into micro-batches. The
samples of a global batch therefore do not depend on the world size, and resuming from
`consumed_samples` (real samples, counted over all ranks) needs no saved state.

What happens to the samples left over after the last full global batch of an epoch is the
`EpochPlan`'s choice: pre-training drops them, fine-tuning trains on them as a smaller last step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from bertforge.errors import ConfigError

if TYPE_CHECKING:
    from bertforge.config import TrainSection


@dataclass(frozen=True)
class BatchGeometry:
    micro_batch_size: int
    global_batch_size: int
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        per_step = self.micro_batch_size * self.world_size
        if self.global_batch_size % per_step:
            raise ConfigError(
                f"`train.global_batch_size` ({self.global_batch_size}) must be a multiple of "
                f"`train.micro_batch_size` × world size ({self.micro_batch_size} × {self.world_size}); "
                f"e.g. set train.global_batch_size={per_step * max(1, round(self.global_batch_size / per_step))}")

    @property
    def accumulation_steps(self) -> int:
        return self.global_batch_size // (self.micro_batch_size * self.world_size)


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The global sample order of an epoch: a pure function of (seed, epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    generator = np.random.Generator(np.random.PCG64([seed, epoch]))
    return generator.permutation(num_samples).astype(np.int64)


@dataclass(frozen=True)
class StepShape:
    """One optimizer step: how many micro-batches each rank runs and how many samples all ranks see."""

    micro_batches: int
    samples: int


@dataclass(frozen=True)
class BatchRamp:
    """The global batch size of each step while it grows linearly from `start` to `full` over the first
    `steps` steps, rounded down to a multiple of `unit` (micro-batch size × world size)."""

    start: int
    full: int
    steps: int
    unit: int

    def __post_init__(self) -> None:
        if self.start % self.unit or self.full % self.unit:
            raise ConfigError(f"`train.batch_ramp_start` ({self.start}) must be a multiple of `train.micro_batch_size` "
                              f"× world size ({self.unit}); e.g. set train.batch_ramp_start="
                              f"{max(self.unit, self.start - self.start % self.unit)}")

    @classmethod
    def of_run(cls, train: TrainSection, total_steps: int, world_size: int) -> BatchRamp:
        """`train.batch_ramp_start` growing to the global batch over `batch_ramp_fraction` of a run's `total_steps`."""
        assert train.batch_ramp_start is not None
        return cls(train.batch_ramp_start, train.global_batch_size, math.ceil(train.batch_ramp_fraction * total_steps),
                   train.micro_batch_size * world_size)

    def size_at(self, step: int) -> int:
        if step >= self.steps:
            return self.full
        size = self.start + (self.full - self.start) * step // self.steps  # integers: the same on every machine
        return size - size % self.unit


@dataclass(frozen=True)
class PlannedStep:
    """One optimizer step as this rank reads it: its index, its epoch and the sample indices of its micro-batches."""

    step: int
    epoch: int
    micro_batches: list[np.ndarray]


@dataclass(frozen=True)
class EpochPlan:
    """How an epoch of `num_samples` is cut into optimizer steps.

    `keep_partial_batch=False` (pre-training) drops the samples after the last full global batch,
    as Megatron does: the next epoch reshuffles, and budgets there are steps or tokens.
    `keep_partial_batch=True` (fine-tuning) trains on them as a smaller last step, as HF `Trainer`
    and `DataLoader(drop_last=False)` do. On a small labeled set that is every example every
    epoch; the parity study measured dropping them at -0.5 accuracy points (docs/benchmarks.md).
    The kept remainder is cut to a multiple of the world size, so that every rank runs the same
    number of micro-batches and none is empty: at most `world_size - 1` samples per epoch are
    left out, none on one process. Its micro-batches hold at most `micro_batch_size` samples.

    With a `batch_ramp` the steps of the first part of the run are smaller (Cramming's batch-size
    warm-up); a step that would run past the end of an epoch takes only what is left of it, so an
    epoch is still `samples` samples and `consumed_samples` still locates the epoch by division.
    The shape of a step is then a function of (consumed samples, step), both in every checkpoint.
    """

    num_samples: int
    geometry: BatchGeometry
    keep_partial_batch: bool = False
    batch_ramp: BatchRamp | None = None  # smaller global batches in the first steps (train.batch_ramp_start)

    def __post_init__(self) -> None:
        if self.steps == 0:
            raise ConfigError(f"the training data has {self.num_samples} samples, fewer than one global batch "
                              f"({self.geometry.global_batch_size}); lower `train.global_batch_size` or add data")

    @property
    def full_steps(self) -> int:
        return self.num_samples // self.geometry.global_batch_size

    @property
    def remainder(self) -> int:
        """Samples trained on in the epoch's last, smaller step (0: none)."""
        if not self.keep_partial_batch:
            return 0
        left = self.num_samples % self.geometry.global_batch_size
        return left - left % self.geometry.world_size

    @property
    def steps(self) -> int:
        return self.full_steps + (1 if self.remainder else 0)

    @property
    def samples(self) -> int:
        """Samples trained on per epoch (`consumed_samples` grows by this much each epoch)."""
        return self.full_steps * self.geometry.global_batch_size + self.remainder

    def _position(self, consumed_samples: int) -> tuple[int, int]:
        epoch, offset = divmod(consumed_samples, self.samples)
        if self.batch_ramp is not None:
            if offset % self.batch_ramp.unit:
                raise ConfigError(f"cannot resume from consumed_samples={consumed_samples}: not at a step boundary of "
                                  f"the batch-size ramp (multiples of {self.batch_ramp.unit}); keep the train.batch_ramp_* "
                                  "keys, `train.micro_batch_size`, the world size and the training data when resuming")
        elif offset % self.geometry.global_batch_size:
            raise ConfigError(f"cannot resume from consumed_samples={consumed_samples}: not at a step boundary of "
                              f"global batch size {self.geometry.global_batch_size} over {self.samples} samples per "
                              "epoch; keep `train.global_batch_size` and the training data when resuming")
        return epoch, offset

    def _shape(self, offset: int, step: int) -> StepShape:
        """Step `step`, starting at `offset` in its epoch: the step's batch size, or what is left of the epoch
        (fine-tuning's smaller last step; with a ramp, any step that reaches the end of an epoch)."""
        batch = self.batch_ramp.size_at(step) if self.batch_ramp is not None else self.geometry.global_batch_size
        samples = min(batch, self.samples - offset)
        rank_share = samples // self.geometry.world_size
        return StepShape(math.ceil(rank_share / self.geometry.micro_batch_size), samples)

    def step_at(self, consumed_samples: int, step: int = 0) -> StepShape:
        """The shape of step `step` (which matters only under a batch ramp), starting after `consumed_samples`."""
        _, offset = self._position(consumed_samples)
        return self._shape(offset, step)

    def steps_from(self, *, seed: int, consumed_samples: int = 0, step: int = 0,
                   shuffle: bool = True) -> Iterator[PlannedStep]:
        """This rank's share of every optimizer step, forever, from step `step` after `consumed_samples` on."""
        geometry = self.geometry
        epoch, offset = self._position(consumed_samples)
        while True:
            order = epoch_order(self.num_samples, seed, epoch, shuffle)
            while offset < self.samples:
                shape = self._shape(offset, step)
                rank_share = shape.samples // geometry.world_size
                first = offset + geometry.rank * rank_share
                # near-equal pieces: a full step splits into micro_batch_size pieces exactly
                yield PlannedStep(step, epoch, np.array_split(order[first: first + rank_share], shape.micro_batches))
                offset += shape.samples
                step += 1
            epoch, offset = epoch + 1, 0

    def with_batch_ramp(self, ramp: BatchRamp) -> EpochPlan:
        """This plan with steps that grow from `ramp.start` samples to the global batch size."""
        return replace(self, batch_ramp=ramp)

    def micro_batch_indices(self, *, seed: int, consumed_samples: int = 0, step: int = 0,
                            shuffle: bool = True) -> Iterator[tuple[int, np.ndarray]]:
        """(epoch, sample indices) of this rank's micro-batches, forever, from step `step` after `consumed_samples`."""
        for planned in self.steps_from(seed=seed, consumed_samples=consumed_samples, step=step, shuffle=shuffle):
            yield from ((planned.epoch, piece) for piece in planned.micro_batches)

