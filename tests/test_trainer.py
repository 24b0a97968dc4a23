"""The trainer on a user-defined task: budgets, checkpoints, exact resume, faults, the CLI."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import trainer_tasks
from helpers.cli import error_line

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import BertforgeError
from bertforge.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "helpers" / "trainer_tasks.py"

BASE = ["optim.lr=3e-2", "optim.weight_decay=0.0", "schedule.name=cosine", "schedule.warmup=2",
        "train.micro_batch_size=32", "train.global_batch_size=64", "train.max_steps=12", "train.log_every=1",
        "train.eval_every=4", "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false"]


def config_for(run_dir: Path, *extra: str):
    return load_config(None, [*BASE, f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *extra])


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "final" / "model.pt", weights_only=True)


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def metrics(run_dir: Path, split: str = "train") -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if record["split"] == split]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "uninterrupted"
    Trainer(config_for(run_dir), trainer_tasks.SmallWithDropout(config_for(run_dir))).fit()
    return run_dir


def test_run_directory_holds_config_metrics_checkpoints_and_final_model(uninterrupted: Path) -> None:
    assert (uninterrupted / "config.yaml").is_file()
    assert load_config(uninterrupted / "config.yaml").train.max_steps == 12
    train = metrics(uninterrupted)
    assert [r["step"] for r in train] == list(range(1, 13))
    assert all({"loss", "lr", "tokens_per_s", "samples_per_s"} <= r.keys() for r in train)
    assert train[-1]["loss"] < train[0]["loss"]
    assert len(metrics(uninterrupted, "validation")) == 3
    assert (uninterrupted / "checkpoints" / "latest").read_text() == "step-00000012"
    assert (uninterrupted / "final" / "model.pt").is_file()


def test_sigterm_saves_a_checkpoint_and_resume_matches_uninterrupted_run(uninterrupted: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "interrupted"
    monkeypatch.setenv("BERTFORGE_TEST_SIGTERM_AT", str(2 * 5))  # 2 micro-batches per step: during step 5
    trainer_tasks.StopsItselfWithSigterm.calls = 0
    result = Trainer(config_for(run_dir), trainer_tasks.StopsItselfWithSigterm(config_for(run_dir))).fit()
    assert result.stopped_by == "signal" and result.state.step == 5
    assert not (run_dir / "final").exists()
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000005"
    resumed = Trainer(config_for(run_dir), trainer_tasks.SmallWithDropout(config_for(run_dir))).fit()
    assert resumed.state.step == 12 and resumed.stopped_by == "budget"
    assert_bitwise_equal(final_weights(run_dir), final_weights(uninterrupted))
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, 13))  # no duplicated log lines


def test_kill_9_at_random_moments_then_resume_matches_uninterrupted_run(uninterrupted: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    command = [sys.executable, "-m", "bertforge.cli", "-q", "train", "--task", f"{TASKS}:SmallWithDropout",
               "--print-config"]
    overrides = [*BASE, f"run.output_dir={tmp_path}", "run.name=killed", "train.checkpoint_every=1",
                 "train.keep_last=2"]
    command = command[:-1] + ["-"] if False else command[:-1]
    config_file = tmp_path / "killed.yaml"
    from bertforge.config import config_to_yaml
    config_file.write_text(config_to_yaml(load_config(None, overrides)))
    command = [*command, str(config_file)]
    rng = random.Random(1234)
    kills = 0
    for _ in range(3):
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        latest = run_dir / "checkpoints" / "latest"
        start = latest.read_text() if latest.exists() else ""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if latest.exists() and latest.read_text() != start:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))  # somewhere in a step or in a checkpoint write
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    assert kills >= 1
    assert main(command[3:]) == 0  # the resume that finishes, in this process: only the killed ones need their own
    assert_bitwise_equal(final_weights(run_dir), final_weights(uninterrupted))
    leftovers = list((run_dir / "checkpoints").glob(".tmp-*"))
    assert leftovers == []


@pytest.mark.parametrize("policy", ["skip", "stop", "rollback"])
def test_non_finite_loss_policies(policy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / policy
    monkeypatch.setenv("BERTFORGE_TEST_NAN_AT", str(2 * 6 - 1))  # the first micro-batch of step 6
    trainer_tasks.InjectsNaN.calls = 0
    config = config_for(run_dir, f"train.nan_policy={policy}", "train.checkpoint_every=2", "train.keep_last=10")
    if policy == "stop":
        with pytest.raises(BertforgeError, match="non-finite loss at step 6"):
            Trainer(config, trainer_tasks.InjectsNaN(config)).fit()
        assert not (run_dir / "final").exists()
        return
    result = Trainer(config, trainer_tasks.InjectsNaN(config)).fit()
    assert result.state.step == 12 and result.state.skipped_steps == 1
    flagged = [r for r in metrics(run_dir) if r.get("non_finite_loss")]
    assert [r["step"] for r in flagged] == [6]
    assert all(torch.isfinite(t).all() for t in final_weights(run_dir).values())
    # what tells the policies apart: rollback restores step 4's weights when step 6 fails (the
    # checkpoint saved at step 6 holds them); skip keeps step 5's update and drops only step 6's
    step = {n: torch.load(run_dir / "checkpoints" / f"step-{n:08d}" / "model.pt", weights_only=True) for n in (4, 6)}
    same = all(torch.equal(step[4][k], step[6][k]) for k in step[4])
    assert same == (policy == "rollback")


def test_keep_last_k_leaves_exactly_the_k_newest_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "kept"
    config = config_for(run_dir, "train.checkpoint_every=2", "train.keep_last=3")
    Trainer(config, trainer_tasks.NoDropout(config)).fit()
    kept = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert kept == ["step-00000008", "step-00000010", "step-00000012"]


def test_clipping_bounds_the_update_by_the_limit(tmp_path: Path) -> None:
    """With plain SGD (lr 1, no momentum or decay) one step moves the weights by exactly the clipped
    gradient, so its norm must be the limit although the raw gradient (logged) is larger."""
    limit = 0.01
    run_dir = tmp_path / "clipped"
    config = config_for(run_dir, "optim.name=sgd", "optim.lr=1.0", "optim.weight_decay=0.0", "optim.momentum=0.0",
                        "schedule.name=constant", "schedule.warmup=0", "train.max_steps=1",
                        f"optim.clip_grad_norm={limit}")
    task = trainer_tasks.NoDropout(config)
    task.build_datasets()
    torch.manual_seed(config.run.seed)  # the trainer draws the initial weights right after this seed
    initial = {k: v.clone() for k, v in task.build_model().state_dict().items()}
    Trainer(config, trainer_tasks.NoDropout(config)).fit()
    trained = final_weights(run_dir)
    update = torch.sqrt(sum(((trained[k] - initial[k]).double() ** 2).sum() for k in initial))
    assert metrics(run_dir)[0]["grad_norm"] > 10 * limit  # the raw gradient was well above the limit
    assert float(update) == pytest.approx(limit, rel=1e-3)


def test_global_batch_must_divide_into_micro_batches(tmp_path: Path) -> None:
    config = config_for(tmp_path / "bad", "train.global_batch_size=48", "train.micro_batch_size=32")
    with pytest.raises(BertforgeError, match="must be a multiple"):
        Trainer(config, trainer_tasks.SmallWithDropout(config))


def test_cli_train_runs_a_user_task_file_and_reports_bad_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    # `bertforge.cli.main` in this process (test_divergence runs `train --task` as a process, exit code and all)
    monkeypatch.chdir(tmp_path)
    ok = main(["-q", "train", "--task", f"{TASKS}:NoDropout", str(ROOT / "examples" / "tasks" / "bag_of_words.yaml"),
               f"run.output_dir={tmp_path}", "train.max_steps=3", "log.progress=false"])
    assert ok == 0, capsys.readouterr().err
    assert (tmp_path / "bag-of-words" / "final").is_dir()
    assert list((tmp_path / "bag-of-words" / "tensorboard").glob("events.out.tfevents.*"))  # on by default
    bad = error_line(capsys, "train", "--task", f"{TASKS}:Missing", str(ROOT / "examples" / "tasks" / "bag_of_words.yaml"))
    assert "has no class 'Missing'" in bad


def test_token_and_wall_clock_budgets_stop_the_run(tmp_path: Path) -> None:
    by_tokens = config_for(tmp_path / "tokens", "train.max_steps=null", "train.max_tokens=3000")
    result = Trainer(by_tokens, trainer_tasks.SmallWithDropout(by_tokens)).fit()
    assert result.state.consumed_tokens >= 3000
    assert result.state.step <= 12
    by_time = config_for(tmp_path / "time", "train.max_steps=null", "train.max_time_minutes=0.01")
    result = Trainer(by_time, trainer_tasks.SmallWithDropout(by_time)).fit()
    assert result.state.elapsed_seconds >= 0.6 and result.stopped_by == "budget"
    lrs = [r["lr"] for r in metrics(tmp_path / "time")]
    assert lrs[-1] < max(lrs)  # the schedule followed elapsed time down


def test_an_on_step_end_hook_ends_the_run_at_its_step_as_a_finished_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "hooked"
    stopper_steps: list[int] = []
    observer_steps: list[int] = []

    def stop_at_step_5(trainer: Trainer, state) -> bool:
        stopper_steps.append(state.step)
        return state.step == 5

    def observe(trainer: Trainer, state) -> None:  # returns nothing: never stops the run
        assert trainer.run_dir == run_dir
        observer_steps.append(state.step)

    result = Trainer(config_for(run_dir), trainer_tasks.SmallWithDropout(config_for(run_dir)),
                     on_step_end=[stop_at_step_5, observe]).fit()
    assert result.stopped_by == "hook" and result.exit_code == 0 and result.state.step == 5
    assert stopper_steps == observer_steps == [1, 2, 3, 4, 5]  # every hook runs, the stopping one's step included
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000005"
    assert (run_dir / "final" / "model.pt").is_file()
    assert [r["step"] for r in metrics(run_dir)] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in metrics(run_dir, "validation")] == [4, 5]  # evaluated at its last step, as a budget end


def test_no_budget_is_a_clear_error(tmp_path: Path) -> None:
    config = config_for(tmp_path / "none", "train.max_steps=null")
    with pytest.raises(BertforgeError, match="no training budget"):
        Trainer(config, trainer_tasks.SmallWithDropout(config)).fit()


def test_bf16_on_cpu_warns_and_still_trains(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = config_for(tmp_path / "bf16", "train.precision=bf16", "train.max_steps=2")
    with caplog.at_level("WARNING", logger="bertforge"):
        result = Trainer(config, trainer_tasks.SmallWithDropout(config)).fit()
    assert result.state.step == 2
    assert any("fp32 is the CPU default" in record.message for record in caplog.records)


def test_fp16_uses_a_grad_scaler_that_is_checkpointed(tmp_path: Path) -> None:
    config = config_for(tmp_path / "fp16", "train.precision=fp16", "train.max_steps=2")
    Trainer(config, trainer_tasks.SmallWithDropout(config)).fit()
    assert (tmp_path / "fp16" / "checkpoints" / "step-00000002" / "scaler.safetensors").is_file()


def test_plot_writes_png_curves(uninterrupted: Path, tmp_path: Path) -> None:
    from bertforge.cli import main

    assert main(["plot", str(uninterrupted), "--out", str(tmp_path)]) == 0
    written = {p.name for p in tmp_path.glob("*.png")}
    assert {"loss.png", "lr.png", "tokens_per_s.png", "accuracy.png"} <= written
    assert all((tmp_path / name).read_bytes()[:4] == b"\x89PNG" for name in written)
