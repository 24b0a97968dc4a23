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
        stored = json.loads(path.read_text(encoding="utf-8"))["settings"]
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

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(self.directory.glob("*.json"))]
