"""Seconds per optimizer step of step-matched recipe arms (`benchmarks/dropout_plateau.py --stage cost`), measured in
one warm process, the arms alternating for several rounds, so that the machine's load touches every arm alike: a
step-matched comparison (steps to leave the plateau) becomes a time comparison only through this ratio."""

from __future__ import annotations

import shutil
import statistics
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks.ttq.settings import DEFAULT_RECIPE, RunSpec, bertforge_config
from benchmarks.ttq.step_matched import StepArm

WARM_STEPS = 5  # the first steps of each run (allocations, the data loader's start) are not timed


class StepTimer:
    """An `on_step_end` hook: the wall-clock seconds between consecutive steps, ending the run after `steps`."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.stamps: list[float] = []

    def __call__(self, trainer: Any, state: Any) -> bool:
        self.stamps.append(time.perf_counter())
        return state.step >= self.steps

    def seconds_per_step(self) -> float:
        timed = self.stamps[WARM_STEPS:]
        return statistics.median(later - earlier for earlier, later in pairwise(timed))


def measure_step_costs(arms: list[StepArm], seed: int, data_dir: Path, work: Path, steps: int, rounds: int,
                       threads: int) -> dict[str, Any]:
    """Each arm's median seconds per step in each round, and its ratio to the first arm's in the same round."""
    import torch

    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    torch.set_num_threads(threads)
    per_round: list[dict[str, float]] = []
    for _ in range(rounds):
        seconds = {}
        for arm in arms:
            out_dir = work / "cost" / arm.name
            shutil.rmtree(out_dir, ignore_errors=True)  # a timed run is thrown away; each round starts afresh
            spec = RunSpec(arm="d", budget_minutes=0, seed=seed, model="bert-mini", threads=threads,
                           out_dir=str(out_dir), tokenizer_dir="", data_dir=str(data_dir),
                           recipe=str(DEFAULT_RECIPE), calibration=(0.0, 0))
            config = bertforge_config(spec, max_steps=arm.steps,
                                      overrides=("train.max_time_minutes=null", "log.plots=false", *arm.overrides))
            timer = StepTimer(steps)
            Trainer(config, PretrainTask(config), on_step_end=[timer]).fit()
            seconds[arm.name] = timer.seconds_per_step()
        per_round.append(seconds)
    shutil.rmtree(work / "cost", ignore_errors=True)
    first = arms[0].name
    return {"steps_per_run": steps, "timed_steps_per_run": steps - WARM_STEPS - 1, "rounds": per_round,
            "ratio_to_" + first: {arm.name: statistics.median(row[arm.name] / row[first] for row in per_round)
                                  for arm in arms}}
