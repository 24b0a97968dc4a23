"""`bertforge quickstart`: the end-to-end demo on the bundled data (what `make demo` runs)."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command
from bertforge.quickstart import QuickstartPlan

# the plan's sizes a flag can set: QuickstartPlan field -> what it is
SIZES = {"pretrain_steps": "pre-training steps", "seq_len": "tokens per pre-training sample",
         "train_rows": "supersense training examples used for fine-tuning",
         "validation_rows": "supersense validation examples (they choose the best checkpoint)",
         "test_rows": "supersense test examples", "finetune_epochs": "fine-tuning epochs of the tiny models",
         "minilm_epochs": "fine-tuning epochs of all-MiniLM-L6-v2 (0 skips that comparison)"}
OPTIONAL_STAGES = {"minilm_epochs"}  # sizes that may be 0: the stage is skipped


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "quickstart", help="run the whole pipeline on the bundled data (about 10 minutes on 2 CPU cores)",
        description="Train a tokenizer, prepare shards, pre-train a tiny BERT, fine-tune it on the WordNet "
                    "supersense task, compare with the same model untrained, all-MiniLM-L6-v2 and the majority "
                    "class, and print the results with where everything was written. Re-running resumes.",
        example="""
        bertforge quickstart
        bertforge quickstart --out runs/quickstart-short --pretrain-steps 1500 --seq-len 64 --train-rows 1000 --validation-rows 200 --test-rows 1000 --finetune-epochs 4 --minilm-epochs 1
        """)
    parser.add_argument("--out", default="runs/quickstart", help="directory for every output (default: %(default)s)")
    for name, what in SIZES.items():
        default = getattr(QuickstartPlan(), name)
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"{what} (default: {default})")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of every training stage (default: 42); use a new --out per seed, as a finished "
                             "run is resumed, not trained again")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import quiet_transformers
    from bertforge.quickstart import run_quickstart

    quiet_transformers()
    run_quickstart(plan_of(args))
    return 0


def plan_of(args: argparse.Namespace) -> QuickstartPlan:
    """The plan the flags describe: the defaults, with each size given on the command line."""
    import dataclasses

    from bertforge.errors import BertforgeError
    from bertforge.output_guard import output_directory

    changes: dict[str, object] = {"out_dir": output_directory(args.out, "--out")}
    for field in SIZES:
        value = getattr(args, field)
        if value is not None:
            least = 0 if field in OPTIONAL_STAGES else 1
            if value < least:
                raise BertforgeError(f"--{field.replace('_', '-')} must be at least {least}")
            changes[field] = value
    if args.seed is not None:
        changes["seed"] = args.seed
    return dataclasses.replace(QuickstartPlan(), **changes)
