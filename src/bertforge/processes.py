"""Worker processes that die with the process that started them, even after its kill -9.

A data-loader or tokenizer worker waits on a pipe whose write end it inherited itself, so when
the main process is killed without warning the worker never sees end-of-file and lives on,
holding memory and open shards; kill/resume cycles pile them up. On Linux the kernel can deliver
a signal to a child when its parent dies (`prctl(PR_SET_PDEATHSIG)`); elsewhere a daemon thread
notices the new parent id. Call `die_with_parent(parent_pid)` first thing in the child.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PARENT_POLL_SECONDS = 1.0


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def die_with_parent(parent_pid: int, *_: object) -> None:
    """Make this (child) process exit when `parent_pid` is gone; extra arguments are ignored, so it
    serves as a DataLoader `worker_init_fn` through `functools.partial(die_with_parent, os.getpid())`."""
    prctl = _prctl()
    if prctl is not None and prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
        # the parent may have died between fork and prctl: then no signal will ever come
        if os.getppid() != parent_pid:
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="bertforge-parent-watch", daemon=True).start()


def kill_with_parent_preexec() -> Callable[[], None] | None:
    """A `subprocess.Popen(preexec_fn=...)` that kills the child when this process dies (Linux; None
    elsewhere). libc is loaded here, in the parent: between fork and exec the child should only call."""
    prctl = _prctl()
    if prctl is None:
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
