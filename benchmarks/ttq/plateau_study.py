"""The driver of `benchmarks/dropout_plateau.py`: train step-matched arms, then score their exports and final
models (see that script's docstring)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import benchmarks.ttq  # noqa: F401  (offline hub, quiet tokenizers)
from benchmarks.common.reports import write_atomically
from benchmarks.ttq.inputs import corpus_file, group_texts_dataset, prepare_corpus
from benchmarks.ttq.plateau_scoring import UNTRAINED
from benchmarks.ttq.settings import REPO
from benchmarks.ttq.step_matched import ARMS, train_step_arm


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stage", choices=("train", "score", "seeds", "cost"), required=True,
                        help="seeds: the arms' scores across --seeds, mean and spread (benchmarks.ttq.plateau_seeds); "
                        "cost: the recipe arms' seconds per step, alternating in one process (benchmarks.ttq.step_cost)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated: " + ", ".join(ARMS) + " (and, to "
                        "score, untrained: bert-mini's random initial weights)")
    parser.add_argument("--corpus", default="tech-dictionaries")
    parser.add_argument("--seed", type=int, default=1, help="the pre-training seed")
    parser.add_argument("--every", type=int, default=100, help="export every N steps")
    parser.add_argument("--max-steps", type=int, default=None, help="stop each recipe arm after this many steps "
                        "(train); its schedule still follows the arm's planned steps")
    parser.add_argument("--report-name", default="dropout_plateau", help="the report's file stem (score)")
    parser.add_argument("--seeds", default="1,2,3", help="the pre-training seeds to summarize (seeds)")
    parser.add_argument("--earlier", action="append", default=[], help="an earlier score report for arms and seeds "
                        "not scored under --work-dir (seeds; repeatable)")
    parser.add_argument("--feature-steps", default=None, help="measure the features of these exported steps only, "
                        "comma-separated (score; default every export)")
    parser.add_argument("--validation-samples", type=int, default=None, help="score every export on about this "
                        "many validation samples, whole batches spread evenly over the split (score, seeds; default "
                        "all: tech-dictionaries' 4,447 masked tokens; debian-docs' split holds ~109k)")
    parser.add_argument("--cost-steps", type=int, default=40, help="steps per timed run (cost)")
    parser.add_argument("--cost-rounds", type=int, default=2, help="rounds of every arm in turn (cost)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--downstream-seeds", type=int, default=1, help="fine-tuning seeds per setting (score)")
    parser.add_argument("--fine-tune-steps", default="final", help="the exports to fine-tune, comma-separated steps "
                        "or final (score)")
    parser.add_argument("--finetune-rows", default="8000,2000", help="supersense train,test rows (evenly spaced; "
                        "time_to_quality.py fine-tunes on 8000,2000)")
    parser.add_argument("--downstream-lrs", default="1e-3,5e-4,3e-4", help="fine-tuning learning rates")
    parser.add_argument("--downstream-dropouts", default="model,0", help="fine-tuning dropout rates; model = its own")
    parser.add_argument("--report-dir", default=None, help="where the report goes (benchmarks/results)")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "benchmarks" / "dropout_plateau"))
    arguments = parser.parse_args()
    arguments.finetune_rows = tuple(int(rows) for rows in arguments.finetune_rows.split(","))
    arguments.downstream_lrs = [float(lr) for lr in arguments.downstream_lrs.split(",")]
    arguments.downstream_dropouts = [None if rate.strip() == "model" else float(rate)
                                     for rate in arguments.downstream_dropouts.split(",")]
    arguments.fine_tune_steps = [step.strip() for step in arguments.fine_tune_steps.split(",") if step.strip()]
    arguments.arms = [arm.strip() for arm in arguments.arms.split(",")]
    if arguments.feature_steps is not None:
        arguments.feature_steps = {int(step) for step in arguments.feature_steps.split(",")}
    unknown = sorted(set(arguments.arms) - set(ARMS) - ({UNTRAINED} if arguments.stage != "train" else set()))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    return arguments


def main() -> None:
    arguments = parse_arguments()
    work = Path(arguments.work_dir).resolve() / arguments.corpus
    corpus = corpus_file(arguments.corpus, work)
    tokenizer_dir, data_dir, manifest = prepare_corpus(corpus, work)
    if arguments.stage == "train":
        # only HF Trainer's arm reads run_mlm's group_texts blocks: on debian-docs (142 MB) building them costs
        # minutes of CPU and a large dataset on disk that a recipe-only call never opens
        hf_data = (group_texts_dataset(work, tokenizer_dir, corpus, manifest)
                   if any(ARMS[name].kind == "hf" for name in arguments.arms) else None)
        for name in arguments.arms:
            run_dir = work / "runs" / f"{name}-seed{arguments.seed}"
            record = train_step_arm(ARMS[name], arguments.seed, run_dir / "train", tokenizer_dir, data_dir, hf_data,
                                    arguments.every, arguments.threads, step_cap=arguments.max_steps)
            record["step_cap"] = arguments.max_steps
            write_atomically(run_dir / "training.json", json.dumps(record, indent=1))
        return
    if arguments.stage == "cost":
        from benchmarks.common.reports import machine_description
        from benchmarks.ttq.settings import RESULTS
        from benchmarks.ttq.step_cost import measure_step_costs

        costs = measure_step_costs([ARMS[name] for name in arguments.arms], arguments.seed, data_dir, work,
                                   arguments.cost_steps, arguments.cost_rounds, arguments.threads)
        report = {"machine": machine_description("cpu"), "command": " ".join(["python", *sys.argv]), **costs}
        destination = Path(arguments.report_dir) if arguments.report_dir else RESULTS
        write_atomically(destination / f"{arguments.report_name}.json", json.dumps(report, indent=1))
        print(json.dumps(report, indent=1))
        return
    if arguments.stage == "seeds":
        from benchmarks.ttq.plateau_seeds import summarize_seeds

        summarize_seeds(arguments, work, data_dir)
        return
    from benchmarks.ttq.plateau_scoring import score_all

    score_all(arguments, work, tokenizer_dir, data_dir)
