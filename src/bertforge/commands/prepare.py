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
    pretrain.add_argument("--out", required=True,
                          help="output directory or fsspec URL: new, empty, or an earlier prepared dataset (resumed "
                               "when its inputs and settings are the same; replaced only with --overwrite)")
    pretrain.add_argument("--overwrite", action="store_true",
                          help="replace an earlier dataset of other inputs, tokenizer or settings at --out")
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
    pretrain.add_argument("--num-parts", type=int, default=None, metavar="N",
                          help="split the preparation across N machines: this run tokenizes only part --part of the "
                               "input into --out; `bertforge prepare merge` then builds the dataset")
    pretrain.add_argument("--part", type=int, default=None, metavar="I",
                          help="which part (0..N-1) this run prepares, with --num-parts (a Slurm array's "
                               "$SLURM_ARRAY_TASK_ID)")
    pretrain.set_defaults(func=run_pretrain)
    merge = add_command(
        commands, "merge", help="one dataset from the parts of a preparation split with --num-parts",
        description="Check that the parts belong to one preparation (same inputs, tokenizer and settings; every part "
                    "once), then build the train/validation/test split, the samples, the shards and the manifest "
                    "exactly as a one-machine `prepare pretrain` would: the result equals it sample for sample.",
        example="""
            bertforge prepare pretrain --input 'corpus/*.zst' --tokenizer tok --out parts/0 --num-parts 4 --part 0
            ...   (parts 1-3, on other machines)
            bertforge prepare merge parts/0 parts/1 parts/2 parts/3 --out data
        """)
    merge.add_argument("parts", nargs="+", metavar="PART", help="the --out of every part (directories or URLs)")
    merge.add_argument("--out", required=True, help="output directory or fsspec URL of the dataset")
    merge.add_argument("--overwrite", action="store_true",
                       help="replace an earlier dataset of another preparation at --out")
    merge.add_argument("--workers", type=int, default=None,
                       help="worker processes building samples (default: the number of CPUs; 0 = in-process)")
    merge.set_defaults(func=run_merge)


def run_pretrain(args: argparse.Namespace) -> int:
    from bertforge.data.prepare import Part, PrepareSettings, parse_split, prepare_pretraining_data
    from bertforge.errors import DataError

    settings = PrepareSettings(seq_len=args.seq_len, nsp=args.nsp, line_by_line=args.line_by_line,
                               short_seq_prob=args.short_seq_prob,
                               split=parse_split(args.split), seed=args.seed, text_field=args.text_field,
                               chunk_bytes=max(1, int(args.chunk_mb * (1 << 20))))
    part = None
    if args.num_parts is not None or args.part is not None:
        if args.num_parts is None or args.part is None:
            raise DataError("--num-parts and --part go together, e.g. --num-parts 4 --part 0")
        part = Part(args.part, args.num_parts)
    prepare_pretraining_data(args.input, args.tokenizer, args.out, settings, workers=args.workers, part=part,
                             overwrite=args.overwrite)
    return 0


def run_merge(args: argparse.Namespace) -> int:
    from bertforge.data.prepare_parts import merge_parts

    merge_parts(args.parts, args.out, workers=args.workers, overwrite=args.overwrite)
    return 0
