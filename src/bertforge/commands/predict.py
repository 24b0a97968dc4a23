"""`bertforge predict MODEL --input FILE --out preds.jsonl`: batched, unpadded classification, regression or
tagging (entities with character spans)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bertforge.commands.common import add_command


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The text columns of an input file (shared with `bertforge evaluate`)."""
    parser.add_argument("--text-column", default="text", help="column with the (first) text (default: text)")
    parser.add_argument("--text-pair-column", default=None, help="column with the second text, for pair models")
    parser.add_argument("--delimiter", default=None,
                        help="csv/tsv delimiter (default: from the extension, comma for .csv, tab for .tsv)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward pass (default 64)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "predict", help="predict labels (with probabilities) or scores for a file of texts",
        description="Run a fine-tuned model over a csv/tsv/jsonl/parquet file (or bundled:supersense/SPLIT) and "
                    "write one JSON line per text: the label, its probability and every class's probability "
                    "(classification), the score (regression), or the entities with their character spans and scores "
                    "(token classification, as transformers' token-classification pipeline gives them). MODEL is a run directory, its final/, a "
                    "checkpoint, or a bertforge / Hugging Face model directory. Batches are unpadded.",
        example="""
        bertforge predict runs/supersense-minilm --input bundled:supersense/test --out preds.jsonl
        bertforge predict runs/nli/final --input pairs.tsv --text-column premise --text-pair-column hypothesis \\
            --out preds.jsonl
        """)
    parser.add_argument("model", metavar="MODEL", help="run directory, final/, checkpoint or model directory")
    parser.add_argument("--input", required=True, help="file with the texts to classify")
    parser.add_argument("--out", required=True, help="output JSON lines file (never --input)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier predictions file at --out")
    add_input_arguments(parser)
    parser.set_defaults(func=run)


def load_model_for(args: argparse.Namespace) -> Any:
    """Check the shared input options and load MODEL (shared with `bertforge evaluate`)."""
    from bertforge.console import quiet_transformers
    from bertforge.errors import BertforgeError
    from bertforge.inference import load_model

    if args.batch_size < 1:
        raise BertforgeError(f"--batch-size is {args.batch_size}; give at least 1")
    quiet_transformers()
    return load_model(args.model)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import log
    from bertforge.errors import BertforgeError
    from bertforge.inference import entity_rows, prediction_rows, read_inputs, write_jsonl
    from bertforge.output_guard import claim_file, record_outputs

    out = claim_file(args.out, command="predict", flag="--out", what="predictions file", overwrite=args.overwrite,
                     sources=[(args.input, "the --input file"), (args.model, "MODEL")],
                     recognise=is_predictions_file, example_name="predictions.jsonl")
    loaded = load_model_for(args)
    split = read_inputs(args.input, text_column=args.text_column, text_pair_column=args.text_pair_column,
                        delimiter=args.delimiter)
    if loaded.is_tagger():  # a token classifier: entities with character spans per text
        if split.text_pairs is not None:
            raise BertforgeError(f"{loaded.name} tags single texts; drop --text-pair-column")
        rows = entity_rows(loaded, split.texts, args.batch_size)
    else:
        rows = prediction_rows(loaded, split, args.batch_size)
    path = write_jsonl(rows, out)
    record_outputs(path.parent, [path.name], "predict")
    log.info(f"{len(rows):,} predictions written to {path}")
    return 0


PREDICTION_KEYS = frozenset({"text", "text_pair", "label", "label_id", "score", "probabilities", "entities"})


def is_predictions_file(path: Path) -> bool:
    """A file `predict` wrote before it kept a ledger: JSON lines of its own keys (a labeled input has others)."""
    try:
        with open(path, encoding="utf-8") as handle:
            row = json.loads(handle.readline())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(row, dict) and "text" in row and ("score" in row or "entities" in row) and set(row) <= PREDICTION_KEYS
