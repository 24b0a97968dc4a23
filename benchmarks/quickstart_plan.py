"""What the quickstart's pre-training buys, over seeds: the plan the suite once ran for one seed.

Each seed is one `run_quickstart(QuickstartPlan(...))` of the plan below (tokenizer, shards, 1,500 MLM steps of a
tiny BERT at 64 tokens, then 4 epochs on 1,000 supersense rows from the pre-trained model and from random weights,
tested on 1,000 rows), in its own directory `OUT/seed-N`. It prints and writes test accuracy of the pre-trained and
the untrained tiny BERT and of the majority class as mean ± standard deviation over the seeds, and the gap in points.
About 5 CPU-minutes per seed on one thread (docs/benchmarks.md, "Quickstart"):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quickstart_plan.py --out /tmp/qs-plan --seeds 1 2 3 4 5 \\
        --json benchmarks/results/quickstart_plan_seeds_1-5.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/quickstart_plan.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.reports import machine_description, write_atomically
from benchmarks.common.stats import mean_std
from bertforge.quickstart import QuickstartPlan, run_quickstart

# The plan tests/test_quickstart.py ran until its single-seed quality claim moved here.
PLAN = dict(pretrain_steps=1500, seq_len=64, train_rows=1000, validation_rows=200, test_rows=1000,
            finetune_epochs=4, minilm_epochs=0)
ARMS = {"majority class": "majority", "tiny BERT, pre-trained": "pretrained", "tiny BERT, no pre-training": "scratch"}


def run_seed(out: Path, seed: int) -> dict[str, float]:
    results = run_quickstart(QuickstartPlan(out_dir=out / f"seed-{seed}", seed=seed, **PLAN))
    return {ARMS[r.name]: float(r.test_accuracy) for r in results if r.name in ARMS and r.test_accuracy is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="working directory: one quickstart per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--json", type=Path, default=None, help="write the per-seed accuracies and summary here")
    args = parser.parse_args(argv)
    machine = machine_description("cpu")
    per_seed = {}
    for seed in args.seeds:
        per_seed[seed] = run_seed(args.out, seed)
        print(f"seed {seed}: " + ", ".join(f"{arm} {value:.4f}" for arm, value in per_seed[seed].items()), flush=True)

    accuracies = {arm: [per_seed[seed][arm] for seed in args.seeds] for arm in ARMS.values()}
    gaps = [per_seed[seed]["pretrained"] - per_seed[seed]["scratch"] for seed in args.seeds]
    for arm, values in accuracies.items():
        print(f"{arm}: {mean_std(values)} over seeds {args.seeds} (min {min(values):.4f}, max {max(values):.4f})")
    print(f"pre-trained - untrained: {mean_std(gaps, scale=100, digits=1)} points (min {100 * min(gaps):.1f})")
    if args.json:
        write_atomically(args.json, json.dumps({
            "plan": PLAN, "seeds": args.seeds, "machine": machine, "test_accuracy": accuracies,
            "mean": {arm: statistics.fmean(v) for arm, v in accuracies.items()},
            "stdev": {arm: statistics.stdev(v) if len(v) > 1 else None for arm, v in accuracies.items()},
            "gap_points": [100 * gap for gap in gaps],
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
