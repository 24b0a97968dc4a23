"""`bertforge prepare pretrain`: text -> a sharded, pre-tokenized pre-training dataset."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(subparsers, "prepare", help="tokenize text into a sharded pre-training dataset",
                         description="Data preparation.",
                         example="bertforge prepare pretrain --input bundled:corpus --tokenizer tok --out data")
    commands = parser.add_subparsers(dest="prepare_command", metavar="<subcommand>", required=True)
    pretrain = add_command(
        commands, "pretrain", help="MLM (and NSP) samples, tokenized in parallel, in memory-mapped shards",
        description="Tokenize documents in parallel worker processes, split them into sentences and build "
                    "pre-training samples (packed MLM sequences, one line per sample with --line-by-line, or NSP "
                    "sentence pairs with --nsp), written as "
                    "memory-mapped shards with a manifest (index.json: format version, tokenizer fingerprint, "
                    "counts, sha256 per file). Documents are split into train/validation[/test] by contiguous "
                    "ranges (Megatron's --split). Running again with the same inputs, tokenizer and settings "
                    "does nothing; an interrupted run resumes. OUT may be a directory or an fsspec URL.",
        example="""
            bertforge tokenizer train --input bundled:corpus --vocab-size 8192 --out runs/tokenizer
            bertforge prepare pretrain --input bundled:corpus --tokenizer runs/tokenizer --out runs/data --seq-len 128
        """)
    pretrain.add_argument("--input", action="append", required=True, metavar="PATH",
                          help="text input: file, directory, glob, URL, hf:NAME or bundled:corpus (repeatable)")
    pretrain.add_argument("--tokenizer", required=True, help="tokenizer directory (any Hugging Face tokenizer)")
    pretrain.add_argument("--out", required=True, help="output directory or fsspec URL")
    pretrain.add_argument("--seq-len", type=int, default=128, help="tokens per sample incl. [CLS]/[SEP] (default 128)")
    pretrain.add_argument("--nsp", action="store_true", help="build sentence pairs with next-sentence labels")
    pretrain.add_argument("--line-by-line", action="store_true",
                          help="one sample per line (run_mlm.py's --line_by_line; a longer line is cut into several) "
                               "instead of packing a document's sentences up to --seq-len")
    pretrain.add_argument("--split", default="980,20",
                          help="train,validation[,test] weights over documents (default 980,20)")
    pretrain.add_argument("--short-seq-prob", type=float, default=0.1,
                          help="probability of a shorter target length per sample (default 0.1, as BERT)")
    pretrain.add_argument("--workers", type=int, default=None,
                          help="tokenizer worker processes (default: the number of CPUs; 0 = in-process)")
    pretrain.add_argument("--seed", type=int, default=12345, help="seed for NSP cuts/negatives and short lengths")
    pretrain.add_argument("--text-field", default="text", help="field/column with the text (jsonl/csv/parquet/HF/MDS)")
    pretrain.add_argument("--chunk-mb", type=float, default=2.0,
                          help="MB of text per tokenization task, roughly the size of a shard (default 2)")
    pretrain.set_defaults(func=run_pretrain)


def run_pretrain(args: argparse.Namespace) -> int:
    from bertforge.data.prepare import PrepareSettings, parse_split, prepare_pretraining_data

    settings = PrepareSettings(seq_len=args.seq_len, nsp=args.nsp, line_by_line=args.line_by_line,
                               short_seq_prob=args.short_seq_prob,
                               split=parse_split(args.split), seed=args.seed, text_field=args.text_field,
                               chunk_bytes=max(1, int(args.chunk_mb * (1 << 20))))
    prepare_pretraining_data(args.input, args.tokenizer, args.out, settings, workers=args.workers)
    return 0
