"""`bertforge pretrain CONFIG [overrides]`: MLM (+ NSP) pre-training on a prepared dataset."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command, add_config_arguments, claim_run, resolve_config


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "pretrain", help="pre-train an encoder with MLM (+ NSP) on a prepared dataset",
        description="Pre-train a BERT-family encoder on a dataset written by `bertforge prepare pretrain`. "
                    "The run directory gets config.yaml, metrics.jsonl, checkpoints/, tensorboard/ and final/ "
                    "(a Hugging Face model). Running the same command again resumes from the newest checkpoint.",
        example="""
        bertforge pretrain configs/pretrain/quickstart.yaml data.path=data/corpus-128 train.max_steps=300
        torchrun --nproc_per_node=8 -m bertforge.cli pretrain configs/pretrain/mosaic-bert-base.yaml \\
            data.path=s3://bucket/c4-128 dist.strategy=ddp
        """)
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import quiet_transformers
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    quiet_transformers()  # no "Loading weights" / "Writing model shards" bars among ours
    config = resolve_config(args)
    if config is None:
        return 0
    claim_run(config, "pretrain")
    return Trainer(config, PretrainTask(config)).fit().exit_code
