"""The result store: one JSON file per run (arm, budget, pre-training seed), so that a study can be run in parts."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.common.reports import write_atomically


class RunKey(NamedTuple):
    arm: str
    budget_minutes: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.arm}-{self.budget_minutes:g}min-seed{self.seed}"


# Where arm (d)'s recipe file lay is not part of a run's set-up; its content (`recipe_sha256`) is. A study resumed
# from a checkout at another path (a fresh machine, a git worktree) keeps its runs.
NOT_SETUP = ("recipe",)
# What a report's `data` block says of the corpus its runs trained on. A corpus rebuilt on a fresh machine, from
# Debian packages that moved on or with other evaluation tasks built to keep out, is another corpus (debian-docs held
# 32,342, 32,337 and 32,341 training documents in three builds, the debian-sections task following Debian's archive):
# its runs and the report's must not share one table. `build_pretraining_corpus.py --replay MANIFEST` rebuilds a
# corpus whose manifest was kept.
DATA_IDENTITY = ("train_documents", "train_tokens", "validation_documents")


def setup_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that define what a run measured: two runs with the same set-up belong to one study."""
    return {key: value for key, value in settings.items() if key not in NOT_SETUP}


class ResultStore:
    """One JSON file per run (arm, budget, pre-training seed), written atomically once the run is scored.

    A result holds the settings it was measured with; a stored result with other settings than this
    invocation's is refused rather than skipped or overwritten, so a study split over sessions cannot
    mix two set-ups.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: RunKey) -> Path:
        return self.directory / f"{key.name}.json"

    def is_done(self, key: RunKey, settings: dict[str, Any]) -> bool:
        path = self.path(key)
        if not path.is_file():
            return False
        stored, settings = setup_of(json.loads(path.read_text(encoding="utf-8"))["settings"]), setup_of(settings)
        if stored != settings:
            differing = sorted(k for k in stored.keys() | settings.keys() if stored.get(k) != settings.get(k))
            raise SystemExit(f"error: {path} was measured with other settings ({', '.join(differing)}: "
                             f"{[stored.get(k) for k in differing]} there, {[settings.get(k) for k in differing]} now); "
                             "delete it to measure it again, or give another --work-dir")
        return True

    def pending(self, keys: list[RunKey], settings_for: Callable[[str], dict[str, Any]]) -> list[RunKey]:
        return [key for key in keys if not self.is_done(key, settings_for(key.arm))]

    def save(self, key: RunKey, result: dict[str, Any]) -> None:
        write_atomically(self.path(key), json.dumps(result, indent=1))

    def import_report(self, report_path: Path, data: dict[str, Any]) -> list[RunKey]:
        """Put the runs of a finished report (`time_to_quality.json`, as committed to benchmarks/results) into the
        store, so that a study split over machines, whose work directories do not survive, resumes where the
        report stopped. `data` is this invocation's prepared corpus (the report's `data` block): a report whose
        corpus differs in any of `DATA_IDENTITY` is refused before anything is imported. A run the store already
        holds is kept, not replaced; an imported run measured with other settings is refused by `pending`, as any
        stored one is. Returns the keys it added."""
        try:
            report = json.loads(report_path.read_text(encoding="utf-8"))
            keyed = [(RunKey(result["arm"], float(result["budget_minutes"]), int(result["seed"])), result)
                     for result in report["results"]]
            reported = {key: report["data"][key] for key in DATA_IDENTITY}
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"error: {report_path} is not a time-to-quality report ({error!r}); give the .json that "
                             "time_to_quality.py wrote") from None
        differing = [key for key in DATA_IDENTITY if reported[key] != data[key]]
        if differing:
            raise SystemExit(f"error: {report_path} was measured on another corpus than the one prepared here ("
                             + ", ".join(f"{key}: {reported[key]} there, {data[key]} here" for key in differing)
                             + "); rebuild the corpus the report names (scripts/build_pretraining_corpus.py "
                             "--replay its manifest, where one was kept), or start a new report with another "
                             "--report-name and without --results-from")
        added = []
        for key, result in keyed:
            if not self.path(key).is_file():
                self.save(key, result)
                added.append(key)
        return added

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(self.directory.glob("*.json"))]
