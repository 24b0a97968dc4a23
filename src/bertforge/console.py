"""Console output shared by every command: one `rich` console on stderr, three verbosity levels.

Progress bars and log lines go to stderr so that a command's real output (predictions, a config
printed with `--print-config`, a results table) can be piped from stdout.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from rich.console import Console
from rich.logging import RichHandler

console = Console(stderr=True, highlight=False)
stdout_console = Console(highlight=False, soft_wrap=True)
log = logging.getLogger("bertforge")

QUIET, NORMAL, VERBOSE = 0, 1, 2
_verbosity = NORMAL


def setup_logging(verbosity: int = NORMAL) -> None:
    """Route the `bertforge` logger through rich; `--quiet` keeps warnings, `--verbose` adds debug."""
    global _verbosity
    _verbosity = verbosity
    level = {QUIET: logging.WARNING, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}[verbosity]
    log.handlers.clear()
    handler = RichHandler(console=console, show_path=verbosity >= VERBOSE, show_time=verbosity >= VERBOSE,
                          markup=False, rich_tracebacks=True)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False


def verbosity() -> int:
    return _verbosity


def progress_enabled() -> bool:
    """Progress bars are shown unless `--quiet` was given or stderr is not a terminal-like sink."""
    return _verbosity >= NORMAL and not _progress_hidden


_progress_hidden = False


def hide_progress() -> None:
    """No progress bars from here on: `bertforge serve` runs the engine once per group of requests, many short runs
    whose bars would flicker among its log lines."""
    global _progress_hidden
    _progress_hidden = True


def quiet_transformers() -> None:
    """For the CLI: no `transformers` progress bars ("Loading weights", "Writing model shards") among ours.

    Applied now if `transformers` is imported, else the moment it is: importing it only to quiet it cost
    `predict`/`embed` about a second of start-up on models that never need it."""
    transformers_logging = sys.modules.get(_TRANSFORMERS_LOGGING)
    if transformers_logging is not None:
        _silence(transformers_logging)
    elif not any(isinstance(finder, _QuietWhenImported) for finder in sys.meta_path):
        sys.meta_path.insert(0, _QuietWhenImported())


_TRANSFORMERS_LOGGING = "transformers.utils.logging"


def _silence(transformers_logging: ModuleType) -> None:
    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()


class _QuietWhenImported(importlib.abc.MetaPathFinder):
    """Finds `transformers.utils.logging` as the default finders do, and silences it once it has run."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TRANSFORMERS_LOGGING:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def run_then_silence(module: ModuleType) -> None:
            run_module(module)
            _silence(module)

        spec.loader.exec_module = run_then_silence  # type: ignore[method-assign]
        return spec
