"""Processes a test started: which are alive, which descend from which, and kill -9 of a tree (psutil).

A killpg of a launcher's process group is not enough for `torchrun`: it starts each worker in a session of its
own (`start_new_session=True` in torch.distributed.elastic's SubprocessHandler), so the workers outlive the
launcher, reparented to PID 1, and go on training into the run directory the test resumes in.
"""

from __future__ import annotations

import contextlib
import subprocess
import time

import psutil

from helpers import HANG_TIMEOUT


def alive(pid: int) -> bool:
    """Running, not a zombie (a container's PID 1 may never reap an orphan that died)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    """Every process below `pid`."""
    return [child.pid for child in psutil.Process(pid).children(recursive=True)]


def kill_tree(process: subprocess.Popen) -> list[int]:
    """SIGKILL to `process` and every descendant, whatever group or session each made, as a node losing power
    would; returns the descendants killed, once none of them runs. They are listed before the first signal:
    once the launcher is dead its workers are PID 1's children, no longer found below it."""
    launcher = psutil.Process(process.pid)
    below = launcher.children(recursive=True)
    for each in (launcher, *below):
        with contextlib.suppress(psutil.NoSuchProcess):
            each.kill()
    process.wait()
    deadline = time.monotonic() + HANG_TIMEOUT
    while survivors := [each.pid for each in below if alive(each.pid)]:
        assert time.monotonic() < deadline, f"processes {survivors} outlived SIGKILL"
        time.sleep(0.02)
    return [each.pid for each in below]
