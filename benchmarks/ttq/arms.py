"""One run of one arm, in its own process: HF's arms (a, b) under `BudgetClock` after a step-time calibration,
bertforge's (c, d) under `train.max_time_minutes` with `ExportMarks` (and arm d's planned steps)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common.hf_arms import BudgetClock, StepTiming, hf_masked_lm
from benchmarks.common.mlm import MASK_PROBABILITY, SEQ_LEN
from benchmarks.common.reports import quiet_progress_bars, write_atomically
from benchmarks.ttq.clock import ExportMarks, curve_point, curve_points, export_marks
from benchmarks.ttq.planning import step_cost, steps_filling
from benchmarks.ttq.settings import TUNED, RunSpec, bertforge_config


def hf_trainers(spec: RunSpec) -> Callable[[int, Any, str], Any]:
    """Arm a's or b's HF `Trainer`s: `trainer(max_steps, callback, name)` builds one on `spec`'s data, a fresh model
    each time, writing under `spec.out_dir / name`."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir)
    train = load_from_disk(spec.data_dir)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY)
    chosen = {} if spec.arm == "a" else TUNED.hf_arguments()  # (a): TrainingArguments' defaults

    def trainer(max_steps: int, callback: Any, name: str) -> Any:
        arguments = TrainingArguments(output_dir=str(Path(spec.out_dir) / name), max_steps=max_steps, seed=spec.seed,
                                      use_cpu=True, save_strategy="no", report_to="none", disable_tqdm=True, **chosen)
        torch.manual_seed(spec.seed)  # run_mlm.py's set_seed before the model is built
        return Trainer(model=hf_masked_lm(tokenizer, spec.model), args=arguments, train_dataset=train,
                       data_collator=collator, processing_class=tokenizer, callbacks=[callback])

    return trainer


def run_hf_arm(spec: RunSpec) -> dict[str, Any]:
    """Arm a or b: calibrate the steps the budget allows, then train under `BudgetClock`, exporting along the way."""
    trainer = hf_trainers(spec)
    out = Path(spec.out_dir)
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


def run_bertforge_arm(spec: RunSpec) -> dict[str, Any]:
    """Arm c or d: `train.max_time_minutes`, exporting along bertforge's own clock; arm d's step-keyed switches
    add `train.max_steps`, planned from calibrations (`steps_filling`)."""
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

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
    exports = ExportMarks(export_marks(spec.budget_minutes), Path(spec.out_dir) / "exports")
    result = Trainer(config, PretrainTask(config), on_step_end=[exports]).fit()
    state = result.state
    final = curve_point(state.elapsed_seconds, state.step, state.consumed_tokens, result.run_dir / "final")
    return {"points": curve_points(exports.exports, final),
            "stopped_by": result.stopped_by, **planned,
            "hyperparameters": {"optim": asdict(config.optim), "schedule": asdict(config.schedule),
                                "train": asdict(config.train), "model": asdict(config.model),
                                "data": {key: value for key, value in asdict(config.data).items()
                                         if key.startswith(("mask", "seq_len", "random", "whole"))}}}


def run_arm(spec_path: Path) -> None:
    """The child process: train one run and write its training record next to the spec."""
    import torch

    spec = RunSpec(**json.loads(spec_path.read_text(encoding="utf-8")))
    quiet_progress_bars()
    torch.set_num_threads(spec.threads)
    shutil.rmtree(spec.out_dir, ignore_errors=True)  # a fresh run, never a resumed one
    Path(spec.out_dir).mkdir(parents=True)
    record = run_bertforge_arm(spec) if spec.arm in ("c", "d") else run_hf_arm(spec)
    write_atomically(spec_path.with_name("training.json"), json.dumps(record, indent=1))
