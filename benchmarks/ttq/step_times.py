"""How well a calibration plans HF's steps: the start of each of HF `Trainer`'s first steps (arm b as the study
builds it, on a study's prepared corpus), their steady pace after the first ones, and what each calibration setting
(seconds timed after warm-up steps, `--calibration`) would have said from the same steps.

    python -m benchmarks.ttq.step_times --corpus debian-docs --steps 130

It reads what `time_to_quality.py --corpus C` prepared in its work directory (run that first), trains on idle
cores for about as many seconds as steps, and writes benchmarks/results/time_to_quality_calibration.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common.hf_arms import StepTiming
from benchmarks.common.reports import fp32_matmul_gflops, machine_description, write_atomically
from benchmarks.ttq.arms import hf_trainers
from benchmarks.ttq.inputs import GROUP_TEXTS_DIR, TOKENIZER_DIR
from benchmarks.ttq.settings import CALIBRATION_SECONDS, CALIBRATION_WARMUP, RESULTS, WORK_DIR, RunSpec

SETTINGS = ((20.0, 5), (CALIBRATION_SECONDS, CALIBRATION_WARMUP), (90.0, 20))  # the first studies', today's, longer


def calibration_estimate(starts: list[float], seconds: float, warmup: int) -> dict[str, Any] | None:
    """What `StepTiming(seconds, warmup)` would have measured on steps begun at `starts`: its seconds per step and how
    many steps it timed; None where `starts` end before it is done."""
    timing = StepTiming(seconds, warmup)
    for start in starts:
        timing.starts.append(start)
        if timing.calibrated():
            return {"seconds": seconds, "warmup": warmup, "timed_steps": len(timing.starts) - 1 - warmup,
                    "seconds_per_step": timing.seconds_per_step()}
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", default="debian-docs", help="a corpus time_to_quality.py prepared (debian-docs)")
    parser.add_argument("--work-dir", default=str(WORK_DIR),
                        help="time_to_quality.py's work directory")
    parser.add_argument("--steps", type=int, default=130, help="steps to time (130)")
    parser.add_argument("--steady-from", type=int, default=40,
                        help="the steady pace is the mean step from this step on (40)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(RESULTS / "time_to_quality_calibration.json"))
    arguments = parser.parse_args()
    work = Path(arguments.work_dir) / arguments.corpus
    inputs = work / TOKENIZER_DIR, work / GROUP_TEXTS_DIR
    missing = [str(path) for path in inputs if not path.is_dir()]
    if missing:
        raise SystemExit(f"error: {', '.join(missing)} not found: run `python benchmarks/time_to_quality.py "
                         f"--corpus {arguments.corpus}` first, which prepares them")
    if arguments.steps <= arguments.steady_from + 1:
        parser.error(f"--steps {arguments.steps} must exceed --steady-from {arguments.steady_from} + 1")
    import torch

    torch.set_num_threads(2)
    machine = machine_description("cpu") | {"fp32_matmul_gflops": fp32_matmul_gflops()}
    with tempfile.TemporaryDirectory() as out_dir:
        spec = RunSpec(arm="b", budget_minutes=0.0, seed=arguments.seed, model="bert-mini", threads=2, out_dir=out_dir,
                       tokenizer_dir=str(inputs[0]), data_dir=str(inputs[1]), recipe=None, calibration=(0.0, 0))
        timing = StepTiming(float("inf"), 0)  # only records: the step budget stops the run
        hf_trainers(spec)(arguments.steps, timing, "steps").train()
    starts = timing.starts
    steps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    steady = steps[arguments.steady_from:]
    pace, spread = statistics.fmean(steady), statistics.stdev(steady)
    estimates = [estimate | {"over_steady": estimate["seconds_per_step"] / pace}
                 for estimate in (calibration_estimate(starts, *setting) for setting in SETTINGS) if estimate]
    report = {"command": shlex.join(["python", "-m", "benchmarks.ttq.step_times", *sys.argv[1:]]), "machine": machine,
              "corpus": arguments.corpus, "seed": arguments.seed, "step_seconds": steps,
              "steady": {"from_step": arguments.steady_from, "mean": pace, "sd": spread},
              "estimates": estimates}
    write_atomically(Path(arguments.out), json.dumps(report, indent=1))
    print(f"steady from step {arguments.steady_from}: {pace:.3f} s (sd {spread:.3f})")
    for estimate in estimates:
        print(f"{estimate['seconds']:g} s after {estimate['warmup']} steps: {estimate['timed_steps']} steps timed, "
              f"{estimate['seconds_per_step']:.3f} s a step, {estimate['over_steady']:.3f} of the steady pace")


if __name__ == "__main__":
    main()
