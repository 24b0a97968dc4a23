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
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the PNGs of an earlier `plot` in --out (a run's own plots/ is always redrawn)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.output_guard import claim_file, output_directory
    from bertforge.plotting import plot_names, plot_run, run_metrics
    from bertforge.run_directory import RunDirectory

    run = RunDirectory(Path(args.run_dir))
    out_dir = output_directory(args.out, "--out") if args.out else run.plots
    # a run's own plots/ is derived from its metrics (the trainer draws it at the end of every run): redrawing
    # it is what the command is for; a directory of the user's choosing keeps the --overwrite rule
    redraw = args.overwrite or args.out is None
    for name in plot_names(run_metrics(run.root)):
        claim_file(out_dir / name, command="plot", flag="--out", what="plot", overwrite=redraw,
                   sources=[(run.metrics_file, f"the run's {run.metrics_file.name}")], recognise=is_png)
    written = plot_run(run.root, out_dir)
    for path in written:
        stdout_console.print(str(path))
    return 0


def is_png(path: Path) -> bool:
    """A metric's PNG as `plot` wrote it before it kept a ledger."""
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == b"\x89PNG"
    except OSError:
        return False
