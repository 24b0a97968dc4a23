"""`bertforge <command>`: the one entry point. Thin: parses arguments and calls the library.

Each command lives in `bertforge.commands.<name>` and exposes `register(subparsers)`; a command is
listed in `COMMAND_MODULES` only once it works end to end (no placeholder commands).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

from rich.markup import escape

from bertforge import __version__
from bertforge.console import NORMAL, QUIET, VERBOSE, console, setup_logging
from bertforge.errors import INTERNAL_ERROR_EXIT_CODE, USER_ERROR_EXIT_CODE, BertforgeError, user_message
from bertforge.size_limits import LIFT_VARIABLE, lift_limits

COMMAND_MODULES = [
    "bertforge.commands.quickstart",
    "bertforge.commands.data",
    "bertforge.commands.tokenizer",
    "bertforge.commands.prepare",
    "bertforge.commands.pretrain",
    "bertforge.commands.train",
    "bertforge.commands.plot",
    "bertforge.commands.finetune",
    "bertforge.commands.evaluate",
    "bertforge.commands.predict",
    "bertforge.commands.embed",
    "bertforge.commands.fill_mask",
    "bertforge.commands.export",
    "bertforge.commands.serve",
    "bertforge.commands.glue",
    "bertforge.commands.doctor",
]


class CommandParser(argparse.ArgumentParser):
    """argparse whose errors suggest the closest command or choice (`pretrian` -> `pretrain`); subcommand
    parsers are made of the same class."""

    def error(self, message: str) -> NoReturn:
        super().error(with_suggestion(message))


INVALID_CHOICE = re.compile(r"invalid choice: '?(?P<given>[^' ]*)'? \(choose from (?P<choices>.*)\)")
OVERRIDE = re.compile(r"[A-Za-z_][\w.\[\]-]*=")


def with_suggestion(message: str) -> str:
    match = INVALID_CHOICE.search(message)
    if match is None:
        return message
    choices = [choice.strip().strip("'") for choice in match["choices"].split(",")]
    close = difflib.get_close_matches(match["given"], choices, n=1, cutoff=0.6)
    return f"{message}; did you mean {close[0]!r}?" if close else message


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="bertforge",
        description="From raw text to a trained, evaluated, exported BERT-family encoder.",
        epilog="Run `bertforge <command> --help` for a command's options and an example.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    add_global_flags(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="<command>")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """--quiet/--verbose/--debug, accepted before or after the command name."""
    group = parser.add_argument_group("output")
    group.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="only warnings and errors")
    group.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="debug-level logging")
    group.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks for errors")
    group.add_argument("--no-size-limits", action="store_true", default=argparse.SUPPRESS,
                       help="lift the checks on vocabulary and model sizes (a model larger than this machine's "
                            "memory, a vocabulary over 2^20 tokens)")


# what the file system says when the user's disk, quota, mount or limits (not bertforge) refuse a write
FILE_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES})


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse a command line whose dotted overrides (`KEY=VALUE`) may stand anywhere after CONFIG, between
    and after options: argparse alone takes positionals in one run, so `glue CONFIG --jobs 2 glue.tasks=[rte]`
    would leave `glue.tasks=[rte]` unrecognized. Leftover overrides are appended in command-line order."""
    args, extras = parser.parse_known_args(argv)
    command = innermost_parser(parser, args)
    if hasattr(args, "overrides"):
        if args.config is not None and is_override(args.config) and not Path(args.config).exists():
            args.overrides.insert(0, args.config)
            args.config = None
        args.overrides += [extra for extra in extras if is_override(extra)]
        extras = [extra for extra in extras if not is_override(extra)]
        if args.config is None and args.config_required:
            command.error(f"missing CONFIG, the YAML recipe to run{first_example(command)}; the KEY=VALUE "
                          "overrides are optional")
    if extras:
        command.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def is_override(argument: str) -> bool:
    return OVERRIDE.match(argument) is not None


def innermost_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command the arguments chose, for errors that show its usage."""
    while True:
        subcommands = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, subcommands.dest, None) if subcommands is not None else None
        if subcommands is None or chosen is None:
            return parser
        parser = subcommands.choices[chosen]


def first_example(parser: argparse.ArgumentParser) -> str:
    lines = (parser.epilog or "").splitlines()
    return f", e.g. `{lines[1].strip()}`" if len(lines) > 1 and lines[0] == "example:" else ""


def main(argv: list[str] | None = None) -> int:
    from bertforge.model_card import remember_command

    # the command a model card names, for this call only: a later run through the Python API in the same
    # process (a notebook, a test) must not be credited to it
    remember_command(list(argv) if argv is not None else sys.argv[1:])
    # --no-size-limits lifts the limits through the environment (for this process and the ones it starts);
    # when the call returns, a process that goes on (a notebook, a test) gets its own setting back
    limits_before = os.environ.get(LIFT_VARIABLE)
    try:
        return _run_command(argv)
    finally:
        remember_command(None)
        if limits_before is None:
            os.environ.pop(LIFT_VARIABLE, None)
        else:
            os.environ[LIFT_VARIABLE] = limits_before


def _run_command(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parse_arguments(parser, argv)
    debug = getattr(args, "debug", False) or os.environ.get("BERTFORGE_DEBUG") == "1"
    if getattr(args, "no_size_limits", False):
        lift_limits()
    verbosity = QUIET if getattr(args, "quiet", False) else VERBOSE if getattr(args, "verbose", False) else NORMAL
    setup_logging(verbosity)
    if not debug:
        # s3fs/aiohttp sessions that the interpreter's exit closes on a dead event loop make asyncio log
        # "Task exception was never retrieved" with a traceback after our one-line error (seen after a shard
        # checksum error from a bucket); that is noise to a user, and --debug keeps it
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        result = args.func(args)
        return int(result or 0)
    except BertforgeError as error:
        if debug:
            console.print_exception()
        console.print(f"[bold red]error:[/] {escape(user_message(error))}", markup=True, highlight=False, soft_wrap=True)
        return error.exit_code
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        return 130
    except Exception as error:  # a bug in bertforge, not the user's fault -- unless a peer rank died or the disk
        if not debug and isinstance(error, OSError) and error.errno in FILE_SYSTEM_ERRNOS:
            # a full or read-only disk met by a plain write (metrics, reports, logs)
            target = f" {error.filename}" if error.filename else ""
            console.print(f"[bold red]error:[/] could not write{escape(target)}: "
                          f"{escape(error.strerror or str(error))}; free space or choose a writable location, then "
                          "run the command again", highlight=False, soft_wrap=True)
            return USER_ERROR_EXIT_CODE
        if debug:
            console.print_exception()
        elif (peer_failure := peer_failure_line(error)) is not None:
            console.print(f"[bold red]error:[/] {escape(peer_failure)}", highlight=False, soft_wrap=True)
        else:
            console.print(f"[bold red]internal error:[/] {type(error).__name__}: {escape(str(error))} "
                          "(rerun with --debug for the traceback and please report it)", highlight=False,
                          soft_wrap=True)
        return INTERNAL_ERROR_EXIT_CODE


def peer_failure_line(error: BaseException) -> str | None:
    """`train.distributed.describe_peer_failure`; no collective ran, so none failed, if torch.distributed never loaded."""
    if "torch.distributed" not in sys.modules:
        return None
    from bertforge.train.distributed import describe_peer_failure

    return describe_peer_failure(error)


if __name__ == "__main__":
    sys.exit(main())
