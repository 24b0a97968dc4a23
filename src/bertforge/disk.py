"""Writes that fail for want of disk (full, quota, read-only, file-size limit) as one-line user errors.

The libraries we write with report the same fault in different ways: `OSError` from Python and
numpy, `RuntimeError("[enforce fail at inline_container.cc] ...")` from `torch.save`,
`SafetensorError("I/O error: ...")` from safetensors. `disk_write` turns any of them, raised while
writing under a directory, into a `DiskWriteError` that names the path, the free space there and
what to do; the callers have already arranged that nothing half-written is left under a final name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from bertforge.errors import BertforgeError, first_line

# how torch.save and safetensors word a failed write (they carry no errno)
WRITE_FAILURE_MARKS = ("inline_container", "file write failed", "unexpected pos", "I/O error", "No space left",
                       "Read-only file system", "File too large", "Disk quota")


# below this much free space a write that failed without an errno failed because the disk is full
FULL_BELOW_BYTES = 1 << 20


class DiskWriteError(BertforgeError):
    """A write failed because of the file system, not because of bertforge."""


def is_write_failure(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return True
    library_error = isinstance(error, RuntimeError) or type(error).__name__ == "SafetensorError"
    return library_error and any(mark in str(error) for mark in WRITE_FAILURE_MARKS)


def _free_space(directory: Path) -> str:
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            try:
                free = shutil.disk_usage(candidate).free
            except OSError:
                return "unknown free space"
            writable = "" if os.access(candidate, os.W_OK) else ", not writable"
            return f"{free / 2**30:.2f} GiB free{writable}"
    return "unknown free space"


@contextlib.contextmanager
def disk_write(path: Path, then: str | Callable[[], str]) -> Iterator[None]:
    """Inside the block, a failed write under `path` becomes a `DiskWriteError`; `then` says what to do after
    freeing space (e.g. "run the same command to resume from step-00000040"), or is a function that
    says it, called only when a write fails (what to say may cost a file read)."""
    try:
        yield
    except BertforgeError:
        raise
    except Exception as error:
        if not is_write_failure(error):
            raise
        advice = then() if callable(then) else then
        raise DiskWriteError(f"could not write {path} ({_reason(error, Path(path))}; {_free_space(Path(path))}); "
                             f"free space or choose a writable location, then {advice}") from None


def _reason(error: BaseException, path: Path) -> str:
    """The library's words, led by the plain cause when the library hides the errno: `torch.save` on a full
    disk says only "unexpected pos 1024 vs 918"."""
    words = first_line(error)
    if isinstance(error, OSError) or "No space left" in words:
        return words
    for candidate in (path, *path.parents):
        if candidate.exists():
            with contextlib.suppress(OSError):
                if shutil.disk_usage(candidate).free < FULL_BELOW_BYTES:
                    return f"No space left on device: {words}"
            break
    return words
