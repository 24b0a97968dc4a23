"""`torchrun` run by its own code (`torch.distributed.run.main`) in a thread of the test's process.

The workers are real processes started by the real launcher, with a real rendezvous and gloo; what is saved
is the launcher's own interpreter (about 2.5 s of CPU, most of it importing torch, per launch). For tests whose
subject is what the ranks compute; a test that kills or restarts the launcher, or reads what the launcher
prints, starts `python -m torch.distributed.run` as a process of its own.

A thread rather than this process's main thread: torchrun installs its SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers
only in the main thread, and they would outlive the launch (pytest's Ctrl-C would then raise torch's
SignalException); it also names the thread it runs in.
"""

from __future__ import annotations

import threading

import pytest

from helpers import HANG_TIMEOUT


def torchrun_in_this_process(*arguments: str) -> None:
    """`torchrun ARGUMENTS`; an AssertionError with torchrun's summary when a worker failed. The workers'
    output goes to this process's file descriptors (pytest captures it per test)."""
    import torch.distributed.run

    failures: list[BaseException] = []

    def launch() -> None:
        try:
            torch.distributed.run.main(list(arguments))
        except BaseException as error:  # handed to the test's thread, which raises it
            failures.append(error)

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # the workers' (torchrun passes this process's environment on)
        patch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)  # torchrun sets it in os.environ: undone
        thread = threading.Thread(target=launch, name="torchrun", daemon=True)
        thread.start()
        thread.join(HANG_TIMEOUT)
    assert not thread.is_alive(), f"torchrun {' '.join(arguments)} still running after {HANG_TIMEOUT} s"
    if failures:
        raise AssertionError(f"torchrun {' '.join(arguments)} failed: {failures[0]}") from failures[0]
