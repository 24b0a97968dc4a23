"""The pre-training data loader: a deterministic distributed sampler with exact resume, and batches
in the unpadded layout (our model) or the padded one (the Hugging Face reference model).

Sampler: `bertforge.data.sampler` (Megatron-like; shared with the trainer's map-style loader).
The order of epoch e is a permutation of the N samples that depends only on (seed, e), truncated
to a multiple of the global batch G; rank r of W takes the r-th contiguous slice of each global
batch, in micro-batches. The samples of every optimizer step are the same for any W, and a run
resumed from `consumed_samples` continues exactly where an uninterrupted one would be.

Workers: the sampler runs in the main process and hands whole micro-batch descriptors
(epoch, sample indices) to `torch.utils.data.DataLoader` workers, which return them in order;
masking is keyed by (seed, epoch, sample index). So batches are identical with 0, 1 or N workers.
Workers return numpy arrays, turned into tensors (zero-copy) in the main process: a pickled array
through the worker pipe is about twice as fast here as a tensor in shared memory (one shm segment
per tensor per batch).

Remote data: a dataset in a bucket fetches its shards as they are first read. The sampler runs in
the main process, so that is where `FetchingSampler` queues the shards of the next
`PREFETCH_MICRO_BATCHES` micro-batches for background download; a worker that needs a shard not
yet here fetches it itself (or waits on its lock): training starts once the first micro-batch's
shards arrived, not the whole dataset.

Order, not packing: the loader decides only which samples a micro-batch holds and in what order
(the sampler's deterministic order above). Samples were already filled with consecutive sentences
up to `seq_len` at prepare time, so most are full, and the unpadded layout carries no padding at
all. Laying the sequences out in rows is the model's job, the one packer whose layout matters:
`models.attention.place_in_rows` puts them into as few rows as fit for SDPA (whatever order they
come in), and flash-attn's varlen kernel needs no rows. The padded layout, for the HF model, holds
one sample per row: that model would attend across samples sharing a row.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bertforge.batch import padded_grid, unpadded_inputs
from bertforge.data.curriculum import DataCurriculum, StepData, cut_samples
from bertforge.data.masking import Masker, MaskingSettings
from bertforge.data.sampler import BatchGeometry, EpochPlan
from bertforge.data.shards import PretokenizedDataset
from bertforge.data.tokenizer import load_tokenizer
from bertforge.errors import ConfigError
from bertforge.processes import die_with_parent

LAYOUTS = ("unpadded", "padded")
PREFETCH_MICRO_BATCHES = 16  # how far ahead of the loader a remote dataset's shards are fetched
IGNORE_INDEX = -100
PAD_TO_MULTIPLE = 8


@dataclass(frozen=True)
class MicroBatch:
    """What a loader worker needs to build one micro-batch: the epoch, the sample indices and the settings
    of its step (`data/curriculum.py`; None = the masker's own)."""

    epoch: int
    indices: np.ndarray
    step_data: StepData | None = None


class TrainSampler:
    """This rank's micro-batches forever, from step `step` after `consumed_samples`: `bertforge.data.sampler`'s
    order, each stamped with its step's settings from the `curriculum` (of `total_steps` steps).

    Pre-training drops each epoch's partial global batch (`EpochPlan`'s default).
    """

    def __init__(self, plan: EpochPlan, *, seed: int, consumed_samples: int = 0, step: int = 0,
                 curriculum: DataCurriculum | None = None, total_steps: int | None = None) -> None:
        self.plan, self.seed, self.consumed_samples, self.step = plan, seed, consumed_samples, step
        self.curriculum, self.total_steps = curriculum or DataCurriculum(), total_steps
        # the trainer refuses such a config first (`Config.step_keyed_switches`); without steps `at` would be constant
        assert total_steps is not None or not self.curriculum.follows_steps, "a step-keyed curriculum needs total_steps"
        # fail at construction (not at the first batch) on a bad geometry or resume point
        next(self.plan.micro_batch_indices(seed=seed, consumed_samples=consumed_samples, step=step))

    def __iter__(self) -> Iterator[MicroBatch]:
        varies = self.curriculum.follows_steps
        for planned in self.plan.steps_from(seed=self.seed, consumed_samples=self.consumed_samples, step=self.step):
            step_data = self.curriculum.at(planned.step, self.total_steps) if varies else None
            yield from (MicroBatch(planned.epoch, indices, step_data) for indices in planned.micro_batches)


class EvalSampler:
    """One pass over the samples in order, this rank's contiguous share, in micro-batches."""

    def __init__(self, num_samples: int, *, micro_batch_size: int, world_size: int = 1, rank: int = 0) -> None:
        per_rank = math.ceil(num_samples / world_size)
        self.indices = np.arange(rank * per_rank, min((rank + 1) * per_rank, num_samples))
        self.micro_batch_size = micro_batch_size

    def __iter__(self) -> Iterator[MicroBatch]:
        for start in range(0, len(self.indices), self.micro_batch_size):
            yield MicroBatch(0, self.indices[start:start + self.micro_batch_size])

    def __len__(self) -> int:
        return math.ceil(len(self.indices) / self.micro_batch_size)


class FetchingSampler:
    """The micro-batches of `sampler`, unchanged, queueing the shards of the next `lookahead` ones for
    background download (in the order they will be read) as each is handed out.

    It never waits: a worker (or the main process) that reads a shard not yet here fetches it then,
    waiting on the file's lock if a prefetch is downloading it, so the first step waits only for the
    first micro-batch's shards. (Blocking here would also make DataLoader prime `prefetch_factor`
    micro-batches' shards before the first batch, and an error raised inside its index feeding
    leaves its queues half shut; a worker's error reaches the user as one line.)
    """

    def __init__(self, sampler: Iterable[MicroBatch], dataset: PretokenizedDataset,
                 lookahead: int = PREFETCH_MICRO_BATCHES) -> None:
        self.sampler, self.dataset, self.lookahead = sampler, dataset, lookahead

    def __iter__(self) -> Iterator[MicroBatch]:
        upcoming = iter(self.sampler)
        window: deque[MicroBatch] = deque()
        for micro in itertools.islice(upcoming, self.lookahead + 1):
            window.append(micro)
            self.dataset.prefetch(self.dataset.shards_of(micro.indices))
        while window:
            yield window.popleft()
            following = next(upcoming, None)
            if following is not None:
                window.append(following)
                self.dataset.prefetch(self.dataset.shards_of(following.indices))

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]


class PretrainingBatches(Dataset):
    """Turns a `MicroBatch` into a batch dict; runs inside loader workers."""

    def __init__(self, dataset: PretokenizedDataset, masker: Masker, *, layout: str = "unpadded",
                 pad_id: int = 0) -> None:
        if layout not in LAYOUTS:
            raise ConfigError(f"batch layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        self.dataset = dataset
        self.masker = masker
        self.layout = layout
        self.pad_id = pad_id
        self.sep_id = int(dataset.manifest["tokenizer"]["ids"]["sep"])

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, micro: MicroBatch) -> dict[str, Any]:  # type: ignore[override]
        indices = np.asarray(micro.indices, dtype=np.int64)
        flat, lengths, pairs = self.dataset.gather(indices)
        if micro.step_data is not None and micro.step_data.seq_len is not None:
            flat, lengths = cut_samples(flat, lengths, micro.step_data.seq_len, self.sep_id)
        mask_prob = micro.step_data.mask_prob if micro.step_data is not None else None
        masked = self.masker(flat, lengths, indices, micro.epoch, mask_prob=mask_prob)
        if self.layout == "unpadded":
            return _unpadded(masked.input_ids, lengths, pairs, masked.masked_positions, masked.masked_labels)
        return _padded(masked.input_ids, lengths, pairs, masked.masked_positions, masked.masked_labels, self.pad_id)


def _unpadded(input_ids: np.ndarray, lengths: np.ndarray, pairs: np.ndarray | None, masked_positions: np.ndarray,
              masked_labels: np.ndarray) -> dict[str, Any]:
    batch = unpadded_inputs(input_ids, np.zeros(len(input_ids), dtype=np.int64), lengths) | {
        "masked_positions": masked_positions.astype(np.int64),
        "masked_labels": masked_labels.astype(np.int64),
        "num_samples": len(lengths),
    }
    if pairs is not None:
        batch["token_type_ids"][batch["position_ids"] >= np.repeat(pairs[:, 0], lengths)] = 1
        batch["next_sentence_label"] = pairs[:, 1].astype(np.int64)
    return batch


def _padded(input_ids: np.ndarray, lengths: np.ndarray, pairs: np.ndarray | None, masked_positions: np.ndarray,
            masked_labels: np.ndarray, pad_id: int) -> dict[str, Any]:
    rows = len(lengths)
    width = int(math.ceil(int(lengths.max()) / PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE) if rows else 0
    row_of_token, column_of_token = padded_grid(lengths)
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    ids[row_of_token, column_of_token] = input_ids
    attention_mask = np.zeros((rows, width), dtype=np.int64)
    attention_mask[row_of_token, column_of_token] = 1
    labels = np.full((rows, width), IGNORE_INDEX, dtype=np.int64)
    labels[row_of_token[masked_positions], column_of_token[masked_positions]] = masked_labels
    token_type_ids = np.zeros((rows, width), dtype=np.int64)
    batch: dict[str, Any] = {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "token_type_ids": token_type_ids,
        "labels": labels,
        "num_samples": rows,
    }
    if pairs is not None:
        token_type_ids[(np.arange(width)[None, :] >= pairs[:, :1]) & (attention_mask == 1)] = 1
        batch["next_sentence_label"] = pairs[:, 1].astype(np.int64)
    return batch


def build_masker(dataset: PretokenizedDataset, settings: MaskingSettings) -> Masker:
    """A masker for the tokenizer the dataset was prepared with."""
    tokenizer = load_tokenizer(dataset.tokenizer_path)
    return Masker(settings, mask_id=tokenizer.mask_id, special_ids=tokenizer.special_ids(),
                  vocab_size=tokenizer.vocab_size,
                  word_continuation=tokenizer.word_continuation_table() if settings.whole_word else None)


def _unchanged(batch: dict[str, Any]) -> dict[str, Any]:
    return batch


class TensorBatches:
    """Re-iterable batches of a DataLoader whose workers return numpy arrays, as tensors."""

    def __init__(self, batches: PretrainingBatches, sampler: Any, num_workers: int) -> None:
        if batches.dataset.cache is not None:
            sampler = FetchingSampler(sampler, batches.dataset)
        # a private generator: DataLoader draws its worker base seed from it; drawing from the global
        # RNG would shift dropout after a resume and break bitwise-exact resumption
        self.loader = DataLoader(batches, sampler=sampler, batch_size=None, num_workers=num_workers,
                                 collate_fn=_unchanged, prefetch_factor=4 if num_workers > 0 else None,
                                 generator=torch.Generator().manual_seed(0),
                                 worker_init_fn=functools.partial(die_with_parent, os.getpid()))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for batch in self.loader:
            yield {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                   for key, value in batch.items()}


class PretrainingLoader:
    """The trainer's `ResumableLoader` for pre-training: `iterate(consumed_samples, step=...)` resumes exactly.

    Masking is seeded by `masking.seed` (default: `seed`), so order and masks come from one seed; the
    `curriculum` changes the mask rate with the step (`data/curriculum.py`).
    """

    def __init__(self, dataset: PretokenizedDataset, geometry: BatchGeometry, *, seed: int = 42,
                 num_workers: int = 0, layout: str = "unpadded", masking: MaskingSettings | None = None,
                 curriculum: DataCurriculum | None = None) -> None:
        self.dataset, self.geometry, self.seed, self.num_workers = dataset, geometry, seed, num_workers
        self.curriculum = curriculum or DataCurriculum()
        self.plan = EpochPlan(len(dataset), geometry)
        self.batches = PretrainingBatches(dataset, build_masker(dataset, masking or MaskingSettings(seed=seed)),
                                          layout=layout, pad_id=int(dataset.manifest["tokenizer"]["ids"]["pad"]))

    def iterate(self, consumed_samples: int, *, step: int = 0, total_steps: int | None = None) -> Iterator[dict[str, Any]]:
        sampler = TrainSampler(self.plan, seed=self.seed, consumed_samples=consumed_samples, step=step,
                               curriculum=self.curriculum, total_steps=total_steps)
        yield from TensorBatches(self.batches, sampler, self.num_workers)


def build_eval_loader(dataset: PretokenizedDataset, *, micro_batch_size: int, world_size: int = 1, rank: int = 0,
                      num_workers: int = 0, layout: str = "unpadded",
                      masking: MaskingSettings | None = None) -> TensorBatches:
    """One ordered pass over a split (this rank's share) with fixed masks (epoch 0): comparable evaluations."""
    sampler = EvalSampler(len(dataset), micro_batch_size=micro_batch_size, world_size=world_size, rank=rank)
    batches = PretrainingBatches(dataset, build_masker(dataset, masking or MaskingSettings()), layout=layout,
                                 pad_id=int(dataset.manifest["tokenizer"]["ids"]["pad"]))
    return TensorBatches(batches, sampler, num_workers)
