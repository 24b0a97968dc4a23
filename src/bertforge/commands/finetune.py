"""`bertforge finetune CONFIG`: classification, regression, token classification or sentence-embedding fine-tuning
with the trainer."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from bertforge.commands.common import add_command, add_config_arguments, claim_run, resolve_config

if TYPE_CHECKING:
    from bertforge.config import Config
    from bertforge.train.task import Task


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "finetune", help="fine-tune a classifier, regressor, token tagger or sentence embedder",
        description="Fine-tune sequence classification (one text or a pair, binary or multi-class, optional "
                    "class weights and label_map), regression (STS-B style) or token classification (NER-style tagging from "
                    "CoNLL or jsonl files: finetune.task_type=token_classification; finetune.tagging.*) or sentence embeddings (text pairs, "
                    "in-batch negatives over the whole global batch, or cosine regression: finetune.task_type=embedding; finetune.embedding.*; "
                    "final/ is a sentence-transformers directory) from a bertforge run/checkpoint or "
                    "any Hugging Face BERT directory (model.init_from), or from scratch (model.preset + "
                    "model.tokenizer). Batches carry only real tokens. Writes a run directory with metrics, "
                    "checkpoints (the best one by train.best_metric is reloaded at the end), the test report "
                    "(test_results.json, test_report.md, test_confusion_matrix.png; entity-level precision/recall/F1 by "
                    "seqeval for tagging) and final/, a Hugging Face "
                    "model that transformers.pipeline loads as is. Works under torchrun.",
        example="""
        bertforge finetune configs/finetune/supersense-minilm.yaml
        bertforge finetune configs/finetune/supersense-tiny.yaml model.init_from=runs/quickstart-pretrain
        bertforge finetune configs/finetune/wordnet-embedding-minilm.yaml
        torchrun --nproc_per_node=2 -m bertforge.cli finetune my.yaml train.micro_batch_size=16
        """)
    add_config_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.commands.preflight import refuse_missing_finetune_files
    from bertforge.config import finetune_defaults
    from bertforge.console import quiet_transformers, stdout_console
    from bertforge.run_directory import RunDirectory

    config = resolve_config(args, base=finetune_defaults())
    if config is None:
        return 0
    claim_run(config, "finetune")
    refuse_missing_finetune_files(config.finetune)
    quiet_transformers()
    # torch and the trainer only now: a refused config or a missing data file costs no import of them
    from bertforge.train.trainer import Trainer

    result = Trainer(config, finetune_task(config)).fit()
    if result.stopped_by == "signal" or int(os.environ.get("RANK", "0")) != 0:  # one summary under torchrun
        return result.exit_code
    run = RunDirectory(result.run_dir)
    for path in run.results_files():
        report = json.loads(path.read_text(encoding="utf-8"))
        shown = "  ".join(f"{k} {v:.4f}" for k, v in report["metrics"].items() if k != "examples")
        stdout_console.print(f"{report['split']}: {shown}", markup=False)
    stdout_console.print(f"run directory: {run.root}  (final model: {run.final})", markup=False)
    return 0


def finetune_task(config: Config) -> Task:
    """The Task of the kind `finetune.task_type` names (`bertforge.tasks.kinds`)."""
    from bertforge.tasks.kinds import kind_named

    return kind_named(config.finetune.task_type).task(config)
