"""Processes a test started, read from /proc: which are alive, which descend from which, and kill -9 of a tree.

A killpg of a launcher's process group is not enough for `torchrun`: it starts each worker in a session of its
own (`start_new_session=True` in torch.distributed.elastic's SubprocessHandler), so the workers outlive the
launcher, reparented to PID 1, and go on training into the run directory the test resumes in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import HANG_TIMEOUT


def alive(pid: int) -> bool:
    """Running, not a zombie (a container's PID 1 may never reap an orphan that died)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, children first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        found += (kids := [kid for parent in frontier for kid in children.get(parent, [])])
        frontier = kids
    return found


def kill_tree(process: subprocess.Popen) -> list[int]:
    """SIGKILL to `process`, its process group and every descendant (each in whatever group or session it
    made), as a node losing power would; returns the descendants killed, once none of them runs. They are
    listed before the first signal: once the launcher is dead its workers are PID 1's children, not found."""
    below = descendants(process.pid)
    victims = [process.pid, *below]
    for pid in victims:
        try:
            os.killpg(pid, signal.SIGKILL)  # a session leader's group (torchrun's workers lead their own)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    deadline = time.monotonic() + HANG_TIMEOUT
    while any(alive(pid) for pid in victims):
        assert time.monotonic() < deadline, f"processes {[p for p in victims if alive(p)]} outlived SIGKILL"
        time.sleep(0.02)
    return below
