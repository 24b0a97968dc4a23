"""Console output shared by every command: one `rich` console on stderr, three verbosity levels.

Progress bars and log lines go to stderr so that a command's real output (predictions, a config
printed with `--print-config`, a results table) can be piped from stdout.
"""

from __future__ import annotations

import logging

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
    """For the CLI: no `transformers` progress bars ("Loading weights", "Writing model shards") among ours."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
