#!/usr/bin/env python3
"""Does a model pre-trained without dropout fine-tune better with dropout? (issue 18)

The budget recipe pre-trains with dropout off. Its 40-minute model (arm d of `time_to_quality.py`)
had a far better MLM accuracy than HF's (b) yet fine-tuned worse. When that model's config said
dropout 0, every fine-tune started from it ran without dropout too, where (b)'s ran with 0.1.
This fine-tunes one pre-trained model with each dropout rate in `--dropouts` (hidden, attention and
classifier dropout together), with the same fine-tuning as `time_to_quality.py` (the quickstart's recipe,
the same tasks, rows and seeds), and writes mean ± std per task and rate:

    .venv/bin/python benchmarks/finetune_dropout.py --model runs/benchmarks/time_to_quality/debian-docs/runs/d-40min-seed42/train/final

Results: `benchmarks/results/finetune_dropout.{json,md}` (`--out` to change).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("bertforge_time_to_quality_benchmark",
                                              REPO / "benchmarks" / "time_to_quality.py")
assert spec is not None and spec.loader is not None
ttq = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = ttq
spec.loader.exec_module(ttq)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a pre-trained model directory (a run's final/)")
    parser.add_argument("--dropouts", default="0.0,0.1", help="dropout rates to fine-tune with (comma-separated)")
    parser.add_argument("--seeds", type=int, default=5, help=f"fine-tuning seeds per task and rate "
                        f"(at most {len(ttq.pv.DOWNSTREAM_SEEDS)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "benchmarks" / "finetune_dropout"))
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "finetune_dropout"))
    arguments = parser.parse_args()
    model = Path(arguments.model).resolve()
    if not (model / "config.json").is_file():
        parser.error(f"--model {model} has no config.json: give a model directory such as a run's final/")
    dropouts = [float(value) for value in arguments.dropouts.split(",")]
    seeds = ttq.pv.DOWNSTREAM_SEEDS[:arguments.seeds]
    work = Path(arguments.work_dir).resolve()
    ttq.pv.quiet_progress_bars()
    tasks = ttq.downstream_tasks(ttq.DOWNSTREAM_ROWS)
    results: dict[str, dict[str, list[float]]] = {}
    for rate in dropouts:
        overrides = (f"model.hidden_dropout={rate}", f"model.attention_dropout={rate}",
                     f"model.classifier_dropout={rate}")
        for task in tasks:
            scores = results.setdefault(task.name, {}).setdefault(f"{rate:g}", [])
            for seed in seeds:
                scores.append(ttq.fine_tune_accuracy(str(model), task, f"dropout{rate:g}", seed, work,
                                                     arguments.threads, overrides))
                print(f"{task.name} dropout {rate:g} seed {seed}: {scores[-1]:.4f}", flush=True)
    lines = [f"# Fine-tuning dropout on {model.name} ({model})", "",
             f"Command: `{shlex.join(['python', *sys.argv])}`; seeds {list(seeds)}", "",
             "| task | " + " | ".join(f"dropout {rate:g}" for rate in dropouts) + " |",
             "|---|" + "---|" * len(dropouts)]
    for task, by_rate in results.items():
        lines.append(f"| {task} | " + " | ".join(
            f"{100 * statistics.fmean(v):.2f} ± {100 * statistics.stdev(v):.2f}" if len(v) > 1 else f"{100 * v[0]:.2f}"
            for v in by_rate.values()) + " |")
    out = Path(arguments.out)
    ttq.pv.write_atomically(out.with_suffix(".json"), json.dumps(
        {"command": shlex.join(["python", *sys.argv]), "model": str(model), "seeds": list(seeds),
         "machine": ttq.pv.machine_description("cpu"), "accuracy": results}, indent=1))
    ttq.pv.write_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
