"""Turn a task's map-style dataset into a `ResumableLoader` sharded by the deterministic sampler."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from bertforge.data.sampler import BatchGeometry, EpochPlan
from bertforge.processes import die_with_parent


class _IndexBatches:
    """The sampler as a DataLoader batch sampler; epoch-aware datasets receive (epoch, index)."""

    def __init__(self, plan: EpochPlan, seed: int, consumed_samples: int, step: int, shuffle: bool,
                 epoch_aware: bool) -> None:
        self.plan, self.seed, self.consumed_samples, self.step = plan, seed, consumed_samples, step
        self.shuffle, self.epoch_aware = shuffle, epoch_aware

    def __iter__(self) -> Iterator[list[Any]]:
        for epoch, indices in self.plan.micro_batch_indices(seed=self.seed, consumed_samples=self.consumed_samples,
                                                            step=self.step, shuffle=self.shuffle):
            yield [(epoch, int(i)) for i in indices] if self.epoch_aware else [int(i) for i in indices]


class MapStyleLoader:
    """Micro-batches of a map-style dataset for one rank; `iterate(consumed)` resumes exactly.

    Every example is trained on every epoch: the last, smaller global batch is kept (`EpochPlan`).
    """

    def __init__(self, dataset: Dataset, collate: Callable[[list[Any]], dict[str, Any]], geometry: BatchGeometry,
                 *, seed: int, num_workers: int = 0, shuffle: bool = True) -> None:
        self.dataset, self.collate = dataset, collate
        self.seed, self.num_workers, self.shuffle = seed, num_workers, shuffle
        self.plan = EpochPlan(len(dataset), geometry, keep_partial_batch=True)  # type: ignore[arg-type]

    def iterate(self, consumed_samples: int, *, step: int = 0, total_steps: int | None = None) -> Iterator[dict[str, Any]]:
        """The batches from step `step` (after `consumed_samples`) on (the step matters under a batch ramp);
        `total_steps` is for loaders whose data changes with the step, which this one does not."""
        batches = _IndexBatches(self.plan, self.seed, consumed_samples, step, self.shuffle,
                                epoch_aware=bool(getattr(self.dataset, "epoch_aware", False)))
        # a private generator: DataLoader draws worker seeds from it, and drawing them from the
        # global RNG would shift dropout after a resume and break bitwise-exact resumption
        generator = torch.Generator().manual_seed(self.seed)
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate,
                            num_workers=self.num_workers, persistent_workers=False, generator=generator,
                            worker_init_fn=functools.partial(die_with_parent, os.getpid()),
                            prefetch_factor=4 if self.num_workers else None)
        yield from loader


def iterate_once(dataset: Dataset, collate: Callable[[list[Any]], dict[str, Any]], batch_size: int,
                 rows: Sequence[int] | None = None) -> Iterator[dict[str, Any]]:
    """Evaluation batches in order, each sample once (optionally only those of `rows`)."""
    rows = range(len(dataset)) if rows is None else rows  # type: ignore[arg-type]
    for start in range(0, len(rows), batch_size):
        with torch.no_grad():
            yield collate([dataset[i] for i in rows[start:start + batch_size]])
