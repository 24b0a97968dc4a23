"""The study's settings: its arms, budgets and export marks, the tuned hyperparameters, one run's spec and the
bertforge config of arms c and d."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common.mlm import DEVICE_DEFAULTS, MASK_PROBABILITY, WARMUP_FRACTION
from benchmarks.common.tasks import DOWNSTREAM_ROWS as SUPERSENSE_ROWS

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
WORK_DIR = REPO / "runs" / "benchmarks" / "time_to_quality"  # inputs, runs and the result store, per corpus
DEFAULT_RECIPE = REPO / "configs" / "pretrain" / "budget-cpu.yaml"
ARMS = ("a", "b", "c", "d")
ARM_TITLES = {"a": "(a) HF run_mlm.py defaults", "b": "(b) HF Trainer, tuned", "c": "(c) bertforge, tuned",
              "d": "(d) bertforge, budget recipe"}
EXPORT_FRACTIONS = (0.125, 0.25, 0.5, 0.75)  # of the budget, besides the end
# HF's steps are planned from this calibration (`--calibration`). 20 s after 5 steps, the first studies' setting, timed
# 13-16 steps: 8 of their 25 seeded HF runs finished their schedule at 81-95% of the budget. On 130 steps of debian-docs
# (benchmarks.ttq.step_times) the steps from the 40th on took 1.211 s (sd 0.052); 20 s after 5 steps said 1.292, 60 s
# after 20 said 1.235.
CALIBRATION_SECONDS, CALIBRATION_WARMUP = 60.0, 20
DOWNSTREAM_TASKS = ("supersense", "manpages")
ALL_ROWS = 1_000_000  # benchmarks.common.tasks.load_task keeps every row of a split with fewer rows than this
DOWNSTREAM_ROWS = {"supersense": (SUPERSENSE_ROWS["train"], SUPERSENSE_ROWS["test"]),
                   "manpages": (ALL_ROWS, ALL_ROWS)}
# Each final model is fine-tuned at the learning rate and dropout of this grid that score best on a dev split held
# out of the task's training rows (every DEV_EVERY-th row), as the BERT paper chose its fine-tuning settings per
# model and task: one lr for all arms favoured the barely trained ones, and supersense fine-tunes better without
# dropout (docs/benchmarks.md, "Why (d) fine-tuned worse", "Where (d)'s supersense deficit comes from", "Each model
# fine-tuned at its own lr and dropout"). Dropout None keeps the model's own (its config.json: 0.1 for every arm here).
DOWNSTREAM_LRS = (1e-3, 5e-4, 3e-4)
DOWNSTREAM_DROPOUTS: tuple[float | None, ...] = (None, 0.0)
DEV_EVERY = 10
CODE_FILE = "code.sha256"  # in a fine-tune's run directory: the code_fingerprint it ran under
QUICK = {"model": "bert-tiny", "budgets": [0.3], "downstream_seeds": 1, "calibration": (2.0, 2),
         "downstream_rows": {"supersense": (256, 128), "manpages": (256, 128)}, "downstream_lrs": [1e-3, 3e-4],
         "downstream_dropouts": [None, 0.0]}
# recipe keys that change the model's shape: arm (d) must keep the other arms' (`check_recipe`)
SHAPE_KEYS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
              "max_position_embeddings", "position", "mlp", "norm", "bias", "tie_word_embeddings",
              "local_attention_window", "global_every_n")


@dataclass(frozen=True)
class Hyperparameters:
    """bertforge's tuned pre-training hyperparameters, the ones `pretrain_vs_hf.py` gives its arms on a CPU."""

    batch_size: int = DEVICE_DEFAULTS["cpu"]["batch_size"]
    lr: float = DEVICE_DEFAULTS["cpu"]["lr"]
    warmup: float = WARMUP_FRACTION
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    clip_grad_norm: float = 1.0
    dropout: float = 0.1

    def hf_arguments(self) -> dict[str, Any]:
        """As `TrainingArguments` keywords (arm b)."""
        return {"per_device_train_batch_size": self.batch_size, "learning_rate": self.lr,
                "weight_decay": self.weight_decay, "adam_beta1": self.betas[0], "adam_beta2": self.betas[1],
                "adam_epsilon": self.eps, "max_grad_norm": self.clip_grad_norm, "lr_scheduler_type": "linear",
                "warmup_steps": self.warmup, "logging_steps": 10}

    def bertforge_overrides(self) -> list[str]:
        """As `bertforge pretrain` overrides (arm c)."""
        return [f"model.hidden_dropout={self.dropout}", f"model.attention_dropout={self.dropout}", "optim.name=adamw",
                f"optim.lr={self.lr}", f"optim.weight_decay={self.weight_decay}",
                f"optim.betas=[{self.betas[0]},{self.betas[1]}]", f"optim.eps={self.eps}",
                f"optim.clip_grad_norm={self.clip_grad_norm}", "schedule.name=linear", f"schedule.warmup={self.warmup}",
                f"train.micro_batch_size={self.batch_size}", f"train.global_batch_size={self.batch_size}",
                f"data.mask_prob={MASK_PROBABILITY}", "train.precision=fp32", "train.log_every=10"]


TUNED = Hyperparameters()


@dataclass
class RunSpec:
    arm: str
    budget_minutes: float
    seed: int
    model: str
    threads: int
    out_dir: str
    tokenizer_dir: str
    data_dir: str  # bertforge's prepared dataset (c, d) or the group_texts `save_to_disk` directory (a, b)
    recipe: str | None  # arm d's recipe
    calibration: tuple[float, int]  # HF arms: seconds of steps timed, after this many warm-up steps


def bertforge_config(spec: RunSpec, max_steps: int | None = None, overrides: tuple[str, ...] = ()) -> Any:
    """Arm c: the tuned hyperparameters; arm d: the recipe. Both: this run's place, data, budget and seed, then
    `overrides`. With `max_steps` the run has both budgets: its schedules follow the steps, the time stops it."""
    from bertforge.config import load_config

    placement = [
        "run.name=bertforge", f"run.output_dir={spec.out_dir}", f"run.seed={spec.seed}", "run.device=cpu",
        "run.resume=never", f"data.path={spec.data_dir}", f"model.preset={spec.model}",
        f"train.max_time_minutes={spec.budget_minutes}", f"train.max_steps={'null' if max_steps is None else max_steps}",
        "train.max_tokens=null", "train.max_epochs=null", "train.eval_every=1000000000", "log.progress=false",
        "log.tensorboard=false", *overrides]
    if spec.arm == "d":
        return load_config(spec.recipe, placement)
    return load_config(None, TUNED.bertforge_overrides() + placement)
