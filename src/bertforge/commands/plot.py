"""`bertforge plot RUN_DIR`: PNG curves of a run's metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.commands.common import add_command
from bertforge.console import stdout_console


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "plot", help="plot a run's loss, accuracy, learning rate and throughput",
                         description="Write PNG curves from RUN_DIR/metrics.jsonl into RUN_DIR/plots/ "
                                     "(or --out): one file per metric, training and validation together.",
                         example="bertforge plot runs/quickstart-pretrain")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds metrics.jsonl)")
    parser.add_argument("--out", default=None, help="output directory (default: RUN_DIR/plots)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.plotting import plot_run

    written = plot_run(Path(args.run_dir), Path(args.out) if args.out else None)
    for path in written:
        stdout_console.print(str(path))
    return 0
