"""`bertforge fill-mask MODEL "the [MASK] of the law"`: the most likely tokens for each [MASK]; `--input FILE` for
a file of masked texts, through the inference engine."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bertforge.commands.common import add_command
from bertforge.parts import add_part_arguments

MASK_SPELLINGS = ("[MASK]", "<mask>")  # bertforge.inference.MASK_SPELLINGS, without importing torch


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "fill-mask", help="predict the tokens behind [MASK] with a pre-trained model",
        description="Show the top-k tokens (with probabilities) the masked-language-model head predicts for "
                    "each [MASK] in TEXT — the same results as transformers.pipeline('fill-mask') on the "
                    "exported model. MODEL is a pre-training run directory, its final/, a checkpoint, or a "
                    "bertforge / Hugging Face *ForMaskedLM directory. --input FILE fills the masks of every text of "
                    "a .txt file (one per line) or of a column of a csv/tsv/jsonl/parquet file, sorted by length "
                    "into unpadded batches, and writes one JSON line per text (to --out, or .parquet, else stdout): "
                    "its id (--id-column, by default `id` when there is one, else the row number from 0), the text "
                    "and each mask's candidates. --num-parts N --part I does only part I of the rows.",
        example="""
        bertforge fill-mask runs/quickstart-pretrain "the [MASK] of the law"
        bertforge fill-mask runs/quickstart-pretrain/final "and god said , let there be [MASK]" --top-k 3 --json
        bertforge fill-mask runs/quickstart-pretrain --input masked.txt --out filled.jsonl
        """)
    parser.add_argument("model", metavar="MODEL", help="pre-training run directory, final/, checkpoint or model dir")
    parser.add_argument("text", metavar="TEXT", nargs="?",
                        help="text with one or more mask tokens: [MASK] or <mask>, read as the model's own")
    parser.add_argument("--input", help="instead of TEXT: a .txt file (one masked text per line) or a "
                                        "csv/tsv/jsonl/parquet file with a text column")
    parser.add_argument("--text-column", default="text", help="--input csv/tsv/jsonl/parquet: the column of masked "
                                                              "texts (default: text)")
    parser.add_argument("--id-column", default=None,
                        help="--input: the column carried into each output line as \"id\" (default: `id` when the "
                             "input has it, else the row number from 0)")
    parser.add_argument("--delimiter", default=None,
                        help="csv/tsv delimiter (default: from the extension, comma for .csv, tab for .tsv)")
    parser.add_argument("--out", default=None, help="--input: output file, JSON lines or .parquet (default: JSON "
                                                    "lines on stdout)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier fill-mask file at --out")
    parser.add_argument("--top-k", type=int, default=5, help="candidates per mask (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON (as the transformers pipeline returns)")
    add_part_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.errors import BertforgeError

    if (args.text is None) == (args.input is None):
        raise BertforgeError("give the masked TEXT or --input FILE (one masked text per line), not both"
                             if args.text is not None else "give the masked TEXT, e.g. \"the [MASK] of the law\", "
                             "or --input FILE with one masked text per line")
    if args.input is None:
        for flag, given in (("--out", args.out), ("--num-parts", args.num_parts), ("--part", args.part),
                            ("--id-column", args.id_column)):
            if given is not None:
                raise BertforgeError(f"{flag} goes with --input FILE; for one TEXT the candidates are printed")
        return fill_one(args)
    if args.json:
        raise BertforgeError("--input always writes JSON lines; leave out --json (it is for one TEXT)")
    return fill_file(args)


def fill_one(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from bertforge.commands.preflight import refuse_missing_model
    from bertforge.console import quiet_transformers, stdout_console

    refuse_missing_model(args.model)
    quiet_transformers()
    from bertforge.inference import fill_mask, load_model  # torch: only once MODEL is there

    results = fill_mask(load_model(args.model), args.text, args.top_k)
    if args.json:
        stdout_console.print(json.dumps([[asdict(p) for p in row] for row in results], ensure_ascii=False),
                             markup=False, highlight=False)
        return 0
    for index, predictions in enumerate(results, start=1):
        table = Table(title=f"[MASK] {index} of {len(results)}" if len(results) > 1 else None)
        for column, justify in (("rank", "right"), ("token", "left"), ("probability", "right"), ("sequence", "left")):
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for rank, prediction in enumerate(predictions, start=1):
            table.add_row(str(rank), prediction.token_str, f"{prediction.score:.4f}", prediction.sequence)
        stdout_console.print(table)
    return 0


def fill_file(args: argparse.Namespace) -> int:
    """Every text of --input (or of its part), one output row each, in input order."""
    from dataclasses import asdict

    from bertforge.commands.preflight import refuse_missing_data_file
    from bertforge.console import log, quiet_transformers
    from bertforge.engine_settings import EngineSettings
    from bertforge.errors import DataError
    from bertforge.output_guard import claim_file, record_outputs
    from bertforge.parts import check_out_without_parts, claim_part, part_of, row_ids, store

    part = part_of(args)
    if part is not None and args.out is None:
        raise DataError("--num-parts writes each part beside --out: give --out, e.g. --out filled.jsonl")
    check_out_without_parts(args.out, part)
    sources = [(args.input, "the --input file"), (args.model, "MODEL")]
    out = None
    if args.out is not None and part is None:
        out = claim_file(args.out, command="fill-mask", flag="--out", what="fill-mask file", overwrite=args.overwrite,
                         sources=sources, example_name="filled.jsonl")
    refuse_missing_data_file(args.input)
    # torch only now, once --input is there
    from bertforge.inference import fill_masks, load_model, read_prediction_inputs, write_rows

    inputs = read_prediction_inputs(args.input, text_column=args.text_column, id_column=args.id_column,
                                    delimiter=args.delimiter)
    texts, ids = inputs.split.texts, row_ids(inputs.ids, len(inputs.split))
    for text, row_id in zip(texts, ids, strict=True):
        if not any(spelling in text for spelling in MASK_SPELLINGS):
            raise DataError(f"{inputs.split.source}: the text of row {row_id!r} has no {' or '.join(MASK_SPELLINGS)} "
                            "to fill; mask a word in it or remove the row")
    location = None
    if part is not None:
        rows = part.rows(len(texts))
        texts, ids = texts[rows.start:rows.stop], ids[rows.start:rows.stop]
        if not texts:
            log.info(f"part {part.index} of {part.count} has no rows (the input has {len(inputs.split):,}); nothing "
                     "to write")
            return 0
        location = part.output_of(args.out)
        if not claim_part(location, ids, command="fill-mask", what="fill-mask file", overwrite=args.overwrite,
                          sources=sources):
            log.info(f"part {part.index} of {part.count}: {location} already holds its {len(texts):,} rows; skipped")
            return 0
    quiet_transformers()
    results = fill_masks(load_model(args.model), texts, args.top_k, EngineSettings(label="filling masks"))
    filled: list[dict[str, Any]] = [{"id": row_id, "text": text, "masks": [[asdict(p) for p in mask] for mask in found]}
                                    for row_id, text, found in zip(ids, texts, results, strict=True)]
    if part is not None and location is not None:
        store(location, lambda path: write_rows(filled, path), "fill-mask")
        log.info(f"part {part.index} of {part.count}: {len(filled):,} texts filled into {location}")
    elif out is not None:
        path = write_rows(filled, out)
        record_outputs(path.parent, [path.name], "fill-mask")
        log.info(f"{len(filled):,} texts filled into {path}")
    else:
        for row in filled:
            sys.stdout.write(json.dumps(row, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    return 0
