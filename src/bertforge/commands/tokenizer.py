"""`bertforge tokenizer train`: a WordPiece, byte-level BPE or Unigram tokenizer in Hugging Face format."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.commands.common import add_command
from bertforge.console import log, progress_enabled

TOKENIZER_MODEL_NAMES = ("wordpiece", "bpe", "unigram")  # data/tokenizer_models.py's, without importing tokenizers here
NORMALIZATION_NAMES = ("arabic", "arabic-diacritics", "tatweel")  # data/normalization.py's NAMES, likewise


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "tokenizer", help="train a WordPiece, byte-level BPE or Unigram tokenizer",
                         description="Tokenizer tools.",
                         example="bertforge tokenizer train --input bundled:corpus --vocab-size 8192 --out tok")
    commands = parser.add_subparsers(dest="tokenizer_command", metavar="<subcommand>", required=True)
    train = add_command(
        commands, "train", help="train a WordPiece, byte-level BPE or Unigram tokenizer on text files",
        description="Train a tokenizer with Hugging Face `tokenizers`: --model wordpiece (BERT's: [PAD] [UNK] [CLS] "
                    "[SEP] [MASK], uncased by default), bpe (RoBERTa's byte-level BPE: <s> <pad> </s> <unk> <mask>, "
                    "cased) or unigram (XLM-R's SentencePiece Unigram, the same specials, cased). The vocabulary is "
                    "padded to a multiple of 64 and saved in Hugging Face format (tokenizer.json, "
                    "tokenizer_config.json, special_tokens_map.json; vocab.txt for WordPiece), so "
                    "AutoTokenizer.from_pretrained(OUT) loads it. Inputs: .txt (blank line between documents), "
                    ".jsonl/.json, .csv/.tsv, .parquet (optionally .gz/.zst), HF dataset dirs, MDS dirs, "
                    "hf:NAME[:CONFIG][@SPLIT], globs and fsspec URLs; bundled:corpus is the corpus shipped with "
                    "bertforge.",
        example="bertforge tokenizer train --input bundled:corpus --vocab-size 8192 --out runs/tokenizer\n"
                "bertforge tokenizer train --model bpe --input bundled:corpus --vocab-size 8192 --out runs/bpe")
    train.add_argument("--model", choices=TOKENIZER_MODEL_NAMES, default="wordpiece",
                       help="wordpiece (BERT), bpe (byte-level, RoBERTa) or unigram (SentencePiece, XLM-R); "
                            "default wordpiece")
    train.add_argument("--input", action="append", required=True, metavar="PATH",
                       help="text input: file, directory, glob, URL or hf:NAME (repeatable)")
    train.add_argument("--vocab-size", type=int, default=32768, help="vocabulary size (padded to x64; default 32768)")
    train.add_argument("--out", required=True,
                       help="output directory: new, empty, or an earlier `tokenizer train` output (then add --overwrite)")
    train.add_argument("--overwrite", action="store_true", help="replace an earlier tokenizer at --out")
    case = train.add_mutually_exclusive_group()
    case.add_argument("--uncased", dest="lowercase", action="store_true", default=None,
                      help="lower-case, and strip accents unless --keep-accents or --normalize (WordPiece's "
                           "default; WordPiece only)")
    case.add_argument("--cased", dest="lowercase", action="store_false",
                      help="keep case and accents (BPE's and Unigram's only way)")
    accents = train.add_mutually_exclusive_group()
    accents.add_argument("--strip-accents", dest="strip_accents", action="store_true", default=None,
                         help="decompose characters and drop every combining mark (what --uncased does by default; "
                              "it also drops the hamza and madda of Arabic أ إ آ ؤ ئ; WordPiece only)")
    accents.add_argument("--keep-accents", dest="strip_accents", action="store_false",
                         help="keep accents and marks, --uncased or not (the default with --normalize)")
    train.add_argument("--normalize", action="append", choices=NORMALIZATION_NAMES, default=[], metavar="NAME",
                       help="remove characters first: arabic-diacritics (harakat U+064B-U+0652, U+0670), tatweel "
                            "(U+0640), or arabic for both; repeatable. Saved in tokenizer.json: every bertforge "
                            "command and AutoTokenizer apply it")
    train.add_argument("--text-field", default="text", help="field/column with the text (jsonl/csv/parquet/HF/MDS)")
    train.add_argument("--min-frequency", type=int, default=None,
                       help="minimum pair frequency for a merge (WordPiece and BPE; default 2)")
    train.set_defaults(func=run_train)


SAVED_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")  # save_tokenizer's


def run_train(args: argparse.Namespace) -> int:
    from bertforge.data.normalization import describe
    from bertforge.data.tokenizer import train_tokenizer_from_inputs
    from bertforge.data.tokenizer_models import TOKENIZER_MODELS
    from bertforge.errors import ConfigError
    from bertforge.output_guard import claim_directory

    if args.model == "unigram" and args.min_frequency is not None:
        raise ConfigError("--min-frequency counts the pairs WordPiece and BPE merge; Unigram prunes its pieces by "
                          "likelihood instead, so drop it or use --model wordpiece or bpe")

    def earlier_tokenizer(names: list[str], directories: set[str]) -> bool:  # written before the ledger
        return "tokenizer.json" in names and set(names) <= set(SAVED_FILES)

    claimed = claim_directory(args.out, command="tokenizer train", flag="--out", what="tokenizer",
                              overwrite=args.overwrite, sources=[(path, "an --input") for path in args.input],
                              recognise=earlier_tokenizer)
    loaded = train_tokenizer_from_inputs(args.input, args.out, model=args.model, vocab_size=args.vocab_size,
                                         lowercase=args.lowercase, strip_accents=args.strip_accents,
                                         normalize=args.normalize, text_field=args.text_field,
                                         min_frequency=2 if args.min_frequency is None else args.min_frequency,
                                         show_progress=progress_enabled())
    claimed.record(*SAVED_FILES)
    stale = Path(args.out) / "vocab.txt"
    if args.model != "wordpiece" and stale.is_file():  # an earlier WordPiece's, which an export would copy
        stale.unlink()
    model = TOKENIZER_MODELS[args.model]
    log.info(f"saved a {model.describe} tokenizer ({describe(loaded.tokenizer)}) with {loaded.vocab_size:,} tokens "
             f"to {args.out}")
    return 0
