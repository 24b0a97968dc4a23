"""`bertforge train --task file.py:MyTask CONFIG`: run a user's own task with the trainer."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command, add_config_arguments, claim_run, resolve_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "train", help="train a user-defined Task (white-box API)",
        description="Train your own Task subclass (build_datasets, build_model, forward_step, evaluate) with "
                    "bertforge's trainer: precision, accumulation, torchrun DDP/ZeRO-1/FSDP2, checkpoints, "
                    "exact resume and logging come for free.",
        example="""
        bertforge train --task examples/tasks/bag_of_words.py:BagOfWordsSupersense \\
            examples/tasks/bag_of_words.yaml train.max_epochs=1
        torchrun --nproc_per_node=2 -m bertforge.cli train --task my_task.py:MyTask my.yaml
        """)
    parser.add_argument("--task", required=True, metavar="FILE.py:CLASS", help="the Task class to train")
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.train.trainer import Trainer
    from bertforge.train.user_task import load_task_class

    task_class = load_task_class(args.task)
    config = resolve_config(args)
    if config is None:
        return 0
    claim_run(config, "train")
    result = Trainer(config, task_class(config)).fit()
    return 2 if result.stopped_by == "nan" else result.exit_code
