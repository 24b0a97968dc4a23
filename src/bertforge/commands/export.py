"""`bertforge export RUN_OR_CHECKPOINT --out DIR [--format hf|onnx]`."""

from __future__ import annotations

import argparse

from bertforge.commands.common import add_command


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_command(
        subparsers, "export", help="export a model to a Hugging Face directory or an ONNX graph",
        description="Export a run directory, a checkpoint or a model directory. --format hf (default) writes a "
                    "directory stock transformers loads with AutoModelFor*.from_pretrained / pipeline (label names "
                    "and tokenizer included); architectures without a stock class are written in bertforge's own "
                    "format, with a message. --format onnx writes model.onnx (padded inputs with dynamic batch and "
                    "length) and checks it against the PyTorch model with onnxruntime (pip install "
                    "'bertforge[onnx]').",
        example="""
        bertforge export runs/supersense-minilm --out exported/supersense
        bertforge export runs/supersense-minilm/checkpoints/step-00000250 --out exported/onnx --format onnx
        """)
    parser.add_argument("model", metavar="RUN_OR_CHECKPOINT", help="run directory, checkpoint or model directory")
    parser.add_argument("--out", required=True,
                        help="output directory: new, empty, or an earlier export (then add --overwrite); it is "
                             "written atomically and never the model's own run")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export at --out")
    parser.add_argument("--format", choices=("hf", "onnx"), default="hf", help="hf (default) or onnx")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertforge.commands.preflight import refuse_missing_model
    from bertforge.console import quiet_transformers, stdout_console
    from bertforge.storage import is_remote

    if not is_remote(args.out):  # a local --out: the model is the first thing `export_model` checks
        refuse_missing_model(args.model)
    quiet_transformers()
    from bertforge.export import export_model  # torch: only once MODEL is there

    summary = export_model(args.model, args.out, args.format, overwrite=args.overwrite)
    stdout_console.print(f"{summary.format}: {summary.directory}", markup=False, highlight=False)
    return 0
