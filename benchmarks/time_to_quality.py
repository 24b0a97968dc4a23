"""Time to quality: what four ways of pre-training a BERT reach in the same wall-clock minutes (issue 18).

One corpus, one WordPiece tokenizer (8192, trained on the corpus as `pretrain_vs_hf.py` trains it),
one model shape (`--model`, bert-mini by default), sequences of 128 tokens and 15% masking for all
four arms, each trained for each of the `--budgets` (minutes of training on this machine):

- `a`: HF `run_mlm.py` as a user runs it out of the box: `BertForMaskedLM` from a config, the
  training documents tokenized and cut into 128-token blocks by `group_texts` (`--max_seq_length
  128`, the one flag passed), `DataCollatorForLanguageModeling(mlm_probability=0.15)` and
  `TrainingArguments`' defaults (transformers 5.x): learning rate 5e-5, `lr_scheduler_type` linear,
  `warmup_steps` 0, `optim` adamw_torch_fused with betas 0.9/0.999, eps 1e-8, weight decay 0.0,
  `max_grad_norm` 1.0, `per_device_train_batch_size` 8, `logging_steps` 500, seed 42 (here the
  pre-training seed). The only argument sized here is `max_steps` (below);
- `b`: the same model, data and collator under HF `Trainer` with bertforge's tuned hyperparameters,
  as `pretrain_vs_hf.py`'s `HF (b) group_texts` arm: batch 32, lr 1e-3, linear decay after 6%
  warmup, AdamW betas 0.9/0.98, eps 1e-6, weight decay 0.01, clipping 1.0, dropout 0.1;
- `c`: `bertforge pretrain` with those hyperparameters on the prepared dataset (sentences of one
  document packed up to 128 tokens), as `pretrain_vs_hf.py`'s `bertforge` arm;
- `d`: `bertforge pretrain` with the budget recipe, `configs/pretrain/budget-cpu.yaml` (`--recipe`):
  every key of it except where and how long it runs (run.*, data.path, the budget keys, evaluation
  and logging), on the same prepared dataset. Its model section must not change the shape; its
  switches keyed to the step count get a step budget as well (below).

The budget. bertforge trains with `train.max_time_minutes`: its clock (`TrainingState.elapsed_seconds`)
counts the optimizer steps (data, forward, backward, optimizer), not the set-up, logging, its
evaluation or checkpoints, and its schedule follows that clock, so its learning rate reaches zero at
the budget. HF `Trainer` has no time budget: `BudgetClock` (a `TrainerCallback`) runs a clock from
`on_train_begin`, stops training when it passes the budget, and is paused while it exports. HF's
linear schedule is sized in steps, so `max_steps` is estimated by a timed calibration: the same
model, data and arguments, freshly built in the same process, train for `CALIBRATION_SECONDS` (20)
after `CALIBRATION_WARMUP` (5) steps; seconds per step is measured between the starts of the timed
steps, and `max_steps = budget / seconds per step`. The calibration is thrown away and not counted. It is an
estimate: where the real run is slower (a busier machine, slower later steps), the clock stops it
before its learning rate has decayed to zero; where it is faster, it runs out of steps before the
budget and its curve ends early. Each run records planned and done steps and its minutes.

Arm (d)'s recipe may turn on switches that bertforge keys to the step count (`Config.step_keyed_switches`:
`data.mask_schedule`, `data.seq_len_schedule`, `train.batch_ramp_start`), which it refuses under a
time budget alone. With any of them, arm (d)'s steps are planned from timed calibrations, bertforge runs
of the recipe on the same prepared data, thrown away, each timed by its own clock (`elapsed_seconds`)
over `CALIBRATION_SECONDS` after `CALIBRATION_WARMUP` steps, and the run gets both `train.max_steps`
and `train.max_time_minutes`: its schedules, the learning rate's included, follow the steps, and the
time budget is a hard stop. One calibration runs the recipe's most expensive step throughout
(`calibration_overrides`: the full batch, full-length samples, the higher of its mask rates, since the
vocabulary projection runs only on masked rows); where the ramp or a shorter phase makes cheaper
steps, a second runs its cheapest (`cheapest_calibration_overrides`: the ramp's first batch at the
shortest phase's length, the higher mask rate still). A step's seconds are modelled as a line in its
tokens (samples × length) through the two (`StepCost`), and the planned steps are the most whose
modelled seconds, over the step shapes the ramp and phases give (`step_tokens`, the trainer's own
functions of step and total steps), fit the budget (`steps_filling`). (Before the second calibration,
the dearest step's seconds alone sized the plan, and the 10-minute ramp and phase screens ended at 6.9
and 7.4 minutes.) The record says how many steps were planned and done, and both calibrations. A
recipe with only time-keyed switches trains for `train.max_time_minutes` alone, as arm (c) does.

Along each run the model is exported in HF format at 1/8, 1/4, 1/2 and 3/4 of the budget (by each
arm's own clock, not counted in it) and at the end (`final/`); with `train.ema` bertforge's exports
hold the moving average, as its `final/` does (with `train.average_last_k` only `final/` is an
average). Quality:

- validation MLM loss and accuracy of every export, by `pretrain_vs_hf.py`'s `mlm_accuracy`: stock
  `transformers.BertForMaskedLM` on the prepared dataset's validation split (the last 2% of the
  documents, Megatron's split 980,20, never trained on by any arm: HF's blocks are built from the
  documents before them) with masks fixed by one seed (`packed_validation_batches`). (The tokenizer
  is trained on the whole corpus, validation documents included, as in `pretrain_vs_hf.py`.)
- downstream test accuracy of each run's final model after the same `bertforge finetune` (the
  quickstart's recipe, `recipes/quickstart-finetune-tiny.yaml`: 3 epochs, max length 64) with
  `--downstream-seeds` seeds at the learning rate of `--downstream-lrs` (1e-3, 5e-4, 3e-4) and the
  dropout of `--downstream-dropouts` (the model's own, 0.1 here, or 0) that scored best on a dev split
  for that model and task (fine-tuned with the first seed on 9/10 of the training rows, scored on the
  other tenth; the BERT paper's per-model choice: one lr for all arms favoured the barely trained
  models, and supersense fine-tunes better without dropout); a fine-tune that already finished with
  the same config, model and code is read back, not re-run. The tasks: the bundled supersense task
  (8,000 train / 2,000 test glosses, as `pretrain_vs_hf.py`) and `manpages` (all 2,998 train / 387
  test rows: a man page's DESCRIPTION -> its manual section, 6 classes). manpages because it is
  technical prose like the debian-docs corpus yet kept out of it by
  `scripts/build_pretraining_corpus.py`, and it asks for another skill than glosses (what kind of
  thing a text documents), while staying small enough to fine-tune in a minute.
- MLM accuracy of each final model on each downstream task's test texts (masked once, as above): a
  model can only bring to a task what its corpus taught it about that task's text;
- time to quality: the first minute at which an arm's validation MLM accuracy reaches (b)'s at the
  largest budget, linearly interpolated between exports on each of the arm's runs (the earliest over
  its budgets; "≤" where its first export already reached it).

Every (arm, budget, pre-training seed) is one result file under `--work-dir`, written atomically as
soon as it is scored; a re-run skips the done ones (results measured with other settings are refused,
not mixed in). The report is built from every result in the store, so a study can be run in parts.

The corpora (`--corpus`): `bundled` (the KJV and the supersense training glosses), `debian-docs`
(`scripts/build_pretraining_corpus.py`) and `mixed`: every k-th debian-docs document, k chosen for 2/3 of
the text, and the whole bundled corpus, spread evenly through one file written into the work directory
(`write_mixed_corpus`), so that the one corpus covers the text of both downstream tasks. Studies are run in parts, e.g.:

    .venv/bin/python benchmarks/time_to_quality.py --quick --arms a,b,c           # smoke run, a few minutes
    .venv/bin/python benchmarks/time_to_quality.py --corpus debian-docs --arms a,b --budgets 10,20,40
    .venv/bin/python benchmarks/time_to_quality.py --corpus debian-docs --arms c,d --budgets 10,20,40
    .venv/bin/python benchmarks/time_to_quality.py --corpus mixed --arms b,d --budgets 40 --downstream-seeds 5

    python scripts/build_pretraining_corpus.py               # the debian-docs corpus, once
    python scripts/build_parity_tasks.py --tasks manpages    # the manpages task, once

The report goes to `benchmarks/results/time_to_quality.md` (+ `.json`, `.png`); `--quick` writes
into the work directory instead, so a smoke run never replaces a measurement.
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from transformers import TrainerCallback

from bertforge.train.trainer import Trainer as BertforgeTrainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parent.parent


def _repo_module(relative_path: str, module_name: str) -> ModuleType:
    """A script or benchmark of this repository imported by path (they are files, not packages)."""
    spec = importlib.util.spec_from_file_location(module_name, REPO / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in the module look it up there
    spec.loader.exec_module(module)
    return module


pv = _repo_module("benchmarks/pretrain_vs_hf.py", "bertforge_pretrain_vs_hf_benchmark")
parity = _repo_module("benchmarks/parity.py", "bertforge_parity_benchmark")
corpus_builder = _repo_module("scripts/build_pretraining_corpus.py", "bertforge_build_pretraining_corpus")

SEQ_LEN, MASK_PROBABILITY = pv.SEQ_LEN, pv.MASK_PROBABILITY
RESULTS = REPO / "benchmarks" / "results"
DEFAULT_RECIPE = REPO / "configs" / "pretrain" / "budget-cpu.yaml"
ARMS = ("a", "b", "c", "d")
ARM_TITLES = {"a": "(a) HF run_mlm.py defaults", "b": "(b) HF Trainer, tuned", "c": "(c) bertforge, tuned",
              "d": "(d) bertforge, budget recipe"}
EXPORT_FRACTIONS = (0.125, 0.25, 0.5, 0.75)  # of the budget, besides the end
CALIBRATION_SECONDS, CALIBRATION_WARMUP, MIN_TIMED_STEPS = 20.0, 5, 5
DOWNSTREAM_TASKS = ("supersense", "manpages")
ALL_ROWS = 1_000_000  # parity.load_task keeps every row of a split with fewer rows than this
DOWNSTREAM_ROWS = {"supersense": (pv.DOWNSTREAM_ROWS["train"], pv.DOWNSTREAM_ROWS["test"]),
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

    batch_size: int = pv.DEVICE_DEFAULTS["cpu"]["batch_size"]
    lr: float = pv.DEVICE_DEFAULTS["cpu"]["lr"]
    warmup: float = pv.WARMUP_FRACTION
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


# ---------------------------------------------------------------------------------------------
# the wall clock: HF's budget callback, its calibration, bertforge's exports along its own clock


class BudgetClock(TrainerCallback):
    """Stops HF `Trainer` once `budget_seconds` of training have passed, and calls `export(model, seconds,
    step)` (keeping what it returns in `exports`) as the clock passes each of `marks` (seconds).

    The clock starts at `on_train_begin` and is paused while exporting, as bertforge's elapsed time leaves
    its checkpoints and exports out; `stopped_at` is its reading when training ended.
    """

    def __init__(self, budget_seconds: float, marks: tuple[float, ...] = (),
                 export: Callable[[Any, float, int], dict[str, Any]] | None = None) -> None:
        self.budget_seconds = budget_seconds
        self.pending_marks = sorted(mark for mark in marks if mark < budget_seconds)
        self.export = export
        self.exports: list[dict[str, Any]] = []
        self.started = self.paused = 0.0
        self.stopped_at: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.paused

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started, self.paused = time.perf_counter(), 0.0

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        while self.pending_marks and self.elapsed() >= self.pending_marks[0]:
            self.pending_marks.pop(0)
            if self.export is not None:
                pause_began = time.perf_counter()
                self.exports.append(self.export(model, self.elapsed(), state.global_step))
                self.paused += time.perf_counter() - pause_began
        if self.elapsed() >= self.budget_seconds:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stopped_at = self.elapsed()


class StepTiming(TrainerCallback):
    """The calibration: times HF `Trainer`'s steps and stops it once `seconds` have passed after `warmup` steps
    (and at least `MIN_TIMED_STEPS` steps were timed)."""

    def __init__(self, seconds: float, warmup: int) -> None:
        self.seconds, self.warmup = seconds, warmup
        self.starts: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        timed = len(self.starts) - 1 - self.warmup
        if timed >= MIN_TIMED_STEPS and self.starts[-1] - self.starts[self.warmup] >= self.seconds:
            control.should_training_stop = True

    def seconds_per_step(self) -> float:
        """Between the starts of the first step after warm-up and of the last step."""
        return (self.starts[-1] - self.starts[self.warmup]) / (len(self.starts) - 1 - self.warmup)


class ExportingTrainer(BertforgeTrainer):
    """bertforge's trainer that also exports its model in HF format as its clock (`elapsed_seconds`, the one its
    time budget and schedule follow) passes each of `marks` (seconds)."""

    def __init__(self, config: Any, task: Any, marks: tuple[float, ...], exports_dir: Path) -> None:
        super().__init__(config, task)
        self.pending_marks = sorted(marks)
        self.exports_dir = exports_dir
        self.exports: list[dict[str, Any]] = []

    def _budget_spent(self, state: Any, total_steps: int | None) -> bool:
        # asked between steps, outside the span the clock counts, so exporting costs the run no budget
        while self.pending_marks and state.elapsed_seconds >= self.pending_marks[0]:
            self.pending_marks.pop(0)
            self.exports.append(self._export(state))
        return super()._budget_spent(state, total_steps)

    def _export(self, state: Any) -> dict[str, Any]:
        model = self.raw_model
        if self.ema is not None:  # what final/ would hold if the run stopped here
            model = copy.deepcopy(self.raw_model)
            self.ema.copy_to(model)
        directory = self.exports_dir / f"step-{state.step:08d}"
        self.task.save_final(model, directory)
        return curve_point(state.elapsed_seconds, state.step, state.consumed_tokens, directory)


class CalibratingTrainer(BertforgeTrainer):
    """Arm d's calibration: bertforge's trainer stopped once `seconds` of its own clock (`elapsed_seconds`, the one
    its time budget follows) have passed after `warmup` steps (and at least `MIN_TIMED_STEPS` steps were timed)."""

    def __init__(self, config: Any, task: Any, seconds: float, warmup: int) -> None:
        super().__init__(config, task)
        self.seconds, self.warmup = seconds, warmup
        self.warm_elapsed = 0.0  # the clock when the warm-up steps were done

    def _budget_spent(self, state: Any, total_steps: int | None) -> bool:
        if state.step == self.warmup:
            self.warm_elapsed = state.elapsed_seconds
        timed = state.step - self.warmup
        if timed >= MIN_TIMED_STEPS and state.elapsed_seconds - self.warm_elapsed >= self.seconds:
            return True
        return super()._budget_spent(state, total_steps)

    def seconds_per_step(self, state: Any) -> float:
        """Over the steps after warm-up, by the run's own clock."""
        return (state.elapsed_seconds - self.warm_elapsed) / (state.step - self.warmup)


def curve_point(seconds: float, step: int, tokens: int, model_dir: Path) -> dict[str, Any]:
    return {"minutes": seconds / 60, "step": step, "tokens": tokens, "model_dir": str(model_dir)}


def curve_points(exports: list[dict[str, Any]], final: dict[str, Any]) -> list[dict[str, Any]]:
    """The exports, then the final model; an export taken at the last step (a mark passed on it) is that model."""
    return [point for point in exports if point["step"] < final["step"]] + [final]


def export_marks(budget_minutes: float) -> tuple[float, ...]:
    return tuple(fraction * budget_minutes * 60 for fraction in EXPORT_FRACTIONS)


# ---------------------------------------------------------------------------------------------
# one run, in its own process


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


def hf_masked_lm(tokenizer: Any, preset: str) -> Any:
    """`BertForMaskedLM` of the preset's shape and HF's default dropout (0.1), as `pretrain_vs_hf.run_hf` builds it."""
    from transformers import BertConfig, BertForMaskedLM

    from bertforge.models import get_preset

    geometry = get_preset(preset)
    return BertForMaskedLM(BertConfig(
        vocab_size=len(tokenizer), hidden_size=geometry.hidden_size, num_hidden_layers=geometry.num_layers,
        num_attention_heads=geometry.num_heads, intermediate_size=geometry.intermediate_size,
        max_position_embeddings=geometry.max_position_embeddings, pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa"))


def run_hf_arm(spec: RunSpec) -> dict[str, Any]:
    """Arm a or b: calibrate the steps the budget allows, then train under `BudgetClock`, exporting along the way."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir)
    train = load_from_disk(spec.data_dir)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY)
    chosen = {} if spec.arm == "a" else TUNED.hf_arguments()  # (a): TrainingArguments' defaults
    out = Path(spec.out_dir)

    def trainer(max_steps: int, callback: TrainerCallback, name: str) -> Any:
        arguments = TrainingArguments(output_dir=str(out / name), max_steps=max_steps, seed=spec.seed, use_cpu=True,
                                      save_strategy="no", report_to="none", disable_tqdm=True, **chosen)
        torch.manual_seed(spec.seed)  # run_mlm.py's set_seed before the model is built
        return Trainer(model=hf_masked_lm(tokenizer, spec.model), args=arguments, train_dataset=train,
                       data_collator=collator, processing_class=tokenizer, callbacks=[callback])

    timing = StepTiming(*spec.calibration)
    trainer(1_000_000, timing, "calibration").train()  # stopped by `timing`; its schedule does not matter
    seconds_per_step = timing.seconds_per_step()
    budget_seconds = spec.budget_minutes * 60
    planned_steps = max(1, int(budget_seconds / seconds_per_step))

    def tokens_after(step: int) -> int:  # every group_texts row holds 128 real tokens
        return step * measured.args.per_device_train_batch_size * SEQ_LEN

    def export(model: Any, seconds: float, step: int) -> dict[str, Any]:
        directory = out / "exports" / f"step-{step:08d}"
        model.save_pretrained(str(directory))
        return curve_point(seconds, step, tokens_after(step), directory)

    clock = BudgetClock(budget_seconds, export_marks(spec.budget_minutes), export)
    measured = trainer(planned_steps, clock, "trainer")
    measured.train()
    final = out / "final"
    measured.save_model(str(final))
    assert clock.stopped_at is not None  # on_train_end has run
    step = measured.state.global_step
    return {"points": curve_points(clock.exports, curve_point(clock.stopped_at, step, tokens_after(step), final)),
            "planned_steps": planned_steps, "calibration_seconds_per_step": seconds_per_step,
            "hyperparameters": {key: str(getattr(measured.args, key)) for key in (
                "per_device_train_batch_size", "learning_rate", "lr_scheduler_type", "warmup_steps", "optim",
                "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "max_grad_norm")}}


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


def calibration_overrides(config: Any) -> tuple[str, ...]:
    """`config`'s most expensive step, every step: the full batch, full-length samples and the higher of its mask
    rates (the vocabulary projection runs only on masked rows). Its evaluation at the end, thrown away with the run,
    scores one validation sample."""
    mask_prob = max(config.data.mask_prob, config.data.mask_prob_start or 0.0)
    return ("run.name=calibration", "train.max_time_minutes=null", "train.batch_ramp_start=null",
            "data.seq_len_schedule=[]", "data.mask_schedule=constant", "data.mask_prob_start=null",
            f"data.mask_prob={mask_prob}", "data.validation_samples=1")


def cheapest_step(config: Any) -> tuple[int, int]:
    """(samples, tokens per sample) of `config`'s cheapest step: the batch ramp's first and the shortest phase's."""
    samples = config.train.batch_ramp_start or config.train.global_batch_size
    return samples, min([config.data.seq_len, *(phase.seq_len for phase in config.data.seq_len_schedule)])


def cheapest_calibration_overrides(config: Any) -> tuple[str, ...]:
    """`calibration_overrides` at the shape of `cheapest_step`: that batch, and samples cut to that length for every
    step (one phase to the last step of the calibration's step budget). The mask rate stays the higher one."""
    samples, seq_len = cheapest_step(config)
    phase = () if seq_len == config.data.seq_len else (f"data.seq_len_schedule=[{{seq_len: {seq_len}, until: 0.999999}}]",)
    return (*calibration_overrides(config), f"train.global_batch_size={samples}", *phase)


@dataclass(frozen=True)
class StepCost:
    """Seconds per step as a line in the step's tokens (samples × tokens per sample) through two timed shapes: the
    recipe's cheapest step and its most expensive one (one shape, one cost, when they are the same)."""
    cheap_tokens: int
    cheap_seconds: float
    full_tokens: int
    full_seconds: float

    @property
    def seconds_per_token(self) -> float:
        tokens = self.full_tokens - self.cheap_tokens
        return (self.full_seconds - self.cheap_seconds) / tokens if tokens else 0.0

    def seconds(self, tokens: Any) -> Any:
        """Of a step, or of an array of steps, of `tokens` tokens."""
        return self.cheap_seconds + self.seconds_per_token * (tokens - self.cheap_tokens)


def step_tokens(config: Any, total_steps: int) -> Any:
    """The tokens of each of `total_steps` steps (samples × tokens per sample) under `config`'s batch ramp and
    sequence-length phases: the same functions of (step, total steps) the trainer and the data path follow."""
    import numpy as np

    from bertforge.data.curriculum import DataCurriculum
    from bertforge.data.sampler import BatchRamp

    train = config.train
    steps = np.arange(total_steps)
    samples = np.full(total_steps, train.global_batch_size)
    if train.batch_ramp_start is not None:
        ramp = BatchRamp.of_run(train, total_steps, world_size=1)  # the benchmark trains in one process
        samples = np.array([ramp.size_at(int(step)) for step in steps])
    curriculum = DataCurriculum.from_config(config.data)
    lengths = np.array([curriculum.at(int(step), total_steps).seq_len or config.data.seq_len for step in steps])
    return samples * lengths


def steps_filling(budget_seconds: float, cost: StepCost, config: Any) -> int:
    """The most steps whose modelled seconds (`cost` over `step_tokens`) fit in `budget_seconds`: a step budget that a
    ramp's or a short phase's cheap early steps do not leave partly unused. Between the bounds that certainly fit
    (every step the dearest) and certainly do not (every step the cheapest), by bisection."""
    def fits(total_steps: int) -> bool:
        return float(cost.seconds(step_tokens(config, total_steps)).sum()) <= budget_seconds

    low = max(1, int(budget_seconds / max(cost.full_seconds, cost.cheap_seconds)))
    high = int(budget_seconds / min(cost.full_seconds, cost.cheap_seconds)) + 1
    if not fits(low):
        return low
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def calibrate_bertforge(spec: RunSpec, config: Any, overrides: tuple[str, ...]) -> float:
    """Seconds per step of `config` with `overrides` (a calibration shape), timed by a short bertforge run on the same
    data that is then thrown away."""
    from bertforge.tasks.pretrain import PretrainTask

    calibration = bertforge_config(spec, max_steps=1_000_000, overrides=overrides)
    trainer = CalibratingTrainer(calibration, PretrainTask(calibration), *spec.calibration)
    result = trainer.fit()  # stopped by the trainer's own calibration clock
    shutil.rmtree(result.run_dir)
    return trainer.seconds_per_step(result.state)


def step_cost(spec: RunSpec, config: Any) -> StepCost:
    """Both calibrations of `config` (one where its cheapest step is its dearest)."""
    full_tokens = config.train.global_batch_size * config.data.seq_len
    full_seconds = calibrate_bertforge(spec, config, calibration_overrides(config))
    samples, seq_len = cheapest_step(config)
    if samples * seq_len == full_tokens:
        return StepCost(full_tokens, full_seconds, full_tokens, full_seconds)
    return StepCost(samples * seq_len, calibrate_bertforge(spec, config, cheapest_calibration_overrides(config)),
                    full_tokens, full_seconds)


def run_bertforge_arm(spec: RunSpec) -> dict[str, Any]:
    """Arm c or d: `train.max_time_minutes`, exporting along bertforge's own clock; arm d's step-keyed switches
    add `train.max_steps`, planned from calibrations (`steps_filling`)."""
    from bertforge.tasks.pretrain import PretrainTask

    config = bertforge_config(spec)
    planned: dict[str, Any] = {}
    if switches := config.step_keyed_switches():
        cost = step_cost(spec, config)
        planned_steps = steps_filling(spec.budget_minutes * 60, cost, config)
        config = bertforge_config(spec, max_steps=planned_steps)
        planned = {"planned_steps": planned_steps, "calibration_seconds_per_step": cost.full_seconds,
                   "calibration_cheapest_seconds_per_step": cost.cheap_seconds,
                   "calibration_tokens_per_step": [cost.cheap_tokens, cost.full_tokens],
                   "step_keyed_switches": switches}
    trainer = ExportingTrainer(config, PretrainTask(config), export_marks(spec.budget_minutes),
                               Path(spec.out_dir) / "exports")
    result = trainer.fit()
    state = result.state
    final = curve_point(state.elapsed_seconds, state.step, state.consumed_tokens, result.run_dir / "final")
    return {"points": curve_points(trainer.exports, final),
            "stopped_by": result.stopped_by, **planned,
            "hyperparameters": {"optim": asdict(config.optim), "schedule": asdict(config.schedule),
                                "train": asdict(config.train), "model": asdict(config.model),
                                "data": {key: value for key, value in asdict(config.data).items()
                                         if key.startswith(("mask", "seq_len", "random", "whole"))}}}


def run_arm(spec_path: Path) -> None:
    """The child process: train one run and write its training record next to the spec."""
    import torch

    spec = RunSpec(**json.loads(spec_path.read_text(encoding="utf-8")))
    pv.quiet_progress_bars()
    torch.set_num_threads(spec.threads)
    shutil.rmtree(spec.out_dir, ignore_errors=True)  # a fresh run, never a resumed one
    Path(spec.out_dir).mkdir(parents=True)
    record = run_bertforge_arm(spec) if spec.arm in ("c", "d") else run_hf_arm(spec)
    pv.write_atomically(spec_path.with_name("training.json"), json.dumps(record, indent=1))


# ---------------------------------------------------------------------------------------------
# inputs: the corpus, the tokenizer, bertforge's prepared dataset, HF's group_texts blocks


CORPORA = ("bundled", "debian-docs", "mixed")
# The mixed corpus: debian-docs documents for two thirds of its bytes, the whole bundled corpus for the
# other third. Each single corpus covers the text of one downstream task (debian-docs the manpages'
# technical prose, bundled the supersense glosses), and on each the budget recipe beat HF on that task
# and trailed on the other; the mix covers both, in a corpus small enough (36.7 MB, 8.6M tokens) that both
# arms' 40 minutes see every document at least once (1.0 and 2.1 epochs measured).
MIXED_DEBIAN_DOCS_SHARE = 2 / 3


def corpus_file(name: str, work: Path) -> Path:
    """The corpus text file (the mixed one is written under `work` once); a missing debian-docs corpus ends the
    program with the command that builds it."""
    from bertforge.data.bundled import corpus_path

    if name == "bundled":
        return corpus_path()
    path = corpus_builder.default_out() / corpus_builder.CORPUS_FILE
    if not path.is_file():
        print(f"error: the debian-docs corpus is not built ({path} is missing); build it with "
              "`python scripts/build_pretraining_corpus.py`", file=sys.stderr)
        raise SystemExit(2)
    if name == "debian-docs":
        return path
    mixed = work / "corpus.txt"
    if not mixed.is_file():
        write_mixed_corpus(path, corpus_path(), MIXED_DEBIAN_DOCS_SHARE, mixed)
    return mixed


def write_mixed_corpus(large: Path, small: Path, large_share: float, out: Path) -> dict[str, int]:
    """All of `small`'s documents and every k-th of `large`'s, k chosen so that `large` gives about `large_share`
    of the text, interleaved evenly (document i of a part's n sits at (i + 0.5) / n of the file), so that the
    last 2% of documents, the validation split, holds both parts in their shares. Written atomically as a
    bertforge .txt corpus; returns the documents taken from each part."""
    large_documents, small_documents = corpus_documents(large), corpus_documents(small)
    large_chars, small_chars = sum(map(len, large_documents)), sum(map(len, small_documents))
    stride = max(1, round(large_chars * (1 - large_share) / (large_share * small_chars)))
    taken = large_documents[::stride]
    placed = sorted([((index + 0.5) / len(taken), 0, text) for index, text in enumerate(taken)]
                    + [((index + 0.5) / len(small_documents), 1, text) for index, text in enumerate(small_documents)])
    pv.write_atomically(out, "".join(f"{text}\n\n" for _, _, text in placed))
    return {"large": len(taken), "small": len(small_documents)}


def prepare_corpus(corpus: Path, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """`pretrain_vs_hf.prepare_inputs` for any corpus file: the tokenizer and the packed dataset (reused when present)."""
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    tokenizer_dir, data_dir = work / "tokenizer", work / f"data-{SEQ_LEN}"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer_from_inputs([str(corpus)], tokenizer_dir, vocab_size=pv.VOCAB_SIZE)
    manifest = prepare_pretraining_data([str(corpus)], tokenizer_dir, data_dir,
                                        PrepareSettings(seq_len=SEQ_LEN, split=(980.0, 20.0)), workers=2,
                                        progress=False)
    return tokenizer_dir, data_dir, manifest


def corpus_documents(corpus: Path) -> list[str]:
    """The corpus' documents in order, read as `bertforge prepare` reads them (`pretrain_vs_hf.corpus_documents`)."""
    from bertforge.data.sources import iter_documents, resolve_inputs

    return [document.text for document in iter_documents(resolve_inputs([str(corpus)]))]


def group_texts_dataset(work: Path, tokenizer_dir: Path, corpus: Path, manifest: dict[str, Any]) -> Path:
    """The training documents as `run_mlm.py` feeds them (`pretrain_vs_hf.hf_training_dataset`), saved once
    per prepared dataset (its `cache_key` covers the corpus, the tokenizer and the split)."""
    from transformers import AutoTokenizer

    target = work / "hf-group-texts"
    stamp = target / "bertforge_cache_key.txt"
    if stamp.is_file() and stamp.read_text(encoding="utf-8") == manifest["cache_key"]:
        return target
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.model_max_length = 1 << 30  # run_mlm tokenizes whole documents; silence the length warning
    train_documents = manifest["splits"]["train"]["documents"]
    dataset = pv.hf_training_dataset("hf-group-texts", corpus_documents(corpus)[:train_documents], tokenizer)
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    (staging / stamp.name).write_text(manifest["cache_key"], encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def check_recipe(recipe: Path, model: str) -> None:
    """Arm d's recipe must exist, keep the benchmark's model shape and its 128-token samples."""
    from bertforge.config import Config, load_config

    if not recipe.is_file():
        raise SystemExit(f"error: arm d trains the budget recipe {recipe}, which does not exist yet; write it, give "
                         "another with --recipe PATH, or leave arm d out (--arms a,b,c)")
    config, default = load_config(recipe), Config()
    if config.model.preset not in (default.model.preset, model):
        raise SystemExit(f"error: {recipe} sets model.preset={config.model.preset} but the other arms train {model}; "
                         f"run the benchmark with --model {config.model.preset} so that all arms share one shape")
    changed = [key for key in SHAPE_KEYS if getattr(config.model, key) != getattr(default.model, key)]
    if changed:
        raise SystemExit(f"error: {recipe} changes the model's shape (model.{', model.'.join(changed)}); every arm "
                         f"trains the {model} preset, which the HF arms build as BertForMaskedLM: remove those keys")
    if config.data.seq_len != SEQ_LEN:
        raise SystemExit(f"error: {recipe} sets data.seq_len={config.data.seq_len}; the benchmark prepares "
                         f"{SEQ_LEN}-token samples for every arm (shorter phases go in data.seq_len_schedule)")


def recipe_fingerprint(recipe: Path) -> str:
    """sha256 of the recipe as loaded (its `extends` chain resolved): arm d's results are tied to it."""
    from bertforge.config import load_config

    return hashlib.sha256(json.dumps(asdict(load_config(recipe)), sort_keys=True).encode()).hexdigest()


def downstream_tasks(rows: dict[str, tuple[int, int]]) -> list[Any]:
    """The fine-tuning tasks (`parity.load_task`); a missing manpages task ends the program with its command."""
    if not (parity.tasks_dir() / "manpages" / "task.json").is_file():
        print(f"error: the manpages task is not built ({parity.tasks_dir() / 'manpages'} is missing); build it with "
              "`python scripts/build_parity_tasks.py --tasks manpages`", file=sys.stderr)
        raise SystemExit(2)
    return [parity.load_task(name, *rows[name]) for name in DOWNSTREAM_TASKS]


# ---------------------------------------------------------------------------------------------
# quality


def fine_tune_accuracy(model_dir: str, task: Any, name: str, seed: int, work: Path, threads: int,
                       overrides: tuple[str, ...] = ()) -> float:
    """`pretrain_vs_hf.fine_tune_accuracy` for any classification task of `parity.load_task`: the quickstart's
    fine-tuning recipe with a fresh pooler and classifier (plus `overrides`), test accuracy at the end. A run that
    finished with the same config and code after the model was written is read back instead (fine-tuning is
    deterministic on CPU), so an interrupted scoring resumes and a wider grid re-runs only its new settings."""
    import torch

    from bertforge.config import finetune_defaults, load_config
    from bertforge.tasks.classify import ClassificationTask

    torch.set_num_threads(threads)
    files = {}
    for split, rows in (("train", task.train), ("test", task.test)):
        files[split] = work / "downstream" / f"{task.name}-{split}-{len(rows)}.jsonl"
        if not files[split].is_file():
            pv.write_atomically(files[split], "".join(json.dumps({"text": row["text"], "label": str(row["label"])}) + "\n"
                                                      for row in rows))
    recipe = REPO / "src" / "bertforge" / "recipes" / "quickstart-finetune-tiny.yaml"
    run_name = f"{name}-{task.name}-ft{seed}"
    labels = ",".join(json.dumps(label) for label in task.labels)  # quoted: manpages' labels are digits
    config = load_config(recipe, [
        f"run.output_dir={work / 'downstream'}", f"run.name={run_name}", f"run.seed={seed}", "run.device=cpu",
        "run.resume=never", f"model.init_from={model_dir}", f"finetune.train_file={files['train']}",
        f"finetune.test_file={files['test']}", f"finetune.labels=[{labels}]", "train.best_metric=null",
        "log.progress=false", "log.tensorboard=false", *overrides], base=finetune_defaults())
    run_dir = work / "downstream" / run_name
    if not finished_fine_tune(run_dir, config, Path(model_dir)):
        shutil.rmtree(run_dir, ignore_errors=True)  # a re-scored run starts afresh
        run_dir = BertforgeTrainer(config, ClassificationTask(config)).fit().run_dir
        (run_dir / CODE_FILE).write_text(code_fingerprint(), encoding="utf-8")
    return json.loads((run_dir / "test_results.json").read_text())["metrics"]["accuracy"]


@functools.cache  # once per process: the code that runs is the code imported at the start, not a later edit
def code_fingerprint() -> str:
    """sha256 of torch's version and bertforge's source: a fine-tune is reused only under the code that ran it, since
    a change of float rounding alone (such as folding clipping into AdamW) moves its accuracy as another seed does."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted((REPO / "src" / "bertforge").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def finished_fine_tune(run_dir: Path, config: Any, model_dir: Path) -> bool:
    """Whether `run_dir` holds the test results of `config`, run by this code after every file of the model it starts
    from was written."""
    from bertforge.config import config_to_yaml

    results, saved, code = run_dir / "test_results.json", run_dir / "config.yaml", run_dir / CODE_FILE
    if not (results.is_file() and saved.is_file() and code.is_file()):
        return False
    if saved.read_text(encoding="utf-8") != config_to_yaml(config) or code.read_text(encoding="utf-8") != code_fingerprint():
        return False
    return results.stat().st_mtime > max(path.stat().st_mtime for path in model_dir.iterdir())


@dataclass(frozen=True)
class FineTuning:
    """One fine-tuning setting of the grid a dev split chooses from: a learning rate and the dropout rate (hidden,
    attention and classifier together; None keeps the model's own)."""
    lr: float
    dropout: float | None = None

    @property
    def overrides(self) -> tuple[str, ...]:
        rate = () if self.dropout is None else (f"model.hidden_dropout={self.dropout}",
                                                f"model.attention_dropout={self.dropout}",
                                                f"model.classifier_dropout={self.dropout}")
        return (f"optim.lr={self.lr}", *rate)

    @property
    def slug(self) -> str:  # the model's own dropout keeps the run names of the earlier, lr-only grid
        return f"lr{self.lr:g}" + ("" if self.dropout is None else f"-dropout{self.dropout:g}")

    def __str__(self) -> str:
        return f"lr {self.lr:g}, dropout {dropout_text(self.dropout)}"


def dropout_text(rate: float | None) -> str:
    return "the model's" if rate is None else f"{rate:g}"


def fine_tuning_grid(lrs: list[float], dropouts: list[float | None]) -> list[FineTuning]:
    return [FineTuning(lr, dropout) for lr in lrs for dropout in dropouts]


def fine_tune_with(model_dir: str, task: Any, name: str, setting: FineTuning, seed: int, work: Path,
                   threads: int) -> float:
    """`fine_tune_accuracy` with `setting`, its run named after it."""
    return fine_tune_accuracy(model_dir, task, f"{name}-{setting.slug}", seed, work, threads, setting.overrides)


def dev_split(task: Any) -> Any:
    """The task with every DEV_EVERY-th training row moved to its test split: the dev set the settings are chosen
    on (the rows are spread over the labels, so the dev set keeps their mix); the real test rows are not seen."""
    train = [row for index, row in enumerate(task.train) if index % DEV_EVERY != DEV_EVERY - 1]
    dev = [row for index, row in enumerate(task.train) if index % DEV_EVERY == DEV_EVERY - 1]
    return replace(task, name=f"{task.name}-dev", train=train, test=dev)


def choose_setting(model_dir: str, task: Any, name: str, grid: list[FineTuning], work: Path,
                   threads: int) -> dict[str, Any]:
    """Fine-tune on the dev split's training rows with each setting (the first fine-tuning seed); `best_setting`
    picks."""
    seed, dev = pv.DOWNSTREAM_SEEDS[0], dev_split(task)
    scores = {setting: fine_tune_with(model_dir, dev, name, setting, seed, work, threads) for setting in grid}
    chosen = best_setting(scores)
    return {"chosen": asdict(chosen), "chosen_text": str(chosen),
            "dev_accuracy": {str(setting): accuracy for setting, accuracy in scores.items()},
            "dev_rows": [len(dev.train), len(dev.test)]}


def best_setting(dev_accuracy: dict[FineTuning, float]) -> FineTuning:
    """The setting with the best dev accuracy; of equals the gentler: the lower lr, then the model's own dropout
    (then the higher rate)."""
    def gentleness(setting: FineTuning) -> tuple[float, float]:
        return setting.lr, -(float("inf") if setting.dropout is None else setting.dropout)

    return max(sorted(dev_accuracy, key=gentleness), key=lambda setting: dev_accuracy[setting])  # first of equals


# ---------------------------------------------------------------------------------------------
# the result store


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
        pv.write_atomically(self.path(key), json.dumps(result, indent=1))

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text(encoding="utf-8")) for path in sorted(self.directory.glob("*.json"))]


# ---------------------------------------------------------------------------------------------
# the report


def time_to_reach(curve: list[tuple[float, float]], target: float) -> float | None:
    """The first minute at which `curve` ((minutes, accuracy) in time order) reaches `target`, linearly
    interpolated between the two points around the crossing; None if it never does. A curve already at
    the target at its first point gives that point's minute: an upper bound."""
    previous: tuple[float, float] | None = None
    for minutes, value in curve:
        if value >= target:
            if previous is None:
                return minutes
            before_minutes, before_value = previous
            return before_minutes + (minutes - before_minutes) * (target - before_value) / (value - before_value)
        previous = (minutes, value)
    return None


def mean_std(values: list[float], scale: float = 1.0, digits: int = 4) -> str:
    if not values:  # e.g. no downstream fine-tunes (`--downstream-seeds 0`)
        return "—"
    mean = f"{scale * statistics.fmean(values):.{digits}f}"
    return f"{mean} ± {scale * statistics.stdev(values):.{digits}f}" if len(values) > 1 else mean


@dataclass
class Cell:
    """One arm at one budget, over its pre-training seeds."""

    arm: str
    budget_minutes: float
    runs: list[dict[str, Any]]

    def finals(self, metric: str) -> list[float]:
        return [run["curve"][-1][metric] for run in self.runs]

    def mean_curve(self) -> list[tuple[float, float]]:
        """(minutes, accuracy) point by point, averaged over the seeds (their exports share the fractions)."""
        length = min(len(run["curve"]) for run in self.runs)
        return [(statistics.fmean(run["curve"][i]["minutes"] for run in self.runs),
                 statistics.fmean(run["curve"][i]["accuracy"] for run in self.runs)) for i in range(length)]


def cells_of(results: list[dict[str, Any]]) -> dict[tuple[str, float], Cell]:
    cells: dict[tuple[str, float], Cell] = {}
    for result in results:
        key = (result["arm"], result["budget_minutes"])
        cells.setdefault(key, Cell(*key, []))
        cells[key].runs.append(result)
    return dict(sorted(cells.items()))


def reach_times(cells: dict[tuple[str, float], Cell]) -> tuple[float | None, dict[str, tuple[float, float] | None]]:
    """(b)'s validation MLM accuracy at its largest budget, and per arm (minutes to reach it, the budget of the run
    that reached it first), None where none did."""
    b_budgets = [budget for arm, budget in cells if arm == "b"]
    if not b_budgets:
        return None, {}
    target = statistics.fmean(cells["b", max(b_budgets)].finals("accuracy"))
    times: dict[str, tuple[float, float] | None] = {}
    for arm in dict.fromkeys(arm for arm, _ in cells):
        reached = [(minutes, budget) for (other, budget), cell in cells.items() if other == arm
                   if (minutes := time_to_reach(cell.mean_curve(), target)) is not None]
        times[arm] = min(reached) if reached else None
    return target, times


def render(report: dict[str, Any], cells: dict[tuple[str, float], Cell]) -> str:
    settings, machine = report["settings"], report["machine"]
    data = report["data"]
    lines = [
        f"## Time to quality — {settings['model']}, seq {SEQ_LEN}, corpus {settings['corpus']}, torch threads: "
        f"{settings['threads']}", "",
        f"- Command: `{report['command']}`",
        f"- Machine: {machine['cpu']}, {machine['cpu_count']} cores; torch {machine['torch']}, transformers "
        f"{machine['transformers']}; load average {machine['load_average_start']:.2f} at the start, "
        f"{machine['load_average_end']:.2f} at the end (of this invocation; the store may hold runs of earlier ones)",
        f"- Data: {data['train_documents']:,} training documents ({data['train_tokens']:,} tokens by bertforge's "
        f"count), WordPiece {pv.VOCAB_SIZE}; validation: the last {data['validation_documents']:,} documents, "
        f"{data['validation_masked_tokens']:,} masked tokens (fixed masks), scored with stock "
        "`transformers.BertForMaskedLM` on every arm's HF export",
        f"- Downstream: `bertforge finetune` (recipes/quickstart-finetune-tiny.yaml) of each final model, "
        f"{settings['downstream_seeds']} seed(s) per task and pre-training seed, at the lr of "
        f"{', '.join(f'{lr:g}' for lr in settings['downstream_lrs'])} and the dropout of "
        f"{', '.join(dropout_text(rate) for rate in settings['downstream_dropouts'])} that scored best on a dev split (every "
        f"{DEV_EVERY}th training row, fine-tuned on the rest, seed {pv.DOWNSTREAM_SEEDS[0]}) per model and task; supersense "
        f"{settings['downstream_rows']['supersense'][0]:,} / {settings['downstream_rows']['supersense'][1]:,} and "
        f"manpages {data['manpages_rows'][0]:,} / {data['manpages_rows'][1]:,} train / test rows", "",
        "| arm | budget (min) | trained (min) | steps (planned) | tokens seen | MLM accuracy | MLM loss | "
        "supersense accuracy (%) | manpages accuracy (%) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (arm, budget), cell in cells.items():
        runs = cell.runs
        finals = [run["curve"][-1] for run in runs]
        planned = [run["training"].get("planned_steps") for run in runs]
        steps = f"{statistics.fmean(p['step'] for p in finals):,.0f}" + (
            f" ({statistics.fmean(planned):,.0f})" if None not in planned else "")
        downstream = {task: [a for run in runs for a in run["downstream"][task]] for task in DOWNSTREAM_TASKS}
        chosen = {task: sorted({run["downstream_setting"][task]["chosen_text"] for run in runs
                                if task in run["downstream_setting"]}) for task in DOWNSTREAM_TASKS}
        at = {task: f" ({'; '.join(texts)})" if texts else "" for task, texts in chosen.items()}
        lines.append(
            f"| {ARM_TITLES[arm]} | {budget:g} | {statistics.fmean(p['minutes'] for p in finals):.2f} | {steps} | "
            f"{statistics.fmean(p['tokens'] for p in finals):,.0f} | {mean_std(cell.finals('accuracy'))} | "
            f"{mean_std(cell.finals('loss'), digits=3)} | {mean_std(downstream['supersense'], 100, 2)}{at['supersense']} | "
            f"{mean_std(downstream['manpages'], 100, 2)}{at['manpages']} |")
    lines += ["", "MLM accuracy of each final model on the downstream tasks' test texts (15% masked once, the same masks "
              "for every arm): whether the pre-training corpus covers the text a task is about.", "",
              "| arm | budget (min) | " + " | ".join(f"{task} texts" for task in DOWNSTREAM_TASKS) + " |",
              "|---|---:|" + "---:|" * len(DOWNSTREAM_TASKS)]
    for (arm, budget), cell in cells.items():
        lines.append(f"| {ARM_TITLES[arm]} | {budget:g} | " + " | ".join(
            mean_std([run["task_text_mlm"][task]["accuracy"] for run in cell.runs]) for task in DOWNSTREAM_TASKS) + " |")
    target, times = reach_times(cells)
    lines.append("")
    if target is None:
        lines.append("Time to quality: arm (b) is not measured yet, so there is no target.")
    else:
        b_budget = max(budget for arm, budget in cells if arm == "b")
        lines += [f"Time to reach (b)'s validation MLM accuracy at {b_budget:g} minutes ({target:.4f}), interpolated "
                  "between exports (at 1/8, 1/4, 1/2, 3/4 of each budget and its end), the earliest over the arm's "
                  "budgets:", "", "| arm | minutes to reach | in the run of | (b)'s budget ÷ that |", "|---|---:|---:|---:|"]
        for arm, reached in times.items():
            if reached is None:
                lines.append(f"| {ARM_TITLES[arm]} | not reached | — | — |")
                continue
            minutes, budget = reached
            first = cells[arm, budget].mean_curve()[0][0]
            bound = "≤ " if minutes == first else ""
            lines.append(f"| {ARM_TITLES[arm]} | {bound}{minutes:.2f} | {budget:g} min | {b_budget / minutes:.2f}× |")
    lines += ["", f"MLM accuracy and loss: mean ± std over pre-training seeds {settings['seeds_present']}; downstream: "
              "over pre-training × fine-tuning seeds. Planned steps: HF's arms, and arm (d) where its recipe has "
              "switches keyed to the step count, are sized by a timed calibration (see the script's docstring); a "
              "run that ends short of its budget ran out of planned steps."]
    return "\n".join(lines) + "\n"


def plot_curves(cells: dict[tuple[str, float], Cell], target: float | None, title: str, path: Path) -> None:
    """Validation MLM accuracy vs training minutes: one colour per arm, one line per budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(ARMS, ("tab:orange", "tab:red", "tab:blue", "tab:green"), strict=True))
    figure, axes = plt.subplots(figsize=(7, 4.5), dpi=100)
    labelled: set[str] = set()
    for (arm, _budget), cell in cells.items():
        minutes, accuracy = zip(*cell.mean_curve(), strict=True)
        axes.plot(minutes, accuracy, marker="o", markersize=3, color=colours[arm],
                  label=None if arm in labelled else ARM_TITLES[arm])
        labelled.add(arm)
    if target is not None:
        axes.axhline(target, color="grey", linestyle="--", linewidth=1, label="(b) at its largest budget")
    axes.set_xlabel("training minutes (each arm's own clock)")
    axes.set_ylabel("validation MLM accuracy")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.png")
    figure.savefig(temporary)
    plt.close(figure)
    temporary.replace(path)


# ---------------------------------------------------------------------------------------------
# the driver


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: bert-tiny, 0.3-minute budgets, 1 downstream seed on 256/128 rows")
    parser.add_argument("--corpus", default="bundled", choices=CORPORA,
                        help="bundled (KJV + WordNet glosses), debian-docs (scripts/build_pretraining_corpus.py) or "
                             "mixed (every 6th-or-so debian-docs document for 2/3 of the text, all of bundled)")
    parser.add_argument("--budgets", default=None, help="training minutes per run, comma-separated (10,20,40)")
    parser.add_argument("--arms", default=",".join(ARMS), help="arms to run, comma-separated (a,b,c,d)")
    parser.add_argument("--seeds", default="42", help="pre-training seeds, comma-separated (42)")
    parser.add_argument("--downstream-seeds", type=int, default=None, help="fine-tuning seeds per task (3)")
    parser.add_argument("--downstream-lrs", default=None, help="fine-tuning learning rates to choose from on a dev "
                        "split, per model and task, comma-separated (" + ",".join(f"{lr:g}" for lr in DOWNSTREAM_LRS) + ")")
    parser.add_argument("--downstream-dropouts", default=None, help="fine-tuning dropout rates to choose from with the "
                        "lrs, comma-separated; 'model' keeps the model's own (model,0)")
    parser.add_argument("--model", default=None, help="the classic BERT preset every arm trains (bert-mini)")
    parser.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="arm d's recipe (configs/pretrain/budget-cpu.yaml)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "benchmarks" / "time_to_quality"),
                        help="inputs, runs and the result store (reused: a re-run skips the done runs)")
    parser.add_argument("--report-dir", default=None,
                        help="where the report goes (benchmarks/results; the work directory with --quick), e.g. "
                             "elsewhere for a screening run that must not replace the study's report")
    parser.add_argument("--run-arm", default=None, help=argparse.SUPPRESS)  # internal: the child process
    arguments = parser.parse_args()
    if arguments.run_arm is not None:
        return arguments
    arguments.arms = [arm.strip() for arm in arguments.arms.split(",")]
    unknown = sorted(set(arguments.arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    arguments.seeds = [int(seed) for seed in arguments.seeds.split(",")]
    if arguments.budgets is not None:
        arguments.budgets = [float(budget) for budget in arguments.budgets.split(",")]
    if arguments.downstream_lrs is not None:
        arguments.downstream_lrs = [float(lr) for lr in arguments.downstream_lrs.split(",")]
    if arguments.downstream_dropouts is not None:
        arguments.downstream_dropouts = [None if rate.strip() == "model" else float(rate)
                                         for rate in arguments.downstream_dropouts.split(",")]
    defaults = QUICK if arguments.quick else {"model": "bert-mini", "budgets": [10.0, 20.0, 40.0], "downstream_seeds": 3,
                                              "calibration": (CALIBRATION_SECONDS, CALIBRATION_WARMUP),
                                              "downstream_rows": DOWNSTREAM_ROWS, "downstream_lrs": list(DOWNSTREAM_LRS),
                                              "downstream_dropouts": list(DOWNSTREAM_DROPOUTS)}
    for key, value in defaults.items():
        if getattr(arguments, key, None) is None:
            setattr(arguments, key, value)
    if arguments.downstream_seeds > len(pv.DOWNSTREAM_SEEDS):
        parser.error(f"--downstream-seeds is at most {len(pv.DOWNSTREAM_SEEDS)}")
    return arguments


def train_run(key: RunKey, spec_values: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    """Train one run in a child process (its own threads and memory), or reuse its finished training record."""
    from bertforge.console import console

    run_dir = runs_dir / key.name
    record_path, spec_path = run_dir / "training.json", run_dir / "spec.json"
    spec = RunSpec(arm=key.arm, budget_minutes=key.budget_minutes, seed=key.seed, out_dir=str(run_dir / "train"),
                   **spec_values)
    same_spec = spec_path.is_file() and json.loads(spec_path.read_text(encoding="utf-8")) == json.loads(
        json.dumps(asdict(spec)))
    if record_path.is_file() and same_spec:  # trained by an earlier invocation that stopped before scoring it
        return json.loads(record_path.read_text(encoding="utf-8"))
    record_path.unlink(missing_ok=True)
    pv.write_atomically(spec_path, json.dumps(asdict(spec), indent=1))
    console.print(f"[bold]{ARM_TITLES[key.arm]}[/bold]: {key.budget_minutes:g} minutes of {spec.model}, seed {key.seed}")
    pv.run_in_child(Path(__file__), spec_path, f"the run {key.name}")
    return json.loads(record_path.read_text(encoding="utf-8"))


def task_text_batches(tasks: list[Any], tokenizer_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each task's test texts, masked once at 15% under the evaluation seed: how well a model predicts the words of
    the text it will be fine-tuned on tells whether its corpus covers that task's domain."""
    return {task.name: pv.line_validation_batches(tokenizer_dir, [row["text"] for row in task.test], pv.EVALUATION_SEED)
            for task in tasks}


def score_run(key: RunKey, record: dict[str, Any], validation: list[dict[str, Any]], tasks: list[Any],
              task_texts: dict[str, list[dict[str, Any]]], downstream_seeds: int, grid: list[FineTuning], work: Path,
              threads: int) -> dict[str, Any]:
    """Validation MLM loss and accuracy of every export; the final model's MLM accuracy on each task's test texts;
    its downstream test accuracy, fine-tuned with the setting `choose_setting` picks for it and the task."""
    from bertforge.console import console

    curve = [point | pv.mlm_accuracy(point["model_dir"], validation, "cpu") for point in record["points"]]
    final_dir = record["points"][-1]["model_dir"]
    task_text_mlm = {name: pv.mlm_accuracy(final_dir, batches, "cpu") for name, batches in task_texts.items()}
    downstream: dict[str, list[float]] = {}
    downstream_setting: dict[str, dict[str, Any]] = {}
    for task in tasks:
        if not downstream_seeds:
            downstream[task.name] = []
            continue
        downstream_setting[task.name] = choose_setting(final_dir, task, key.name, grid, work, threads)
        setting = FineTuning(**downstream_setting[task.name]["chosen"])
        downstream[task.name] = [fine_tune_with(final_dir, task, key.name, setting, seed, work, threads)
                                 for seed in pv.DOWNSTREAM_SEEDS[:downstream_seeds]]
    console.print(f"{key.name}: validation MLM accuracy {curve[-1]['accuracy']:.4f}" + "".join(
        f", {name} {statistics.fmean(values):.4f} ({downstream_setting[name]['chosen_text']})"
        for name, values in downstream.items() if values))
    return {"curve": curve, "task_text_mlm": task_text_mlm, "downstream": downstream,
            "downstream_setting": downstream_setting}


def main() -> None:
    arguments = parse_arguments()
    if arguments.run_arm is not None:
        run_arm(Path(arguments.run_arm))
        return
    import torch

    from bertforge.console import console

    tasks = downstream_tasks(arguments.downstream_rows)
    recipe = Path(arguments.recipe).resolve()
    if "d" in arguments.arms:
        check_recipe(recipe, arguments.model)
    work = Path(arguments.work_dir).resolve()
    work = (work / "quick" if arguments.quick else work) / arguments.corpus
    corpus = corpus_file(arguments.corpus, work)
    store = ResultStore(work / "results")
    common = {"corpus": arguments.corpus, "model": arguments.model, "threads": arguments.threads, "seq_len": SEQ_LEN,
              "vocab_size": pv.VOCAB_SIZE, "export_fractions": list(EXPORT_FRACTIONS),
              "calibration": list(arguments.calibration), "downstream_seeds": arguments.downstream_seeds,
              "downstream_lrs": arguments.downstream_lrs, "downstream_dropouts": arguments.downstream_dropouts,
              "downstream_rows": {name: [len(task.train), len(task.test)] for name, task in
                                  zip(DOWNSTREAM_TASKS, tasks, strict=True)}}

    recipe_settings = {"recipe": str(recipe), "recipe_sha256": recipe_fingerprint(recipe) if recipe.is_file() else None}

    def settings_for(arm: str) -> dict[str, Any]:
        return common | (recipe_settings if arm == "d" else {})

    keys = [RunKey(arm, budget, seed) for seed in arguments.seeds for budget in arguments.budgets
            for arm in arguments.arms]
    pending = store.pending(keys, settings_for)
    torch.set_num_threads(arguments.threads)
    machine = pv.machine_description("cpu")
    console.print(f"{len(keys) - len(pending)} of {len(keys)} runs already in {store.directory}; "
                  f"{len(pending)} to run")
    pv.quiet_progress_bars()
    tokenizer_dir, data_dir, manifest = prepare_corpus(corpus, work)
    if pending:
        validation = pv.packed_validation_batches(data_dir, pv.EVALUATION_SEED)
        task_texts = task_text_batches(tasks, tokenizer_dir)
        hf_data = group_texts_dataset(work, tokenizer_dir, corpus, manifest)
        for key in pending:
            record = train_run(key, {
                "model": arguments.model, "threads": arguments.threads, "tokenizer_dir": str(tokenizer_dir),
                "data_dir": str(data_dir if key.arm in ("c", "d") else hf_data),
                "recipe": str(recipe) if key.arm == "d" else None, "calibration": arguments.calibration},
                work / "runs")
            quality = score_run(key, record, validation, tasks, task_texts, arguments.downstream_seeds,
                                fine_tuning_grid(arguments.downstream_lrs, arguments.downstream_dropouts), work,
                                arguments.threads)
            store.save(key, {"arm": key.arm, "budget_minutes": key.budget_minutes, "seed": key.seed,
                             "settings": settings_for(key.arm), "machine": machine, "training": record} | quality)
    machine["load_average_end"] = os.getloadavg()[0]
    results = [result for result in store.results() if result["settings"] == settings_for(result["arm"])]
    cells = cells_of(results)
    train_split = manifest["splits"]["train"]
    report = {
        "command": shlex.join(["python", *sys.argv]), "machine": machine,
        "settings": common | {"seeds_present": sorted({result["seed"] for result in results})},
        "data": {"train_documents": train_split["documents"], "train_tokens": train_split["tokens"],
                 "validation_documents": manifest["splits"]["validation"]["documents"],
                 "validation_masked_tokens": results[0]["curve"][-1]["masked_tokens"] if results else 0,
                 "manpages_rows": common["downstream_rows"]["manpages"]},
        "results": results}
    target, times = reach_times(cells)
    report["time_to_quality"] = {"target_accuracy": target, "per_arm": times}
    table = render(report, cells)
    print(table)
    destination = Path(arguments.report_dir) if arguments.report_dir else work if arguments.quick else RESULTS
    pv.write_atomically(destination / "time_to_quality.md", table)
    pv.write_atomically(destination / "time_to_quality.json", json.dumps(report, indent=1))
    plot_curves(cells, target, f"Time to quality: {arguments.model}, {arguments.corpus} corpus, torch threads: "
                f"{arguments.threads}", destination / "time_to_quality.png")
    console.print(f"written to {destination / 'time_to_quality'}.md, .json and .png", soft_wrap=True)


if __name__ == "__main__":
    main()
