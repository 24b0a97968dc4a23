"""User-facing errors.

A `BertforgeError` is a mistake the user can fix (a bad config key, a missing column, a corrupt
shard). The CLI prints its message as one line and exits with code 2, without a traceback unless
`--debug` is given. Anything else that escapes is a bug in bertforge and exits with code 1.

Messages follow one shape: what was wrong, where (file:line or config key), what to do.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

USER_ERROR_EXIT_CODE = 2
INTERNAL_ERROR_EXIT_CODE = 1


class BertforgeError(Exception):
    """A problem with the user's input, config or environment that they can fix."""

    exit_code = USER_ERROR_EXIT_CODE


class ConfigError(BertforgeError):
    """An invalid configuration: unknown key, wrong type, value out of range."""


class DataError(BertforgeError):
    """Unreadable or invalid input data: a missing column, a corrupt shard, a bad label."""


def first_line(error: BaseException) -> str:
    """A library exception's message cut to its first line (its class name when it has none), for our one-line errors."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


WORKER_TRACEBACK_MARK = "Original Traceback (most recent call last):"


def user_message(error: BertforgeError) -> str:
    """The one line to show for a user error, also when a DataLoader worker raised it: PyTorch re-raises
    it in the main process with the worker's whole traceback in front of our message."""
    text = str(error)
    if WORKER_TRACEBACK_MARK not in text:
        return text
    last = [line for line in text.splitlines() if line.strip()][-1]
    prefix = f"{type(error).__module__}.{type(error).__name__}: "
    return last[len(prefix):] if last.startswith(prefix) else last


def directory_listing(directory: Path, shown: int = 6) -> str:
    """What a directory holds, for an error message: its first `shown` names (folders with a `/`), "and N more"."""
    names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in directory.iterdir())
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return (", ".join(names[:shown]) + more) or "nothing"


def location(path: object, line: int | None = None) -> str:
    """Format `path:line` for error messages (line numbers are 1-based)."""
    return f"{path}:{line}" if line is not None else str(path)


# what a truncated, corrupt or mislabelled .gz raises mid-read (zstandard's ZstdError is added where it is imported)
CORRUPT_GZIP_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, gzip.BadGzipFile)


def corrupt_compressed_file(path: object, error: BaseException) -> DataError:
    return DataError(f"{path}: the compressed data is truncated or corrupt ({first_line(error)}); download or "
                     "compress the file again (`gzip -t FILE` / `zstd -t FILE` checks it)")
