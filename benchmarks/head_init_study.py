"""The fine-tuning head's initial draw, compared by seed: BERT's truncated normal against `transformers`'
plain normal (issue 35 item 7), each also against HF `Trainer`.

Reads `benchmarks/parity.py --json` files of parity mode: the runs of one draw (`--truncated`,
`--normal`: bertforge's results of each file) and HF's (`--hf`: HF's results of each file). The two
draws are paired by seed: `parity.py --bertforge-head-init` re-draws the classifier from its own
generator, so two runs of one seed share their data order and dropout and differ in the head's
initial values only. One command per task:

    python benchmarks/head_init_study.py --task supersense --truncated A.json,B.json --normal C.json --hf A.json,D.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

if not __package__:  # run as `python benchmarks/head_init_study.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.stats import mean_std, welch_interval


def side_by_seed(paths: list[Path], task: str, side: str) -> dict[int, float]:
    """{seed: metric} of one side (`bertforge` or `hf`) of `task` over parity-mode JSON files; a seed
    given two different results is refused (a run is deterministic per seed on a CPU)."""
    found: dict[int, float] = {}
    for path in paths:
        entry = json.loads(path.read_text())["results"]["parity"].get(task)
        for seed, metric in zip(entry["seeds"], entry[side], strict=False) if entry else ():
            if found.setdefault(seed, metric) != metric:
                raise SystemExit(f"{path}: {task} seed {seed} {side} gave {metric}, another file {found[seed]}")
    return found


def paired_interval(differences: list[float]) -> tuple[float, float, float]:
    """Mean of the per-seed differences and its 95% interval (Student's t), in points (×100)."""
    from scipy import stats

    mean = statistics.fmean(differences)
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return 100 * mean, 100 * (mean - half), 100 * (mean + half)


def report(task: str, truncated: dict[int, float], normal: dict[int, float], hf: dict[int, float]) -> str:
    seeds = [seed for seed in normal if seed in truncated]
    if not seeds:
        raise SystemExit(f"{task}: no seed run with both draws")
    differences = [normal[s] - truncated[s] for s in seeds]
    mean, low, high = paired_interval(differences) if len(seeds) > 1 else (100 * differences[0], math.nan, math.nan)
    wins = sum(d > 0 for d in differences), sum(d == 0 for d in differences), sum(d < 0 for d in differences)
    lines = [f"{task}: {len(seeds)} seeds run with both draws ({', '.join(map(str, seeds))})", "",
             "| draw | mean ± std, paired seeds | mean ± std, every seed (n) | Δ vs HF Trainer [95% CI] |",
             "|---|---:|---:|---:|"]
    for name, runs in (("truncated (BERT)", truncated), ("plain normal (transformers)", normal)):
        every = list(runs.values())
        difference, low_hf, high_hf = welch_interval(every, list(hf.values()))
        lines.append(f"| {name} | {mean_std([runs[s] for s in seeds], 100, 2)} | {mean_std(every, 100, 2)} "
                     f"({len(every)}) | {difference:+.2f} [{low_hf:+.2f}, {high_hf:+.2f}] |")
    lines += [f"| HF Trainer | | {mean_std(list(hf.values()), 100, 2)} ({len(hf)}) | |", "",
              f"normal − truncated, paired by seed: {mean:+.2f} [{low:+.2f}, {high:+.2f}] points "
              f"(std of the differences {100 * statistics.stdev(differences) if len(seeds) > 1 else math.nan:.2f}); normal higher on {wins[0]}, "
              f"equal on {wins[1]}, lower on {wins[2]} seeds",
              "per seed (truncated → normal): " + ", ".join(
                  f"{s}: {100 * truncated[s]:.2f} → {100 * normal[s]:.2f}" for s in seeds)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    files = {"type": lambda s: [Path(p) for p in s.split(",")], "required": True}
    parser.add_argument("--task", required=True)
    parser.add_argument("--truncated", help="parity.py --json files of bertforge with BERT's truncated draw", **files)
    parser.add_argument("--normal", help="parity.py --json files of bertforge with the plain normal draw", **files)
    parser.add_argument("--hf", help="parity.py --json files holding HF Trainer's runs of the task", **files)
    args = parser.parse_args()
    print(report(args.task, side_by_seed(args.truncated, args.task, "bertforge"),
                 side_by_seed(args.normal, args.task, "bertforge"), side_by_seed(args.hf, args.task, "hf")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
