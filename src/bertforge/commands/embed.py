"""`bertforge embed MODEL --input FILE --out vectors.npy`: sentence vectors, batched and unpadded."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.commands.common import add_command
from bertforge.commands.predict import add_engine_arguments
from bertforge.parts import add_part_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "embed", help="write the sentence vectors of a file of texts as a .npy matrix or a table",
        description="Embed every text of a .txt file (one text per line) or of a column of a csv/tsv/jsonl/parquet "
                    "file and write a [texts, hidden] float32 NumPy array (row i = text i), or with --out x.parquet "
                    "(or x.jsonl) one row per text: its id (the --id-column, by default `id` when there is one, "
                    "else the row number from 0) and its vector. MODEL is an embedding run "
                    "(finetune.task_type=embedding), its final/, a checkpoint, all-MiniLM-L6-v2 or any "
                    "sentence-transformers directory (its pooling, Normalize and max_seq_length are used, so the "
                    "vectors are those SentenceTransformer(dir).encode gives), or any other encoder (mean pooling). "
                    "Texts are sorted by length into unpadded batches of at most --max-batch-tokens tokens, "
                    "tokenized on a thread ahead of the model; a text over the model's length is truncated (the "
                    "summary line counts them). --num-parts N --part I embeds only part I of the rows (a Slurm "
                    "array on many machines) into OUT's name with .part-0000I-of-0000N before its suffix.",
        example="""
        bertforge embed runs/wordnet-embedding-minilm --input sentences.txt --out vectors.npy
        bertforge embed all-MiniLM-L6-v2 --input pairs.jsonl --text-column anchor --out anchors.npy --overwrite
        bertforge embed all-MiniLM-L6-v2 --input docs.parquet --id-column doc_id --out vectors.parquet \\
            --num-parts 16 --part 3
        """)
    parser.add_argument("model", metavar="MODEL", help="run directory, final/, checkpoint or model directory")
    parser.add_argument("--input", required=True, help=".txt (one text per line) or csv/tsv/jsonl/parquet file")
    parser.add_argument("--out", required=True,
                        help="output .npy file, or .parquet / .jsonl for rows of id and vector (a local path or an "
                             "s3:// URL with --num-parts)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier vectors file at --out")
    parser.add_argument("--text-column", default="text", help="csv/tsv/jsonl/parquet: the column to embed (default: text)")
    parser.add_argument("--delimiter", default=None,
                        help="csv/tsv delimiter (default: from the extension, comma for .csv, tab for .tsv)")
    parser.add_argument("--id-column", default=None,
                        help="with --out .parquet/.jsonl: the input column carried into each row as \"id\" (default: "
                             "`id` when the input has it, else the row number from 0)")
    add_engine_arguments(parser)
    add_part_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import log, quiet_transformers, stdout_console
    from bertforge.embed import (
        ROW_SUFFIXES,
        check_vectors_path,
        check_vectors_suffix,
        embed_run,
        load_embedder,
        save_vectors,
        write_vectors,
    )
    from bertforge.engine import settings_of
    from bertforge.errors import BertforgeError
    from bertforge.inference import read_prediction_inputs
    from bertforge.parts import check_out_without_parts, claim_part, part_of, row_ids, store

    settings = settings_of(args, "embedding texts")
    part = part_of(args)
    check_out_without_parts(args.out, part)
    check_vectors_suffix(args.out)
    as_rows = Path(args.out).suffix in ROW_SUFFIXES
    if args.id_column is not None and not as_rows:
        raise BertforgeError(f"--id-column {args.id_column}: a .npy holds only the vectors (row i = text i); give "
                             f"--out {Path(args.out).with_suffix('.parquet')} to write each row's id beside its vector")
    sources = [(args.input, "the --input file"), (args.model, "MODEL")]
    out = check_vectors_path(args.out, args.overwrite, sources) if part is None else None
    inputs = read_prediction_inputs(args.input, text_column=args.text_column, id_column=args.id_column,
                                    delimiter=args.delimiter)
    texts, ids = inputs.split.texts, row_ids(inputs.ids, len(inputs.split))
    location = None
    if part is not None:
        rows = part.rows(len(texts))
        texts, ids = texts[rows.start:rows.stop], ids[rows.start:rows.stop]
        location = part.output_of(args.out)
        if not texts:
            log.info(f"part {part.index} of {part.count} has no rows (the input has {len(inputs.split):,}); nothing "
                     "to write")
            return 0
        if not claim_part(location, ids, command="embed", what="vectors file", overwrite=args.overwrite,
                          sources=sources):
            log.info(f"part {part.index} of {part.count}: {location} already holds its {len(texts):,} rows; skipped")
            return 0
    quiet_transformers()
    embedder = load_embedder(args.model)
    embedded = embed_run(embedder, texts, settings)
    vectors = embedded.vectors
    kept_ids = ids if as_rows else None
    if location is None:
        written = str(write_vectors(vectors, out, kept_ids))  # type: ignore[arg-type]
    else:
        written = store(location, lambda path: save_vectors(vectors, path, kept_ids), "embed")
    truncated = f" ({embedded.truncated:,} truncated at {embedder.max_length} tokens)" if embedded.truncated else ""
    log.info(f"{len(texts):,} vectors of {vectors.shape[1]} dimensions from {embedder.name}{truncated}")
    stdout_console.print(f"{written} ({vectors.shape[0]} x {vectors.shape[1]}, float32)", markup=False, highlight=False)
    return 0
