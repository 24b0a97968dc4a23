"""One writer per run directory: an advisory lock held for the life of the training process.

Two processes training into one run directory would interleave their metrics, mix checkpoint
state and overwrite each other's `final/`. The lock is `fcntl.flock` on `RUN_DIR/.lock`: the
kernel releases it when the holder exits or is killed (kill -9 included), so a stale lock never
needs cleaning up. The file records who holds it (PID, host, start time) for the error message.
Under torchrun only rank 0 takes it; the trainer shares the outcome with every rank.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import IO

from bertforge.errors import BertforgeError

LOCK_NAME = ".lock"


class RunInUseError(BertforgeError):
    """Another live process holds the run directory's lock."""


def holder_of(lock_path: Path) -> str:
    try:
        holder = json.loads(lock_path.read_text(encoding="utf-8"))
        return f"PID {holder['pid']} on {holder['host']} (since {holder['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class RunLock:
    """Hold `run_dir/.lock` exclusively until `release()` or the process ends."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_NAME
        self._handle: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 -- held open for the life of the run
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RunInUseError(f"run directory {self.path.parent} is in use by {holder_of(self.path)}; wait for it to "
                                "finish or stop it, or choose another run.name") from None
        handle.seek(0)
        handle.truncate()
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}) + "\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor drops the flock
            self._handle = None

    @property
    def held(self) -> bool:
        return self._handle is not None
