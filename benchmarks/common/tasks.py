"""The fine-tuning tasks the comparisons score on: the bundled supersense task and the parity tasks
(`scripts/build_parity_tasks.py` builds them into the cache), and the seeds the fine-tuning studies draw from."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# the pre-training comparisons' fine-tuning seeds, and their supersense rows
DOWNSTREAM_SEEDS = (17, 2024, 31337, 7, 123, 99, 4242, 1)
DOWNSTREAM_ROWS = {"train": 8000, "test": 2000}  # evenly spaced over the bundled splits, as the quickstart's
# the fine-tuning parity studies' seeds: the first 40 are the studies' seeds so far (in docs/benchmarks.md); consecutive ones after them.
SEEDS = (17, 2024, 31337, 7, 123, 99, 4242, 1, 555, 8080, 31, 64, 2718, 3141, 11, 404, 90210, 6, 1234, 77,
         2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765, 10946, 28657,
         *range(100_001, 100_161))


@dataclass
class TaskData:
    name: str
    task_type: str  # classification | regression
    train: list[dict[str, Any]]
    test: list[dict[str, Any]]
    labels: list[str]  # class names in id order; empty for regression
    pair: bool

    @property
    def metric(self) -> str:
        return "pearson" if self.task_type == "regression" else "accuracy"


def evenly_spaced(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """A fixed subset spread over the whole file (the files are sorted by label or source)."""
    if count >= len(rows):
        return rows
    return [rows[i * len(rows) // count] for i in range(count)]


def tasks_dir() -> Path:
    cache = os.environ.get("BERTFORGE_CACHE")
    return Path(cache) / "tasks" if cache else Path.home() / ".cache" / "bertforge" / "tasks"


def load_task(name: str, train_rows: int, test_rows: int) -> TaskData:
    if name == "supersense":
        from bertforge.data.bundled import supersense_labels, supersense_lines

        return TaskData(name, "classification", [json.loads(x) for x in supersense_lines("train", train_rows)],
                        [json.loads(x) for x in supersense_lines("test", test_rows)], supersense_labels(), False)
    directory = tasks_dir() / name
    if not (directory / "task.json").is_file():
        sys.exit(f"error: task {name!r} is not built in {directory}; run "
                 f"`python scripts/build_parity_tasks.py --tasks {name}` first")
    description = json.loads((directory / "task.json").read_text())

    def read(split: str, count: int) -> list[dict[str, Any]]:
        lines = (directory / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        return evenly_spaced([json.loads(line) for line in lines], count)

    train = read("train", train_rows)
    labels = sorted({str(r["label"]) for r in train}) if description["task_type"] == "classification" else []
    test = [r for r in read("test", test_rows) if description["task_type"] == "regression" or str(r["label"]) in labels]
    return TaskData(name, description["task_type"], train, test, labels, description.get("text_pair_column") is not None)
