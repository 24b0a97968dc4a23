"""The GLUE task table: each task's files, quirks, labels, official metrics, default hyperparameters,
published BERT-base numbers, and the final results table.

The eight tasks the Mosaic BERT runner fine-tunes. WNLI is left out, as it does: its dev set is
adversarial (hypotheses shared with training examples flip their label, GLUE FAQ), so fine-tuned
BERTs score the majority-class rate, 56.34, and it only adds noise to the average. Files are read
from the standard GLUE directory layout written by the GLUE download script (`CoLA/train.tsv`,
`MNLI/dev_matched.tsv`, ...), with the column positions of Hugging Face's GLUE processors
(`transformers/data/processors/glue.py`: CoLA text at column 3 with no header, MNLI sentences at
8/9 with the gold label last, STS-B sentences at 7/8 with the score last, QQP skipping malformed
rows). Lines are split on tabs with quoting off: GLUE text contains unbalanced `"` characters, which
a csv reader would treat as an opening quote and swallow the rows after it. The MRPC files begin
with a UTF-8 byte-order mark, dropped here.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.console import log
from bertforge.data.labels import LabeledSplit, LabelSet, label_key
from bertforge.errors import ConfigError, DataError

GLUE_LAYOUT_HINT = "point --data-dir at the GLUE root, the folder holding CoLA/, SST-2/, MRPC/, ..."

# Published dev-set numbers of BERT-base (bert-base-cased, 3 epochs; 5 for MRPC) from the table in
# Hugging Face's text-classification example README (examples/pytorch/text-classification/README.md,
# "We get the following results on the dev set of the benchmark").
REFERENCE_NAME = "BERT-base (HF run_glue README, dev)"
# A task directory holding this file is a stand-in in GLUE's layout, not GLUE's data (tests/glue_layout.py writes
# one per task); its first line says what the task is instead. Its results are never set against BERT-base's.
STAND_IN_FILE = "STAND-IN.txt"


@dataclass(frozen=True)
class TsvLayout:
    """Where a GLUE file keeps its fields; a negative index counts from the end of the row."""

    text: int
    label: int
    text_pair: int | None = None
    header: tuple[tuple[int, str], ...] = ()  # (column, name) pairs checked on line 1; () = no header line
    skip_malformed: bool = False  # QQP: rows with missing fields are skipped, as HF's QqpProcessor does

    @property
    def min_fields(self) -> int:
        used = [self.text, self.label] + ([self.text_pair] if self.text_pair is not None else [])
        return max(i + 1 if i >= 0 else -i for i in used)


@dataclass(frozen=True)
class GlueHyperparameters:
    """Fine-tuning defaults (Mosaic's `finetuning_jobs.py`: AdamW, betas 0.9/0.98, linear decay, 6% warmup)."""

    lr: float
    epochs: int
    batch_size: int
    weight_decay: float
    max_length: int = 256


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: how to read it, how it is scored, how to fine-tune it, what BERT-base reached."""

    name: str  # short name used in configs: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte
    title: str  # the GLUE directory name and how papers write it: CoLA, SST-2, ...
    task_type: str  # classification | regression
    label_names: tuple[str, ...]  # class names in id order (the files hold names or these ids)
    layout: TsvLayout  # the same in train and dev files (MNLI's extra dev columns come before the last)
    eval_splits: tuple[str, ...]  # dev file stems: ("dev",) or MNLI's ("dev_matched", "dev_mismatched")
    official: tuple[tuple[str, str], ...]  # (eval split, metric) pairs the task is scored by, in print order
    metric_label: str  # how the official metrics are named in results tables
    reference: tuple[float, ...]  # published BERT-base values of `official`, in points
    hyperparameters: GlueHyperparameters
    seeds: tuple[int, ...]  # small tasks run several seeds and report the median
    from_mnli: bool = False  # may start from the MNLI checkpoint (Mosaic's recipe for RTE, MRPC, STS-B)

    @property
    def small(self) -> bool:
        return len(self.seeds) > 1

    @property
    def num_labels(self) -> int:
        return 1 if self.task_type == "regression" else len(self.label_names)

    def score(self, values: Sequence[float]) -> float:
        """The task's GLUE score: the unweighted mean of its official metrics, as GLUE scores tasks with
        several metrics (MNLI's matched and mismatched accuracies included, as Mosaic's runner does)."""
        return sum(values) / len(values)


# Seeds: Mosaic's yamls/finetuning/glue/hf-bert-base-uncased.yaml (5 for RTE/MRPC/STS-B, 4 for CoLA;
# SST-2 gets one here, not Mosaic's three: 67k training rows is not small on a CPU).
FIVE_SEEDS = (19, 8364, 717, 10536, 90166)
ONE_SEED = (19,)

GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask(
            "cola", "CoLA", "classification", ("unacceptable", "acceptable"),
            # no header; source, label, original-judgement marker ("*"), sentence
            layout=TsvLayout(text=3, label=1),
            eval_splits=("dev",), official=(("dev", "matthews"),), metric_label="Matthews corr",
            reference=(56.53,), hyperparameters=GlueHyperparameters(5e-5, 10, 32, 5e-6), seeds=FIVE_SEEDS[:4],
        ),
        GlueTask(
            "sst2", "SST-2", "classification", ("negative", "positive"),
            layout=TsvLayout(text=0, label=1, header=((0, "sentence"), (1, "label"))),
            eval_splits=("dev",), official=(("dev", "accuracy"),), metric_label="Accuracy",
            reference=(92.32,), hyperparameters=GlueHyperparameters(3e-5, 3, 16, 3e-6), seeds=ONE_SEED,
        ),
        GlueTask(
            "mrpc", "MRPC", "classification", ("not_equivalent", "equivalent"),
            layout=TsvLayout(text=3, text_pair=4, label=0,
                             header=((0, "Quality"), (3, "#1 String"), (4, "#2 String"))),
            eval_splits=("dev",), official=(("dev", "f1"), ("dev", "accuracy")), metric_label="F1/Accuracy",
            reference=(88.85, 84.07), hyperparameters=GlueHyperparameters(8e-5, 10, 32, 8e-6), seeds=FIVE_SEEDS,
            from_mnli=True,
        ),
        GlueTask(
            "stsb", "STS-B", "regression", (),
            layout=TsvLayout(text=7, text_pair=8, label=-1,
                             header=((7, "sentence1"), (8, "sentence2"), (9, "score"))),
            eval_splits=("dev",), official=(("dev", "pearson"), ("dev", "spearman")),
            metric_label="Pearson/Spearman corr.", reference=(88.64, 88.48),
            hyperparameters=GlueHyperparameters(3e-5, 10, 32, 3e-6), seeds=FIVE_SEEDS, from_mnli=True,
        ),
        GlueTask(
            "qqp", "QQP", "classification", ("not_duplicate", "duplicate"),
            layout=TsvLayout(text=3, text_pair=4, label=5, skip_malformed=True,
                             header=((3, "question1"), (4, "question2"), (5, "is_duplicate"))),
            eval_splits=("dev",), official=(("dev", "accuracy"), ("dev", "f1")), metric_label="Accuracy/F1",
            reference=(90.71, 87.49), hyperparameters=GlueHyperparameters(3e-5, 5, 16, 3e-6), seeds=ONE_SEED,
        ),
        GlueTask(
            "mnli", "MNLI", "classification", ("entailment", "neutral", "contradiction"),
            # train has label1 + gold_label (12 columns), dev label1..label5 + gold_label (16): gold is last
            layout=TsvLayout(text=8, text_pair=9, label=-1,
                             header=((8, "sentence1"), (9, "sentence2"), (-1, "gold_label"))),
            eval_splits=("dev_matched", "dev_mismatched"),
            official=(("dev_matched", "accuracy"), ("dev_mismatched", "accuracy")),
            metric_label="Matched acc./Mismatched acc.", reference=(83.91, 84.10),
            hyperparameters=GlueHyperparameters(5e-5, 3, 48, 5e-6), seeds=ONE_SEED,
        ),
        GlueTask(
            "qnli", "QNLI", "classification", ("entailment", "not_entailment"),
            layout=TsvLayout(text=1, text_pair=2, label=-1,
                             header=((1, "question"), (2, "sentence"), (3, "label"))),
            eval_splits=("dev",), official=(("dev", "accuracy"),), metric_label="Accuracy",
            reference=(90.66,), hyperparameters=GlueHyperparameters(1e-5, 10, 16, 1e-6), seeds=ONE_SEED,
        ),
        GlueTask(
            "rte", "RTE", "classification", ("entailment", "not_entailment"),
            layout=TsvLayout(text=1, text_pair=2, label=-1,
                             header=((1, "sentence1"), (2, "sentence2"), (3, "label"))),
            eval_splits=("dev",), official=(("dev", "accuracy"),), metric_label="Accuracy",
            reference=(65.70,), hyperparameters=GlueHyperparameters(1e-5, 3, 16, 1e-5), seeds=FIVE_SEEDS,
            from_mnli=True,
        ),
    )
}

_ALIASES = {task.title.lower(): task.name for task in GLUE_TASKS.values()} | {"sts": "stsb"}


def get_glue_task(name: str) -> GlueTask:
    """A task by its short name or title, any case: "sst2", "SST-2", "sts-b", "MNLI"."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key).replace("-", "")
    if key in GLUE_TASKS:
        return GLUE_TASKS[key]
    if key == "wnli":
        raise ConfigError("WNLI is left out of bertforge's GLUE runner (as in Mosaic's): its adversarial dev set "
                          "keeps fine-tuned BERTs at the majority-class rate; remove it from the task list")
    raise ConfigError(f"unknown GLUE task {name!r}; choose from {', '.join(GLUE_TASKS)}")


# ---------------------------------------------------------------------------------------------
# reading the GLUE layout


def glue_file(task: GlueTask, data_dir: str | Path, split: str) -> Path:
    """The .tsv of one split (`train` or one of `task.eval_splits`); a clear error when it is missing."""
    if split != "train" and split not in task.eval_splits:
        raise ConfigError(f"{task.title} has no split {split!r}; use train or {', '.join(task.eval_splits)}")
    path = Path(data_dir) / task.title / f"{split}.tsv"
    if not path.is_file():
        raise DataError(f"{path}: GLUE file not found; {GLUE_LAYOUT_HINT} (GLUE cannot be downloaded by bertforge: "
                        "fetch it with the GLUE download script, download_glue_data.py)")
    return path


def _read_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw[:error.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8; the GLUE files are UTF-8 — download them again") from None
    return text.split("\n")


def _check_header(path: Path, fields: list[str], layout: TsvLayout, title: str) -> None:
    for column, expected in layout.header:
        found = fields[column] if -len(fields) <= column < len(fields) else None
        if found != expected:
            raise DataError(f"{path}:1: expected a {title} header with {expected!r} in column {column}, found "
                            f"{found!r}; is this the right file? {GLUE_LAYOUT_HINT}")


def read_glue_split(task: GlueTask | str, data_dir: str | Path, split: str = "train") -> LabeledSplit:
    """One split of a GLUE task as a `LabeledSplit` (labels as ids of `task.label_names`, or floats)."""
    task = get_glue_task(task) if isinstance(task, str) else task
    path = glue_file(task, data_dir, split)
    layout = task.layout
    lines = _read_lines(path)
    first = 0
    if layout.header:
        _check_header(path, lines[0].rstrip("\r").split("\t"), layout, task.title)
        first = 1
    label_set = LabelSet(task.label_names, origin=f"GLUE {task.title}") if task.task_type == "classification" else None
    texts: list[str] = []
    pairs: list[str] | None = [] if layout.text_pair is not None else None
    labels: list[Any] = []
    skipped = 0
    for number, line in enumerate(lines[first:], start=first + 1):
        line = line.rstrip("\r")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) < layout.min_fields:
            if layout.skip_malformed:
                skipped += 1
                continue
            raise DataError(f"{path}:{number}: {len(fields)} tab-separated fields, {task.title} rows have at least "
                            f"{layout.min_fields}; the file is damaged — download it again")
        texts.append(fields[layout.text])
        if pairs is not None:
            pairs.append(fields[layout.text_pair])  # type: ignore[index]
        labels.append(_encode_label(fields[layout.label], label_set, f"{path}:{number}", task))
    if skipped:
        log.warning("%s: skipped %d malformed rows (missing fields), as Hugging Face's GLUE processor does", path,
                    skipped)
    if not texts:
        raise DataError(f"{path}: no rows; the file is empty — download it again")
    return LabeledSplit(str(path), task.task_type, texts, pairs, labels, list(task.label_names))


def _encode_label(raw: str, label_set: LabelSet | None, where: str, task: GlueTask) -> int | float:
    if label_set is None:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise DataError(f"{where}: {task.title} score {raw!r} is not a number; the file is damaged")
        return value
    label_id = label_set.id_of(label_key(raw) or "")
    if label_id is None:
        raise DataError(f"{where}: {task.title} label {raw!r} is not one of {', '.join(task.label_names)} (or their "
                        "ids); the file is damaged or belongs to another task")
    return label_id


# ---------------------------------------------------------------------------------------------
# the final table

RunMetrics = Mapping[str, Mapping[str, float]]  # one run: eval split -> metric name -> value (0-1 scale)


def _official_values(task: GlueTask, run: RunMetrics) -> list[float]:
    values = []
    for split, metric in task.official:
        try:
            values.append(100.0 * float(run[split][metric]))
        except KeyError:
            raise KeyError(f"{task.name} results lack {split}/{metric}; got {json.dumps(run)}") from None
    return values


def stand_in_description(task: GlueTask | str, data_dir: str | Path) -> str | None:
    """What a stand-in task directory says it holds instead of GLUE's data; None for a real one."""
    task = get_glue_task(task) if isinstance(task, str) else task
    marker = Path(data_dir) / task.title / STAND_IN_FILE
    if not marker.is_file():
        return None
    lines = marker.read_text(encoding="utf-8").strip().splitlines()
    return lines[0].strip() if lines else "a stand-in, not GLUE's data"


def stand_in_tasks(tasks: Sequence[GlueTask], data_dir: str | Path) -> dict[str, str]:
    """{task name: description} of the stand-ins among `tasks` in `data_dir`."""
    found = {task.name: stand_in_description(task, data_dir) for task in tasks}
    return {name: description for name, description in found.items() if description is not None}


def summarize_glue(results: Mapping[str, Sequence[RunMetrics]],
                   stand_ins: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The GLUE summary (JSON-ready, all numbers in points = metric x 100).

    `results` maps each task run to its per-seed metrics, as `compute_metrics` returns them per
    eval split. Each official metric is the median over seeds; a task's score is the mean of its
    official metrics; the GLUE average is the mean of the task scores. The reference average is
    taken over the same tasks, so a partial run is compared like for like. `stand_ins` names the tasks
    whose data was a stand-in (`stand_in_tasks`): each says so (`stand_in`), and the summary lists them.
    """
    stand_ins = {get_glue_task(key).name: description for key, description in (stand_ins or {}).items()}
    by_name: dict[str, Sequence[RunMetrics]] = {}
    for key, runs in results.items():
        name = get_glue_task(key).name
        if name in by_name:
            raise ConfigError(f"{key!r} and another entry both name GLUE task {name}; give each task once")
        if not runs:
            raise ValueError(f"no runs for GLUE task {key!r}")
        by_name[name] = runs
    tasks: dict[str, Any] = {}
    for name, task in GLUE_TASKS.items():  # the table order, whatever order the runs finished in
        if name not in by_name:
            continue
        per_seed = [_official_values(task, run) for run in by_name[name]]
        medians = [statistics.median(column) for column in zip(*per_seed, strict=True)]
        keys = [f"{split}/{metric}" for split, metric in task.official]
        tasks[name] = {
            "title": task.title,
            "metric": task.metric_label,
            "seeds": len(per_seed),
            "values": dict(zip(keys, medians, strict=True)),
            "score": task.score(medians),
            "reference": dict(zip(keys, task.reference, strict=True)),
            "reference_score": task.score(task.reference),
            "per_seed": [dict(zip(keys, values, strict=True)) for values in per_seed],
            "stand_in": stand_ins.get(name),  # what the data was instead of GLUE's; None: the real task
        }
    scores = [entry["score"] for entry in tasks.values()]
    references = [entry["reference_score"] for entry in tasks.values()]
    return {
        "units": "points (metric x 100)",
        "tasks": tasks,
        "tasks_run": len(tasks),
        "glue_average": sum(scores) / len(scores) if scores else None,
        "reference_glue_average": sum(references) / len(references) if references else None,
        "reference_name": REFERENCE_NAME,
        "stand_in_tasks": [name for name, entry in tasks.items() if entry["stand_in"] is not None],
    }


def _joined(values: Mapping[str, float]) -> str:
    return "/".join(f"{v:.2f}" for v in values.values())


def glue_results_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as a markdown table: our numbers beside the published BERT-base ones. A stand-in task is
    marked so, with no Δ (BERT-base's number is for the real task), and a note under the table says what it was."""
    stand_ins = {entry["title"]: entry.get("stand_in") for entry in summary["tasks"].values() if entry.get("stand_in")}
    lines = [f"| Task | Metric | bertforge | {summary['reference_name']} | Δ score | Seeds |",
             "|---|---|---:|---:|---:|---:|"]
    for entry in summary["tasks"].values():
        seeds = f"{entry['seeds']} (median)" if entry["seeds"] > 1 else "1"
        title, delta = entry["title"], f"{entry['score'] - entry['reference_score']:+.2f}"
        if title in stand_ins:
            title, delta = f"{title} (stand-in)", "n/a"
        lines.append(f"| {title} | {entry['metric']} | {_joined(entry['values'])} | "
                     f"{_joined(entry['reference'])} | {delta} | {seeds} |")
    if summary["tasks"]:
        count = summary["tasks_run"]
        delta = "n/a" if stand_ins else f"{summary['glue_average'] - summary['reference_glue_average']:+.2f}"
        lines.append(f"| **GLUE average** | mean of {count} task score{'s' if count != 1 else ''} | "
                     f"**{summary['glue_average']:.2f}** | {summary['reference_glue_average']:.2f} | {delta} | |")
    if stand_ins:
        lines += ["", f"**Stand-ins, not GLUE:** {', '.join(stand_ins)} ran on data in GLUE's file layout from another "
                  f"source (their directories hold {STAND_IN_FILE}). The {summary['reference_name']} column is the "
                  "published score on the real task, shown for reference only: it is no comparison, so no Δ is "
                  "given for these tasks or the average.", ""]
        lines += [f"- {title}: {description}" for title, description in stand_ins.items()]
    return "\n".join(lines) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def write_glue_results(summary: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """Write `glue_results.md` and `glue_results.json` into `out_dir`; returns their paths."""
    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    markdown, data = directory / "glue_results.md", directory / "glue_results.json"
    _write_atomically(markdown, glue_results_markdown(summary))
    _write_atomically(data, json.dumps(summary, indent=2) + "\n")
    return markdown, data
