"""The layout of a run directory, in one place: what each of its files is called and how its markers are read.

    RUN/
      config.yaml                the resolved config the run started with
      config-resume-N.yaml       a resumed segment's config, where it differs from the one before
      metrics.jsonl              one JSON row per logged step and per evaluation
      tensorboard/  plots/       TensorBoard's events; PNG curves of metrics.jsonl
      checkpoints/
        step-00000120/           a complete checkpoint: meta.json, model/, optimizer, scaler and RNG state
        latest  best             markers: the bare name of the newest / the best complete checkpoint
      final/                     the trained model directory (with its README.md model card)
      <split>_results.json       the finished run's evaluation of each split (with <split>_report.md, ...)
      summary.json               a finished pre-training run's last validation, budget and MLM plateau verdict

The trainer and the checkpoint manager write it; `locate`, inference, the model card, `plot`, the output
guard and the GLUE runner read it, all through `RunDirectory` and the names here. A marker is a file a
run wrote, not a trusted path: it must hold a bare `step-N` name whose complete checkpoint is inside
`checkpoints/`, or it is ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.directory_lock import LOCK_NAME

if TYPE_CHECKING:
    from bertforge.config import Config

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
TENSORBOARD_DIR = "tensorboard"
PLOTS_DIR = "plots"
CHECKPOINT_META = "meta.json"  # written last into a checkpoint: its presence is what makes the checkpoint complete
CHECKPOINT_MODEL = "model"  # the model directory inside a checkpoint
LEGACY_CHECKPOINT_WEIGHTS = "model.pt"  # a bare state dict: user tasks without `save_model`, earlier bertforge
LATEST_MARKER, BEST_MARKER = "latest", "best"
CHECKPOINT_NAME = re.compile(r"^step-(\d{8})$")
RESUME_CONFIG = re.compile(r"^config-resume-(\d+)\.yaml$")
RESULTS_SUFFIX = "_results.json"
SUMMARY_FILE = "summary.json"


def checkpoint_name(step: int) -> str:
    """`step-00000120`: zero-padded, so that names sort as steps do."""
    return f"step-{step:08d}"


def checkpoint_step(checkpoint: Path) -> int:
    """The step a checkpoint directory (`step-00000120`) was written at."""
    return int(checkpoint.name.removeprefix("step-"))


def is_checkpoint(path: Path) -> bool:
    """Whether `path` is a complete checkpoint directory (one that holds its meta.json)."""
    return (path / CHECKPOINT_META).is_file()


def checkpoint_model(checkpoint: Path) -> Path:
    """The model directory a checkpoint holds (written by the task's `save_model`)."""
    return checkpoint / CHECKPOINT_MODEL


def write_checkpoint_meta(checkpoint: Path, meta: dict[str, Any]) -> None:
    (checkpoint / CHECKPOINT_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")


def read_checkpoint_meta(checkpoint: Path) -> dict[str, Any]:
    return json.loads((checkpoint / CHECKPOINT_META).read_text(encoding="utf-8"))


def evaluation_file_names(split: str) -> tuple[str, str, str]:
    """What an evaluation of `split` writes, in a run directory or `evaluate --out-dir`: results, report,
    confusion matrix (classes only)."""
    return f"{split}{RESULTS_SUFFIX}", f"{split}_report.md", f"{split}_confusion_matrix.png"


def is_run_listing(names: Collection[str]) -> bool:
    """Whether a directory holding `names` is a run, also one from before the output ledger: the trainer writes
    its config first, beside its lock, metrics or checkpoints (a user's project directory holding a config.yaml
    of its own is not a run)."""
    return CONFIG_FILE in names and bool({LOCK_NAME, METRICS_FILE, CHECKPOINTS_DIR} & set(names))


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


@dataclass(frozen=True)
class RunDirectory:
    """The paths of one run directory and the rules for its checkpoints; nothing is created by asking."""

    root: Path

    @classmethod
    def of_model(cls, model_dir: Path) -> RunDirectory | None:
        """The run a model directory belongs to, if any: `final/` is 1 level below its run, a checkpoint's
        `model/` 3 (`checkpoints/step-N/model`)."""
        parents = model_dir.resolve().parents
        for levels in (1, 3):
            if len(parents) >= levels and cls(parents[levels - 1]).is_run():
                return cls(parents[levels - 1])
        return None

    def is_run(self) -> bool:
        """A directory is a run once the trainer has written its config, its first file."""
        return self.config_file.is_file()

    # --- files ----------------------------------------------------------------------------------

    @property
    def config_file(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        return self.root / METRICS_FILE

    @property
    def tensorboard(self) -> Path:
        return self.root / TENSORBOARD_DIR

    @property
    def plots(self) -> Path:
        return self.root / PLOTS_DIR

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def final(self) -> Path:
        return self.root / FINAL_DIR

    def load_config(self) -> Config:
        """The config the run started with (keys renamed since are upgraded)."""
        from bertforge.config import load_run_config

        return load_run_config(self.config_file)

    def config_segments(self) -> list[Path]:
        """config.yaml, then each resumed segment's config-resume-N.yaml in the order they were written."""
        resumed = [path for path in self.root.glob("config-resume-*.yaml") if RESUME_CONFIG.match(path.name)]
        return [self.config_file, *sorted(resumed, key=lambda path: int(RESUME_CONFIG.match(path.name)[1]))]

    def resume_config_file(self, segment: int) -> Path:
        return self.root / f"config-resume-{segment}.yaml"

    @property
    def summary_file(self) -> Path:
        return self.root / SUMMARY_FILE

    def results_file(self, split: str) -> Path:
        return self.root / evaluation_file_names(split)[0]

    def results_files(self) -> list[Path]:
        """The evaluation results the finished run wrote, one per split, by name."""
        return sorted(self.root.glob(f"*{RESULTS_SUFFIX}"))

    # --- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / checkpoint_name(step)

    def complete_checkpoints(self) -> list[Path]:
        """The complete checkpoints (`step-N/` with its meta.json), oldest first."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(path for path in self.checkpoints.iterdir() if CHECKPOINT_NAME.match(path.name)
                      and is_checkpoint(path))

    def checkpoint_named_by(self, marker: str) -> Path | None:
        """The complete checkpoint the `latest` or `best` marker names, if it names one of this run's.

        A marker holds a bare `step-N` name, never a path: anything else (`../../other/checkpoints/step-N`),
        or a name whose directory resolves outside `checkpoints/` (a symlink), is ignored."""
        path = self.checkpoints / marker
        if not path.is_file():
            return None
        name = path.read_text(encoding="utf-8").strip()
        if not CHECKPOINT_NAME.match(name):
            return None
        candidate = self.checkpoints / name
        if candidate.resolve().parent != self.checkpoints.resolve() or not is_checkpoint(candidate):
            return None
        return candidate

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint named by `latest`, or else the newest complete one."""
        named = self.checkpoint_named_by(LATEST_MARKER)
        if named is not None:
            return named
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None

    def best_checkpoint(self) -> Path | None:
        """The checkpoint named by `best`, when it names one of this run's."""
        return self.checkpoint_named_by(BEST_MARKER)

    def mark(self, marker: str, checkpoint: Path) -> None:
        """Name `checkpoint` in the `latest` or `best` marker, atomically (a kill leaves the old name or the new)."""
        _write_atomically(self.checkpoints / marker, checkpoint.name)
