"""Curves of a run from its `metrics.jsonl`: loss, accuracies, learning rate, throughput."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError
from bertforge.run_directory import METRICS_FILE, RunDirectory

# what is worth a picture, in the order users look at them
PLOTTED = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "accuracy", "f1_macro", "matthews", "pearson",
           "spearman", "lr", "tokens_per_s", "samples_per_s", "mfu", "grad_norm")
CURVE_SIZE = (6.0, 3.5)  # inches


def read_metrics(path: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{metric: {split: [(step, value), ...]}}."""
    series: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise BertforgeError(f"{path}:{number}: not a JSON line; the file is damaged") from None
        for key, value in record.items():
            if key not in ("step", "split", "time") and isinstance(value, int | float):
                series[key][record["split"]].append((int(record["step"]), float(value)))
    return series


def run_metrics(run_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    metrics_file = RunDirectory(run_dir).metrics_file
    if not metrics_file.is_file():
        raise BertforgeError(f"{run_dir} has no {METRICS_FILE}; give a run directory written by bertforge")
    return read_metrics(metrics_file)


def plot_names(series: dict[str, dict[str, list[tuple[int, float]]]]) -> list[str]:
    """The files `plot_run` writes: one PNG per plotted metric the run logged."""
    return [f"{metric}.png" for metric in PLOTTED if metric in series]


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    series = run_metrics(run_dir)
    out_dir = out_dir or RunDirectory(run_dir).plots
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in (m for m in PLOTTED if m in series):
        path = out_dir / f"{metric}.png"
        curve_figure(f"{run_dir.name}: {metric}", metric, series[metric]).savefig(path)
        written.append(path)
    from bertforge.output_guard import record_outputs

    record_outputs(out_dir, [path.name for path in written], "plot")
    return written


def curve_figure(title: str, metric: str, points_by_split: dict[str, list[tuple[int, float]]]) -> Any:
    """One metric's curve per split against the step, as a matplotlib Figure."""
    # a bare Figure renders with Agg and leaves pyplot's global backend and figure list alone
    from matplotlib.figure import Figure

    figure = Figure(figsize=CURVE_SIZE, dpi=100)
    axes = figure.subplots()
    for split, points in sorted(points_by_split.items()):
        steps, values = zip(*points, strict=True)
        axes.plot(steps, values, marker="o" if split != "train" else None, markersize=3, label=split)
    axes.set_xlabel("step")
    axes.set_ylabel(metric)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if metric == "lr":
        axes.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    axes.legend()
    figure.subplots_adjust(**_curve_margins(axes))
    return figure


def _curve_margins(axes: Any) -> dict[str, float]:
    """The figure fractions around a curve that fit its y tick labels (measured: the numbers' own widths in font
    metrics, nothing drawn), the axis labels, the title and a scale factor such as 1e-5 above the axis.

    `tight_layout` finds the same room by laying out every artist once more before `savefig` draws them: a third
    of the CPU of a plot."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    labels = axes.yaxis.get_major_formatter().format_ticks(axes.yaxis.get_majorticklocs())
    font = FontProperties(size=10)  # rcParams' tick label size
    widest = max((TextToPath().get_text_width_height_descent(label, font, ismath="TeX" if "$" in label else False)[0]
                  for label in labels), default=0.0)
    inch = 72.0  # points
    left = widest + 10 * 1.2 + 4 + 3.5 + 3.5 + 6  # the numbers, the 10 pt axis label line, its pad, tick pad and length
    bottom = 2 * 10 * 1.2 + 4 + 3.5 + 3.5 + 6  # the x numbers and the axis label, pads
    top = 12 * 1.2 + 6 + 10 * 1.2 + 4  # the title line, its pad, a scale factor's line
    width, height = CURVE_SIZE
    return {"left": left / inch / width, "right": 0.97, "bottom": bottom / inch / height, "top": 1 - top / inch / height}
