"""One writer per directory: an advisory lock held while a process writes a run or a dataset.

Two processes training into one run directory would interleave their metrics, mix checkpoint
state and overwrite each other's `final/`; two `prepare`s into one `--out` delete each other's
shard entries. The lock is `fcntl.flock` on `DIR/.lock`: the kernel releases it when the holder
exits or is killed (kill -9 included), so a stale lock never needs cleaning up. The file records
who holds it (PID, host, start time) for the error message. Under torchrun only rank 0 takes the
run's lock; the trainer shares the outcome with every rank.

A directory that held nothing but the lock when it was taken (made for it, or left so by an earlier
failure) is removed again on release if it still holds nothing else: a run that fails its checks
before writing anything leaves no run directory behind. The lock file is unlinked while still held,
so `acquire` checks that the file it locked is still the one at the path, and retries otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import IO

from bertforge.errors import BertforgeError

LOCK_NAME = ".lock"


class DirectoryInUseError(BertforgeError):
    """Another live process holds the directory's lock."""


def holder_of(lock_path: Path) -> str:
    try:
        holder = json.loads(lock_path.read_text(encoding="utf-8"))
        return f"PID {holder['pid']} on {holder['host']} (since {holder['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


class DirectoryLock:
    """Hold `directory/.lock` exclusively until `release()` or the process ends.

    `what` names the directory in the error ("run directory"); `advice` says what else to do.
    """

    def __init__(self, directory: Path, what: str, advice: str) -> None:
        self.path = directory / LOCK_NAME
        self.what, self.advice = what, advice
        self._handle: IO[str] | None = None
        self._remove_if_unused = False  # the directory held nothing but the lock when it was taken

    def acquire(self) -> None:
        directory = self.path.parent
        while True:
            unused = not directory.exists() or _entries(directory) <= {LOCK_NAME}
            directory.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 -- held open for the life of the run
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise DirectoryInUseError(f"{self.what} {directory} is in use by {holder_of(self.path)}; wait for "
                                          f"it to finish or stop it, or {self.advice}") from None
            if _same_file(handle, self.path):
                break
            handle.close()  # a releasing holder removed the file we locked: lock the one at the path now
        self._remove_if_unused = unused
        handle.seek(0)
        handle.truncate()
        since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}) + "\n")
        handle.flush()
        self._handle = handle

    def release(self) -> None:
        if self._handle is None:
            return
        if self._remove_if_unused and _entries(self.path.parent) == {LOCK_NAME}:
            # unlinked while still held: a process waiting to take it sees the file gone and locks a new one
            self.path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # something appeared in the meantime: keep the directory
                self.path.parent.rmdir()
        self._handle.close()  # closing the descriptor drops the flock
        self._handle = None

    @property
    def held(self) -> bool:
        return self._handle is not None


def _entries(directory: Path) -> set[str]:
    try:
        return {entry.name for entry in directory.iterdir()}
    except OSError:
        return set()


def _same_file(handle: IO[str], path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
