"""The training loop: any `Task`, one config, one CPU / GPU / torchrun job.

Readable top to bottom: set up (process group, seed, model, parallelism, optimizer, resume), then
`fit` runs optimizer steps until the budget is spent (or an `on_step_end` hook ends the run). Each step reads the micro-batches the
loader's `EpochPlan` gives it (`accumulation_steps`, fewer in a fine-tuning epoch's smaller last
step), counts the task's loss units over the whole global batch first (so an MLM loss is
averaged over the masked tokens of the global batch, not per micro-batch), synchronises gradients
only on the last micro-batch, and agrees across ranks on a non-finite loss or a stop signal.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.config import Config, save_config
from bertforge.console import log
from bertforge.data.sampler import BatchGeometry, BatchRamp
from bertforge.data.validation_subset import sample_rows
from bertforge.device import batch_on_device
from bertforge.directory_lock import DirectoryInUseError, DirectoryLock
from bertforge.errors import BertforgeError, ConfigError, first_line
from bertforge.models.serialization import DAMAGED_WEIGHTS_ERRORS
from bertforge.output_guard import claim_run_directory
from bertforge.run_directory import RunDirectory, checkpoint_name, checkpoint_step
from bertforge.train import distributed as D
from bertforge.train.averaging import WeightEMA, average_checkpoints, write_origin
from bertforge.train.checkpoint import CheckpointManager, TrainingState
from bertforge.train.clipping import GradientClipping, folds_into
from bertforge.train.dropout_off import DropoutSwitch, dropout_is_on
from bertforge.train.kept_gradients import KeptGradients
from bertforge.train.logging import MetricsLogger, TrainingProgress
from bertforge.train.map_style import MapStyleLoader, iterate_once
from bertforge.train.optim import (
    build_optimizer,
    default_parameter_groups,
    lr_factor,
    optimizer_class_and_options,
    run_fraction,
    set_learning_rate,
)
from bertforge.train.precision import Precision, resolve_precision
from bertforge.train.resume_config import check_resumed_config
from bertforge.train.task import Batch, StepRunner, Task, TaskData, saves_model_directories


@dataclass
class FitResult:
    run_dir: Path
    state: TrainingState
    stopped_by: str  # budget | early_stopping | hook | signal | nan
    stop_signal: int | None = None  # the signal that stopped the run (SIGTERM, SIGINT), when one did

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process stopped by a signal (143 SIGTERM, 130 SIGINT), so that
        `pretrain && finetune` and schedulers do not take an interrupted run for a finished one."""
        return 128 + self.stop_signal if self.stopped_by == "signal" and self.stop_signal else 0


# what a truncated, corrupt or mismatched checkpoint raises: damaged weights, and from json, torch.load
# or load_state_dict a missing file, key or a wrong type
UNREADABLE_CHECKPOINT = (*DAMAGED_WEIGHTS_ERRORS, OSError, KeyError, TypeError)


class RunInterrupted(BertforgeError):
    """A run stopped by SIGTERM/SIGINT inside a larger job (quickstart): its checkpoint is saved, and the
    job must stop rather than go on with a model that did not finish."""

    def __init__(self, result: FitResult) -> None:
        name = signal.Signals(result.stop_signal).name if result.stop_signal else "a signal"
        super().__init__(f"{result.run_dir} was stopped by {name} at step {result.state.step}; its checkpoint is "
                         "saved, so running the same command again resumes it")
        self.exit_code = result.exit_code or 130


def finished(result: FitResult) -> FitResult:
    """`result`, or `RunInterrupted` when a signal stopped it: for callers that use the trained model next."""
    if result.stopped_by == "signal":
        raise RunInterrupted(result)
    return result


StepEndHook = Callable[["Trainer", TrainingState], "bool | None"]
"""`hook(trainer, state)`, called after every optimizer step, on every rank, outside the span the run's clock
(`state.elapsed_seconds`) counts: work done in it (an export, a measurement) costs the run no time budget. It returns
True to end the run after this step as a finished run: the step is logged and evaluated as a last step is, its
checkpoint and `final/` are written, and `fit` returns `stopped_by="hook"` with exit code 0. A hook reads the state
and the trainer's public attributes (`raw_model`, `ema`, `task`, `run_dir`); a stop on any rank stops every rank."""


class Trainer:
    def __init__(self, config: Config, task: Task, on_step_end: Iterable[StepEndHook] = ()) -> None:
        self.config, self.task = config, task
        self.on_step_end = list(on_step_end)
        self._stopped_by_hook = False
        self.env, self.device = D.init_distributed(config.run.device)
        if not self.env.is_main:
            log.setLevel(max(log.level, logging.WARNING))  # one voice: rank 0 reports progress
        self.run_dir = Path(config.run.output_dir) / config.run.name
        self.run_directory = RunDirectory(self.run_dir)
        self.precision: Precision = resolve_precision(config.train.precision, self.device, config.train.tf32)
        self.geometry = BatchGeometry(config.train.micro_batch_size, config.train.global_batch_size,
                                      self.env.world_size, self.env.rank)
        self._stop_signal: int | None = None
        self._divergence: str | None = None  # why a diverged run stopped (the error it ends with)
        self._previous_handlers: dict[int, Any] = {}
        self.run_lock = DirectoryLock(self.run_dir, "run directory", "choose another run.name")

    # --- set-up ---------------------------------------------------------------------------------

    def _lock_run_dir(self) -> None:
        """One writer per run directory, before anything in it is written (rank 0 holds the lock), and only a
        directory the trainer may write: new, empty or an earlier run, also for runs started from the API,
        GLUE's jobs or the quickstart (the commands check it first, with their own name)."""
        refused: BertforgeError | None = None
        if self.env.is_main:
            try:
                claim_run_directory(self.run_dir, "train")
                self.run_lock.acquire()
            except BertforgeError as error:
                refused = error
        if D.any_rank(refused is not None, self.env, self.device):
            raise refused or DirectoryInUseError(f"run directory {self.run_dir} is refused on rank 0 (in use by "
                                                 "another process, or not a run directory)")

    def _build(self) -> None:
        config = self.config
        self._lock_run_dir()
        torch.manual_seed(config.run.seed)  # the same initial weights on every rank
        self.data: TaskData = self.task.build_datasets()
        model = self.task.build_model().to(self.device)
        self.dropout = DropoutSwitch(model) if config.train.disable_dropout else None
        if self.dropout:
            self.dropout.set(on=False)
            back_on = (f" until {config.train.disable_dropout_until:g} of the run"
                       if config.train.disable_dropout_until < 1.0 else "")
            log.info(f"training with dropout off{back_on} (train.disable_dropout); the model's config, and so "
                     "final/config.json, keeps its dropout rates for fine-tuning")
        self.layers = list(self.task.layer_modules(model))
        self.model = D.parallelize(model, self.layers, config.dist, self.env, self.device,
                                   self.precision.fsdp_param_dtype)
        self.raw_model = model
        self.kept_gradients = KeptGradients(model, enabled=self.device.type == "cpu" and not self.env.distributed
                                            and not config.dist.compile)
        if (config.train.ema is not None or config.train.average_last_k is not None) and D.is_fsdp(self.model):
            raise ConfigError("train.ema and train.average_last_k average whole weights, which FSDP shards over the "
                              "ranks; use dist.strategy=ddp or zero1 with them")
        self.ema = WeightEMA(model, config.train.ema) if config.train.ema is not None else None
        torch.manual_seed(config.run.seed + 1000 * self.env.rank)  # dropout differs across ranks
        self.optimizer = self._build_optimizer(model)
        self.scaler = self.precision.grad_scaler(self.device)
        self.clipping = None if config.optim.clip_grad_norm is None else GradientClipping(
            config.optim.clip_grad_norm,
            fold=folds_into(self.optimizer, amp_scaler=self.scaler is not None, sharded=D.is_fsdp(self.model)))
        self.train_loader = self._train_loader()
        self._unsharded_copy: nn.Module | None = None
        self.checkpoints = CheckpointManager(self.run_dir, self.env, config.train.keep_last,
                                             self._write_model_directory if saves_model_directories(self.task) else None,
                                             ema=self.ema)
        self.metrics = MetricsLogger(self.run_dir, config, enabled=self.env.is_main)

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        custom = self.task.build_optimizer(self.model)
        if custom is not None:
            return custom
        groups = self.task.parameter_groups(model) or default_parameter_groups(model, self.config.optim.weight_decay)
        if self.config.dist.strategy == "zero1" and self.env.distributed:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            # ZeRO-1: each rank keeps the optimizer state of its own shard of the parameters
            optimizer_class, options = optimizer_class_and_options(self.config.optim, self.device)
            return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **options)
        return build_optimizer(self.config.optim, groups, self.device, compiled=self.config.dist.compile)

    def _train_loader(self) -> Any:
        train = self.data.train
        if not hasattr(train, "__getitem__"):  # a loader factory from the task
            return train(self.geometry)
        if self.data.collate is None:
            raise ConfigError(f"{type(self.task).__name__}.build_datasets returned a dataset without `collate`")
        return MapStyleLoader(train, self.data.collate, self.geometry, seed=self.config.run.seed,
                              num_workers=self.config.data.num_workers)

    def _validation_batches(self) -> Any:
        if self.data.validation_batches is not None:
            return self.data.validation_batches
        if self.data.validation is None:
            return None
        if self.data.collate is None:
            raise ConfigError(f"{type(self.task).__name__}.build_datasets returned validation data without `collate`")
        # a seeded sample, not the head of a file that may be sorted; fine-tuning tasks stratify their own
        rows = sample_rows(len(self.data.validation), self.config.data.validation_samples, self.config.run.seed)
        return list(iterate_once(self.data.validation, self.data.collate, self.config.train.micro_batch_size, rows))

    # --- budget ---------------------------------------------------------------------------------

    def _total_steps(self) -> int | None:
        train = self.config.train
        per_epoch = self.train_loader.plan.steps
        candidates = []
        if train.max_steps is not None:
            candidates.append(train.max_steps)
        if train.max_epochs is not None:
            candidates.append(max(1, math.ceil(train.max_epochs * per_epoch)))
        if train.max_tokens is not None and self.data.tokens_per_sample:
            candidates.append(max(1, math.ceil(train.max_tokens / (self.data.tokens_per_sample * train.global_batch_size))))
        if not candidates and train.max_tokens is None and train.max_time_minutes is None:
            raise ConfigError("no training budget: set one of train.max_steps, train.max_epochs, "
                              "train.max_tokens or train.max_time_minutes")
        return min(candidates) if candidates else None

    def _check_step_keyed_switches(self, total_steps: int | None) -> None:
        if total_steps is None and (switches := self.config.step_keyed_switches()):
            raise ConfigError(f"{' and '.join(switches)} follow(s) the step count, but the run has only a wall-clock "
                              "budget; set train.max_steps (or train.max_epochs / train.max_tokens) as well")

    def _apply_batch_ramp(self, total_steps: int | None) -> None:
        """train.batch_ramp_start: the loader's plan gets smaller steps at first (Cramming's batch-size warm-up),
        a function of the step, so the trainer and the loader agree on every step's shape and resume stays exact."""
        train = self.config.train
        if train.batch_ramp_start is None:
            return
        assert total_steps is not None, "_check_step_keyed_switches runs first"
        ramp = BatchRamp.of_run(train, total_steps, self.env.world_size)
        self.train_loader.plan = self.train_loader.plan.with_batch_ramp(ramp)
        log.info(f"global batch ramps from {ramp.start} to {ramp.full} samples over the first {ramp.steps} steps")

    def _budget_spent(self, state: TrainingState, total_steps: int | None) -> bool:
        """Whether the run ends after this step: its budget is spent, or an `on_step_end` hook ended it."""
        train = self.config.train
        if self._stopped_by_hook:
            return True
        if total_steps is not None and state.step >= total_steps:
            return True
        if train.max_tokens is not None and state.consumed_tokens >= train.max_tokens:
            return True
        return train.max_time_minutes is not None and state.elapsed_seconds >= train.max_time_minutes * 60

    def _progress_fraction(self, state: TrainingState) -> float | None:
        """Wall-clock budgets key the schedule to elapsed time (Cramming)."""
        if self.config.train.max_time_minutes is None or self.config.train.max_steps is not None:
            return None
        return state.elapsed_seconds / (self.config.train.max_time_minutes * 60)

    # --- resume ---------------------------------------------------------------------------------

    def _resume(self) -> TrainingState:
        request = self.config.run.resume
        if request == "never":
            if self.checkpoints.complete_checkpoints():
                raise ConfigError(f"run directory {self.run_dir} already holds checkpoints and run.resume=never; "
                                  "set run.resume=auto to continue it or choose another run.name")
            return self._fresh_start()
        if request in ("auto", "force"):
            if not self.checkpoints.resume_candidates():
                return self._fresh_start()
            self._record_config()
            state, path = self._load_newest_readable_checkpoint()
            if path is None:
                return state
        else:
            path = Path(request)
            self._record_config()
            try:
                state = self.checkpoints.load(path, self.model, self.optimizer, self.scaler)
            except UNREADABLE_CHECKPOINT as error:
                raise BertforgeError(f"cannot resume from {path}: {first_line(error)}; give another checkpoint in "
                                     "run.resume, or run.resume=auto") from None
        log.info(f"resumed from {path} (step {state.step}, {state.consumed_samples:,} samples seen)")
        self.metrics.rewind(state.step)
        return state

    def _record_config(self) -> None:
        """A resumed run's config against the one it started with (`check_resumed_config`); a run that
        resumes another run's checkpoint has none yet, and this config becomes its first."""
        if self.run_directory.is_run():
            check_resumed_config(self.run_dir, self.config, write=self.env.is_main)
        elif self.env.is_main:
            save_config(self.config, self.run_directory.config_file)

    def _patience_spent(self, state: TrainingState) -> bool:
        patience = self.config.train.early_stopping_patience
        return (patience is not None and bool(self.config.train.best_metric)
                and state.evaluations_without_improvement >= patience)

    def _check_best_metric(self) -> None:
        """A misspelt train.best_metric fails now, not after the first evaluation (the same message)."""
        metric, names = self.config.train.best_metric, self.task.metric_names()
        if metric is not None and names is not None and metric not in names:
            raise ConfigError(f"`train.best_metric` is {metric!r} but evaluation reports only "
                              f"{', '.join(sorted(names))}; pick one of those")

    def _fresh_start(self) -> TrainingState:
        if self.env.is_main:
            save_config(self.config, self.run_directory.config_file)
        self.metrics.rewind(0)  # an attempt killed before its first checkpoint logged steps this one repeats
        return TrainingState()

    def _load_newest_readable_checkpoint(self) -> tuple[TrainingState, Path | None]:
        """A truncated or corrupt newest checkpoint (a full disk, a bad copy) is skipped with a warning
        for the newest one that loads on every rank; resuming from it stays exact."""
        candidates = self.checkpoints.resume_candidates()
        skipped = []
        for path in candidates:
            problem = None
            try:
                state = self.checkpoints.load(path, self.model, self.optimizer, self.scaler)
            except UNREADABLE_CHECKPOINT as error:
                problem = first_line(error)
            if not D.any_rank(problem is not None, self.env, self.device):
                return state, path
            skipped.append(path.name)
            log.warning(f"checkpoint {path} is unreadable ({problem or 'on another rank'}); trying the previous one")
        if candidates:
            raise BertforgeError(f"no checkpoint in {self.checkpoints.directory} can be read ({', '.join(skipped)}); "
                                 "set run.resume=never with a new run.name to start over")
        return TrainingState(), None

    # --- the loop -------------------------------------------------------------------------------

    def fit(self) -> FitResult:
        try:
            return self._fit()
        finally:
            # the OS drops both when the process ends; an in-process caller needs them back now
            self._restore_signal_handlers()
            self.run_lock.release()

    def _fit(self) -> FitResult:
        self._build()
        self._check_best_metric()
        config = self.config
        state = self._resume()
        total_steps = self._total_steps()
        self._check_step_keyed_switches(total_steps)
        self._apply_batch_ramp(total_steps)
        validation = self._validation_batches()
        batches = self.train_loader.iterate(state.consumed_samples, step=state.step, total_steps=total_steps)
        flops_per_token = self.task.flops_per_token(self.raw_model)
        self._install_signal_handlers()
        stopped_by = "early_stopping" if self._patience_spent(state) else "budget"
        window = _Window()
        log.info(f"training in {self.run_dir}: {self.env.world_size} process(es) on {self.device.type}, "
                 f"{self.precision.name}, global batch {config.train.global_batch_size} = "
                 f"{config.train.micro_batch_size} × {self.env.world_size} × {self.geometry.accumulation_steps} "
                 f"accumulation, {total_steps if total_steps is not None else 'budgeted'} steps")
        with TrainingProgress(total_steps, enabled=self.env.is_main and config.log.progress) as progress:
            progress.update(state.step, {})
            while stopped_by == "budget" and not self._budget_spent(state, total_steps):
                started = time.perf_counter()
                shape = self.train_loader.plan.step_at(state.consumed_samples, state.step)
                loss, metrics, tokens, non_finite = self._train_step(batches, shape.micro_batches, state, total_steps)
                stop_requested = D.any_rank(self._stop_signal is not None, self.env, self.device)
                state.step += 1
                state.consumed_samples += shape.samples
                state.consumed_tokens += tokens
                state.elapsed_seconds += time.perf_counter() - started
                if non_finite:
                    stopped_by = self._handle_non_finite(state, loss)
                    if stopped_by == "nan":
                        break
                else:
                    window.add(loss, metrics, tokens, shape.samples, time.perf_counter() - started)
                self._run_step_end_hooks(state)
                if state.step % config.train.log_every == 0 or self._budget_spent(state, total_steps):
                    stats = window.flush(flops_per_token, self.precision.peak_flops(self.device)) | {
                        "lr": self.optimizer.param_groups[0]["lr"]}
                    self.metrics.write(state.step, "train", stats)
                    progress.update(state.step, {k: stats[k] for k in ("loss", "lr", "tokens_per_s") if k in stats})
                else:
                    progress.update(state.step, {})
                if self._should_evaluate(state, total_steps) and validation is not None:
                    improved = self._evaluate(validation, state, total_steps)
                    state.evaluations_without_improvement = 0 if improved else state.evaluations_without_improvement + 1
                    if self._patience_spent(state):
                        log.info(f"early stopping at step {state.step}: no improvement of "
                                 f"{config.train.best_metric} in {config.train.early_stopping_patience} evaluations")
                        stopped_by = "early_stopping"
                        break
                if config.train.checkpoint_every and state.step % config.train.checkpoint_every == 0:
                    self.checkpoints.save(self.model, self.optimizer, self.scaler, state)
                if stop_requested:
                    stopped_by = "signal"
                    break
        if stopped_by != "nan":
            latest = self.checkpoints.latest()
            if latest is None or latest.name != checkpoint_name(state.step):
                self.checkpoints.save(self.model, self.optimizer, self.scaler, state)
        if stopped_by == "budget" and self._stopped_by_hook:
            stopped_by = "hook"
        if stopped_by == "signal":
            log.warning(f"stopped by a signal; checkpoint saved at step {state.step}. "
                        "Run the same command again to resume (run.resume=auto).")
        elif stopped_by != "nan":
            self._finish(state)
            if not config.train.keep_optimizer_state:
                self._drop_training_state()
        self.metrics.close()
        if self.env.is_main and config.log.plots:
            write_plots(self.run_dir)
        D.shutdown_distributed()
        if stopped_by == "nan":
            raise BertforgeError(self._divergence or (
                f"non-finite loss at step {state.step} (train.nan_policy=stop); lower optim.lr, enable "
                "optim.clip_grad_norm or use precision fp32/bf16, then resume from the last checkpoint"))
        return FitResult(self.run_dir, state, stopped_by, self._stop_signal if stopped_by == "signal" else None)

    def _run_step_end_hooks(self, state: TrainingState) -> None:
        """Every `on_step_end` hook, each called (none skipped by another's stop); the ranks agree on a stop."""
        if not self.on_step_end:
            return
        stops = [bool(hook(self, state)) for hook in self.on_step_end]
        if D.any_rank(any(stops), self.env, self.device):
            self._stopped_by_hook = True
            log.info(f"stopped by an on_step_end hook at step {state.step}")

    def _train_step(self, batches: Iterator[Batch], micro_batch_count: int, state: TrainingState,
                    total_steps: int | None) -> tuple[float, dict[str, float], int, bool]:
        config = self.config
        progress = self._progress_fraction(state)
        factor = lr_factor(config.schedule, step=state.step, total_steps=total_steps or 1, progress=progress)
        set_learning_rate(self.optimizer, config.optim.lr, factor)
        if self.dropout is not None:
            fraction_done = run_fraction(step=state.step, total_steps=total_steps or 1, progress=progress)
            self.dropout.set(on=dropout_is_on(fraction_done, config.train.disable_dropout_until))
        micro_batches = [batch_on_device(next(batches), self.device) for _ in range(micro_batch_count)]
        units = [self.task.loss_units(batch) for batch in micro_batches]
        uses_units = units[0] is not None
        if uses_units:
            keys = sorted(units[0])  # type: ignore[arg-type]
            totals = D.all_reduce_sum([sum(u[k] for u in units) for k in keys], self.env, self.device)  # type: ignore[index]
            global_units = {k: max(v, 1.0) for k, v in zip(keys, totals, strict=True)}
            for batch in micro_batches:
                batch["global_loss_units"] = global_units
        self.model.train()
        step_loss, step_metrics = 0.0, {}
        whole_step = self.task.train_step(micro_batches, self._step_runner())
        if whole_step is not None:  # the task ran the step's passes itself; its loss is the same on every rank
            step_loss = whole_step[0] / self.env.world_size if uses_units else whole_step[0]  # as the loop's sums
            step_metrics = dict(whole_step[1])
        for index, batch in enumerate(micro_batches if whole_step is None else ()):
            last = index == len(micro_batches) - 1
            with D.no_sync(self.model, last), self.precision.autocast(self.device):
                loss, metrics = self.task.forward_step(batch, self.model)
                # gradients are averaged over ranks by DDP/FSDP; a loss already normalised over the
                # global batch must be scaled back up, a per-micro-batch mean divided by accumulation
                scaled = loss * self.env.world_size if uses_units else loss / len(micro_batches)
            self.scaler.scale(scaled).backward() if self.scaler else scaled.backward()
            step_loss += float(scaled.detach()) / (self.env.world_size if uses_units else 1)
            for key, value in metrics.items():
                step_metrics[key] = step_metrics.get(key, 0.0) + float(value) / len(micro_batches)
        tokens = sum(self.task.tokens_in_batch(batch) for batch in micro_batches)
        loss_sum, token_sum, bad = D.all_reduce_sum([step_loss, float(tokens), 0.0 if math.isfinite(step_loss) else 1.0],
                                                    self.env, self.device)
        global_loss = loss_sum if uses_units else loss_sum / self.env.world_size
        non_finite = bad > 0
        if not non_finite:
            if self.scaler:
                self.scaler.unscale_(self.optimizer)
            if self.clipping is not None:
                norm = self.clipping.clip(self.model)
                norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
                step_metrics["grad_norm"] = norm_value
                if not math.isfinite(norm_value) and not self.scaler:
                    non_finite = True
            if not non_finite:
                if self.scaler:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    with self.clipping.step(self.optimizer) if self.clipping is not None else nullcontext():
                        self.optimizer.step()
                if self.ema is not None:
                    self.ema.update(self.raw_model)
        self.kept_gradients.zero_grad(self.optimizer)
        return global_loss, step_metrics, int(token_sum), non_finite

    def _step_runner(self) -> StepRunner:
        def micro_batch(last: bool) -> ExitStack:
            stack = ExitStack()
            stack.enter_context(D.no_sync(self.model, last))
            stack.enter_context(self.precision.autocast(self.device))
            return stack

        def backward(loss: torch.Tensor) -> None:
            self.scaler.scale(loss).backward() if self.scaler else loss.backward()

        return StepRunner(self.model, self.device, self.env.world_size, micro_batch,
                          lambda: self.precision.autocast(self.device), backward,
                          lambda rows: D.all_gather_rows(rows, self.env))

    def _handle_non_finite(self, state: TrainingState, loss: float) -> str:
        policy = self.config.train.nan_policy
        state.skipped_steps += 1
        self.metrics.write(state.step, "train", {"non_finite_loss": 1.0, "skipped_steps": state.skipped_steps})
        if policy == "stop":
            log.error(f"non-finite loss ({loss}) at step {state.step}; stopping (train.nan_policy=stop)")
            return "nan"
        if policy == "rollback":
            latest = self.checkpoints.latest()
            if latest is None:
                log.error(f"non-finite loss at step {state.step} and no checkpoint to roll back to; stopping")
                return "nan"
            restored = self.checkpoints.load(latest, self.model, self.optimizer, self.scaler)
            log.warning(f"non-finite loss ({loss}) at step {state.step}: rolled weights and optimizer back to "
                        f"{latest.name}; the offending batches are skipped (data position kept)")
            state.best_metric, state.best_step = restored.best_metric, restored.best_step
        if state.skipped_steps > self.config.train.max_skipped_steps:
            self._divergence = (f"the run diverged: {state.skipped_steps} steps had a non-finite loss by step "
                                f"{state.step}, more than train.max_skipped_steps={self.config.train.max_skipped_steps};"
                                " no final/ was written. Lower optim.lr or enable optim.clip_grad_norm and start a "
                                "new run (or raise train.max_skipped_steps)")
            log.error(self._divergence)
            return "nan"
        if policy == "rollback":
            return "budget"
        log.warning(f"non-finite loss or gradients (loss {loss}) at step {state.step}: update skipped "
                    f"({state.skipped_steps} so far; train.nan_policy=skip)")
        return "budget"

    def _refuse_diverged_result(self, state: TrainingState) -> None:
        """A run whose weights or last validation loss are not finite has diverged: no final/ is written as
        if it had succeeded (its checkpoints stay, to inspect or roll back to)."""
        broken_metrics = [name for name, value in state.metrics.items() if "loss" in name and not math.isfinite(value)]
        broken_weights = sum(not bool(torch.isfinite(p).all()) for p in self.model.parameters())
        mostly_skipped = state.skipped_steps > state.step / 2  # the same on every rank
        if not D.any_rank(bool(broken_metrics or broken_weights or mostly_skipped), self.env, self.device):
            return
        found = (f"{broken_weights} weight tensors are not finite" if broken_weights else
                 f"the last validation {', '.join(broken_metrics)} is not finite" if broken_metrics else
                 f"{state.skipped_steps} of its {state.step} steps were skipped (non-finite loss or gradients)")
        raise BertforgeError(f"the run diverged: at step {state.step} {found}; no final/ was written. Lower optim.lr or "
                             "enable optim.clip_grad_norm and start a new run")

    def _should_evaluate(self, state: TrainingState, total_steps: int | None) -> bool:
        every = self.config.train.eval_every
        if every is not None and state.step % every == 0:
            return True
        per_epoch = self.train_loader.plan.steps
        if every is None and per_epoch and state.step % per_epoch == 0:
            return True
        return self._budget_spent(state, total_steps)

    def _evaluate(self, validation: Any, state: TrainingState, total_steps: int | None) -> bool:
        self.model.eval()
        with torch.no_grad(), self.precision.autocast(self.device):
            results = self.task.evaluate(self.model, validation)
        self.metrics.write(state.step, "validation", results)
        state.metrics = {k: float(v) for k, v in results.items()}
        summary = "  ".join(f"{k} {v:.4f}" for k, v in results.items())
        log.info(f"step {state.step} validation: {summary}")
        if self.env.is_main:
            self.task.report_evaluation(results, state, run_fraction(step=state.step, total_steps=total_steps or 1,
                                                                     progress=self._progress_fraction(state)))
        metric = self.config.train.best_metric
        if metric is None:
            return False
        if metric not in results:
            raise ConfigError(f"`train.best_metric` is {metric!r} but evaluation reports only "
                              f"{', '.join(sorted(results))}; pick one of those")
        value = float(results[metric])
        better = state.best_metric is None or (
            value > state.best_metric if self.config.train.best_mode == "max" else value < state.best_metric)
        if better:
            state.best_metric, state.best_step = value, state.step
            self.checkpoints.save(self.model, self.optimizer, self.scaler, state, best=True)
        return better

    def _finish(self, state: TrainingState) -> None:
        """Put the weights `final/` should hold into the model (the best checkpoint's, the moving average, the
        mean of the last checkpoints, or else the last weights), then write `final/` in HF format."""
        self._refuse_diverged_result(state)
        origin = self._final_weights(state)
        best = self.checkpoints.best() if self.config.train.best_metric else None
        self.task.final_checkpoint = {"step": state.step, "which": origin["weights"] if origin else "last"} | (
            {"checkpoints": origin["checkpoints"]} if origin and "checkpoints" in origin else {})
        if best is not None:
            self.checkpoints.load_weights(best, self.model)
            log.info(f"reloaded the best checkpoint {best.name} ({self.config.train.best_metric} = {state.best_metric})")
            self.task.final_checkpoint = {"step": checkpoint_step(best), "which": "best",
                                          "best_metric": self.config.train.best_metric, "best_value": state.best_metric}
        full_state = _full_state_dict(self.model)
        if self.env.is_main:
            self.task.save_final(self._unsharded(full_state), self.run_directory.final)
            if origin is not None:
                write_origin(self.run_directory.final, origin)
            write_run_model_card(self.run_dir, self.config)
            log.info(f"final model written to {self.run_directory.final}")
        D.barrier(self.env)

    def _drop_training_state(self) -> None:
        """train.keep_optimizer_state=false: a finished run keeps only its checkpoints' models."""
        if self.env.is_main:
            thinned, freed = self.checkpoints.drop_training_state()
            if thinned:
                log.info(f"dropped the optimizer and RNG state of {thinned} checkpoint(s), {freed / 1e6:,.1f} MB "
                         "(train.keep_optimizer_state=false); their model/ directories stay, the run cannot be resumed")
        D.barrier(self.env)

    def _final_weights(self, state: TrainingState) -> dict[str, Any] | None:
        """With train.ema or train.average_last_k, load the averaged weights into the model and say what they are."""
        train = self.config.train
        if self.ema is not None:
            self.ema.copy_to(self.raw_model)
            log.info(f"final/ holds the moving average of the weights (train.ema = {train.ema}, {state.step} steps)")
            return {"weights": "ema", "ema_decay": train.ema, "steps": state.step}
        if train.average_last_k is not None:
            checkpoints = self.checkpoints.complete_checkpoints()[-train.average_last_k:]
            average_checkpoints(self.raw_model, checkpoints, self.checkpoints.load_weights)
            names = [path.name for path in checkpoints]
            if len(checkpoints) < train.average_last_k:
                log.warning(f"train.average_last_k is {train.average_last_k} but the run has only {len(checkpoints)} "
                            "checkpoints; final/ averages those")
            log.info(f"final/ holds the mean weights of {', '.join(names)}")
            return {"weights": "average_of_checkpoints", "checkpoints": names}
        return None

    def _write_model_directory(self, model: nn.Module, directory: Path) -> None:
        """A checkpoint's model directory (`Task.save_model`); every rank calls it, rank 0 writes."""
        full_state = _full_state_dict(model)
        if self.env.is_main:
            self.task.save_model(self._unsharded(full_state), directory)

    def _unsharded(self, full_state: dict[str, torch.Tensor] | None) -> nn.Module:
        """The model with every weight in place: itself, or under FSDP an unsharded copy on rank 0 holding
        the gathered weights (built once; under `fork_rng`, so building it draws nothing from the
        random streams that exact resume replays)."""
        if full_state is None:
            return self.raw_model
        if self._unsharded_copy is None:
            with torch.random.fork_rng(devices=[]):
                self._unsharded_copy = self.task.build_model()
        self._unsharded_copy.load_state_dict(full_state)
        return self._unsharded_copy

    # --- signals --------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        def request_stop(signum: int, _frame: object) -> None:
            self._stop_signal = signum

        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous_handlers[signum] = signal.signal(signum, request_stop)
            except ValueError:  # not the main thread (e.g. inside a notebook executor)
                pass

    def _restore_signal_handlers(self) -> None:
        """After `fit`, a signal means what it meant before: a later SIGTERM must not be swallowed."""
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()


class _Window:
    """Averages between two log lines: loss, task metrics, throughput."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps, self.loss, self.tokens, self.samples, self.seconds = 0, 0.0, 0, 0, 0.0
        self.metrics: dict[str, float] = {}

    def add(self, loss: float, metrics: dict[str, float], tokens: int, samples: int, seconds: float) -> None:
        self.steps += 1
        self.loss += loss
        self.tokens += tokens
        self.samples += samples
        self.seconds += seconds
        for key, value in metrics.items():
            self.metrics[key] = self.metrics.get(key, 0.0) + value

    def flush(self, flops_per_token: float | None, peak_flops: float | None) -> dict[str, float]:
        if self.steps == 0:
            return {}
        seconds = max(self.seconds, 1e-9)
        stats = {"loss": self.loss / self.steps} | {k: v / self.steps for k, v in self.metrics.items()} | {
            "tokens_per_s": self.tokens / seconds, "samples_per_s": self.samples / seconds}
        if flops_per_token:
            achieved = flops_per_token * self.tokens / seconds
            stats["model_tflops"] = achieved / 1e12
            if peak_flops:
                stats["mfu"] = achieved / peak_flops
        self.reset()
        return stats


def write_plots(run_dir: Path) -> None:
    """`plots/*.png` of the run's metrics (what `bertforge plot` writes): a picture is a convenience, so a
    plotting failure (no matplotlib, no font cache) is a warning, never a failed run."""
    try:
        from bertforge.plotting import plot_run

        plot_run(run_dir)
    except Exception as error:  # noqa: BLE001 - whatever matplotlib raises, the trained model stands
        log.warning(f"plots of {run_dir} not written ({type(error).__name__}: {first_line(error)}); "
                    f"`bertforge plot {run_dir}` tries again")


def write_run_model_card(run_dir: Path, config: Config) -> None:
    """final/README.md (`bertforge.model_card`); a card that cannot be written is a warning, never a failed run."""
    from bertforge.model_card import CARD_NAME, command_line, write_model_card

    final = RunDirectory(run_dir).final
    try:
        write_model_card(final, run_dir=run_dir, config=config, command=command_line())
    except Exception as error:  # noqa: BLE001 - the card describes the model; the model stands without it
        log.warning(f"{final / CARD_NAME} not written ({type(error).__name__}: {first_line(error)})")


def _full_state_dict(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Under FSDP2 gather the full weights (a collective: every rank calls it); else None."""
    if not D.is_fsdp(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
