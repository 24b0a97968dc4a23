"""The step-matched arms of `benchmarks/dropout_plateau.py` across pre-training seeds (`--stage seeds`): per arm and
seed, the step it leaves the MLM plateau, its MLM accuracy at each export, the last layer's common share at step 100
and its fine-tuned accuracy per learning rate (mean of the downstream seeds), then the mean and spread over seeds.

It reads what `--stage score` cached under the work directory (`scores/ARM-seedN.json`); an arm and seed not there
can come from an earlier report (`--earlier`, e.g. the single-seed `dropout_plateau.json`, whose runs are gone),
cut at the step cap so every arm is compared over the same steps."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.ttq.plateau_scoring import (
    TITLES,
    UNTRAINED,
    check_validation_cap,
    guess_description,
    plateau_exit,
)

FEATURE_STEP = 100  # the step whose common share and fine-tunes the single-seed study reported


def arm_seed_record(curve: list[dict[str, Any]], fine_tunes: dict[str, list[dict[str, Any]]], baseline: float,
                    step_cap: int | None, source: str, settings: list[str], seeds: list[int]) -> dict[str, Any]:
    """One arm and seed: its curve up to the cap, plateau exit, step-100 common share and fine-tune means."""
    curve = [point for point in curve if step_cap is None or point["step"] <= step_cap]
    at_feature_step = next((point for point in curve if point["step"] == FEATURE_STEP), None)
    return {
        "source": source,
        "plateau_exit_step": plateau_exit(curve, baseline),
        # on a 100-step grid too: the single-seed runs exported every 100 steps, the capped ones every 50
        "plateau_exit_step_100": plateau_exit([point for point in curve if point["step"] % 100 == 0], baseline),
        "exports_every": min((point["step"] for point in curve if point["step"] > 0), default=None),
        "mlm_accuracy": {str(point["step"]): point["accuracy"] for point in curve},
        "common_share_step_100": (at_feature_step["features"]["layers"][-1]["common_share"]
                                  if at_feature_step and "features" in at_feature_step else None),
        "common_share_last": (curve[-1]["features"]["layers"][-1]["common_share"]
                              if curve and "features" in curve[-1] else None),
        "fine_tuned": {step: setting_means(runs, settings, seeds) for step, runs in fine_tunes.items()
                       if step_cap is None or int(step) <= step_cap},
    }


def setting_means(runs: list[dict[str, Any]], settings: list[str], seeds: list[int]) -> dict[str, dict[str, Any]]:
    """Per fine-tuning setting of `settings`: the mean test accuracy over the downstream `seeds` it ran, those seeds
    and its one-class runs (Matthews correlation 0: every test row given one label)."""
    means = {}
    for setting in settings:
        chosen = [run for run in runs if run["setting"] == setting and run["seed"] in seeds]
        if not chosen:
            continue
        means[setting] = {"accuracy": statistics.fmean(run["accuracy"] for run in chosen),
                          "seeds": [run["seed"] for run in chosen],
                          "one_class_runs": sum(1 for run in chosen if not run.get("matthews"))}
    return means


def collect(work: Path, arms: list[str], seeds: list[int], baseline: float, step_cap: int | None,
            earlier: list[dict[str, Any]], settings: list[str], downstream_seeds: list[int],
            raw: dict[str, dict[str, Any]], validation_samples: int | None) -> dict[str, dict[str, Any]]:
    """{arm: {seed: record}} from the cached scores, else from the earlier reports (their arms of their seed); `raw`
    gets what each record was made from (every export's figures and features, each fine-tune and its loss)."""
    table: dict[str, dict[str, Any]] = {}
    for arm in arms:
        for seed in seeds:
            cached = work / "scores" / f"{arm}-seed{seed}.json"
            if cached.is_file():
                result, source = json.loads(cached.read_text()), str(cached.relative_to(work))
                check_validation_cap(result, validation_samples, cached)
            else:
                found = next((report for report in earlier if report["seed"] == seed and arm in report["arms"]), None)
                if found is None:
                    continue
                result, source = found["arms"][arm], found["source"]
            raw.setdefault(arm, {})[str(seed)] = result
            table.setdefault(arm, {})[str(seed)] = arm_seed_record(result["curve"], result.get("fine_tunes", {}),
                                                                   baseline, step_cap, source, settings,
                                                                   downstream_seeds)
    return table


def spread(values: list[float], digits: int = 4) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def seed_mean(values: list[float], seeds: int) -> str:
    """A fine-tuning cell's mean ± sd over the pre-training seeds that have it, saying so when not all of them do."""
    return spread(values, 3) + (f" ({len(values)} of {seeds} seeds)" if 0 < len(values) < seeds else "")


def render(report: dict[str, Any]) -> str:
    """Two tables, one row per arm and seed and a mean ± sd row per arm (sd over pre-training seeds): the plateau
    (exit step, MLM accuracy at every export, common share at step 100), then the fine-tuned accuracy."""
    table = report["arms"]
    records_of = [record for arm in table.values() for record in arm.values()]
    steps = sorted({int(step) for record in records_of for step in record["mlm_accuracy"] if int(step) > 0})
    settings = report["fine_tuning_settings"]
    ft_steps = sorted({int(step) for record in records_of for step in record["fine_tuned"]})
    cap = report.get("validation_samples_cap")
    subset = f", ~{cap} samples spread evenly over the split" if cap else ""
    lines = [f"Unigram guess (validation{subset}, fixed masks): {report['unigram_accuracy']:.4f}, "
             f"{guess_description(report)}; on the plateau = MLM accuracy at most {report['plateau_margin']} above "
             f"it; step cap {report['step_cap']}; supersense "
             f"majority class {report['majority_class_accuracy']}", "",
             "| arm | seed | plateau exit step | exit on the 100-step grid | common share @100 | "
             + " | ".join(f"MLM acc @{step}" for step in steps) + " |", "|---|---|---:|---:|---:|" + "---:|" * len(steps)]
    for name, seeds in table.items():
        if name == UNTRAINED:
            continue
        records = list(seeds.values())
        for seed, record in seeds.items():
            share = record["common_share_step_100"]
            lines.append(f"| {name} | {seed} | {record['plateau_exit_step'] or 'not left'} | "
                         f"{record['plateau_exit_step_100'] or 'not left'} | "
                         + ("–" if share is None else f"{share:.3f}") + " | "
                         + " | ".join(f"{record['mlm_accuracy'][str(step)]:.4f}" if str(step) in record["mlm_accuracy"]
                                      else "–" for step in steps) + " |")
        if len(records) > 1:
            exits = [record["plateau_exit_step"] for record in records]
            grid_exits = [record["plateau_exit_step_100"] for record in records]
            shares = [record["common_share_step_100"] for record in records
                      if record["common_share_step_100"] is not None]
            lines.append(f"| **{name}** | mean ± sd ({len(records)}) | "
                         + (spread([float(step) for step in exits], 0) if None not in exits else "not left on all")
                         + " | " + (spread([float(step) for step in grid_exits], 0) if None not in grid_exits
                                    else "not left on all")
                         + f" | {spread(shares, 3)} | "
                         + " | ".join(spread([record["mlm_accuracy"][str(step)] for record in records
                                              if str(step) in record["mlm_accuracy"]]) for step in steps) + " |")
    columns = [(step, setting) for step in ft_steps for setting in settings]
    lines += ["", f"Supersense test accuracy, mean of the downstream seeds {report['downstream_seeds']} per "
                  "pre-training seed (one-class: runs whose Matthews correlation is 0):", "",
              "| arm | seed | " + " | ".join(f"step {step}, {setting}" for step, setting in columns) + " |",
              "|---|---|" + "---:|" * len(columns)]
    for name, seeds in table.items():
        records = list(seeds.values())
        for seed, record in seeds.items():
            cells = []
            for step, setting in columns:
                chosen = record["fine_tuned"].get(str(step), {}).get(setting)
                cells.append("–" if chosen is None else f"{chosen['accuracy']:.3f}"
                             + (f" ({chosen['one_class_runs']} one-class)" if chosen["one_class_runs"] else "")
                             + (f" (seed {', '.join(map(str, chosen['seeds']))} only)"
                                if len(chosen["seeds"]) < len(report["downstream_seeds"]) else ""))
            lines.append(f"| {name} | {seed} | " + " | ".join(cells) + " |")
        if len(records) > 1:
            lines.append(f"| **{name}** | mean ± sd ({len(records)}) | " + " | ".join(
                seed_mean([record["fine_tuned"][str(step)][setting]["accuracy"] for record in records
                           if setting in record["fine_tuned"].get(str(step), {})], len(records))
                for step, setting in columns) + " |")
    lines += ["", "Arms: " + "; ".join(f"`{name}` {TITLES[name]}" for name in table), "",
              "Sources: " + "; ".join(f"{name} seed {seed}: {record['source']}" for name, seeds in table.items()
                                      for seed, record in seeds.items())]
    return "\n".join(lines) + "\n"


def summarize_seeds(arguments: Any, work: Path, data_dir: Path) -> None:
    from benchmarks.common.mlm import guess_record, unigram_baseline
    from benchmarks.common.reports import write_atomically
    from benchmarks.common.tasks import DOWNSTREAM_SEEDS
    from benchmarks.ttq.downstream import fine_tuning_grid
    from benchmarks.ttq.plateau_scoring import scored_validation
    from benchmarks.ttq.settings import RESULTS
    from bertforge.tasks.mlm_plateau import PLATEAU_MARGIN

    guess, baseline = unigram_baseline(data_dir, scored_validation(data_dir, arguments.validation_samples))
    earlier = []
    for path in arguments.earlier:
        report = json.loads(Path(path).read_text())
        earlier.append(report | {"source": Path(path).name})
    seeds = [int(seed) for seed in arguments.seeds.split(",")]
    arms = [arm for arm in arguments.arms if arm in TITLES] + ([UNTRAINED] if UNTRAINED not in arguments.arms else [])
    settings = [str(setting) for setting in fine_tuning_grid(arguments.downstream_lrs, arguments.downstream_dropouts)]
    downstream_seeds = list(DOWNSTREAM_SEEDS[:arguments.downstream_seeds])
    raw: dict[str, dict[str, Any]] = {}
    majority = next((report["majority_class_accuracy"] for report in earlier), None)
    report = {"command": " ".join(["python", *sys.argv]), "corpus": arguments.corpus, "seeds": seeds, "step_cap": arguments.max_steps,
              "unigram_guess": guess_record(guess), "unigram_accuracy": baseline,
              "validation_samples_cap": arguments.validation_samples, "plateau_margin": PLATEAU_MARGIN, "majority_class_accuracy": majority,
              "fine_tuning_settings": settings, "downstream_seeds": downstream_seeds,
              "arms": collect(work, arms, seeds, baseline, arguments.max_steps, earlier, settings, downstream_seeds,
                              raw, arguments.validation_samples)}
    destination = Path(arguments.report_dir) if arguments.report_dir else RESULTS
    write_atomically(destination / f"{arguments.report_name}.json", json.dumps(report, indent=1))
    write_atomically(destination / f"{arguments.report_name}_raw.json", json.dumps(raw, indent=1))
    summary = render(report)
    write_atomically(destination / f"{arguments.report_name}_summary.md", summary)
    print(summary)
