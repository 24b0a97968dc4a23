"""Where training metrics go: `metrics.jsonl` always; TensorBoard, W&B and MLflow when available.

Only rank 0 writes. Each sink is the library's own API; a sink whose library is missing is
skipped with one note instead of failing the run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bertforge.config import Config, config_to_yaml
from bertforge.console import console, log, progress_enabled
from bertforge.errors import ConfigError, first_line
from bertforge.run_directory import CONFIG_FILE, RunDirectory


def _after_the_last_event_file(directory: Path) -> None:
    """Wait, at most a second, until a new event file's name sorts after every file in `directory`.
    TensorBoard reads a run's event files in name order, `events.out.tfevents.<whole seconds>.<host>.<pid>...`,
    and the purge only drops the events read before it: an interrupted attempt's file from the same second
    as the rewound writer's (a re-run started at once, in the same process) sorted after it when its pid
    did, and TensorBoard showed the dead attempt's steps again (seen in the suite)."""
    newest = max((int(parts[3]) for path in directory.glob("events.out.tfevents.*")
                  if len(parts := path.name.split(".")) > 3 and parts[3].isdigit()), default=None)
    if newest is not None and time.time() < newest + 1:
        time.sleep(newest + 1 - time.time())


class MetricsLogger:
    def __init__(self, run_dir: Path, config: Config, enabled: bool) -> None:
        self.enabled = enabled
        self.path = RunDirectory(run_dir).metrics_file
        self.tensorboard_dir = RunDirectory(run_dir).tensorboard
        self._tensorboard = self._wandb = self._mlflow = None
        if not enabled:
            return
        if config.log.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(log_dir=str(self.tensorboard_dir))
            except ImportError:
                log.info("TensorBoard is not installed (pip install 'bertforge[tracking]'); skipping its logs")
        if config.log.wandb_project:
            try:
                import wandb

                self._wandb = wandb.init(project=config.log.wandb_project, name=config.run.name,
                                         config=json.loads(json.dumps(_plain(config))), dir=str(run_dir))
            except ImportError:
                log.warning("log.wandb_project is set but wandb is not installed (pip install wandb); skipping W&B")
            except Exception as error:  # not logged in, no network, a bad setting: say so in one line
                raise ConfigError(f"log.wandb_project: W&B did not start ({first_line(error)}); run `wandb login`, "
                                  "set WANDB_MODE=offline, or unset log.wandb_project") from None
        if config.log.mlflow_experiment:
            try:
                import mlflow

                mlflow.set_experiment(config.log.mlflow_experiment)
                self._mlflow = mlflow.start_run(run_name=config.run.name)
                mlflow.log_text(config_to_yaml(config), CONFIG_FILE)
            except ImportError:
                log.warning("log.mlflow_experiment is set but mlflow is not installed (pip install mlflow); skipping")
            except Exception as error:
                raise ConfigError(f"log.mlflow_experiment: MLflow did not start ({first_line(error)}); check "
                                  "MLFLOW_TRACKING_URI, or unset log.mlflow_experiment") from None

    def write(self, step: int, split: str, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": split, "time": round(time.time(), 3)} | {
            key: float(value) for key, value in metrics.items()}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self._tensorboard is not None:
            for key, value in metrics.items():
                self._tensorboard.add_scalar(f"{split}/{key}", float(value), step)
            self._tensorboard.flush()
        if self._wandb is not None:
            self._wandb.log({f"{split}/{key}": float(value) for key, value in metrics.items()}, step=step)
        if self._mlflow is not None:
            import mlflow

            mlflow.log_metrics({f"{split}_{key}": float(value) for key, value in metrics.items()}, step=step)

    def rewind(self, step: int) -> None:
        """Forget what an interrupted attempt logged after `step`, the step this one starts from (0 when
        it died before its first checkpoint): those steps are about to be trained and logged again.
        metrics.jsonl keeps its earlier rows, and a half-written last row (kill -9 mid-write) goes too;
        TensorBoard is told to purge its later events (`purge_step`), as its event files are append-only."""
        if not self.enabled:
            return
        if self.path.is_file():
            kept = [line for line in self.path.read_text(encoding="utf-8").splitlines()
                    if (record := _record(line)) is not None and record.get("step", 0) <= step]
            self.path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        if self._tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard.close()
            _after_the_last_event_file(self.tensorboard_dir)
            self._tensorboard = SummaryWriter(log_dir=str(self.tensorboard_dir), purge_step=step + 1)

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            import mlflow

            mlflow.end_run()


def _record(line: str) -> dict[str, Any] | None:
    """A metrics.jsonl row, or None for a blank or half-written one."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def _plain(config: Config) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.structured(config))


class TrainingProgress:
    """A rich bar: step, loss, lr, tokens/s and ETA. Silent on other ranks and with --quiet.

    Off a terminal (nohup, Slurm, a pipe: the console, stderr, is a file) a bar cannot redraw and rich shows it
    only at the end, so each `train.log_every` step prints one plain line with the same numbers instead."""

    def __init__(self, total_steps: int | None, enabled: bool) -> None:
        self.enabled = enabled and progress_enabled()
        self.plain_lines = self.enabled and not console.is_terminal
        self.total_steps = total_steps
        self._first: tuple[int, float] | None = None  # (step, time) of the first update: the ETA's origin
        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False,
            disable=not self.enabled or self.plain_lines)
        self._task = self._progress.add_task("train", total=total_steps, stats="")

    def __enter__(self) -> TrainingProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)  # type: ignore[arg-type]

    def update(self, step: int, stats: dict[str, float]) -> None:
        """Steps without stats move the bar; steps with them (every `train.log_every`) also print a plain line."""
        if self.plain_lines:
            now = time.monotonic()
            if self._first is None:
                self._first = (step, now)
            if stats:
                console.print(progress_line(step, self.total_steps, stats, self._eta(step, now)), markup=False,
                              highlight=False, soft_wrap=True)
            return
        text = "  ".join(_format(key, value) for key, value in stats.items())
        self._progress.update(self._task, completed=step, stats=text)

    def _eta(self, step: int, now: float) -> float | None:
        assert self._first is not None
        first_step, started = self._first
        if self.total_steps is None or step <= first_step:
            return None
        return (self.total_steps - step) * (now - started) / (step - first_step)


def progress_line(step: int, total_steps: int | None, stats: dict[str, float], eta_seconds: float | None) -> str:
    """`step 50/300  loss 4.1234  lr 1.00e-03  tokens/s 12,345  eta 0:02:30`: one line a log file keeps."""
    parts = [f"step {step}/{total_steps}" if total_steps is not None else f"step {step}"]
    parts += [_format(key, value) for key, value in stats.items()]
    if eta_seconds is not None:
        minutes, seconds = divmod(round(eta_seconds), 60)
        parts.append(f"eta {minutes // 60}:{minutes % 60:02d}:{seconds:02d}")
    return "  ".join(parts)


def _format(key: str, value: float) -> str:
    if key == "lr":
        return f"lr {value:.2e}"
    if key.endswith("per_s"):
        return f"{key.replace('_per_s', '/s')} {value:,.0f}"
    return f"{key} {value:.4f}"
