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
    from pathlib import Path

    from bertforge.console import stdout_console
    from bertforge.errors import BertforgeError
    from bertforge.output_guard import claim_directory
    from bertforge.tasks.glue_runner import plan_jobs, run_glue
    from bertforge.tasks.glue_tasks import GLUE_TASKS, glue_results_markdown

    if args.jobs is not None and args.jobs < 1:
        raise BertforgeError(f"--jobs is {args.jobs}; give at least 1")
    config = resolve_config(args)
    if config is None:
        return 0
    out = Path(args.out) if args.out else Path(config.run.output_dir) / config.run.name
    flag = "--out" if args.out else "run.output_dir/run.name"
    results = ["glue_results.md", "glue_results.json"]

    def earlier_glue(names: list[str], directories: set[str]) -> bool:  # written before the ledger
        return all(name in results or (name in directories and name in GLUE_TASKS) for name in names)

    # a GLUE output of this config is continued (finished jobs are skipped), never another directory
    claimed = claim_directory(out, command="glue", flag=flag, what="GLUE output", overwrite=None,
                              sources=[(args.data_dir, "the --data-dir")], recognise=earlier_glue)
    claimed.record(*sorted({job.run_dir.relative_to(out).parts[0] for job in plan_jobs(config, out)}), *results)
    summary = run_glue(config, args.data_dir, out, args.jobs)
    stdout_console.print(glue_results_markdown(summary), markup=False, highlight=False, end="")
    return 0
