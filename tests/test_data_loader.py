"""The loader: deterministic order and masks for any number of workers, exact resume on any world size."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from bertforge.data.pretraining_loader import PretrainingLoader, TrainSampler, build_eval_loader
from bertforge.data.sampler import BatchGeometry, EpochPlan
from bertforge.data.shards import PretokenizedDataset
from bertforge.errors import ConfigError

MICRO, GLOBAL = 4, 16


@pytest.fixture(scope="module")
def dataset(prepared_corpus: Path) -> PretokenizedDataset:
    return PretokenizedDataset(prepared_corpus, "train")


def take(loader: Iterable[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    return list(itertools.islice(iter(loader), count))


def batches(dataset: PretokenizedDataset, count: int, *, world_size: int = 1, rank: int = 0, consumed: int = 0,
            seed: int = 42, **options: Any) -> list[dict[str, Any]]:
    geometry = BatchGeometry(micro_batch_size=MICRO, global_batch_size=GLOBAL, world_size=world_size, rank=rank)
    return take(PretrainingLoader(dataset, geometry, seed=seed, **options).iterate(consumed), count)


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def test_the_unpadded_batch_follows_the_shared_contract(dataset: PretokenizedDataset) -> None:
    batch = batches(dataset, 1)[0]
    total = batch["input_ids"].shape[0]
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["cu_seqlens"][0] == 0
    assert batch["cu_seqlens"][-1] == total and len(batch["cu_seqlens"]) == MICRO + 1
    lengths = torch.diff(batch["cu_seqlens"])
    assert batch["max_seqlen"] == int(lengths.max()) and isinstance(batch["max_seqlen"], int)
    assert torch.equal(batch["position_ids"], torch.cat([torch.arange(int(n)) for n in lengths]))
    assert batch["token_type_ids"].shape == (total,) and set(batch["token_type_ids"].tolist()) <= {0, 1}
    assert torch.all(torch.diff(batch["masked_positions"]) > 0)
    assert batch["masked_labels"].shape == batch["masked_positions"].shape
    assert batch["next_sentence_label"].shape == (MICRO,) and batch["num_samples"] == MICRO
    for key in ("input_ids", "position_ids", "token_type_ids", "masked_positions", "masked_labels"):
        assert batch[key].dtype == torch.int64


def test_on_the_bundled_corpus_nsp_labels_are_balanced_and_masks_spare_special_tokens(
        dataset: PretokenizedDataset) -> None:
    labels = np.array([dataset.next_sentence_label(i) for i in range(len(dataset))])
    assert 0.4 < labels.mean() < 0.6
    chosen = maskable = 0
    for batch in batches(dataset, 25):
        original = batch["input_ids"].clone()
        original[batch["masked_positions"]] = batch["masked_labels"]
        special = original <= 4  # [PAD] [UNK] [CLS] [SEP] [MASK]; [unusedN] ids never occur in text
        assert not special[batch["masked_positions"]].any()
        chosen += len(batch["masked_positions"])
        maskable += int((~special).sum())
    assert abs(chosen / maskable - 0.15) < 0.02


def test_the_padded_batch_holds_the_same_samples_and_hf_style_labels(dataset: PretokenizedDataset) -> None:
    flat = batches(dataset, 1)[0]
    padded = batches(dataset, 1, layout="padded")[0]
    mask = padded["attention_mask"].bool()
    assert padded["input_ids"].shape[1] % 8 == 0
    assert torch.equal(padded["input_ids"][mask], flat["input_ids"])
    assert torch.equal(padded["token_type_ids"][mask], flat["token_type_ids"])
    labels = padded["labels"][mask]
    assert torch.equal(torch.nonzero(labels != -100).flatten(), flat["masked_positions"])
    assert torch.equal(labels[labels != -100], flat["masked_labels"])
    assert torch.all(padded["labels"][~mask] == -100)
    assert torch.equal(padded["next_sentence_label"], flat["next_sentence_label"])


@pytest.mark.parametrize("layout", ["unpadded", "padded"])
def test_batches_and_masks_are_identical_with_0_1_and_2_workers(dataset: PretokenizedDataset, layout: str) -> None:
    runs = [batches(dataset, 10, num_workers=workers, layout=layout) for workers in (0, 1, 2)]
    for run in runs[1:]:
        assert all(same(a, b) for a, b in zip(runs[0], run, strict=True))


def step_samples(world_size: int, consumed: int, steps: int, num_samples: int) -> list[list[int]]:
    """The sample indices of each optimizer step, gathered over all simulated ranks."""
    per_step = GLOBAL // (MICRO * world_size)
    samplers = [iter(TrainSampler(EpochPlan(num_samples, BatchGeometry(MICRO, GLOBAL, world_size, rank)), seed=5,
                                  consumed_samples=consumed)) for rank in range(world_size)]
    out = []
    for _ in range(steps):
        indices: list[int] = []
        for sampler in samplers:
            for micro in itertools.islice(sampler, per_step):
                indices.extend(micro.indices.tolist())
        out.append(indices)
    return out


def test_every_step_sees_the_same_samples_on_any_world_size_and_resume_continues_exactly(
        dataset: PretokenizedDataset) -> None:
    n = len(dataset)
    steps_per_epoch = n // GLOBAL
    uninterrupted = step_samples(1, 0, steps_per_epoch + 5, n)  # crosses an epoch boundary
    for world_size in (1, 2, 4):
        assert step_samples(world_size, 0, 8, n) == uninterrupted[:8]
        for resume_step in (3, steps_per_epoch - 1, steps_per_epoch + 1):
            resumed = step_samples(world_size, resume_step * GLOBAL, 4, n)
            assert resumed == uninterrupted[resume_step:resume_step + 4]
    epoch = [i for step in uninterrupted[:steps_per_epoch] for i in step]
    assert len(set(epoch)) == len(epoch) == steps_per_epoch * GLOBAL  # no sample twice in an epoch


@pytest.mark.parametrize("world_size", [1, 2])
def test_resuming_after_n_batches_yields_exactly_the_batches_of_an_uninterrupted_run(
        dataset: PretokenizedDataset, world_size: int) -> None:
    per_rank_steps = GLOBAL // (MICRO * world_size)

    n_steps, more = 3, 2
    for rank in range(world_size):
        uninterrupted = batches(dataset, (n_steps + more) * per_rank_steps, world_size=world_size, rank=rank, seed=5)
        resumed = batches(dataset, more * per_rank_steps, world_size=world_size, rank=rank, seed=5,
                          consumed=n_steps * GLOBAL, num_workers=1)
        assert all(same(a, b) for a, b in zip(uninterrupted[n_steps * per_rank_steps:], resumed, strict=True))


def test_resuming_on_a_different_world_size_gives_the_same_masked_samples(dataset: PretokenizedDataset) -> None:
    def samples_of_step(world_size: int, consumed: int) -> list[torch.Tensor]:
        out = []
        for rank in range(world_size):
            for batch in batches(dataset, GLOBAL // (MICRO * world_size), world_size=world_size, rank=rank, seed=5,
                                 consumed=consumed, layout="padded"):
                out.extend(torch.cat([batch["input_ids"][row], batch["labels"][row]])
                           for row in range(batch["num_samples"]))
        return out

    one = sorted(tuple(t.tolist()) for t in samples_of_step(1, 2 * GLOBAL))
    two = sorted(tuple(t.tolist()) for t in samples_of_step(2, 2 * GLOBAL))
    assert one == two


def test_eval_loader_covers_every_sample_once_across_ranks(dataset: PretokenizedDataset, tmp_path: Path) -> None:
    validation = PretokenizedDataset(dataset.url, "validation")
    seen = []
    for rank in range(2):
        for batch in build_eval_loader(validation, micro_batch_size=3, world_size=2, rank=rank):
            seen.append(batch["num_samples"])
    assert sum(seen) == len(validation)


def test_bad_batch_settings_are_config_errors(dataset: PretokenizedDataset) -> None:
    with pytest.raises(ConfigError, match="multiple of"):
        BatchGeometry(micro_batch_size=4, global_batch_size=10)
    with pytest.raises(ConfigError, match="not at a step boundary of global batch size 16"):
        TrainSampler(EpochPlan(len(dataset), BatchGeometry(4, 16)), seed=0, consumed_samples=8)
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        TrainSampler(EpochPlan(10, BatchGeometry(4, 16)), seed=0)
