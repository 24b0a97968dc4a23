"""`bertforge data ...`: information about the bundled data."""

from __future__ import annotations

import argparse

from rich.table import Table

from bertforge.commands.common import add_command
from bertforge.console import stdout_console


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "data", help="information about bundled and prepared data",
                         description="Information about the data bundled with bertforge.",
                         example="bertforge data samples")
    data_commands = parser.add_subparsers(dest="data_command", metavar="<subcommand>", required=True)
    samples = add_command(data_commands, "samples", help="where the bundled corpus and datasets are, and their sizes",
                          description="List the real English data shipped inside the package: the pre-training "
                                      "corpus (KJV + WordNet glosses) and the WordNet supersense classification set.",
                          example="bertforge data samples")
    samples.set_defaults(func=run_samples)


def run_samples(args: argparse.Namespace) -> int:
    from bertforge.data.bundled import describe_samples

    table = Table(title="bundled samples", show_lines=False)
    for column in ("name", "rows", "size", "path"):
        table.add_column(column, overflow="fold")
    for entry in describe_samples():
        table.add_row(entry["name"], f"{entry['rows']:,}", f"{entry['bytes'] / 1e6:.2f} MB", str(entry["path"]))
    stdout_console.print(table)
    return 0
