#!/usr/bin/env python3
"""The feature diagnostics of `benchmarks.common.features` for finished models side by side (issue 40, item 1).

`benchmarks/dropout_plateau.py` measures the features of its own step-matched exports; this reads any pre-trained
model directories, such as the final models of `time_to_quality.py`'s cells, so a model that fine-tunes worse than
its neighbours can be set beside them. Each model is read on the same 512 supersense training glosses (evenly spaced,
as `dropout_plateau.py` does: the text the models are fine-tuned on), with its own tokenizer. Per model: the last
layer's token-state norm, common share and effective rank, the mean attention entropy of the last layer against the
uniform one, and the [CLS] and mean-pooled states' mean cosine and effective rank; plus the largest spectral norm of the
attention's query and key projections (how sharp attention can get), from the weights themselves.

    python benchmarks/model_features.py --report-name model_features_tech_dictionaries_20min \
        --model b1=runs/benchmarks/time_to_quality/tech-dictionaries/runs/b-20min-seed1/train/final \
        --model d2=runs/benchmarks/time_to_quality/tech-dictionaries/runs/d-20min-seed2/train/bertforge/final

Results: `benchmarks/results/<report-name>.{json,md}`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/model_features.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.features import feature_report
from benchmarks.common.reports import machine_description, write_atomically
from benchmarks.common.tasks import evenly_spaced, load_task
from benchmarks.ttq.plateau_scoring import FEATURE_TEXTS
from benchmarks.ttq.settings import DOWNSTREAM_ROWS, RESULTS


def labelled_model(text: str) -> tuple[str, Path]:
    label, separator, directory = text.partition("=")
    if not separator or not label:
        raise argparse.ArgumentTypeError(f"{text!r}: give LABEL=DIRECTORY")
    path = Path(directory).resolve()
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{path} has no config.json: give a model directory such as a run's final/")
    return label, path


def largest_query_key_norm(model_dir: Path) -> float:
    """The largest spectral norm over the layers' query and key weight matrices: the product of a query's and a
    key's bounds the attention logits, so it says how far from uniform attention can be pushed."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(model_dir / "model.safetensors"))
    norms = [float(torch.linalg.matrix_norm(tensor.float(), ord=2)) for name, tensor in weights.items()
             if name.endswith(("query.weight", "key.weight"))]
    return max(norms)


def summary_row(label: str, report: dict[str, Any], qk_norm: float) -> str:
    last = report["layers"][-1]
    return (f"| {label} | {last['norm']:.2f} | {last['common_share']:.3f} | {last['effective_rank']:.1f} | "
            f"{last['attention_entropy']:.2f} / {report['uniform_entropy']:.2f} | {report['cls']['mean_cosine']:.3f} | "
            f"{report['cls']['effective_rank']:.1f} | {report['mean_pooled']['mean_cosine']:.3f} | "
            f"{report['mean_pooled']['effective_rank']:.1f} | {qk_norm:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=labelled_model, action="append", required=True, metavar="LABEL=DIRECTORY",
                        help="a model to read (repeat)")
    parser.add_argument("--report-name", default="model_features")
    arguments = parser.parse_args()
    supersense = load_task("supersense", *DOWNSTREAM_ROWS["supersense"])
    texts = [row["text"] for row in evenly_spaced(supersense.train, FEATURE_TEXTS)]
    command = shlex.join(["python", *sys.argv])
    results, rows = {}, []
    for label, directory in arguments.model:
        report = feature_report(str(directory), texts)
        results[label] = {"model_dir": str(directory), "features": report,
                          "query_key_spectral_norm_max": largest_query_key_norm(directory)}
        rows.append(summary_row(label, report, results[label]["query_key_spectral_norm_max"]))
        print(rows[-1], flush=True)
    lines = [f"# Features of finished models on {len(texts)} supersense glosses", "", f"Command: `{command}`", "",
             "| model | last layer: norm | common share | effective rank | attention entropy / uniform | "
             "[CLS] mean cosine | [CLS] effective rank | mean-pooled mean cosine | mean-pooled effective rank | "
             "max Q/K spectral norm |", "|---|" + "---:|" * 9, *rows]
    out = RESULTS / arguments.report_name
    write_atomically(out.with_suffix(".json"), json.dumps(
        {"command": command, "machine": machine_description("cpu"), "texts": len(texts), "models": results}, indent=1))
    write_atomically(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print(f"wrote {out}.{{json,md}}")


if __name__ == "__main__":
    main()
