#!/usr/bin/env python3
"""Fine-tune one pre-trained model under a grid of fine-tuning dropout rates and learning rates (issue 18).

The budget recipe's 40-minute model (arm d of `time_to_quality.py`) has a far better validation MLM
accuracy than HF's arm (b) yet fine-tuned worse on supersense. This asks which fine-tuning setting
that depends on: each (dropout, lr) of the grid fine-tunes the model with the same fine-tuning as
`time_to_quality.py` otherwise (the quickstart's recipe, the same tasks, rows and seeds). Dropout
sets the hidden, attention and classifier dropout together. It writes mean ± std per task and setting:

    .venv/bin/python benchmarks/finetune_settings.py \
        --model runs/benchmarks/time_to_quality/debian-docs/runs/d-40min-seed42/train/bertforge/final \
        --dropouts 0.0,0.1 --lrs 1e-3 --seeds 5

Results: `benchmarks/results/finetune_settings.{json,md}` (`--out` to change).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/finetune_settings.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.reports import machine_description, quiet_progress_bars, write_atomically
from benchmarks.common.tasks import DOWNSTREAM_SEEDS
from benchmarks.ttq.downstream import FineTuning, fine_tune_accuracy
from benchmarks.ttq.inputs import downstream_tasks
from benchmarks.ttq.settings import DOWNSTREAM_ROWS, DOWNSTREAM_TASKS

REPO = Path(__file__).resolve().parent.parent


def numbers(text: str) -> list[float]:
    return [float(value) for value in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a pre-trained model directory (a run's final/)")
    parser.add_argument("--dropouts", type=numbers, default=[0.1], help="fine-tuning dropout rates (comma-separated)")
    parser.add_argument("--lrs", type=numbers, default=[1e-3], help="fine-tuning learning rates (comma-separated; "
                        "the recipe's is 1e-3)")
    parser.add_argument("--pooling", default=None, help="model.pooling of the fine-tunes (pooler, cls, mean; the "
                        "model's own by default: BERT's tanh pooler on [CLS])")
    parser.add_argument("--tasks", default=",".join(DOWNSTREAM_TASKS), help="comma-separated")
    parser.add_argument("--seeds", type=int, default=5, help=f"fine-tuning seeds per task and setting "
                        f"(at most {len(DOWNSTREAM_SEEDS)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "benchmarks" / "finetune_settings"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "finetune_settings"))
    arguments = parser.parse_args()
    model = Path(arguments.model).resolve()
    if not (model / "config.json").is_file():
        parser.error(f"--model {model} has no config.json: give a model directory such as a run's final/")
    names = arguments.tasks.split(",")
    if unknown := set(names) - set(DOWNSTREAM_TASKS):
        parser.error(f"--tasks: unknown {sorted(unknown)}; choose from {', '.join(DOWNSTREAM_TASKS)}")
    seeds = DOWNSTREAM_SEEDS[:arguments.seeds]
    work = Path(arguments.work_dir).resolve()
    quiet_progress_bars()
    tasks = [task for task in downstream_tasks(DOWNSTREAM_ROWS) if task.name in names]
    pooled = "" if arguments.pooling is None else f", pooling {arguments.pooling}"
    grid = [(rate, lr, f"dropout {rate:g}, lr {lr:g}{pooled}") for rate, lr in itertools.product(arguments.dropouts, arguments.lrs)]
    settings = [setting for _, _, setting in grid]
    results: dict[str, dict[str, list[float]]] = {task.name: {} for task in tasks}
    pooling = () if arguments.pooling is None else (f"model.pooling={arguments.pooling}",)
    for rate, lr, setting in grid:
        overrides = FineTuning(lr, rate).overrides  # the benchmark's own lr and dropout overrides
        name = f"dropout{rate:g}-lr{lr:g}" + ("" if arguments.pooling is None else f"-{arguments.pooling}")
        for task in tasks:
            scores = results[task.name].setdefault(setting, [])
            for seed in seeds:
                scores.append(fine_tune_accuracy(str(model), task, name, seed, work, arguments.threads,
                                                 (*overrides, *pooling)))
                print(f"{task.name} {setting} seed {seed}: {scores[-1]:.4f}", flush=True)
    lines = [f"# Fine-tuning settings on {model}", "", f"Command: `{shlex.join(['python', *sys.argv])}`; "
             f"fine-tuning seeds {list(seeds)}; test accuracy (%), mean ± std over the seeds", "",
             "| task | " + " | ".join(settings) + " |", "|---|" + "---:|" * len(settings)]
    for task, by_setting in results.items():
        lines.append(f"| {task} | " + " | ".join(
            f"{100 * statistics.fmean(v):.2f} ± {100 * statistics.stdev(v):.2f}" if len(v) > 1 else f"{100 * v[0]:.2f}"
            for v in by_setting.values()) + " |")
    out = Path(arguments.out)
    write_atomically(out.with_suffix(".json"), json.dumps(
        {"command": shlex.join(["python", *sys.argv]), "model": str(model), "seeds": list(seeds),
         "machine": machine_description("cpu"), "accuracy": results}, indent=1))
    write_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
