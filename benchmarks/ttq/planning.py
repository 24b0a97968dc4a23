"""Arm d's step plan where its recipe has switches keyed to the step count: two timed calibrations (the recipe's
dearest and cheapest step shapes), a step's seconds as a line in its tokens, and the most steps that fit the budget."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from benchmarks.ttq.clock import CalibrationClock
from benchmarks.ttq.settings import RunSpec, bertforge_config


def calibration_overrides(config: Any) -> tuple[str, ...]:
    """`config`'s most expensive step, every step: the full batch, full-length samples and the higher of its mask
    rates (the vocabulary projection runs only on masked rows). Its evaluation at the end, thrown away with the run,
    scores one validation sample."""
    mask_prob = max(config.data.mask_prob, config.data.mask_prob_start or 0.0)
    return ("run.name=calibration", "train.max_time_minutes=null", "train.batch_ramp_start=null",
            "data.seq_len_schedule=[]", "data.mask_schedule=constant", "data.mask_prob_start=null",
            f"data.mask_prob={mask_prob}", "data.validation_samples=1")


def cheapest_step(config: Any) -> tuple[int, int]:
    """(samples, tokens per sample) of `config`'s cheapest step: the batch ramp's first and the shortest phase's."""
    samples = config.train.batch_ramp_start or config.train.global_batch_size
    return samples, min([config.data.seq_len, *(phase.seq_len for phase in config.data.seq_len_schedule)])


def cheapest_calibration_overrides(config: Any) -> tuple[str, ...]:
    """`calibration_overrides` at the shape of `cheapest_step`: that batch, and samples cut to that length for every
    step (one phase to the last step of the calibration's step budget). The mask rate stays the higher one."""
    samples, seq_len = cheapest_step(config)
    phase = () if seq_len == config.data.seq_len else (f"data.seq_len_schedule=[{{seq_len: {seq_len}, until: 0.999999}}]",)
    return (*calibration_overrides(config), f"train.global_batch_size={samples}", *phase)


@dataclass(frozen=True)
class StepCost:
    """Seconds per step as a line in the step's tokens (samples × tokens per sample) through two timed shapes: the
    recipe's cheapest step and its most expensive one (one shape, one cost, when they are the same)."""
    cheap_tokens: int
    cheap_seconds: float
    full_tokens: int
    full_seconds: float

    @property
    def seconds_per_token(self) -> float:
        tokens = self.full_tokens - self.cheap_tokens
        return (self.full_seconds - self.cheap_seconds) / tokens if tokens else 0.0

    def seconds(self, tokens: Any) -> Any:
        """Of a step, or of an array of steps, of `tokens` tokens."""
        return self.cheap_seconds + self.seconds_per_token * (tokens - self.cheap_tokens)


def step_tokens(config: Any, total_steps: int) -> Any:
    """The tokens of each of `total_steps` steps (samples × tokens per sample) under `config`'s batch ramp and
    sequence-length phases: the same functions of (step, total steps) the trainer and the data path follow."""
    import numpy as np

    from bertforge.data.curriculum import DataCurriculum
    from bertforge.data.sampler import BatchRamp

    train = config.train
    steps = np.arange(total_steps)
    samples = np.full(total_steps, train.global_batch_size)
    if train.batch_ramp_start is not None:
        ramp = BatchRamp.of_run(train, total_steps, world_size=1)  # the benchmark trains in one process
        samples = np.array([ramp.size_at(int(step)) for step in steps])
    curriculum = DataCurriculum.from_config(config.data)
    lengths = np.array([curriculum.at(int(step), total_steps).seq_len or config.data.seq_len for step in steps])
    return samples * lengths


def steps_filling(budget_seconds: float, cost: StepCost, config: Any) -> int:
    """The most steps whose modelled seconds (`cost` over `step_tokens`) fit in `budget_seconds`: a step budget that a
    ramp's or a short phase's cheap early steps do not leave partly unused. Between the bounds that certainly fit
    (every step the dearest) and certainly do not (every step the cheapest), by bisection."""
    def fits(total_steps: int) -> bool:
        return float(cost.seconds(step_tokens(config, total_steps)).sum()) <= budget_seconds

    low = max(1, int(budget_seconds / max(cost.full_seconds, cost.cheap_seconds)))
    high = int(budget_seconds / min(cost.full_seconds, cost.cheap_seconds)) + 1
    if not fits(low):
        return low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def calibrate_bertforge(spec: RunSpec, config: Any, overrides: tuple[str, ...]) -> float:
    """Seconds per step of `config` with `overrides` (a calibration shape), timed by a short bertforge run on the same
    data that is then thrown away."""
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    calibration = bertforge_config(spec, max_steps=1_000_000, overrides=overrides)
    clock = CalibrationClock(*spec.calibration)
    result = Trainer(calibration, PretrainTask(calibration), on_step_end=[clock]).fit()  # stopped by `clock`
    shutil.rmtree(result.run_dir)
    return clock.seconds_per_step(result.state)


def step_cost(spec: RunSpec, config: Any) -> StepCost:
    """Both calibrations of `config` (one where its cheapest step is its dearest)."""
    full_tokens = config.train.global_batch_size * config.data.seq_len
    full_seconds = calibrate_bertforge(spec, config, calibration_overrides(config))
    samples, seq_len = cheapest_step(config)
    if samples * seq_len == full_tokens:
        return StepCost(full_tokens, full_seconds, full_tokens, full_seconds)
    return StepCost(samples * seq_len, calibrate_bertforge(spec, config, cheapest_calibration_overrides(config)),
                    full_tokens, full_seconds)
