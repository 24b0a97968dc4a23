"""Atomic checkpoints with exact resume.

A checkpoint is a directory `checkpoints/step-00000123/` holding the model, optimizer, per-rank
RNG states and `meta.json` (step, consumed samples, elapsed time, metrics). The model is a complete
model directory, `model/` (weights in safetensors, its description, the tokenizer), written by the
task's `save_model`, so every command loads a checkpoint as a model; a user task without that hook
keeps a plain state dict, `model.pt`. It is written to a
temporary sibling, every file fsynced, renamed into place and only then named in the `latest`
marker — written last, after every rank has finished its part. A `kill -9` at any moment leaves
either the previous complete checkpoint or the new one, never a half-written one that `resume:
auto` would pick. Under FSDP2 the model and optimizer are sharded states written by
`torch.distributed.checkpoint` (DCP), which is what resume reads, and `model/` is written from the
gathered full weights; otherwise rank 0 writes full states (ZeRO-1 first consolidates the sharded
optimizer state on rank 0). With `train.ema` the moving average of the weights is saved beside them
(`ema.safetensors`) and restored with them.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertforge.console import log
from bertforge.disk import DiskWriteError, disk_write
from bertforge.errors import BertforgeError
from bertforge.models.serialization import WEIGHTS_NAME, load_weights_into
from bertforge.run_directory import (
    BEST_MARKER,
    CHECKPOINT_META,
    LATEST_MARKER,
    LEGACY_CHECKPOINT_WEIGHTS,
    RunDirectory,
    checkpoint_model,
    checkpoint_name,
    is_checkpoint,
    read_checkpoint_meta,
    write_checkpoint_meta,
)
from bertforge.train.averaging import EMA_FILE, WeightEMA
from bertforge.train.distributed import DistEnv, barrier, is_fsdp, unwrap
from bertforge.train.state_files import STATE_SUFFIX, load_state, save_state, state_path

OPTIMIZER_STATE, SCALER_STATE = "optimizer", "scaler"
# what bertforge before the state files wrote: pickles, which can run code when read, so never read
PICKLED_STATE_FILES = ("optimizer.pt", "scaler.pt", "rng-rank0.pt")


def rng_state_name(rank: int) -> str:
    return f"rng-rank{rank}"


@dataclass
class TrainingState:
    """Everything besides tensors that resuming needs."""

    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    elapsed_seconds: float = 0.0
    best_metric: float | None = None
    best_step: int | None = None
    skipped_steps: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    # early stopping's count, saved so that a run killed after it stopped early does not train on
    evaluations_without_improvement: int = 0


def _fsync_tree(directory: Path) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# writes the model (wrapped as trained) as a model directory; called on every rank (under FSDP it gathers)
ModelWriter = Callable[[nn.Module, Path], None]


class CheckpointManager:
    def __init__(self, run_dir: Path, env: DistEnv, keep_last: int, write_model: ModelWriter | None = None,
                 ema: WeightEMA | None = None) -> None:
        self.run = RunDirectory(run_dir)
        self.directory = self.run.checkpoints
        self.env, self.keep_last = env, keep_last
        self.write_model = write_model  # None: the model is saved as a plain state dict
        self.ema = ema  # the moving average of the weights (train.ema), saved and restored with them

    # --- discovery ------------------------------------------------------------------------------

    def complete_checkpoints(self) -> list[Path]:
        return self.run.complete_checkpoints()

    def latest(self) -> Path | None:
        """The checkpoint named by `latest`, or else the newest complete one."""
        return self.run.latest_checkpoint()

    def best(self) -> Path | None:
        """The checkpoint named by `best`, when it names one of this run's."""
        return self.run.best_checkpoint()

    def resume_candidates(self) -> list[Path]:
        """Checkpoints to resume from, best first: `latest`, then every older complete one, newest first."""
        latest = self.latest()
        older = [p for p in reversed(self.complete_checkpoints()) if latest is None or p.name < latest.name]
        return ([latest] if latest is not None else []) + older

    # --- save -----------------------------------------------------------------------------------

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, state: TrainingState,
             *, best: bool = False) -> Path:
        name = checkpoint_name(state.step)
        final = self.directory / name
        temporary = self.directory / f".tmp-{name}"
        if self.env.is_main:
            shutil.rmtree(temporary, ignore_errors=True)
            temporary.mkdir(parents=True)
        barrier(self.env)
        try:
            self._write(model, optimizer, scaler, state, temporary)
        except BaseException:
            if self.env.is_main:  # a full disk leaves no half checkpoint, only the complete older ones
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        if self.env.is_main:
            if final.exists():  # a rollback re-saves a step; replace it whole
                shutil.rmtree(final)
            os.replace(temporary, final)
            self.run.mark(LATEST_MARKER, final)
            if best:
                self.run.mark(BEST_MARKER, final)
            self._prune()
        barrier(self.env)
        return final

    def _how_to_resume(self) -> str:
        """What a failed save's message tells the user (read only then: `latest()` reads the marker file)."""
        previous = self.latest()
        if previous is None:
            return "run the same command again"
        return f"run the same command to resume from {previous.name}"

    def _write(self, model: nn.Module, optimizer: torch.optim.Optimizer, scaler: Any, state: TrainingState,
               temporary: Path) -> None:
        """Each part is written by the ranks it concerns, then every rank learns whether any rank failed:
        a full disk on rank 0 must stop rank 1 with the same one-line error, not leave it waiting in the
        next collective until the job dies as a 'lost peer'."""

        def model_directory() -> None:  # under FSDP a collective gather, then rank 0 writes
            if self.write_model is not None:
                self.write_model(model, checkpoint_model(temporary))

        def tensors_and_rng() -> None:
            self._save_tensors(model, optimizer, temporary)
            save_state(rng_state(), state_path(temporary, rng_state_name(self.env.rank)))
            if self.ema is not None and self.env.is_main:  # the same average on every rank
                self.ema.save(temporary / EMA_FILE)

        def scaler_and_meta() -> None:
            if scaler is not None:
                save_state(scaler.state_dict(), state_path(temporary, SCALER_STATE))
            write_checkpoint_meta(temporary, asdict(state) | {"world_size": self.env.world_size})
            _fsync_tree(temporary)

        self._agree(self._attempt(model_directory, temporary))
        self._agree(self._attempt(tensors_and_rng, temporary))  # every rank has written its part
        self._agree(self._attempt(scaler_and_meta, temporary) if self.env.is_main else None)

    def _attempt(self, write: Callable[[], None], temporary: Path) -> DiskWriteError | None:
        try:
            with disk_write(temporary, self._how_to_resume):
                write()
        except DiskWriteError as error:
            return error
        return None

    def _agree(self, failure: DiskWriteError | None) -> None:
        """Raise on every rank the first rank's write failure, if any rank had one (a collective)."""
        if not self.env.distributed:
            if failure is not None:
                raise failure
            return
        import torch.distributed as dist

        messages: list[str | None] = [None] * self.env.world_size
        dist.all_gather_object(messages, None if failure is None else str(failure))
        first = next((message for message in messages if message is not None), None)
        if first is not None:
            raise failure if failure is not None and str(failure) == first else DiskWriteError(first)

    def _save_tensors(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
        if is_fsdp(model):
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(directory / "dcp"))
            return
        if hasattr(optimizer, "consolidate_state_dict"):  # ZeRO-1: gather the optimizer shards on rank 0
            optimizer.consolidate_state_dict(to=0)
        if self.env.is_main:
            if self.write_model is None:
                torch.save(unwrap(model).state_dict(), directory / LEGACY_CHECKPOINT_WEIGHTS)
            save_state(optimizer.state_dict(), state_path(directory, OPTIMIZER_STATE))

    def drop_training_state(self) -> tuple[int, int]:
        """`train.keep_optimizer_state=false` at the end of a finished run: delete what only a resume reads
        (optimizer, loss scaler, RNG and EMA state, FSDP's sharded `dcp/` beside a model directory) from every
        checkpoint, keeping its model directory and meta.json, so the checkpoints stay loadable models.
        Returns (checkpoints thinned, bytes freed); rank 0 only."""
        thinned, freed = 0, 0
        for checkpoint in self.complete_checkpoints():
            if not _holds_model(checkpoint):  # a plain state dict in dcp/ only: nothing else would be left
                continue
            parts = [state_path(checkpoint, OPTIMIZER_STATE), state_path(checkpoint, SCALER_STATE),
                     *checkpoint.glob(f"rng-rank*{STATE_SUFFIX}"), checkpoint / EMA_FILE, checkpoint / "dcp"]
            existing = [part for part in parts if part.exists()]
            for part in existing:
                freed += _size_of(part)
                shutil.rmtree(part) if part.is_dir() else part.unlink()
            thinned += bool(existing)
        return thinned, freed

    def _prune(self) -> None:
        keep = {p.name for p in self.complete_checkpoints()[-self.keep_last:]}
        best = self.best()
        if best is not None:
            keep.add(best.name)
        for path in self.complete_checkpoints():
            if path.name not in keep:
                shutil.rmtree(path, ignore_errors=True)
        for stale in self.directory.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)

    # --- load -----------------------------------------------------------------------------------

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, scaler: Any) -> TrainingState:
        if not is_checkpoint(path):
            raise BertforgeError(f"{path} is not a complete bertforge checkpoint (no {CHECKPOINT_META}); "
                                 "pick another one or set run.resume=never")
        _refuse_pickled_state(path)
        if optimizer is not None and is_model_only(path):
            raise BertforgeError(
                f"{path} holds only its model: the run finished with train.keep_optimizer_state=false, which dropped "
                "the optimizer and RNG state a resume needs. To train further, start a new run (another run.name) "
                f"from its weights with model.init_from={path.parent.parent}")
        meta = read_checkpoint_meta(path)
        saved_world = meta.pop("world_size", 1)
        if (path / "dcp").is_dir():
            from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

            from bertforge.train.safe_dcp import load_dcp  # torch.distributed.checkpoint: seconds to import

            model_state, optimizer_state = get_state_dict(model, optimizer)
            target = {"model": model_state, "optimizer": optimizer_state}
            load_dcp(target, str(path / "dcp"))
            set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optimizer"])
        else:
            _load_model_weights(path, model)
            if optimizer is not None:
                optimizer.load_state_dict(load_state(state_path(path, OPTIMIZER_STATE)))
        if scaler is not None and state_path(path, SCALER_STATE).is_file():
            scaler.load_state_dict(load_state(state_path(path, SCALER_STATE)))
        if self.ema is not None:
            self._load_ema(path, model)
        rng_file = state_path(path, rng_state_name(self.env.rank))
        if rng_file.is_file() and saved_world == self.env.world_size:
            set_rng_state(load_state(rng_file))
        return TrainingState(**meta)

    def _load_ema(self, path: Path, model: nn.Module) -> None:
        assert self.ema is not None
        if (path / EMA_FILE).is_file():
            self.ema.load(path / EMA_FILE)
            return
        log.warning(f"{path} holds no moving average of the weights (train.ema was off when it was written); the "
                    "average starts again from its weights")
        self.ema.shadow = WeightEMA(unwrap(model), self.ema.decay).shadow

    def load_weights(self, path: Path, model: nn.Module) -> None:
        """Only the model weights of a checkpoint (e.g. the best one, at the end of fine-tuning)."""
        if (path / "dcp").is_dir():
            from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

            from bertforge.train.safe_dcp import load_dcp

            target = {"model": get_model_state_dict(model)}
            load_dcp(target, str(path / "dcp"))
            set_model_state_dict(model, target["model"])
        else:
            _load_model_weights(path, model)


def _holds_model(checkpoint: Path) -> bool:
    return (checkpoint_model(checkpoint) / WEIGHTS_NAME).is_file() or (checkpoint / LEGACY_CHECKPOINT_WEIGHTS).is_file()


def is_model_only(checkpoint: Path) -> bool:
    """A checkpoint whose resume state `drop_training_state` removed: a model, no optimizer state."""
    return (_holds_model(checkpoint) and not state_path(checkpoint, OPTIMIZER_STATE).is_file()
            and not (checkpoint / "dcp").is_dir())


def _size_of(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(part.stat().st_size for part in path.rglob("*") if part.is_file())


def _refuse_pickled_state(checkpoint: Path) -> None:
    """A checkpoint from before the state files holds pickles (optimizer.pt, rng-rank*.pt): reading
    them could run code planted in them, so it is refused, with the way to keep its weights."""
    if state_path(checkpoint, OPTIMIZER_STATE).is_file() or (checkpoint / "dcp").is_dir():
        return
    pickled = [name for name in PICKLED_STATE_FILES if (checkpoint / name).is_file()]
    if pickled:
        weights = checkpoint_model(checkpoint) if checkpoint_model(checkpoint).is_dir() else checkpoint.parent.parent
        raise BertforgeError(
            f"{checkpoint} was written by an earlier bertforge: its optimizer and RNG state are pickles "
            f"({', '.join(pickled)}), which can run code when read, so bertforge no longer resumes from it. Start a "
            f"new run from its weights with model.init_from={weights} (the optimizer starts afresh), or set "
            "run.resume=never")


def _load_model_weights(checkpoint: Path, model: nn.Module) -> None:
    """The weights of a checkpoint's model directory, or of its plain state dict."""
    if (checkpoint_model(checkpoint) / WEIGHTS_NAME).is_file():
        load_weights_into(unwrap(model), checkpoint_model(checkpoint))
    else:
        state = torch.load(checkpoint / LEGACY_CHECKPOINT_WEIGHTS, map_location="cpu", weights_only=True)
        unwrap(model).load_state_dict(state)
