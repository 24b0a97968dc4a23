"""`bertforge fill-mask MODEL "the [MASK] of the law"`: the most likely tokens for each [MASK]."""

from __future__ import annotations

import argparse
import json

from bertforge.commands.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "fill-mask", help="predict the tokens behind [MASK] with a pre-trained model",
        description="Show the top-k tokens (with probabilities) the masked-language-model head predicts for "
                    "each [MASK] in TEXT — the same results as transformers.pipeline('fill-mask') on the "
                    "exported model. MODEL is a pre-training run directory, its final/, a checkpoint, or a "
                    "bertforge / Hugging Face *ForMaskedLM directory.",
        example="""
        bertforge fill-mask runs/quickstart-pretrain "the [MASK] of the law"
        bertforge fill-mask runs/quickstart-pretrain/final "and god said , let there be [MASK]" --top-k 3 --json
        """)
    parser.add_argument("model", metavar="MODEL", help="pre-training run directory, final/, checkpoint or model dir")
    parser.add_argument("text", metavar="TEXT",
                        help="text with one or more mask tokens: [MASK] or <mask>, read as the model's own")
    parser.add_argument("--top-k", type=int, default=5, help="candidates per mask (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON (as the transformers pipeline returns)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from bertforge.console import quiet_transformers, stdout_console
    from bertforge.inference import fill_mask, load_model

    quiet_transformers()
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
