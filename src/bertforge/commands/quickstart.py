"""`bertforge quickstart`: the end-to-end demo on the bundled data (what `make demo` runs)."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "quickstart", help="run the whole pipeline on the bundled data (about 10 minutes on 2 CPU cores)",
        description="Train a tokenizer, prepare shards, pre-train a tiny BERT, fine-tune it on the WordNet "
                    "supersense task, compare with the same model untrained, all-MiniLM-L6-v2 and the majority "
                    "class, and print the results with where everything was written. Re-running resumes.",
        example="""
        bertforge quickstart
        bertforge quickstart --out runs/demo --pretrain-steps 300 --train-rows 4000
        """)
    parser.add_argument("--out", default="runs/quickstart", help="directory for every output (default: %(default)s)")
    parser.add_argument("--pretrain-steps", type=int, default=None, help="pre-training steps (default: 700)")
    parser.add_argument("--train-rows", type=int, default=None,
                        help="supersense training examples used for fine-tuning (default: 8000)")
    parser.add_argument("--test-rows", type=int, default=None, help="supersense test examples (default: 2000)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of every training stage (default: 42); use a new --out per seed, as a finished "
                             "run is resumed, not trained again")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from bertforge.console import quiet_transformers
    from bertforge.errors import BertforgeError
    from bertforge.output_guard import output_directory
    from bertforge.quickstart import QuickstartPlan, run_quickstart

    quiet_transformers()

    changes: dict[str, object] = {"out_dir": output_directory(args.out, "--out")}
    for field, value in (("pretrain_steps", args.pretrain_steps), ("train_rows", args.train_rows),
                         ("test_rows", args.test_rows)):
        if value is not None:
            if value < 1:
                raise BertforgeError(f"--{field.replace('_', '-')} must be at least 1")
            changes[field] = value
    if args.seed is not None:
        changes["seed"] = args.seed
    run_quickstart(dataclasses.replace(QuickstartPlan(), **changes))
    return 0
