"""`bertforge predict MODEL --input FILE --out preds.jsonl`: batched, unpadded classification, regression or
tagging (entities with character spans)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bertforge.commands.common import add_command
from bertforge.engine_settings import BACKENDS, DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS
from bertforge.parts import add_part_arguments

# options that default to the run's own finetune.* setting when MODEL belongs to a run (else the FinetuneSection
# default): the columns it was trained on are the columns of the files it is used on
RUN_SETTINGS = ("text_column", "text_pair_column", "label_column", "tagging.tokens_column", "tagging.tags_column",
                "embedding.negative_column")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The text columns of an input file (shared with `bertforge evaluate`)."""
    parser.add_argument("--text-column", default=None,
                        help="column with the (first) text (default: the run's finetune.text_column, else text)")
    parser.add_argument("--text-pair-column", default=None,
                        help="column with the second text, for pair models (default: the run's "
                             "finetune.text_pair_column)")
    parser.add_argument("--delimiter", default=None,
                        help="csv/tsv delimiter (default: from the extension, comma for .csv, tab for .tsv)")
    add_engine_arguments(parser)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """How the inference engine batches (shared with `bertforge evaluate` and `bertforge embed`)."""
    parser.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS,
                        help="tokens per forward pass: inputs are sorted by length and batched up to this many real "
                             f"tokens (no padding); a longer input runs alone (default {DEFAULT_MAX_BATCH_TOKENS})")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                        help=f"inputs per forward pass at most (default {DEFAULT_BATCH_SIZE}; --max-batch-tokens "
                             "usually binds first)")
    parser.add_argument("--backend", choices=BACKENDS, default=BACKENDS[0],
                        help="what runs the model: torch (eager PyTorch, the default), onnx (ONNX Runtime on the "
                             "model's ONNX export, made once and cached under ~/.cache/bertforge/onnx; needs "
                             "pip install 'bertforge[onnx]') or onnx-int8 (the same with int8 linear layers: "
                             "faster, slightly less accurate, see docs/benchmarks.md)")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "predict", help="predict labels (with probabilities) or scores for texts",
        description="Run a fine-tuned model over a .txt file (one text per line), a csv/tsv/jsonl/parquet file (or "
                    "bundled:supersense/SPLIT) or texts given with --text, and write one JSON line per text: the "
                    "label, its probability and every class's probability (classification), the score "
                    "(regression), or the entities with their character spans and scores (token classification, "
                    "as transformers' token-classification pipeline gives them), to --out or else to stdout. "
                    "MODEL is a run directory, its final/, a checkpoint, or a bertforge / Hugging Face model "
                    "directory; a run's model reads the columns the run was trained on (its config.yaml's "
                    "finetune.text_column / text_pair_column) unless --text-column / --text-pair-column say "
                    "otherwise. An input file's id column (--id-column; by default `id` when there is one, else the "
                    "row number from 0) leads each output line as \"id\". Texts are sorted by length into unpadded "
                    "batches of at most --max-batch-tokens tokens, tokenized on a thread ahead of the model, and "
                    "written in input order; a text over the model's length is truncated (the summary line counts "
                    "them). --out "
                    "x.parquet writes the same rows as a Parquet table. --num-parts N --part I predicts only part I of "
                    "the input's rows (a Slurm array on many machines) into OUT's name with .part-0000I-of-0000N "
                    "before its suffix; a finished part is skipped.",
        example="""
        bertforge predict runs/supersense-minilm --input bundled:supersense/test --out preds.jsonl
        bertforge predict runs/supersense-minilm --text "a small domesticated carnivore" --text "to run fast"
        bertforge predict runs/supersense-minilm --input texts.txt --out preds.jsonl --overwrite
        bertforge predict runs/nli/final --input pairs.tsv --text-column premise --text-pair-column hypothesis \\
            --id-column pair_id --out preds.jsonl
        """)
    parser.add_argument("model", metavar="MODEL", help="run directory, final/, checkpoint or model directory")
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--input", help=".txt (one text per line) or csv/tsv/jsonl/parquet file with the texts")
    given.add_argument("--text", action="append", metavar="TEXT",
                       help="a text to predict on (repeat for more); the predictions go to stdout without --out")
    parser.add_argument("--text-pair", action="append", metavar="TEXT",
                        help="pair models: the second text of each --text, in the same order")
    parser.add_argument("--id-column", default=None,
                        help=f"input column carried into each output line as \"id\" (default: {DEFAULT_ID!r} "
                             "when the input has it, else the row number from 0)")
    parser.add_argument("--out", default=None,
                        help="output file (never --input): JSON lines, or a Parquet table (the same columns) when it "
                             "ends in .parquet; without it the JSON lines go to stdout")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier predictions file at --out")
    add_input_arguments(parser)
    add_part_arguments(parser)
    parser.set_defaults(func=run)


DEFAULT_ID = "id"  # bertforge.inference.DEFAULT_ID_COLUMN, without importing torch to build the parser


def load_model_for(args: argparse.Namespace, data_file: str | None) -> Any:
    """Check the shared input options, load MODEL and fill the options not given from its run's settings
    (shared with `bertforge evaluate`). A missing MODEL or `data_file` (--input, --data) is refused before
    torch is imported; the model's own files are read after."""
    from bertforge.commands.preflight import refuse_missing_data_file, refuse_missing_model
    from bertforge.console import quiet_transformers
    from bertforge.engine_settings import settings_of

    settings_of(args, "predicting")  # checks --max-batch-tokens and --batch-size before the model loads
    refuse_missing_model(args.model)
    refuse_missing_data_file(data_file)
    quiet_transformers()
    from bertforge.inference import load_model  # torch: only once the inputs above are there

    loaded = load_model(args.model)
    fill_from_run(args, loaded.run_settings)
    return loaded


def fill_from_run(args: argparse.Namespace, run_settings: Any) -> None:
    """Each column option not given on the command line takes the run's finetune.* value (a model outside a run:
    the default), and the log says which came from the run."""
    from bertforge.config import FinetuneSection
    from bertforge.console import log

    defaults = FinetuneSection()
    from_run = []
    for setting in RUN_SETTINGS:
        key = setting.rpartition(".")[2]  # the option is --tokens-column for finetune.tagging.tokens_column
        if not hasattr(args, key) or getattr(args, key) is not None:
            continue
        value = _dotted(run_settings or defaults, setting)
        setattr(args, key, value)
        if value != _dotted(defaults, setting):
            from_run.append(f"--{key.replace('_', '-')} {value}")
    if from_run:
        log.info(f"from the run's config.yaml: {', '.join(from_run)}")


def _dotted(section: Any, key: str) -> Any:
    for name in key.split("."):
        section = getattr(section, name)
    return section


def run(args: argparse.Namespace) -> int:
    from bertforge.console import log
    from bertforge.engine_settings import settings_of
    from bertforge.errors import BertforgeError
    from bertforge.output_guard import claim_file, record_outputs
    from bertforge.parts import check_out_without_parts, part_of, row_ids

    if args.text_pair is not None and args.text is None:
        raise BertforgeError("--text-pair gives the second text of each --text; give the --text too (or --input "
                             "with --text-pair-column)")
    part = part_of(args)
    if part is not None and (args.input is None or args.out is None):
        raise BertforgeError("--num-parts splits an --input file into parts, each written beside --out: give --input "
                             "and --out (e.g. --out preds.jsonl writes preds.part-00000-of-00016.jsonl)")
    check_out_without_parts(args.out, part)
    out = None
    if args.out is not None and part is None:
        out = claim_file(args.out, command="predict", flag="--out", what="predictions file", overwrite=args.overwrite,
                         sources=[(args.input, "the --input file"), (args.model, "MODEL")] if args.input else
                         [(args.model, "MODEL")], recognise=is_predictions_file, example_name="predictions.jsonl")
    loaded = load_model_for(args, args.input)
    from bertforge.inference import kind_of_loaded, read_prediction_inputs, texts_given, with_ids, write_rows

    if args.text is not None:
        inputs = texts_given(args.text, checked_text_pairs(args, loaded.name))
    else:
        inputs = read_prediction_inputs(args.input, text_column=args.text_column, text_pair_column=args.text_pair_column,
                                        id_column=args.id_column, delimiter=args.delimiter)
    ids = inputs.ids if args.text is not None else row_ids(inputs.ids, len(inputs.split))
    if part is not None:
        return predict_part(args, part, loaded, inputs.split, ids)
    predictions = kind_of_loaded(loaded).predict(loaded, inputs.split, settings_of(args, "predicting"))
    rows = with_ids(predictions.rows, ids)
    truncated = (f" ({predictions.truncated:,} truncated at {loaded.max_length} tokens)"
                 if predictions.truncated else "")
    if out is None:
        for row in rows:
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        if truncated:
            log.info(f"{len(rows):,} predictions{truncated}")
        return 0
    path = write_rows(rows, out)
    record_outputs(path.parent, [path.name], "predict")
    log.info(f"{len(rows):,} predictions written to {path}{truncated}")
    return 0


def predict_part(args: argparse.Namespace, part: Any, loaded: Any, split: Any, ids: list[Any]) -> int:
    """`--num-parts N --part I`: predict this part's rows into its own file beside --out, unless an earlier run
    finished it."""
    from bertforge.console import log
    from bertforge.data.labels import LabeledSplit
    from bertforge.engine_settings import settings_of
    from bertforge.inference import kind_of_loaded, with_ids, write_rows
    from bertforge.parts import claim_part, store

    rows = part.rows(len(split))
    if not rows:
        log.info(f"part {part.index} of {part.count} has no rows (the input has {len(split):,}); nothing to write")
        return 0
    location = part.output_of(args.out)
    ids = ids[rows.start:rows.stop]
    if not claim_part(location, ids, command="predict", what="predictions file", overwrite=args.overwrite,
                      sources=[(args.input, "the --input file"), (args.model, "MODEL")]):
        log.info(f"part {part.index} of {part.count}: {location} already holds its {len(ids):,} rows; skipped")
        return 0
    pairs = split.text_pairs[rows.start:rows.stop] if split.text_pairs is not None else None
    mine = LabeledSplit.unlabeled(split.source, split.texts[rows.start:rows.stop], pairs)
    predictions = kind_of_loaded(loaded).predict(loaded, mine, settings_of(args, "predicting"))
    predicted = with_ids(predictions.rows, ids)
    store(location, lambda path: write_rows(predicted, path), "predict")
    truncated = (f" ({predictions.truncated:,} truncated at {loaded.max_length} tokens)"
                 if predictions.truncated else "")
    log.info(f"part {part.index} of {part.count}: {len(predicted):,} predictions written to {location}{truncated}")
    return 0


def checked_text_pairs(args: argparse.Namespace, model_name: str) -> list[str] | None:
    """--text-pair, one per --text; a pair model's run without them is told to give them."""
    from bertforge.errors import BertforgeError

    if args.text_pair is None:
        if args.text_pair_column is not None:  # the run was trained on pairs
            raise BertforgeError(f"{model_name} was fine-tuned on text pairs (finetune.text_pair_column "
                                 f"{args.text_pair_column!r}); give a --text-pair after each --text")
        return None
    if len(args.text_pair) != len(args.text):
        raise BertforgeError(f"{len(args.text)} --text but {len(args.text_pair)} --text-pair; give one --text-pair "
                             "per --text, in the same order")
    return args.text_pair


PREDICTION_KEYS = frozenset({"id", "text", "text_pair", "label", "label_id", "score", "probabilities", "entities"})


def is_predictions_file(path: Path) -> bool:
    """A file `predict` wrote before it kept a ledger: JSON lines of its own keys (a labeled input has others)."""
    try:
        with open(path, encoding="utf-8") as handle:
            row = json.loads(handle.readline())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(row, dict) and "text" in row and ("score" in row or "entities" in row) and set(row) <= PREDICTION_KEYS
