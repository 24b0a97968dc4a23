"""`bertforge embed MODEL --input FILE --out vectors.npy`: sentence vectors, batched and unpadded."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command
from bertforge.commands.predict import add_engine_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "embed", help="write the sentence vectors of a file of texts as a .npy matrix",
        description="Embed every text of a .txt file (one text per line) or of a column of a csv/tsv/jsonl/parquet "
                    "file and write a [texts, hidden] float32 NumPy array (row i = text i). MODEL is an embedding run "
                    "(finetune.task_type=embedding), its final/, a checkpoint, all-MiniLM-L6-v2 or any "
                    "sentence-transformers directory (its pooling, Normalize and max_seq_length are used, so the "
                    "vectors are those SentenceTransformer(dir).encode gives), or any other encoder (mean pooling). "
                    "Texts are sorted by length into unpadded batches of at most --max-batch-tokens tokens, "
                    "tokenized on a thread ahead of the model; a text over the model's length is truncated (the "
                    "summary line counts them).",
        example="""
        bertforge embed runs/wordnet-embedding-minilm --input sentences.txt --out vectors.npy
        bertforge embed all-MiniLM-L6-v2 --input pairs.jsonl --text-column anchor --out anchors.npy --overwrite
        """)
    parser.add_argument("model", metavar="MODEL", help="run directory, final/, checkpoint or model directory")
    parser.add_argument("--input", required=True, help=".txt (one text per line) or csv/tsv/jsonl/parquet file")
    parser.add_argument("--out", required=True, help="output .npy file")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier vectors file at --out")
    parser.add_argument("--text-column", default="text", help="csv/tsv/jsonl/parquet: the column to embed (default: text)")
    parser.add_argument("--delimiter", default=None,
                        help="csv/tsv delimiter (default: from the extension, comma for .csv, tab for .tsv)")
    add_engine_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.console import log, quiet_transformers, stdout_console
    from bertforge.embed import check_vectors_path, embed_run, load_embedder, read_texts, write_vectors
    from bertforge.engine import settings_of

    settings = settings_of(args, "embedding texts")
    out = check_vectors_path(args.out, args.overwrite, [(args.input, "the --input file"), (args.model, "MODEL")])
    texts = read_texts(args.input, args.text_column, args.delimiter)
    quiet_transformers()
    embedder = load_embedder(args.model)
    embedded = embed_run(embedder, texts, settings)
    vectors = embedded.vectors
    write_vectors(vectors, out)
    truncated = f" ({embedded.truncated:,} truncated at {embedder.max_length} tokens)" if embedded.truncated else ""
    log.info(f"{len(texts):,} vectors of {vectors.shape[1]} dimensions from {embedder.name}{truncated}")
    stdout_console.print(f"{out} ({vectors.shape[0]} x {vectors.shape[1]}, float32)", markup=False, highlight=False)
    return 0
