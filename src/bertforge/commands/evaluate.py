"""`bertforge evaluate MODEL --data FILE`: metrics, per-class report and confusion matrix of a fine-tuned model."""

from __future__ import annotations

import argparse
from pathlib import Path

from bertforge.commands.common import add_command
from bertforge.commands.predict import add_input_arguments, load_model_for

PRINTED_CONFUSION_CLASSES = 12  # a wider confusion matrix goes to the --out-dir files only


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "evaluate", help="score a fine-tuned model on a labeled file",
        description="Evaluate a fine-tuned model on labeled data read against the model's own label names: "
                    "accuracy, macro F1, Matthews correlation (and binary F1 with two classes), or Pearson, "
                    "Spearman and MSE for regression, plus per-class precision/recall and the confusion matrix. "
                    "MODEL is a run directory, its final/, a checkpoint or a model directory; a run's model reads "
                    "the columns it was trained on (its config.yaml's finetune.text_column, text_pair_column, "
                    "label_column, tagging.tokens_column, tagging.tags_column, embedding.negative_column and "
                    "classification.label_map) unless an option "
                    "says otherwise. Prints the tables; with --out-dir also writes <split>_results.json, <split>_report.md and "
                    "<split>_confusion_matrix.png. A label the model does not know is an error naming its line. A token "
                    "classifier is scored on a tagged file (CoNLL or jsonl) with seqeval's entity-level "
                    "precision/recall/F1, word accuracy and the per-type table. A sentence-embedding model (an embedding run, a "
                    "sentence-transformers directory) is scored on pairs (--text-column the query, --text-pair-column "
                    "its relevant text, optionally --negative-column): each distinct query ranks every distinct "
                    "text by cosine similarity (MRR@10, recall@1/5/10, nDCG@10); with --embedding-metric cosine, "
                    "Pearson/Spearman of cos(a, b) against --label-column's scores.",
        example="""
        bertforge evaluate runs/supersense-minilm --data bundled:supersense/test
        bertforge evaluate runs/reviews/checkpoints/step-00000500 --data reviews-test.csv --out-dir reports/
        bertforge evaluate runs/sts/final --data dev.tsv --text-column sentence1 --text-pair-column sentence2 \\
            --label-column score --split-name dev --out-dir reports/
        """)
    parser.add_argument("model", metavar="MODEL", help="run directory, final/, checkpoint or model directory")
    parser.add_argument("--data", required=True, help="labeled csv/tsv/jsonl/parquet file or bundled:supersense/SPLIT")
    parser.add_argument("--label-column", default=None,
                        help="column with the label or score (default: the run's finetune.label_column, else label)")
    parser.add_argument("--tokens-column", default=None,
                        help="token classifiers, jsonl/parquet data: the column of word lists (default: the run's "
                             "finetune.tagging.tokens_column, else tokens)")
    parser.add_argument("--tags-column", default=None,
                        help="token classifiers, jsonl/parquet data: the column of tag lists (default: the run's "
                             "finetune.tagging.tags_column, else tags; CoNLL files: the last column)")
    parser.add_argument("--negative-column", default=None,
                        help="embedding models: a column of hard negatives, added to the retrieval corpus (default: "
                             "the run's finetune.embedding.negative_column)")
    parser.add_argument("--embedding-metric", choices=("retrieval", "cosine"), default=None,
                        help="embedding models: retrieval metrics or cosine-score correlation (default: cosine for "
                             "a run trained with finetune.embedding.loss cosine, else retrieval)")
    parser.add_argument("--split-name", default="evaluation", help="name used in the tables and file names")
    parser.add_argument("--out-dir", default=None, help="also write the report files into this directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the report files of an earlier `evaluate` of the same --split-name in --out-dir")
    add_input_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from bertforge.console import log, stdout_console
    from bertforge.output_guard import record_outputs

    if args.out_dir:
        claim_report_files(args.out_dir, args.split_name, args.overwrite, [(args.data, "the --data file")])
    loaded = load_model_for(args, args.data)
    from bertforge.inference import kind_of_loaded
    from bertforge.tasks.evaluation import write_evaluation
    from bertforge.tasks.metrics import confusion_table, per_class_table

    report = kind_of_loaded(loaded).evaluate(loaded, args)
    table = Table(title=f"{report.split}: {int(report.metrics['examples']):,} examples from {report.source}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report.metrics.items():
        if name != "examples":
            table.add_row(name, f"{value:.4f}")
    stdout_console.print(table)
    if report.confusion is None and report.per_class:  # a tagger's entity types
        stdout_console.print(per_class_table(report.per_class, title=f"{report.split}: per entity type"))
    if report.confusion is not None:
        stdout_console.print(per_class_table(report.per_class, title=f"{report.split}: per-class metrics"))
        if len(report.label_names) <= PRINTED_CONFUSION_CLASSES:
            stdout_console.print(confusion_table(report.confusion, report.label_names,
                                                 title=f"{report.split}: confusion matrix"))
        elif not args.out_dir:
            log.info(f"{len(report.label_names)} classes: give --out-dir for the confusion matrix (markdown and PNG)")
    if args.out_dir:
        written = write_evaluation(report, args.out_dir)
        record_outputs(args.out_dir, [path.name for path in written], "evaluate")
        log.info(f"report written: {', '.join(str(p) for p in written)}")
    return 0


def claim_report_files(out_dir: str, split: str, overwrite: bool, sources: list[tuple[str, str]]) -> None:
    """The report files `evaluate` may write into `out_dir` (its directory may hold other files)."""

    from bertforge.output_guard import claim_file, output_directory
    from bertforge.run_directory import evaluation_file_names

    directory = output_directory(out_dir, "--out-dir")
    results = directory / evaluation_file_names(split)[0]

    def earlier_report(path: Path) -> bool:  # written before `evaluate` kept a ledger: beside its results
        return is_evaluation_results(results)

    for name in evaluation_file_names(split):
        claim_file(directory / name, command="evaluate", flag="--out-dir", what="evaluation report",
                   overwrite=overwrite, sources=sources, recognise=earlier_report)


def is_evaluation_results(path: object) -> bool:
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(str(path)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"split", "metrics"} <= set(data)
