"""How an epoch is cut into steps: fine-tuning keeps the smaller last batch, pre-training drops it,
and either way a resume from any step boundary continues exactly."""

from __future__ import annotations

import itertools

import pytest

from bertforge.data.sampler import BatchGeometry, BatchRamp, EpochPlan, StepShape
from bertforge.errors import ConfigError

MICRO, GLOBAL = 4, 16


def plan(num_samples: int, world_size: int = 1, rank: int = 0, keep: bool = True) -> EpochPlan:
    return EpochPlan(num_samples, BatchGeometry(MICRO, GLOBAL, world_size, rank), keep_partial_batch=keep)


def steps(num_samples: int, world_size: int, count: int, consumed: int = 0,
          keep: bool = True) -> list[list[list[int]]]:
    """Each step's micro-batches, per rank: steps[s][rank * micro_batches + m] = the sample ids."""
    plans = [plan(num_samples, world_size, rank, keep) for rank in range(world_size)]
    iterators = [p.micro_batch_indices(seed=3, consumed_samples=consumed) for p in plans]
    out = []
    for _ in range(count):
        shape = plans[0].step_at(consumed)
        out.append([piece.tolist() for it in iterators for _, piece in itertools.islice(it, shape.micro_batches)])
        consumed += shape.samples
    return out


def test_fine_tuning_trains_on_every_sample_each_epoch_in_a_smaller_last_step() -> None:
    epoch_plan = plan(70)  # 4 full steps of 16 and one of 6
    assert (epoch_plan.steps, epoch_plan.samples) == (5, 70)
    assert epoch_plan.step_at(0) == StepShape(micro_batches=4, samples=16)
    assert epoch_plan.step_at(64) == StepShape(micro_batches=2, samples=6)  # 6 samples in pieces of at most 4
    assert epoch_plan.step_at(70) == StepShape(micro_batches=4, samples=16)  # the next epoch starts full
    epoch = steps(70, 1, 5)
    assert sorted(i for step in epoch for micro in step for i in micro) == list(range(70))
    assert [len(micro) for micro in epoch[-1]] == [3, 3]


def test_pre_training_drops_the_partial_batch() -> None:
    epoch_plan = plan(70, keep=False)
    assert (epoch_plan.steps, epoch_plan.samples) == (4, 64)
    first = steps(70, 1, 5, keep=False)
    assert all(sum(len(micro) for micro in step) == GLOBAL for step in first)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_rank_runs_the_same_number_of_non_empty_micro_batches_in_the_last_step(world_size: int) -> None:
    num_samples = 2 * GLOBAL + 7  # the remainder of 7 is cut to a multiple of the world size
    epoch_plan = plan(num_samples, world_size)
    kept = 7 - 7 % world_size
    assert epoch_plan.samples == 2 * GLOBAL + kept
    last = steps(num_samples, world_size, 3)[-1]
    shape = epoch_plan.step_at(2 * GLOBAL)
    assert len(last) == shape.micro_batches * world_size
    assert all(0 < len(micro) <= MICRO for micro in last)
    per_rank = [sum(len(m) for m in last[r * shape.micro_batches:(r + 1) * shape.micro_batches])
                for r in range(world_size)]
    assert per_rank == [kept // world_size] * world_size
    epoch = [i for step in steps(num_samples, world_size, 3) for micro in step for i in micro]
    assert len(epoch) == len(set(epoch)) == epoch_plan.samples


@pytest.mark.parametrize("world_size", [1, 2])
def test_full_steps_see_the_same_samples_on_any_world_size(world_size: int) -> None:
    one = [sorted(i for micro in step for i in micro) for step in steps(70, 1, 4)]
    many = [sorted(i for micro in step for i in micro) for step in steps(70, world_size, 4)]
    assert many == one


@pytest.mark.parametrize("world_size", [1, 2])
def test_resuming_at_any_step_boundary_continues_exactly_across_epochs(world_size: int) -> None:
    num_samples = 70
    epoch_plan = plan(num_samples, world_size)
    uninterrupted = steps(num_samples, world_size, 3 * epoch_plan.steps)
    consumed = 0
    for index in range(2 * epoch_plan.steps):
        resumed = steps(num_samples, world_size, 4, consumed=consumed)
        assert resumed == uninterrupted[index:index + 4], f"resume at step {index}"
        consumed += epoch_plan.step_at(consumed).samples


def test_a_resume_point_off_a_step_boundary_and_too_little_data_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="not at a step boundary"):
        next(plan(70).micro_batch_indices(seed=0, consumed_samples=8))
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        plan(10, keep=False)
    assert plan(10).steps == 1  # fine-tuning on fewer rows than a batch trains on one smaller step


# --- the batch-size ramp (train.batch_ramp_start) -----------------------------------------------------


def test_a_batch_ramp_grows_linearly_in_multiples_of_the_unit_then_stays_full() -> None:
    ramp = BatchRamp(start=16, full=64, steps=10, unit=16)
    assert [ramp.size_at(step) for step in range(12)] == [16, 16, 16, 16, 32, 32, 32, 48, 48, 48, 64, 64]
    with pytest.raises(ConfigError, match=r"`train.batch_ramp_start` \(12\) must be a multiple of .* \(8\); e.g. set "
                                          r"train.batch_ramp_start=8"):
        BatchRamp(start=12, full=64, steps=10, unit=8)


def ramped_steps(world_size: int, count: int, consumed: int = 0, step: int = 0,
                 keep: bool = False) -> tuple[list[list[int]], list[int]]:
    """Each step's samples over all ranks and the consumed samples after each, under a ramp 8 -> 16 over 3 steps."""
    ramp = BatchRamp(start=8, full=GLOBAL, steps=3, unit=8)
    plans = [plan(70, world_size, rank, keep).with_batch_ramp(ramp) for rank in range(world_size)]
    iterators = [p.steps_from(seed=3, consumed_samples=consumed, step=step) for p in plans]
    samples, consumed_after = [], []
    for _ in range(count):
        shape = plans[0].step_at(consumed, step)
        planned = [next(iterator) for iterator in iterators]
        assert all(p.step == step and len(p.micro_batches) == shape.micro_batches for p in planned)
        samples.append([int(i) for p in planned for micro in p.micro_batches for i in micro])
        consumed, step = consumed + shape.samples, step + 1
        consumed_after.append(consumed)
    return samples, consumed_after


@pytest.mark.parametrize("world_size", [1, 2])
def test_a_batch_ramp_keeps_epochs_whole_and_resumes_exactly_at_any_step(world_size: int) -> None:
    samples, consumed = ramped_steps(world_size, 12)
    # sizes 8, 8, 8 (8 + 8 * 2 // 3 = 13, rounded down to 8), then 16; the epoch of 64 ends with a step of the 8 left
    assert [len(step) for step in samples] == [8, 8, 8, 16, 16, 8, 16, 16, 16, 16, 16, 16]
    assert consumed[5] == 64
    first_epoch = [i for step in samples[:6] for i in step]
    assert len(first_epoch) == len(set(first_epoch)) == 64
    assert samples == ramped_steps(1, 12)[0]  # the same samples in each step on any world size
    for index in range(1, 11):
        resumed, _ = ramped_steps(world_size, 12 - index, consumed=consumed[index - 1], step=index)
        assert resumed == samples[index:], f"resume at step {index}"


def test_a_batch_ramp_in_fine_tuning_still_trains_on_every_sample_each_epoch() -> None:
    samples, consumed = ramped_steps(1, 8, keep=True)
    assert [len(step) for step in samples] == [8, 8, 8, 16, 16, 14, 16, 16]  # the epoch of 70 ends with its 14 left
    assert sorted(i for step in samples[:6] for i in step) == list(range(70))


def test_a_resume_point_off_the_ramp_unit_is_a_config_error() -> None:
    ramped = plan(70, keep=False).with_batch_ramp(BatchRamp(start=8, full=GLOBAL, steps=3, unit=8))
    with pytest.raises(ConfigError, match=r"not at a step boundary of the batch-size ramp \(multiples of 8\)"):
        ramped.step_at(4, 1)
