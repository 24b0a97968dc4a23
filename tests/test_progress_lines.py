"""Training progress off a terminal (nohup, Slurm, a pipe): one plain line per `train.log_every` steps with the
step, loss, learning rate, tokens/s and ETA, where a progress bar would show nothing until the end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.train.logging import progress_line

TASKS = Path(__file__).resolve().parent / "helpers" / "trainer_tasks.py"
EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "bag_of_words.yaml"
LINE = re.compile(r"^step (\d+)/6  loss \d+\.\d{4}  lr \d\.\d\de-\d\d  tokens/s [\d,]+  eta \d+:\d\d:\d\d$", re.M)


def test_a_run_piped_to_a_file_prints_one_plain_line_per_log_every_steps(tmp_path: Path,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    """In this process, its stderr a file (pytest's capture, as under nohup): the console is not a terminal, which
    is all the choice of plain lines reads; a second interpreter only added start-up CPU."""
    code = main(["train", "--task", f"{TASKS}:SmallWithDropout", str(EXAMPLE_CONFIG), f"run.output_dir={tmp_path}",
                 "train.max_steps=6", "train.log_every=2", "train.eval_every=100", "log.tensorboard=false",
                 "log.plots=false"])
    stderr = capfd.readouterr().err
    assert code == 0, stderr
    assert [int(step) for step in LINE.findall(stderr)] == [2, 4, 6], stderr
    assert "━" not in stderr  # no bar drawn into the file


def test_the_line_without_a_step_budget_leaves_the_total_and_eta_out() -> None:
    assert progress_line(40, None, {"loss": 2.5, "lr": 1e-3, "tokens_per_s": 12345.6}, None) == (
        "step 40  loss 2.5000  lr 1.00e-03  tokens/s 12,346")
    assert progress_line(40, 100, {"loss": 2.5}, 3725.2).endswith("eta 1:02:05")
