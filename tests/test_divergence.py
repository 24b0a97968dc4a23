"""A run that diverges fails: it never ends with exit 0 and a final/ model of non-finite weights.

Each case here exited 0 with a final/ before the fix: `optim.lr=inf` (accepted, as the allowed
range ended at inf) exported 42 non-finite tensors; `optim.lr=1e6` skipped 7 of 8 steps under
`nan_policy=skip` and exported a model whose validation loss was NaN.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.cli import error_line
from helpers.finetuning import run_cli

from bertforge.cli import main
from bertforge.config import config_to_yaml, load_config
from bertforge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "helpers" / "trainer_tasks.py"
BASE = ["optim.lr=3e-2", "optim.weight_decay=0.0", "train.micro_batch_size=32", "train.global_batch_size=32", "train.log_every=1",
        "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false"]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_a_learning_rate_that_is_not_finite_is_refused_before_training(value: str) -> None:
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(None, [f"optim.lr={value}"])


def train_arguments(run_dir: Path, task: str, *overrides: str) -> list[str]:
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(config_to_yaml(load_config(None, [*BASE, f"run.output_dir={run_dir.parent}",
                                                        f"run.name={run_dir.name}", *overrides])), encoding="utf-8")
    return ["train", "--task", f"{TASKS}:{task}", str(config)]


def train(run_dir: Path, task: str, *overrides: str, env: dict[str, str] | None = None):
    """The run as its own process: its exit code, and its stderr whole (one error line, no traceback)."""
    return run_cli(*train_arguments(run_dir, task, *overrides), env=env)


# The first case runs as a process, for the exit code and the stderr a user sees; the others check which
# runs end as diverged and what their line says, the same code run by `bertforge.cli.main` in this process.


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_run_that_skips_more_steps_than_allowed_stops_as_diverged(tmp_path: Path) -> None:
    result = train(tmp_path / "run", "NaNLossFromStep", "train.max_steps=40", "train.max_skipped_steps=3",
                   env={"BERTFORGE_TEST_NAN_FROM": "5"})
    assert result.returncode == 2, result.stderr
    [error] = error_lines(result.stderr)
    assert "diverged" in error and "train.max_skipped_steps=3" in error
    assert not (tmp_path / "run" / "final").exists()
    assert "Traceback" not in result.stderr


def test_a_run_that_ends_with_non_finite_weights_writes_no_final_model(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Without clipping nothing notices NaN gradients during the run; its end refuses the weights."""
    error = error_line(capsys, *train_arguments(tmp_path / "run", "NaNGradients", "train.max_steps=4",
                                                "optim.clip_grad_norm=null"))
    assert "diverged" in error and "no final/" in error
    assert not (tmp_path / "run" / "final").exists()
    assert (tmp_path / "run" / "checkpoints" / "latest").is_file()  # kept, to inspect


def test_a_run_that_skipped_most_of_its_steps_writes_no_final_model(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """4 of 4 steps skipped (NaN gradients caught by clipping) is under the count cap, not a success."""
    error = error_line(capsys, *train_arguments(tmp_path / "run", "NaNGradients", "train.max_steps=4"))
    assert "4 of its 4 steps were skipped" in error
    assert not (tmp_path / "run" / "final").exists()


def test_a_healthy_run_is_untouched_by_the_divergence_checks(tmp_path: Path) -> None:
    assert main(train_arguments(tmp_path / "run", "SmallWithDropout", "optim.lr=3e-2", "train.max_steps=4")) == 0
    assert (tmp_path / "run" / "final").is_dir()
