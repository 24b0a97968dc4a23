"""Output paths of the right kind, checked before a command does its work.

A command that is told to write a file where a directory is (or the reverse) would otherwise fail
at the very end, after minutes of work, with an OS error and no hint; these checks fail first,
with the flag, the path and what to give instead.
"""

from __future__ import annotations

from pathlib import Path

from bertforge.errors import BertforgeError


def _check_parents(path: Path, flag: str) -> None:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise BertforgeError(f"{flag} {path}: {parent} is a file, not a directory; choose another path")
            return


def output_file(path: str | Path, flag: str, example_name: str) -> Path:
    """A path a command will write one file to: not a directory, under directories (or none yet)."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise BertforgeError(f"{flag} {path} is a directory; give a file path, e.g. {flag} {target / example_name}")
    _check_parents(target, flag)
    return target


def output_directory(path: str | Path, flag: str) -> Path:
    """A directory a command will write into: missing (it is created) or a directory, never a file."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise BertforgeError(f"{flag} {path} is a file; give a directory (created if missing)")
    _check_parents(target, flag)
    return target
