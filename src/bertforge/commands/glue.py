"""`bertforge glue CONFIG --data-dir DIR`: the 8 GLUE tasks, task-parallel, with the results table."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command, add_config_arguments, resolve_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "glue", help="fine-tune and score the GLUE benchmark (8 tasks, WNLI left out)",
        description="Fine-tune model.init_from on CoLA, SST-2, MRPC, STS-B, QQP, MNLI (matched/mismatched), QNLI and "
                    "RTE read from the standard GLUE directory layout, with each task's hyperparameters from the "
                    "literature (override them with glue.overrides), several seeds for the small tasks "
                    "(median reported), optionally RTE/MRPC/STS-B from the MNLI model (glue.from_mnli). "
                    "Jobs run in parallel processes: one per GPU, or sharing the CPU cores. Finished jobs are "
                    "skipped when run again. Writes OUT/glue_results.md and .json beside the published BERT-base "
                    "dev numbers and prints the table.",
        example="""
        bertforge glue configs/glue/bert-base.yaml --data-dir ~/data/glue
        bertforge glue configs/glue/minilm-cpu.yaml --data-dir glue_data --jobs 2 glue.tasks=[rte,mrpc]
        """)
    parser.add_argument("--data-dir", required=True, help="the GLUE root: the folder holding CoLA/, SST-2/, ...")
    parser.add_argument("--out", default=None, help="output directory (default: run.output_dir/run.name)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="parallel jobs (default: one per GPU, or on CPU one per 2 cores)")
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import stdout_console
    from bertforge.errors import BertforgeError
    from bertforge.output_paths import output_directory
    from bertforge.tasks.glue_runner import run_glue
    from bertforge.tasks.glue_tasks import glue_results_markdown

    if args.jobs is not None and args.jobs < 1:
        raise BertforgeError(f"--jobs is {args.jobs}; give at least 1")
    config = resolve_config(args)
    if config is None:
        return 0
    if args.out:
        output_directory(args.out, "--out")
    summary = run_glue(config, args.data_dir, args.out, args.jobs)
    stdout_console.print(glue_results_markdown(summary), markup=False, highlight=False, end="")
    return 0
