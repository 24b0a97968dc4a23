"""`bertforge pretrain CONFIG [overrides]`: MLM (+ NSP) pre-training on a prepared dataset."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from bertforge.commands.common import add_command, add_config_arguments, claim_run, resolve_config

if TYPE_CHECKING:
    from bertforge.tasks.mlm_plateau import UnigramGuess
    from bertforge.train.trainer import FitResult


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "pretrain", help="pre-train an encoder with MLM (+ NSP) on a prepared dataset",
        description="Pre-train a BERT-family encoder on a dataset written by `bertforge prepare pretrain`. "
                    "The run directory gets config.yaml, metrics.jsonl, checkpoints/, tensorboard/, final/ "
                    "(a Hugging Face model) and summary.json (the last validation MLM accuracy beside the unigram "
                    "baseline, the steps and tokens trained, and a warning when the model is still on the MLM "
                    "plateau). Running the same command again resumes from the newest checkpoint.",
        example="""
        bertforge pretrain configs/pretrain/quickstart.yaml data.path=data/corpus-128 train.max_steps=300
        torchrun --nproc_per_node=8 -m bertforge.cli pretrain configs/pretrain/mosaic-bert-base.yaml \\
            data.path=s3://bucket/c4-128 dist.strategy=ddp
        """)
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.commands.preflight import refuse_missing_prepared_dataset
    from bertforge.console import quiet_transformers

    quiet_transformers()  # no "Loading weights" / "Writing model shards" bars among ours
    config = resolve_config(args)
    if config is None:
        return 0
    claim_run(config, "pretrain")
    refuse_missing_prepared_dataset(config.data.path)
    # torch and the trainer only now: a refused config or a missing dataset costs no import of them
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    task = PretrainTask(config)
    result = Trainer(config, task).fit()
    if result.stopped_by != "signal" and int(os.environ.get("RANK", "0")) == 0:  # one summary under torchrun
        write_summary(result, task.unigram_guess)
    return result.exit_code


def write_summary(result: FitResult, guess: UnigramGuess | None) -> None:
    """summary.json in the run directory, and its figures on stdout; the plateau warning, when there is one, on
    the console as a warning too (stderr), where a user watching the run sees it."""
    from bertforge.console import log, stdout_console
    from bertforge.output_guard import replace_file
    from bertforge.run_directory import RunDirectory
    from bertforge.tasks.mlm_plateau import MlmStanding, pretrain_summary

    state, run = result.state, RunDirectory(result.run_dir)
    summary = pretrain_summary(state.metrics, steps=state.step, tokens=state.consumed_tokens,
                               seconds=state.elapsed_seconds, guess=guess)
    text = json.dumps(summary, indent=2) + "\n"
    replace_file(run.summary_file, lambda staging: staging.write_text(text, encoding="utf-8"))
    standing = MlmStanding.of(state.metrics)
    trained = f"{state.step:,} steps, {state.consumed_tokens / 1e6:,.1f} M tokens in {state.elapsed_seconds / 60:.1f} min"
    stdout_console.print(f"pre-trained {trained}{standing.describe()}", markup=False)
    stdout_console.print(f"run directory: {run.root}  (final model: {run.final}; summary: {run.summary_file})",
                         markup=False)
    if summary["warning"] is not None:
        log.warning(summary["warning"])
