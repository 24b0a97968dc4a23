"""Scoring the step-matched arms of `benchmarks/dropout_plateau.py`: every export's MLM accuracy on fixed masks
against the unigram baseline (the product's guess, `unigram_baseline`) and its feature diagnostics
(`benchmarks.common.features`), and the final models (or `--fine-tune-steps` exports) fine-tuned on supersense over
the lr x dropout grid, with their fine-tuning dynamics."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.common.features import feature_report
from benchmarks.common.hf_arms import hf_masked_lm
from benchmarks.common.mlm import (
    EVAL_BATCH,
    EVALUATION_SEED,
    guess_record,
    mlm_accuracy,
    packed_validation_batches,
    unigram_baseline,
)
from benchmarks.common.reports import machine_description, write_atomically
from benchmarks.common.tasks import DOWNSTREAM_SEEDS, evenly_spaced, load_task
from benchmarks.ttq.downstream import FineTuning, fine_tune_with, fine_tuning_grid
from benchmarks.ttq.settings import RESULTS
from benchmarks.ttq.step_matched import ARMS

TITLES = {name: arm.title for name, arm in ARMS.items()} | {"untrained": "random initial weights (no pre-training)"}
FEATURE_TEXTS = 512  # supersense training glosses, evenly spaced: the text the models are fine-tuned on


# Reports written before 2026-11-27 have no "unigram_guess": their baseline was the validation masks' own most
# frequent token, which is never below the training data's guess on the same masks (equal on tech-dictionaries: '.')
VALIDATION_MASKS_GUESS = "the validation masks' own most frequent token (reports before 2026-11-27)"


def scored_validation(data_dir: Path, samples: int | None) -> list[dict[str, Any]]:
    """The fixed-mask validation batches every export is scored on: all of them, or about `samples` samples in
    whole batches spread evenly over the split. A large corpus's 2% split (debian-docs: 6,882 samples, ~109k masked
    tokens) costs minutes of CPU per export; evenly spaced, because the split's documents are in corpus order (by
    package on debian-docs) and its first batches would be one package's text. Each batch keeps its masks."""
    batches = packed_validation_batches(data_dir, EVALUATION_SEED)
    if samples is None:
        return batches
    return evenly_spaced(batches, math.ceil(samples / EVAL_BATCH))


def check_validation_cap(result: dict[str, Any], samples: int | None, cached: Path) -> None:
    """A cached curve was scored on the validation subset of its own --validation-samples; comparing it with curves
    or a baseline from another subset would mix two sets of masks, so a different cap ends the program."""
    if "curve" in result and result.get("validation_samples_cap") != samples:
        print(f"error: {cached} was scored with --validation-samples {result.get('validation_samples_cap')}, not "
              f"{samples}; pass that value, or remove the file to score the exports again", file=sys.stderr)
        raise SystemExit(2)


def guess_description(report: dict[str, Any]) -> str:
    """Which guess a report's baseline is, in words; older reports (no "unigram_guess") used the validation masks'."""
    guess = report.get("unigram_guess")
    if guess is None:
        return VALIDATION_MASKS_GUESS
    return f"always {guess['token']!r}, {guess['definition']}"


def plateau_exit(curve: list[dict[str, Any]], baseline: float) -> int | None:
    """The first exported step whose MLM accuracy is more than `PLATEAU_MARGIN` above the unigram baseline
    (`MlmStanding.on_plateau`'s definition of the plateau), None if none is."""
    from bertforge.tasks.mlm_plateau import PLATEAU_MARGIN

    return next((point["step"] for point in curve if point["accuracy"] > baseline + PLATEAU_MARGIN), None)


UNTRAINED = "untrained"  # the reference: bert-mini's random initial weights (HF's BertForMaskedLM, the seed's)


def write_untrained(work: Path, tokenizer_dir: Path, seed: int) -> None:
    """The untrained model as a one-point run: what fine-tuning gets from random weights."""
    import torch
    from transformers import AutoTokenizer

    run_dir = work / "runs" / f"{UNTRAINED}-seed{seed}"
    if (run_dir / "training.json").is_file():
        return
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    hf_masked_lm(tokenizer, "bert-mini").save_pretrained(str(run_dir / "model"))
    tokenizer.save_pretrained(str(run_dir / "model"))
    point = {"minutes": 0.0, "step": 0, "tokens": 0, "model_dir": str(run_dir / "model")}
    write_atomically(run_dir / "training.json", json.dumps({"points": [point]}, indent=1))


def fine_tune_record(work: Path, model_dir: str, task: Any, name: str, setting: FineTuning, seed: int,
                     threads: int) -> dict[str, Any]:
    """One fine-tune's test accuracy, macro F1, Matthews correlation and its training loss along the run."""
    accuracy = fine_tune_with(model_dir, task, name, setting, seed, work, threads)
    run_dir = work / "downstream" / f"{name}-{setting.slug}-{task.name}-ft{seed}"
    metrics = json.loads((run_dir / "test_results.json").read_text())["metrics"]
    losses = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_loss = [(row["step"], row["loss"]) for row in losses if row.get("split") == "train" and "loss" in row]
    return {"setting": str(setting), "seed": seed, "accuracy": accuracy, "f1_macro": metrics.get("f1_macro"),
            "matthews": metrics.get("matthews"), "train_loss": train_loss}


def score_all(arguments: argparse.Namespace, work: Path, tokenizer_dir: Path, data_dir: Path) -> None:
    validation = scored_validation(data_dir, arguments.validation_samples)
    guess, baseline = unigram_baseline(data_dir, validation)
    supersense = load_task("supersense", *arguments.finetune_rows)
    texts = [row["text"] for row in evenly_spaced(supersense.train, FEATURE_TEXTS)]
    labels = [str(row["label"]) for row in supersense.test]
    majority = max(labels.count(label) for label in set(labels)) / len(labels)
    grid = fine_tuning_grid(arguments.downstream_lrs, arguments.downstream_dropouts)
    store = work / "scores"
    results = {}
    if UNTRAINED in arguments.arms:
        write_untrained(work, tokenizer_dir, arguments.seed)
    for name in arguments.arms:
        record_path = work / "runs" / f"{name}-seed{arguments.seed}" / "training.json"
        if not record_path.is_file():
            continue
        cached = store / f"{name}-seed{arguments.seed}.json"
        result = json.loads(cached.read_text()) if cached.is_file() else {}
        check_validation_cap(result, arguments.validation_samples, cached)
        if "curve" not in result:
            record = json.loads(record_path.read_text())
            wanted = arguments.feature_steps
            result["validation_samples_cap"] = arguments.validation_samples
            result["curve"] = [point | mlm_accuracy(point["model_dir"], validation, "cpu")
                               | ({"features": feature_report(point["model_dir"], texts, str(tokenizer_dir))}
                                  if wanted is None or point["step"] in wanted else {})
                               for point in record["points"]]
            write_atomically(cached, json.dumps(result, indent=1))
        fine_tunes = result.setdefault("fine_tunes", {})
        final_step = result["curve"][-1]["step"]
        for step in [final_step if wanted == "final" else int(wanted) for wanted in arguments.fine_tune_steps]:
            point = next((p for p in result["curve"] if p["step"] == step), None)
            if point is None:
                continue
            runs = fine_tunes.setdefault(str(step), [])
            for seed in DOWNSTREAM_SEEDS[:arguments.downstream_seeds]:
                for setting in grid:
                    if any(run["setting"] == str(setting) and run["seed"] == seed for run in runs):
                        continue
                    runs.append(fine_tune_record(work, point["model_dir"], supersense,
                                                 f"{name}-s{arguments.seed}-step{step}", setting, seed,
                                                 arguments.threads))
                    write_atomically(cached, json.dumps(result, indent=1))
        record = json.loads(record_path.read_text())
        result["note"] = record.get("stopped")  # a run stopped early says so
        result["step_cap"] = record.get("step_cap")  # --max-steps: the run stopped there, its schedule planned further
        results[name] = result
    report = {"machine": machine_description("cpu"), "corpus": arguments.corpus, "seed": arguments.seed,
              "command": " ".join(["python", *sys.argv]),
              "unigram_guess": guess_record(guess), "unigram_accuracy": baseline,
              "validation_masked_tokens": result_masked(results), "validation_samples_cap": arguments.validation_samples,
              "supersense_rows": [len(supersense.train), len(supersense.test)], "majority_class_accuracy": majority,
              "arms": {name: {"title": TITLES[name], "planned_steps": ARMS[name].steps if name in ARMS else 0,
                              "steps": result["curve"][-1]["step"], "step_cap": result.get("step_cap"),
                              "plateau_exit_step": plateau_exit(result["curve"], baseline), **result}
                       for name, result in results.items()}}
    destination = Path(arguments.report_dir) if arguments.report_dir else RESULTS
    write_atomically(destination / f"{arguments.report_name}.json", json.dumps(report, indent=1))
    summary = render(report)
    write_atomically(destination / f"{arguments.report_name}_summary.md", summary)
    print(summary)


def result_masked(results: dict[str, Any]) -> int:
    return next((result["curve"][-1]["masked_tokens"] for result in results.values()), 0)


def render(report: dict[str, Any]) -> str:
    """The figures as tables: each arm's plateau and final features, then its fine-tunes per setting."""
    cap = report.get("validation_samples_cap")
    subset = f", ~{cap} samples spread evenly over the split" if cap else ""
    lines = [f"Unigram baseline (validation{subset}, fixed masks): {report['unigram_accuracy']:.4f}, "
             f"{guess_description(report)}; supersense majority class: {report['majority_class_accuracy']:.3f}", "",
             "| arm | last step scored | plateau exit step | final MLM acc | last-layer common share | last-layer eff. rank "
             "| attention entropy (last) / uniform | [CLS] mean cosine | mean-pooled mean cosine |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, arm in report["arms"].items():
        final = arm["curve"][-1]
        if "features" not in final:  # --feature-steps left it out (the untrained arm's step 0, say)
            lines.append(f"| {name} | {arm['steps']} | {arm['plateau_exit_step'] or 'not left'} | {final['accuracy']:.4f} "
                         "| – | – | – | – | – |")
            continue
        features = final["features"]
        last = features["layers"][-1]
        lines.append(f"| {name} | {arm['steps']} | {arm['plateau_exit_step'] or 'not left'} | {final['accuracy']:.4f} "
                     f"| {last['common_share']:.3f} | {last['effective_rank']:.1f} | "
                     f"{last['attention_entropy']:.2f} / {features['uniform_entropy']:.2f} | "
                     f"{features['cls']['mean_cosine']:.3f} | {features['mean_pooled']['mean_cosine']:.3f} |")
    lines += [f"- {name}: {arm['note']}" for name, arm in report["arms"].items() if arm.get("note")]
    lines += ["", "Along each run (every export):", "",
              "| arm | step | MLM acc | [CLS] mean cosine | mean-pooled mean cosine | last-layer common share "
              "| last-layer eff. rank |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, arm in report["arms"].items():
        for point in arm["curve"]:
            if "features" not in point:  # --feature-steps left it out
                lines.append(f"| {name} | {point['step']} | {point['accuracy']:.4f} | – | – | – | – |")
                continue
            features = point["features"]
            lines.append(f"| {name} | {point['step']} | {point['accuracy']:.4f} | {features['cls']['mean_cosine']:.3f} "
                         f"| {features['mean_pooled']['mean_cosine']:.3f} | {features['layers'][-1]['common_share']:.3f} "
                         f"| {features['layers'][-1]['effective_rank']:.1f} |")
    lines += ["", "Per layer of each final model (0 = embeddings): norm / common share / effective rank / attention "
              "entropy:", ""]
    for name, arm in report["arms"].items():
        if "features" not in arm["curve"][-1]:
            lines.append(f"- {name}: not measured (--feature-steps)")
            continue
        cells = [f"{layer['norm']:.1f} / {layer['common_share']:.2f} / {layer['effective_rank']:.0f}"
                 + (f" / {layer['attention_entropy']:.2f}" if layer["attention_entropy"] is not None else "")
                 for layer in arm["curve"][-1]["features"]["layers"]]
        lines.append(f"- {name}: " + "; ".join(cells))
    lines += ["", "| arm | model step | setting | seeds | test accuracy | macro F1 | first / last train loss |",
              "|---|---:|---|---:|---:|---:|---|"]
    for name, arm in report["arms"].items():
        for step, runs in arm["fine_tunes"].items():
            for setting in dict.fromkeys(run["setting"] for run in runs):
                chosen = [run for run in runs if run["setting"] == setting]
                accuracy = [run["accuracy"] for run in chosen]
                spread = f" ± {statistics.stdev(accuracy):.3f}" if len(accuracy) > 1 else ""
                losses = chosen[0]["train_loss"]
                lines.append(f"| {name} | {step} | {setting} | {len(chosen)} | {statistics.fmean(accuracy):.3f}{spread} "
                             f"| {statistics.fmean(run['f1_macro'] for run in chosen):.3f} "
                             f"| {losses[0][1]:.2f} / {losses[-1][1]:.2f} |")
    return "\n".join(lines) + "\n"
