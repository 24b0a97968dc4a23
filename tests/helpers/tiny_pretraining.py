"""A tiny pre-training run (2 layers x 32 wide, dropout off) on the `prepared_corpus` fixture, in this
process or through `torchrun`, and what the tests read back from its run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from bertforge.config import config_to_yaml, load_config
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.trainer import Trainer
from helpers import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]  # the repository
# run.device=cpu: these are the CPU tests on any machine; tests/test_cuda.py adds run.device=cuda
TINY = ["run.device=cpu", "model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.num_layers=2", "model.hidden_dropout=0.0", "model.attention_dropout=0.0", "data.num_workers=0",
        "optim.lr=3e-3", "schedule.name=constant", "schedule.warmup=2", "train.micro_batch_size=8",
        "train.global_batch_size=16", "train.log_every=1", "train.eval_every=100", "log.progress=false",
        "log.tensorboard=false", "log.plots=false", "data.validation_samples=16"]


def train(prepared_corpus: Path, run_dir: Path, *extra: str) -> Path:
    config = load_config(None, [*TINY, f"data.path={prepared_corpus}", f"run.output_dir={run_dir.parent}",
                                f"run.name={run_dir.name}", *extra])
    Trainer(config, PretrainTask(config)).fit()
    return run_dir


def write_config(prepared_corpus: Path, run_dir: Path, *extra: str) -> Path:
    """`train`'s configuration as a YAML file next to the run directory, for `bertforge pretrain`."""
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(config_to_yaml(load_config(None, [*TINY, f"data.path={prepared_corpus}",
                                                         f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                                                         *extra])))
    return config


def train_on_two_ranks(prepared_corpus: Path, run_dir: Path, *extra: str) -> Path:
    """The same run as `train`, by `torchrun --nproc_per_node=2 -m bertforge.cli pretrain` (gloo)."""
    config = write_config(prepared_corpus, run_dir, *extra)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               "-m", "bertforge.cli", "-q", "pretrain", str(config)]
    done = subprocess.run(command, cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir


def train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record["loss"] for record in map(json.loads, lines) if record["split"] == "train"]


def final_weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"step-{step:08d}" / "model" / "model.safetensors")


def relative_distance(weights: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    assert weights.keys() == reference.keys()
    difference = torch.cat([(weights[name] - reference[name]).flatten() for name in reference])
    return (difference.norm() / torch.cat([tensor.flatten() for tensor in reference.values()]).norm()).item()
