"""Two `torchrun` launchers on this machine acting as two nodes (one process each, c10d rendezvous on
127.0.0.1): `bertforge pretrain` gives one process's losses with the same global batch, and a node
whose worker is killed with SIGKILL resumes (`run.resume=auto`) to the uninterrupted run's weights.

The two "nodes" share the run directory, as nodes on a cluster share a file system.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers.processes import kill_tree
from helpers.tiny_pretraining import ROOT, train, train_losses, write_config
from safetensors.torch import load_file

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SETTINGS = ["train.max_steps=6", "train.checkpoint_every=1", "dist.strategy=ddp"]


def free_port() -> int:
    """A port the kernel just handed out: parallel test workers each get their own rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_nodes(config: Path, port: int) -> list[subprocess.Popen]:
    """`torchrun --nnodes=2 --node-rank=R ...` twice; each launcher in its own session."""
    nodes = []
    for node_rank in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node_rank}",
                   "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "-m", "bertforge.cli", "-q", "pretrain", str(config)]
        nodes.append(subprocess.Popen(command, cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    return nodes


def wait_for(nodes: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    results = []
    try:
        for node in nodes:
            output, _ = node.communicate(timeout=timeout)
            results.append((node.returncode, output))
    finally:
        for node in nodes:
            if node.poll() is None:
                kill_tree(node)  # its worker too: torchrun starts it in a session of its own
    return results


def run_two_nodes(config: Path) -> None:
    for returncode, output in wait_for(start_nodes(config, free_port())):
        assert returncode == 0, output[-3000:]


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final" / "model.safetensors")


@pytest.fixture(scope="module")
def two_node_run(prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("multinode") / "two-nodes"
    run_two_nodes(write_config(prepared_corpus, run_dir, *SETTINGS))
    return run_dir


def test_two_nodes_give_one_process_losses_with_the_same_global_batch(two_node_run: Path, prepared_corpus: Path,
                                                                       tmp_path: Path) -> None:
    """One process accumulates 2 micro-batches of 8 per step; two nodes take one each (dropout off). The one
    process is this one (the same config through the trainer): the nodes are what needs processes of their own."""
    single = train(prepared_corpus, tmp_path / "single", *SETTINGS)
    assert len(train_losses(two_node_run)) == 6
    assert (two_node_run / "checkpoints" / "step-00000006" / "rng-rank1.safetensors").is_file()  # two ranks ran
    # measured: bitwise equal here; the tolerance leaves room for another summation order of the two
    # micro-batches' gradients (all-reduce vs accumulation) on other machines
    assert train_losses(two_node_run) == pytest.approx(train_losses(single), rel=1e-6)


def test_a_node_whose_worker_is_killed_resumes_to_the_uninterrupted_weights_bitwise(two_node_run: Path,
                                                                                   prepared_corpus: Path,
                                                                                   tmp_path: Path) -> None:
    run_dir = tmp_path / "killed"
    config = write_config(prepared_corpus, run_dir, *SETTINGS)
    nodes = start_nodes(config, free_port())
    marker = run_dir / "checkpoints" / "latest"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and all(node.poll() is None for node in nodes):
        if marker.exists() and marker.read_text() >= "step-00000002":
            break
        time.sleep(0.02)
    workers = psutil.Process(nodes[1].pid).children()
    assert workers, "node 1's launcher has no worker"
    for worker in workers:
        worker.send_signal(signal.SIGKILL)  # node 1's worker, without warning; its launcher stays
    killed_at = time.time()
    results = wait_for(nodes)
    assert all(returncode != 0 for returncode, _ in results)  # the job failed, on both nodes
    assert not (run_dir / "final").exists()
    run_two_nodes(config)  # the same command again: run.resume=auto picks up the last checkpoint
    first_step = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first_step["step"] == 1 and first_step["time"] < killed_at  # resumed, not started over
    expected, resumed = final_model(two_node_run), final_model(run_dir)
    assert expected.keys() == resumed.keys()
    for name, weight in expected.items():
        assert torch.equal(resumed[name], weight), name
    assert train_losses(run_dir) == train_losses(two_node_run)
