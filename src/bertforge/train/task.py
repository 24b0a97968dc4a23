"""The white-box API: a `Task` says what to train; the `Trainer` says how.

A task builds its data and model and computes a loss from a batch. Everything about devices,
precision, accumulation, parallelism, checkpoints and logging belongs to the trainer, so a user's
own task is one small class in one file (`bertforge train --task my_task.py:MyTask CONFIG`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from bertforge.config import Config
from bertforge.data.sampler import EpochPlan
from bertforge.device import batch_on_device, model_device

if TYPE_CHECKING:
    from bertforge.train.checkpoint import TrainingState

Batch = dict[str, Any]


class ResumableLoader(Protocol):
    """Micro-batches for one rank, epoch after epoch, starting at step `step` after `consumed_samples`.

    `plan` says how an epoch is cut into steps; the trainer reads `plan.step_at(consumed, step)` to
    know how many micro-batches make the next step and how many samples it consumes, and replaces
    `plan` with one that ramps the batch size (`EpochPlan.with_batch_ramp`) before it calls `iterate`
    when `train.batch_ramp_start` is set, so `iterate` must read `self.plan` then. `step` and
    `total_steps` (None under a wall-clock-only budget) are the progress that data which changes
    over the run (a mask-rate schedule) follows, the same the learning-rate schedule follows.
    """

    plan: EpochPlan

    def iterate(self, consumed_samples: int, *, step: int = 0, total_steps: int | None = None) -> Iterator[Batch]: ...


@dataclass
class TaskData:
    """What a task's `build_datasets` returns.

    `train` is either a map-style dataset (anything with `__len__` and `__getitem__`) that the
    trainer batches with `collate` and shards with the deterministic sampler, or a factory
    `geometry -> ResumableLoader` for tasks that bring their own loader (pre-training).
    Validation data is a map-style dataset batched with `collate`, or ready `validation_batches`
    (a list or any re-iterable of batches).
    """

    train: Any
    collate: Callable[[list[Any]], Batch] | None = None
    validation: Any = None
    validation_batches: Iterable[Batch] | None = None
    tokens_per_sample: float | None = None  # average real tokens per training sample, for token budgets


@dataclass(frozen=True)
class StepRunner:
    """What a task that runs a whole optimizer step itself (`Task.train_step`) gets from the trainer."""

    model: nn.Module  # the wrapped (DDP / FSDP) model: call it, not its submodules, so gradients are synced
    device: torch.device
    world_size: int
    micro_batch: Callable[[bool], AbstractContextManager[object]]  # (last micro-batch?): gradient sync only on the last, + autocast
    autocast: Callable[[], AbstractContextManager[object]]  # the run's precision, for passes without backward
    backward: Callable[[torch.Tensor], None]  # backward of a loss, through the GradScaler when there is one
    gather: Callable[[torch.Tensor], torch.Tensor]  # every rank's rows, in rank order; gradients flow to this rank's rows


class Task:
    """Subclass and override `build_datasets`, `build_model` and `forward_step`."""

    # which weights `save_final` gets, for the reports it writes: {"step": 120, "which": "best" | "last" | "ema" |
    # "average_of_checkpoints", ...}; set by the trainer just before it calls `save_final`
    final_checkpoint: dict[str, Any] | None = None

    def __init__(self, config: Config) -> None:
        self.config = config

    # --- required -------------------------------------------------------------------------------

    def build_datasets(self) -> TaskData:
        raise NotImplementedError(f"{type(self).__name__} must implement build_datasets()")

    def build_model(self) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must implement build_model()")

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch and metrics to log.

        If `loss_units` is overridden, return the *sum* of the loss over those units and divide it
        by `batch["global_loss_units"][unit]` — the total over every micro-batch and rank of the
        step, filled in by the trainer — so the loss is normalised over the whole global batch.
        Otherwise return the mean loss of the micro-batch; the trainer averages micro-batches.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement forward_step()")

    # --- optional -------------------------------------------------------------------------------

    def train_step(self, micro_batches: Sequence[Batch], runner: StepRunner) -> tuple[float, dict[str, float]] | None:
        """Run the forward and backward passes of a whole optimizer step, for a loss that couples the
        micro-batches (in-batch negatives over the global batch); return the step's loss, the same on
        every rank, and metrics. None (the default) = the trainer calls `forward_step` per micro-batch."""
        return None

    def loss_units(self, batch: Batch) -> dict[str, float] | None:
        """Counts the loss is averaged over (e.g. {"masked_tokens": 37}); None = mean per micro-batch."""
        return None

    def tokens_in_batch(self, batch: Batch) -> int:
        """Real (non-padding) tokens in a micro-batch, for throughput and token budgets."""
        input_ids = batch.get("input_ids")
        if input_ids is None:
            return 0
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())
        return int(input_ids.numel())

    def metric_names(self) -> set[str] | None:
        """The keys `evaluate` will return, called after `build_datasets`, so that a misspelt
        `train.best_metric` fails before the first step; None = not known until the first evaluation."""
        return {"loss"} if type(self).evaluate is Task.evaluate else None

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        """Validation metrics over the batches; by default the mean of forward_step's loss. The batches are the
        validation data as built, on the CPU: each goes to the model's device here (`batch_on_device`), as the
        trainer moves each training batch before `forward_step`."""
        device = model_device(model)
        total, count = 0.0, 0
        for batch in batches:
            loss, _ = self.forward_step(batch_on_device(batch, device), model)
            total, count = total + float(loss), count + 1
        return {"loss": total / max(count, 1)}

    def report_evaluation(self, results: dict[str, float], state: TrainingState, fraction_done: float) -> None:
        """Called on rank 0 after each evaluation has been logged, for the task's own remarks on its figures (the
        pre-training task's MLM plateau); `fraction_done` is how far into its budget the run is, in [0, 1]."""

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        """Return an optimizer to replace the configured one; None keeps `optim.*`."""
        return None

    def parameter_groups(self, model: nn.Module) -> list[dict[str, Any]] | None:
        """Weight-decay groups; None = the trainer's default (no decay on biases and norms)."""
        return None

    def flops_per_token(self, model: nn.Module) -> float | None:
        """Training FLOPs per real token (forward + backward), for model-FLOPs utilisation."""
        return None

    def layer_modules(self, model: nn.Module) -> Sequence[nn.Module]:
        """The repeated blocks, for per-layer activation checkpointing and FSDP sharding."""
        layers: list[nn.Module] = []
        for name, module in model.named_modules():
            if isinstance(module, nn.ModuleList) and name.split(".")[-1] == "layers":
                layers.extend(module)
        return layers

    def save_model(self, model: nn.Module, directory: Path) -> None:
        """Write `model` (unwrapped, unsharded) as a self-describing model directory, rank 0 only: each
        checkpoint then holds one (`step-N/model/`) that every command can load as a model. A task
        that does not override this keeps a plain state dict (`step-N/model.pt`) in its checkpoints."""
        raise NotImplementedError

    def save_final(self, model: nn.Module, directory: Path) -> None:
        """Write the final model (rank 0 only); by default the raw state dict."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), directory / "model.pt")


def saves_model_directories(task: Task) -> bool:
    """Whether `task` writes its checkpoints' model as a model directory (`Task.save_model`)."""
    return type(task).save_model is not Task.save_model
