"""Real 2-process torchrun jobs on CPU (gloo): DDP, ZeRO-1 and FSDP2 match one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT
from helpers.processes import kill_tree
from helpers.torchrun import torchrun_in_this_process

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "tests" / "helpers" / "trainer_tasks.py"
OVERRIDES = ["optim.lr=3e-2", "optim.weight_decay=0.01", "schedule.name=linear", "schedule.warmup=2",
             "train.micro_batch_size=16", "train.global_batch_size=64", "train.max_steps=6", "train.log_every=1",
             "train.eval_every=3", "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false"]


def write_config(run_dir: Path, *extra: str) -> Path:
    config = run_dir.parent / f"{run_dir.name}.yaml"
    from bertforge.config import config_to_yaml, load_config
    config.write_text(config_to_yaml(load_config(None, [*OVERRIDES, f"run.output_dir={run_dir.parent}",
                                                         f"run.name={run_dir.name}", *extra])))
    return config


def torchrun_arguments(run_dir: Path, nproc: int, task: str, *extra: str) -> list[str]:
    return ["--standalone", f"--nproc_per_node={nproc}", "-m", "bertforge.cli", "-q", "train", "--task",
            f"{TASKS}:{task}", str(write_config(run_dir, *extra))]


def launch(run_dir: Path, nproc: int, task: str, *extra: str) -> None:
    """A torchrun job to its end. The launcher runs in this process (`helpers.torchrun`): these runs are about
    what the ranks compute, and the ranks are processes of their own either way."""
    torchrun_in_this_process(*torchrun_arguments(run_dir, nproc, task, *extra))


def start_launcher(run_dir: Path, nproc: int, task: str, *extra: str) -> subprocess.Popen:
    """`python -m torch.distributed.run ...` as a process in a session of its own, for a test to kill it and its
    workers (`helpers.processes.kill_tree`: torchrun starts each worker in a session of its own, out of reach of
    a killpg of the launcher's group)."""
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run",
                             *torchrun_arguments(run_dir, nproc, task, *extra)], cwd=ROOT,
                            env=os.environ | {"OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["split"] == "train"]


@pytest.fixture(scope="module")
def single_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process reference, run by the CLI's entry point in this process (a second interpreter only added
    start-up CPU)."""
    from bertforge.cli import main

    run_dir = tmp_path_factory.mktemp("dist") / "single"
    assert main(["-q", "train", "--task", f"{TASKS}:NoDropout", str(write_config(run_dir))]) == 0
    return run_dir


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """One uninterrupted 2-rank run per strategy, shared by the test against one process and the kill-and-resume
    test's reference (each started its own before, at twice the CPU). It checkpoints only at its end: the killed
    run checkpoints every step, so the bitwise comparison also shows that checkpointing changes no bits."""
    runs: dict[str, Path] = {}

    def run(strategy: str) -> Path:
        if strategy not in runs:
            run_dir = tmp_path_factory.mktemp(f"two-ranks-{strategy}") / strategy
            launch(run_dir, 2, "NoDropout", f"dist.strategy={strategy}")
            runs[strategy] = run_dir
        return runs[strategy]

    return run


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "fsdp"])
def test_two_ranks_match_one_process_with_the_same_global_batch(strategy: str, single_process: Path,
                                                               two_ranks: Callable[[str], Path]) -> None:
    run_dir = two_ranks(strategy)
    assert losses(run_dir) == pytest.approx(losses(single_process), rel=1e-5, abs=1e-6)
    final_single = torch.load(single_process / "final" / "model.pt", weights_only=True)
    final_dist = torch.load(run_dir / "final" / "model.pt", weights_only=True)
    for key, value in final_single.items():
        torch.testing.assert_close(final_dist[key], value, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_killed_and_resumed_end_equal_to_an_uninterrupted_run(strategy: str, tmp_path: Path,
                                                                        two_ranks: Callable[[str], Path]) -> None:
    """kill -9 of the launcher and both workers; under FSDP2 the checkpoints are sharded (DCP)."""
    settings = ["train.checkpoint_every=1", f"dist.strategy={strategy}"]
    reference = two_ranks(strategy)
    run_dir = tmp_path / "killed"
    process = start_launcher(run_dir, 2, "NoDropout", *settings)
    marker = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if marker.exists() and marker.read_text() >= "step-00000002":
            break
        time.sleep(0.02)
    killed = kill_tree(process)  # the launcher and both workers, without warning; none writes to run_dir after
    assert len(killed) >= 2, "the launcher's two workers were not found, so they may still be training"
    launch(run_dir, 2, "NoDropout", *settings)  # the same command again: run.resume=auto resumes
    if strategy == "fsdp":
        assert (run_dir / "checkpoints" / "step-00000006" / "dcp").is_dir()
    a = torch.load(reference / "final" / "model.pt", weights_only=True)
    b = torch.load(run_dir / "final" / "model.pt", weights_only=True)
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_torchrun_max_restarts_with_resume_auto_recovers_a_crashed_worker(single_process: Path,
                                                                           tmp_path: Path) -> None:
    """Rank 1 dies at step 4; torchrun restarts both workers, which resume from the step-3 checkpoint."""
    run_dir = tmp_path / "restarted"
    marker = tmp_path / "crashed"
    config = tmp_path / "restarted.yaml"
    from bertforge.config import config_to_yaml, load_config
    config.write_text(config_to_yaml(load_config(None, [*OVERRIDES, f"run.output_dir={tmp_path}", "run.name=restarted",
                                                         "train.checkpoint_every=1"])))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--max-restarts=1",
               "-m", "bertforge.cli", "-q", "train", "--task", f"{TASKS}:CrashesOnceAtStep4", str(config)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_TIMEOUT,
                          env=os.environ | {"OMP_NUM_THREADS": "1", "BERTFORGE_TEST_CRASH_MARKER": str(marker)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.exists()  # it really crashed once
    output = done.stdout + done.stderr
    assert "internal error" not in output  # the survivor names the lost peer, not a bug of ours
    # which comes first is a race: rank 0 noticing the lost peer in a collective, or torchrun stopping it
    # (its "Sending process N closing signal SIGTERM"); both are clean ends, a traceback of ours is not
    assert ("rank 0 lost its connection to another process of this job" in output
            or "closing signal SIGTERM" in output), output[-3000:]
    assert losses(run_dir) == pytest.approx(losses(single_process), rel=1e-5, abs=1e-6)


def test_a_lost_peer_is_named_as_such_and_other_errors_are_not() -> None:
    """Gloo's transport raises RuntimeError, NCCL and the store DistError subclasses; a bug stays a bug."""
    import torch.distributed as dist

    from bertforge.train.distributed import describe_peer_failure

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: "
                        "Connection reset by peer")
    for error in (gloo, dist.DistBackendError("NCCL communicator was aborted"), dist.DistNetworkError("timeout")):
        message = describe_peer_failure(error)
        assert message is not None and "lost its connection to another process" in message
        assert "resume" in message and "\n" not in message
    assert describe_peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None
