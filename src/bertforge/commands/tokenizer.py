"""`bertforge tokenizer train`: a BERT WordPiece tokenizer in Hugging Face format."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command
from bertforge.console import log, progress_enabled


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "tokenizer", help="train a WordPiece tokenizer",
                         description="Tokenizer tools.",
                         example="bertforge tokenizer train --input bundled:corpus --vocab-size 8192 --out tok")
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="<subcommand>", required=True)
    train = add_command(
        commands, "train", help="train a BERT-style WordPiece tokenizer on text files",
        description="Train a BERT-style WordPiece tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK]) with Hugging Face "
                    "`tokenizers`. The vocabulary is padded to a multiple of 64 and saved in Hugging Face format "
                    "(tokenizer.json, vocab.txt, tokenizer_config.json, special_tokens_map.json), so "
                    "AutoTokenizer.from_pretrained(OUT) loads it. Inputs: .txt (blank line between documents), "
                    ".jsonl/.json, .csv/.tsv, .parquet (optionally .gz/.zst), HF dataset dirs, MDS dirs, "
                    "hf:NAME[:CONFIG][@SPLIT], globs and fsspec URLs; bundled:corpus is the corpus shipped with "
                    "bertforge.",
        example="bertforge tokenizer train --input bundled:corpus --vocab-size 8192 --out runs/tokenizer")
    train.add_argument("--input", action="append", required=True, metavar="PATH",
                       help="text input: file, directory, glob, URL or hf:NAME (repeatable)")
    train.add_argument("--vocab-size", type=int, default=32768, help="vocabulary size (padded to x64; default 32768)")
    train.add_argument("--out", required=True,
                       help="output directory: new, empty, or an earlier `tokenizer train` output (then add --overwrite)")
    train.add_argument("--overwrite", action="store_true", help="replace an earlier tokenizer at --out")
    case = train.add_mutually_exclusive_group()
    case.add_argument("--uncased", dest="lowercase", action="store_true", default=True,
                      help="lower-case and strip accents (default)")
    case.add_argument("--cased", dest="lowercase", action="store_false", help="keep case and accents")
    train.add_argument("--text-field", default="text", help="field/column with the text (jsonl/csv/parquet/HF/MDS)")
    train.add_argument("--min-frequency", type=int, default=2, help="minimum pair frequency for a merge (default 2)")
    train.set_defaults(func=run_train)


SAVED_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")  # save_tokenizer's


def run_train(args: argparse.Namespace) -> int:
    from bertforge.data.tokenizer import train_tokenizer_from_inputs
    from bertforge.output_guard import claim_directory

    def earlier_tokenizer(names: list[str], directories: set[str]) -> bool:  # written before the ledger
        return "tokenizer.json" in names and set(names) <= set(SAVED_FILES)

    claimed = claim_directory(args.out, command="tokenizer train", flag="--out", what="tokenizer",
                              overwrite=args.overwrite, sources=[(path, "an --input") for path in args.input],
                              recognise=earlier_tokenizer)
    loaded = train_tokenizer_from_inputs(args.input, args.out, vocab_size=args.vocab_size, lowercase=args.lowercase,
                                         text_field=args.text_field, min_frequency=args.min_frequency,
                                         show_progress=progress_enabled())
    claimed.record(*SAVED_FILES)
    log.info(f"saved a {'uncased' if args.lowercase else 'cased'} WordPiece tokenizer with {loaded.vocab_size:,} "
             f"tokens to {args.out}")
    return 0
