"""Argument helpers shared by the commands."""

from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path

from bertforge.cli import add_global_flags
from bertforge.config import Config, config_to_yaml, load_config
from bertforge.console import stdout_console


def add_command(subparsers: argparse._SubParsersAction, name: str, *, help: str, description: str,
                example: str) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with a runnable example."""
    parser = subparsers.add_parser(
        name, help=help, description=description,
        epilog="example:\n" + textwrap.indent(textwrap.dedent(example).strip(), "  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_flags(parser)
    return parser


def add_config_arguments(parser: argparse.ArgumentParser, *, config_required: bool = True) -> None:
    """CONFIG [key=value ...] and --print-config, for every command driven by the config tree."""
    # CONFIG is optional to argparse, so a missing one gets our message (`cli.parse_arguments`), not "required:
    # CONFIG, KEY=VALUE"; overrides after options are collected there too
    parser.add_argument("config", nargs="?", metavar="CONFIG", help="YAML config file (may `extends:` others)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides anywhere after CONFIG, e.g. optim.lr=2e-5 data.seq_len=128")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML and exit")
    parser.set_defaults(config_required=config_required)


def resolve_config(args: argparse.Namespace, base: Config | None = None) -> Config | None:
    """Load CONFIG + overrides; with --print-config print it and return None (the caller exits 0)."""
    config = load_config(args.config, args.overrides, base=base)
    if args.print_config:
        stdout_console.print(config_to_yaml(config), markup=False, highlight=False, end="")
        return None
    return config


def claim_run(config: Config, command: str) -> None:
    """The run directory may be written: new, empty or an earlier run (`output_guard.claim_run_directory`).
    Every rank checks (a refusal must stop them all before they meet in a collective); rank 0 records it."""
    from bertforge.output_guard import claim_run_directory

    claim_run_directory(Path(config.run.output_dir) / config.run.name, command,
                        record=int(os.environ.get("RANK", "0")) == 0)
