"""The report: every arm at every budget over its seeds, the time each arm takes to reach (b)'s accuracy, the
curves."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.mlm import SEQ_LEN, VOCAB_SIZE
from benchmarks.common.reports import write_atomically
from benchmarks.common.stats import accuracy_standard_error, mean_std, welch_interval
from benchmarks.common.tasks import DOWNSTREAM_SEEDS
from benchmarks.ttq.downstream import dropout_text
from benchmarks.ttq.settings import ARM_TITLES, ARMS, DEV_EVERY, DOWNSTREAM_TASKS
from benchmarks.ttq.store import RunKey


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first minute at which `curve` ((minutes, accuracy) in time order) reaches `target`, linearly
    interpolated between the two points around the crossing; None if it never does. A curve already at
    the target at its first point gives that point's minute: an upper bound."""
    previous: tuple[float, float] | None = None
    for minutes, value in curve:
        if value >= target:
            if previous is None:
                return minutes
            before_minutes, before_value = previous
            return before_minutes + (minutes - before_minutes) * (target - before_value) / (value - before_value)
        previous = (minutes, value)
    return None


@dataclass
class Cell:
    """One arm at one budget, over its pre-training seeds."""

    arm: str
    budget_minutes: float
    runs: list[dict[str, Any]]

    def finals(self, metric: str) -> list[float]:
        return [run["curve"][-1][metric] for run in self.runs]

    def on_plateau(self, unigram_accuracy: float) -> int:
        """How many of the seeds ended on the MLM plateau: no more than `PLATEAU_MARGIN` above the unigram guess."""
        from bertforge.tasks.mlm_plateau import PLATEAU_MARGIN

        return sum(accuracy <= unigram_accuracy + PLATEAU_MARGIN for accuracy in self.finals("accuracy"))

    def mean_curve(self) -> list[tuple[float, float]]:
        """(minutes, accuracy) point by point, averaged over the seeds (their exports share the fractions)."""
        length = min(len(run["curve"]) for run in self.runs)
        return [(statistics.fmean(run["curve"][i]["minutes"] for run in self.runs),
                 statistics.fmean(run["curve"][i]["accuracy"] for run in self.runs)) for i in range(length)]


def cells_of(results: list[dict[str, Any]]) -> dict[tuple[str, float], Cell]:
    cells: dict[tuple[str, float], Cell] = {}
    for result in results:
        key = (result["arm"], result["budget_minutes"])
        cells.setdefault(key, Cell(*key, []))
        cells[key].runs.append(result)
    return dict(sorted(cells.items()))


def reach_times(cells: dict[tuple[str, float], Cell]) -> tuple[float | None, dict[str, tuple[float, float] | None]]:
    """(b)'s validation MLM accuracy at its largest budget, and per arm (minutes to reach it, the budget of the run
    that reached it first), None where none did."""
    b_budgets = [budget for arm, budget in cells if arm == "b"]
    if not b_budgets:
        return None, {}
    target = statistics.fmean(cells["b", max(b_budgets)].finals("accuracy"))
    times: dict[str, tuple[float, float] | None] = {}
    for arm in dict.fromkeys(arm for arm, _ in cells):
        reached = [(minutes, budget) for (other, budget), cell in cells.items() if other == arm
                   if (minutes := time_to_reach(cell.mean_curve(), target)) is not None]
        times[arm] = min(reached) if reached else None
    return target, times


@dataclass(frozen=True)
class Difference:
    """An arm's downstream mean minus (b)'s at the same budget, in points, with Welch's 95% intervals: over every
    fine-tune (which treats one model's fine-tunes as independent) and over the pre-training seeds' means (the
    stricter one; None with fewer than 2 seeds on either side)."""

    points: float
    over_fine_tunes: tuple[float, float] | None
    over_seed_means: tuple[float, float] | None

    def text(self) -> str:
        def interval(bounds: tuple[float, float] | None) -> str:
            return f"[{bounds[0]:+.1f}, {bounds[1]:+.1f}]" if bounds else "—"
        return f"{self.points:+.1f}, {interval(self.over_fine_tunes)}; {interval(self.over_seed_means)}"


def difference(arm_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]], task: str) -> Difference | None:
    """`Difference` of one task's accuracy, None where either side has no fine-tunes of it."""
    arm_values = [a for run in arm_runs for a in run["downstream"].get(task, [])]
    b_values = [a for run in b_runs for a in run["downstream"].get(task, [])]
    if not arm_values or not b_values:
        return None

    def bounds(a: list[float], b: list[float]) -> tuple[float, float] | None:
        _, low, high = welch_interval(a, b)
        return None if math.isnan(low) else (low, high)

    seed_means = [[statistics.fmean(run["downstream"][task]) for run in runs if run["downstream"].get(task)]
                  for runs in (arm_runs, b_runs)]
    points, _, _ = welch_interval(arm_values, b_values)
    return Difference(points, bounds(arm_values, b_values), bounds(*seed_means))


@dataclass(frozen=True)
class AgainstB:
    """One arm against (b) at one budget: the study's cell."""

    budget_minutes: float
    arm: str
    seeds: int
    b_seeds: int
    target: float  # (b)'s mean final validation MLM accuracy at this budget
    minutes_to_target: float | None  # along the arm's mean curve at this budget; None if it never gets there
    first_export_minutes: float  # a target reached at the first export is reached at most then
    downstream: dict[str, Difference | None]
    # The minutes to reach the target one standard error of its measurement lower and higher (None where
    # not reached; the band itself None where the runs do not record their masked-token count). Where both
    # curves cross a shelf the ratio swings with noise of that size, and this band shows by how much.
    minutes_within_error: tuple[float | None, float | None] | None = None


def target_error(b_cell: Cell, target: float) -> float | None:
    """One standard error of `target`, (b)'s mean final accuracy, as a measurement on the validation masks; None for
    runs recorded without their masked-token count."""
    masked = [run["curve"][-1].get("masked_tokens") for run in b_cell.runs]
    if None in masked:
        return None
    return accuracy_standard_error(target, min(masked))


def against_b(cells: dict[tuple[str, float], Cell]) -> list[AgainstB]:
    """Each arm against (b) at every budget both ran: time to (b)'s MLM accuracy there, downstream differences."""
    rows = []
    for (arm, budget), cell in cells.items():
        b_cell = cells.get(("b", budget))
        if arm == "b" or b_cell is None:
            continue
        curve, target = cell.mean_curve(), statistics.fmean(b_cell.finals("accuracy"))
        error = target_error(b_cell, target)
        band = None if error is None else (time_to_reach(curve, target - error), time_to_reach(curve, target + error))
        rows.append(AgainstB(budget, arm, len(cell.runs), len(b_cell.runs), target, time_to_reach(curve, target),
                             curve[0][0], {task: difference(cell.runs, b_cell.runs, task) for task in DOWNSTREAM_TASKS},
                             band))
    return sorted(rows, key=lambda row: (row.budget_minutes, row.arm))


def render_against_b(rows: list[AgainstB]) -> list[str]:
    if not rows:
        return []
    lines = ["", "Each arm against (b) at the same budget: the minute its mean curve reaches (b)'s mean final MLM "
             "accuracy in its run of that budget, the same ratio with that target one binomial standard error of its "
             "validation estimate higher and lower (how far the ratio swings with the measurement's noise: widely "
             "where the curves cross a shelf), and its downstream mean minus (b)'s in points with Welch's 95% "
             "intervals, over the fine-tunes (one model's fine-tunes taken as independent) and over the pre-training "
             "seeds' means (the stricter; — with fewer than 2 seeds a side):", "",
             "| budget (min) | arm | seeds (arm / b) | (b)'s MLM accuracy | minutes to reach it | budget ÷ that | "
             "budget ÷ that, (b)'s accuracy +1 s.e. / −1 s.e. | "
             + " | ".join(f"{task} − (b): points, [fine-tunes]; [seed means]" for task in DOWNSTREAM_TASKS) + " |",
             "|---:|---|---|---:|---:|---:|---:|" + "---|" * len(DOWNSTREAM_TASKS)]
    for row in rows:
        differences = [row.downstream[task].text() if row.downstream[task] else "—" for task in DOWNSTREAM_TASKS]
        lines.append(f"| {row.budget_minutes:g} | {ARM_TITLES[row.arm]} | {row.seeds} / {row.b_seeds} | "
                     f"{row.target:.4f} | {reach_text(row.minutes_to_target, row.first_export_minutes)} | "
                     f"{ratio_text(row.budget_minutes, row.minutes_to_target, row.first_export_minutes)} | "
                     f"{band_text(row)} | " + " | ".join(differences) + " |")
    return lines


def reach_text(minutes: float | None, first_export_minutes: float) -> str:
    if minutes is None:
        return "not reached"
    return f"{'≤ ' if minutes == first_export_minutes else ''}{minutes:.2f}"


def ratio_text(budget_minutes: float, minutes: float | None, first_export_minutes: float) -> str:
    """The budget over the minutes to reach the target; a target reached at the first export gives a lower bound."""
    if minutes is None:
        return "—"
    return f"{'≥ ' if minutes == first_export_minutes else ''}{budget_minutes / minutes:.2f}×"


def band_text(row: AgainstB) -> str:
    if row.minutes_within_error is None:
        return "—"
    lower_target, higher_target = row.minutes_within_error
    return " / ".join(ratio_text(row.budget_minutes, minutes, row.first_export_minutes)
                      for minutes in (higher_target, lower_target))


def runs_by_cpu(results: list[dict[str, Any]]) -> str:
    """How many of the report's runs each CPU trained: a study resumed on other machines mixes them, and the same
    minutes buy another number of steps on another CPU."""
    counts = Counter(result["machine"]["cpu"] for result in results)
    return ", ".join(f"{count} on {cpu}" for cpu, count in sorted(counts.items())) or "none"


def matmul_speeds(results: list[dict[str, Any]]) -> str:
    """Each run's fp32 matmul GFLOP/s, measured on idle cores as its invocation started (`fp32_matmul_gflops`): the
    CPU's name alone does not say how many steps its minutes bought that day. Runs from before the probe are counted."""
    speeds = {RunKey(result["arm"], result["budget_minutes"], result["seed"]).name: result["machine"]["fp32_matmul_gflops"]
              for result in results if "fp32_matmul_gflops" in result["machine"]}
    unprobed = len(results) - len(speeds)
    parts = [f"{name} {gflops:.0f}" for name, gflops in sorted(speeds.items())]
    if unprobed:
        parts.append(f"{unprobed} run(s) from before the probe")
    return ", ".join(parts) or "none"


def render(report: dict[str, Any], cells: dict[tuple[str, float], Cell]) -> str:
    from bertforge.tasks.mlm_plateau import PLATEAU_MARGIN

    settings, machine = report["settings"], report["machine"]
    data = report["data"]
    lines = [
        f"## Time to quality — {settings['model']}, seq {SEQ_LEN}, corpus {settings['corpus']}, torch threads: "
        f"{settings['threads']}", "",
        f"- Command: `{report['command']}`",
        f"- Machine: {machine['cpu']}, {machine['cpu_count']} cores; torch {machine['torch']}, transformers "
        f"{machine['transformers']}; load average {machine['load_average_start']:.2f} at the start, "
        f"{machine['load_average_end']:.2f} at the end (of this invocation; the store may hold runs of earlier ones)",
        f"- Runs: {runs_by_cpu(report['results'])} (a budget is minutes on that CPU)",
        f"- fp32 matmul GFLOP/s at each run's start: {matmul_speeds(report['results'])}",
        f"- Data: {data['train_documents']:,} training documents ({data['train_tokens']:,} tokens by bertforge's "
        f"count), WordPiece {VOCAB_SIZE}; validation: the last {data['validation_documents']:,} documents, "
        f"{data['validation_masked_tokens']:,} masked tokens (fixed masks), scored with stock "
        "`transformers.BertForMaskedLM` on every arm's HF export",
        f"- Downstream: `bertforge finetune` (recipes/quickstart-finetune-tiny.yaml) of each final model, "
        f"{settings['downstream_seeds']} seed(s) per task and pre-training seed, at the lr of "
        f"{', '.join(f'{lr:g}' for lr in settings['downstream_lrs'])} and the dropout of "
        f"{', '.join(dropout_text(rate) for rate in settings['downstream_dropouts'])} that scored best on a dev split (every "
        f"{DEV_EVERY}th training row, fine-tuned on the rest, seed {DOWNSTREAM_SEEDS[0]}) per model and task; supersense "
        f"{settings['downstream_rows']['supersense'][0]:,} / {settings['downstream_rows']['supersense'][1]:,} and "
        f"manpages {data['manpages_rows'][0]:,} / {data['manpages_rows'][1]:,} train / test rows",
        f"- Plateau: always answering the training data's most frequent maskable token "
        f"({data['unigram_guess']['token']!r}, as `bertforge pretrain` does) scores {data['unigram_accuracy']:.4f} "
        f"on the validation masks; a final MLM accuracy no more than {PLATEAU_MARGIN:g} above it is on the MLM plateau (column "
        "'on the plateau': how many of the cell's seeds)", "",
        "| arm | budget (min) | trained (min) | steps (planned) | tokens seen | MLM accuracy | on the plateau | MLM loss | "
        "supersense accuracy (%) | manpages accuracy (%) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (arm, budget), cell in cells.items():
        runs = cell.runs
        finals = [run["curve"][-1] for run in runs]
        planned = [run["training"].get("planned_steps") for run in runs]
        steps = f"{statistics.fmean(p['step'] for p in finals):,.0f}" + (
            f" ({statistics.fmean(planned):,.0f})" if None not in planned else "")
        downstream = {task: [a for run in runs for a in run["downstream"][task]] for task in DOWNSTREAM_TASKS}
        chosen = {task: sorted({run["downstream_setting"][task]["chosen_text"] for run in runs
                                if task in run["downstream_setting"]}) for task in DOWNSTREAM_TASKS}
        at = {task: f" ({'; '.join(texts)})" if texts else "" for task, texts in chosen.items()}
        lines.append(
            f"| {ARM_TITLES[arm]} | {budget:g} | {statistics.fmean(p['minutes'] for p in finals):.2f} | {steps} | "
            f"{statistics.fmean(p['tokens'] for p in finals):,.0f} | {mean_std(cell.finals('accuracy'))} | "
            f"{cell.on_plateau(data['unigram_accuracy'])} of {len(runs)} | {mean_std(cell.finals('loss'), digits=3)} | {mean_std(downstream['supersense'], 100, 2)}{at['supersense']} | "
            f"{mean_std(downstream['manpages'], 100, 2)}{at['manpages']} |")
    lines += ["", "MLM accuracy of each final model on the downstream tasks' test texts (15% masked once, the same masks "
              "for every arm): whether the pre-training corpus covers the text a task is about.", "",
              "| arm | budget (min) | " + " | ".join(f"{task} texts" for task in DOWNSTREAM_TASKS) + " |",
              "|---|---:|" + "---:|" * len(DOWNSTREAM_TASKS)]
    for (arm, budget), cell in cells.items():
        lines.append(f"| {ARM_TITLES[arm]} | {budget:g} | " + " | ".join(
            mean_std([run["task_text_mlm"][task]["accuracy"] for run in cell.runs]) for task in DOWNSTREAM_TASKS) + " |")
    target, times = reach_times(cells)
    lines.append("")
    if target is None:
        lines.append("Time to quality: arm (b) is not measured yet, so there is no target.")
    else:
        b_budget = max(budget for arm, budget in cells if arm == "b")
        lines += [f"Time to reach (b)'s validation MLM accuracy at {b_budget:g} minutes ({target:.4f}), interpolated "
                  "between exports (at 1/8, 1/4, 1/2, 3/4 of each budget and its end), the earliest over the arm's "
                  "budgets:", "", "| arm | minutes to reach | in the run of | (b)'s budget ÷ that |", "|---|---:|---:|---:|"]
        for arm, reached in times.items():
            if reached is None:
                lines.append(f"| {ARM_TITLES[arm]} | not reached | — | — |")
                continue
            minutes, budget = reached
            first = cells[arm, budget].mean_curve()[0][0]
            lines.append(f"| {ARM_TITLES[arm]} | {reach_text(minutes, first)} | {budget:g} min | "
                         f"{ratio_text(b_budget, minutes, first)} |")
    lines += render_against_b(against_b(cells))
    lines += ["", f"MLM accuracy and loss: mean ± std over pre-training seeds {settings['seeds_present']}; downstream: "
              "over pre-training × fine-tuning seeds. Planned steps: HF's arms, and arm (d) where its recipe has "
              "switches keyed to the step count, are sized by a timed calibration (see the script's docstring); a "
              "run that ends short of its budget ran out of planned steps."]
    return "\n".join(lines) + "\n"


def report_title(settings: dict[str, Any]) -> str:
    return f"Time to quality: {settings['model']}, {settings['corpus']} corpus, torch threads: {settings['threads']}"


def publish_report(stem: Path, report: dict[str, Any]) -> tuple[str, list[Path]]:
    """Render a report from its own settings, data and runs and write it (`write_report`); the table comes back for
    the console. Both the study and a re-render of a committed report publish through here, so they cannot drift.
    A field the table shows but the report lacks raises KeyError before any file is written."""
    cells = cells_of(report["results"])
    target, _ = reach_times(cells)
    table = render(report, cells)
    return table, write_report(stem, report, table, cells, target, report_title(report["settings"]))


def write_report(stem: Path, report: dict[str, Any], table: str, cells: dict[tuple[str, float], Cell],
                 target: float | None, title: str) -> list[Path]:
    """The report as `stem`.md (the table), .json (every result) and .png (the curves); each file is replaced
    whole or not at all, and no other file is touched."""
    paths = [stem.with_name(stem.name + suffix) for suffix in (".md", ".json", ".png")]
    write_atomically(paths[0], table)
    write_atomically(paths[1], json.dumps(report, indent=1))
    plot_curves(cells, target, title, paths[2])
    return paths


def plot_curves(cells: dict[tuple[str, float], Cell], target: float | None, title: str, path: Path) -> None:
    """Validation MLM accuracy vs training minutes: one colour per arm, one line per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(ARMS, ("tab:orange", "tab:red", "tab:blue", "tab:green"), strict=True))
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    labelled: set[str] = set()
    for (arm, _budget), cell in cells.items():
        minutes, accuracy = zip(*cell.mean_curve(), strict=True)
        axes.plot(minutes, accuracy, marker="o", markersize=3, color=colours[arm],
                  label=None if arm in labelled else ARM_TITLES[arm])
        labelled.add(arm)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label="(b) at its largest budget")
    axes.set_xlabel("training minutes (each arm's own clock)")
    axes.set_ylabel("validation MLM accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(temporary)
    plt.close(figure)
    temporary.replace(path)
