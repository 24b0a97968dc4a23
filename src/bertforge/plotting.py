"""Curves of a run from its `metrics.jsonl`: loss, accuracies, learning rate, throughput."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from bertforge.errors import BertforgeError
from bertforge.run_directory import METRICS_FILE, RunDirectory

# what is worth a picture, in the order users look at them
PLOTTED = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "accuracy", "f1_macro", "matthews", "pearson",
           "spearman", "lr", "tokens_per_s", "samples_per_s", "mfu", "grad_norm")


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = out_dir or RunDirectory(run_dir).plots
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in (m for m in PLOTTED if m in series):
        figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
        for split, points in sorted(series[metric].items()):
            steps, values = zip(*points, strict=True)
            axes.plot(steps, values, marker="o" if split != "train" else None, markersize=3, label=split)
        axes.set_xlabel("step")
        axes.set_ylabel(metric)
        axes.set_title(f"{run_dir.name}: {metric}")
        axes.grid(alpha=0.3)
        if metric == "lr":
            axes.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        axes.legend()
        figure.tight_layout()
        path = out_dir / f"{metric}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    from bertforge.output_guard import record_outputs

    record_outputs(out_dir, [path.name for path in written], "plot")
    return written
