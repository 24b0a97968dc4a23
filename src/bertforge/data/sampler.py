"""Which samples each rank reads at each step: a deterministic, resumable distributed order.

Megatron's semantics, kept deliberately simple so that exact resume is a matter of arithmetic:
the order of epoch `e` is a permutation that is a pure function of (seed, e), cut to a multiple
of the global batch; rank `r` of `W` reads the r-th contiguous slice of each global batch and
splits it into micro-batches. The samples of a global batch therefore do not depend on the
world size, and resuming from `consumed_samples` (counted over all ranks) needs no saved state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bertforge.errors import ConfigError


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


def steps_per_epoch(num_samples: int, global_batch_size: int) -> int:
    return num_samples // global_batch_size


def micro_batch_indices(num_samples: int, geometry: BatchGeometry, *, seed: int, consumed_samples: int = 0,
                        shuffle: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """(epoch, sample indices) of this rank's micro-batches, forever, from `consumed_samples` on."""
    global_batch = geometry.global_batch_size
    per_epoch = steps_per_epoch(num_samples, global_batch) * global_batch
    if per_epoch == 0:
        raise ConfigError(f"the training data has {num_samples} samples, fewer than one global batch "
                          f"({global_batch}); lower `train.global_batch_size` or add data")
    if consumed_samples % global_batch:
        raise ConfigError(f"cannot resume from consumed_samples={consumed_samples}: not a multiple of the "
                          f"global batch size {global_batch}; keep `train.global_batch_size` when resuming")
    epoch, offset = divmod(consumed_samples, per_epoch)
    rank_share = global_batch // geometry.world_size
    while True:
        order = epoch_order(num_samples, seed, epoch, shuffle)
        for start in range(offset, per_epoch, global_batch):
            rank_slice = order[start + geometry.rank * rank_share: start + (geometry.rank + 1) * rank_share]
            for micro_start in range(0, rank_share, geometry.micro_batch_size):
                yield epoch, rank_slice[micro_start: micro_start + geometry.micro_batch_size]
        epoch, offset = epoch + 1, 0
