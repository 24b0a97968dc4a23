"""The driver: arguments, the runs still missing from the store (each trained in a child process, then scored),
and the report built from every result in the store."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import benchmarks.ttq
from benchmarks.common.mlm import (
    EVALUATION_SEED,
    SEQ_LEN,
    VOCAB_SIZE,
    guess_record,
    line_validation_batches,
    mlm_accuracy,
    packed_validation_batches,
    unigram_baseline,
)
from benchmarks.common.reports import (
    fp32_matmul_gflops,
    machine_description,
    quiet_progress_bars,
    run_in_child,
    write_atomically,
)
from benchmarks.common.tasks import DOWNSTREAM_SEEDS
from benchmarks.ttq.arms import run_arm
from benchmarks.ttq.downstream import FineTuning, choose_setting, fine_tune_with, fine_tuning_grid
from benchmarks.ttq.inputs import (
    CORPORA,
    check_recipe,
    corpus_file,
    downstream_tasks,
    group_texts_dataset,
    prepare_corpus,
    recipe_fingerprint,
)
from benchmarks.ttq.report import cells_of, publish_report, reach_times
from benchmarks.ttq.settings import (
    ARM_TITLES,
    ARMS,
    CALIBRATION_SECONDS,
    CALIBRATION_WARMUP,
    DEFAULT_RECIPE,
    DOWNSTREAM_DROPOUTS,
    DOWNSTREAM_LRS,
    DOWNSTREAM_ROWS,
    DOWNSTREAM_TASKS,
    EXPORT_FRACTIONS,
    QUICK,
    REPO,
    RESULTS,
    WORK_DIR,
    RunSpec,
)
from benchmarks.ttq.store import ResultStore, RunKey, setup_of

ENTRY = REPO / "benchmarks" / "time_to_quality.py"  # what a run's child process runs (`--run-arm`)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=benchmarks.ttq.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: bert-tiny, 0.3-minute budgets, 1 downstream seed on 256/128 rows")
    parser.add_argument("--corpus", default="bundled", choices=CORPORA,
                        help="bundled (KJV + WordNet glosses), debian-docs (scripts/build_pretraining_corpus.py), "
                             "mixed (every 6th-or-so debian-docs document for 2/3 of the text, all of bundled) or "
                             "tech-dictionaries (FOLDOC, Jargon File, V.E.R.A.: `apt-get install dict-foldoc "
                             "dict-jargon dict-vera`; neither task's text)")
    parser.add_argument("--budgets", default=None, help="training minutes per run, comma-separated (10,20,40)")
    parser.add_argument("--arms", default=",".join(ARMS), help="arms to run, comma-separated (a,b,c,d)")
    parser.add_argument("--seeds", default="42", help="pre-training seeds, comma-separated (42)")
    parser.add_argument("--downstream-seeds", type=int, default=None, help="fine-tuning seeds per task (3)")
    parser.add_argument("--downstream-lrs", default=None, help="fine-tuning learning rates to choose from on a dev "
                        "split, per model and task, comma-separated (" + ",".join(f"{lr:g}" for lr in DOWNSTREAM_LRS) + ")")
    parser.add_argument("--downstream-dropouts", default=None, help="fine-tuning dropout rates to choose from with the "
                        "lrs, comma-separated; 'model' keeps the model's own (model,0)")
    parser.add_argument("--model", default=None, help="the classic BERT preset every arm trains (bert-mini)")
    parser.add_argument("--recipe", default=str(DEFAULT_RECIPE), help="arm d's recipe (configs/pretrain/budget-cpu.yaml)")
    parser.add_argument("--calibration", default=None, metavar="SECONDS,WARMUP",
                        help="the step-time calibration that plans HF's steps (and arm d's with step-keyed switches): "
                             f"seconds timed after this many warm-up steps ({CALIBRATION_SECONDS:g},{CALIBRATION_WARMUP}); "
                             "the studies committed before the second debian-docs one ran 20,5: give it to extend them")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--work-dir", default=str(WORK_DIR),
                        help="inputs, runs and the result store (reused: a re-run skips the done runs)")
    parser.add_argument("--results-from", action="append", default=[], metavar="REPORT.json",
                        help="a committed report (e.g. benchmarks/results/time_to_quality_tech_dictionaries.json): "
                             "its runs go into the store first and are not run again, so a study split over "
                             "machines resumes (repeatable)")
    parser.add_argument("--report-dir", default=None,
                        help="where the report goes (benchmarks/results; the work directory with --quick), e.g. "
                             "elsewhere for a screening run that must not replace the study's report")
    parser.add_argument("--report-name", default="time_to_quality",
                        help="the report's file name, without .md / .json / .png (time_to_quality); one per "
                             "corpus keeps each study's report, e.g. time_to_quality_tech_dictionaries")
    parser.add_argument("--run-arm", default=None, help=argparse.SUPPRESS)  # internal: the child process
    arguments = parser.parse_args()
    if arguments.run_arm is not None:
        return arguments
    if not arguments.report_name or Path(arguments.report_name).name != arguments.report_name:
        parser.error(f"--report-name {arguments.report_name!r} must be a file name without a folder "
                     "(--report-dir says where)")
    arguments.arms = [arm.strip() for arm in arguments.arms.split(",")]
    unknown = sorted(set(arguments.arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
    arguments.seeds = [int(seed) for seed in arguments.seeds.split(",")]
    if arguments.budgets is not None:
        arguments.budgets = [float(budget) for budget in arguments.budgets.split(",")]
    if arguments.calibration is not None:
        arguments.calibration = calibration_of(arguments.calibration, parser)
    if arguments.downstream_lrs is not None:
        arguments.downstream_lrs = [float(lr) for lr in arguments.downstream_lrs.split(",")]
    if arguments.downstream_dropouts is not None:
        arguments.downstream_dropouts = [None if rate.strip() == "model" else float(rate)
                                         for rate in arguments.downstream_dropouts.split(",")]
    defaults = QUICK if arguments.quick else {"model": "bert-mini", "budgets": [10.0, 20.0, 40.0], "downstream_seeds": 3,
                                              "calibration": (CALIBRATION_SECONDS, CALIBRATION_WARMUP),
                                              "downstream_rows": DOWNSTREAM_ROWS, "downstream_lrs": list(DOWNSTREAM_LRS),
                                              "downstream_dropouts": list(DOWNSTREAM_DROPOUTS)}
    for key, value in defaults.items():
        if getattr(arguments, key, None) is None:
            setattr(arguments, key, value)
    if arguments.downstream_seeds > len(DOWNSTREAM_SEEDS):
        parser.error(f"--downstream-seeds is at most {len(DOWNSTREAM_SEEDS)}")
    return arguments


def calibration_of(text: str, parser: argparse.ArgumentParser) -> tuple[float, int]:
    """`--calibration SECONDS,WARMUP` as (seconds, warm-up steps)."""
    try:
        seconds, warmup = text.split(",")
        calibration = float(seconds), int(warmup)
    except ValueError:
        parser.error(f"--calibration {text!r} must be SECONDS,WARMUP, e.g. {CALIBRATION_SECONDS:g},{CALIBRATION_WARMUP}")
    if calibration[0] <= 0 or calibration[1] < 0:
        parser.error(f"--calibration {text!r}: the seconds must be above 0 and the warm-up steps at least 0")
    return calibration


def train_run(key: RunKey, spec_values: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    """Train one run in a child process (its own threads and memory), or reuse its finished training record."""
    from bertforge.console import console

    run_dir = runs_dir / key.name
    record_path, spec_path = run_dir / "training.json", run_dir / "spec.json"
    spec = RunSpec(arm=key.arm, budget_minutes=key.budget_minutes, seed=key.seed, out_dir=str(run_dir / "train"),
                   **spec_values)
    same_spec = spec_path.is_file() and json.loads(spec_path.read_text(encoding="utf-8")) == json.loads(
        json.dumps(asdict(spec)))
    if record_path.is_file() and same_spec:  # trained by an earlier invocation that stopped before scoring it
        return json.loads(record_path.read_text(encoding="utf-8"))
    record_path.unlink(missing_ok=True)
    write_atomically(spec_path, json.dumps(asdict(spec), indent=1))
    console.print(f"[bold]{ARM_TITLES[key.arm]}[/bold]: {key.budget_minutes:g} minutes of {spec.model}, seed {key.seed}")
    run_in_child(ENTRY, spec_path, f"the run {key.name}")
    return json.loads(record_path.read_text(encoding="utf-8"))


def task_text_batches(tasks: list[Any], tokenizer_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Each task's test texts, masked once at 15% under the evaluation seed: how well a model predicts the words of
    the text it will be fine-tuned on tells whether its corpus covers that task's domain."""
    return {task.name: line_validation_batches(tokenizer_dir, [row["text"] for row in task.test], EVALUATION_SEED)
            for task in tasks}


def score_run(key: RunKey, record: dict[str, Any], validation: list[dict[str, Any]], tasks: list[Any],
              task_texts: dict[str, list[dict[str, Any]]], downstream_seeds: int, grid: list[FineTuning], work: Path,
              threads: int) -> dict[str, Any]:
    """Validation MLM loss and accuracy of every export; the final model's MLM accuracy on each task's test texts;
    its downstream test accuracy, fine-tuned with the setting `choose_setting` picks for it and the task."""
    from bertforge.console import console

    curve = [point | mlm_accuracy(point["model_dir"], validation, "cpu") for point in record["points"]]
    final_dir = record["points"][-1]["model_dir"]
    task_text_mlm = {name: mlm_accuracy(final_dir, batches, "cpu") for name, batches in task_texts.items()}
    downstream: dict[str, list[float]] = {}
    downstream_setting: dict[str, dict[str, Any]] = {}
    for task in tasks:
        if not downstream_seeds:
            downstream[task.name] = []
            continue
        downstream_setting[task.name] = choose_setting(final_dir, task, key.name, grid, work, threads)
        setting = FineTuning(**downstream_setting[task.name]["chosen"])
        downstream[task.name] = [fine_tune_with(final_dir, task, key.name, setting, seed, work, threads)
                                 for seed in DOWNSTREAM_SEEDS[:downstream_seeds]]
    console.print(f"{key.name}: validation MLM accuracy {curve[-1]['accuracy']:.4f}" + "".join(
        f", {name} {statistics.fmean(values):.4f} ({downstream_setting[name]['chosen_text']})"
        for name, values in downstream.items() if values))
    return {"curve": curve, "task_text_mlm": task_text_mlm, "downstream": downstream,
            "downstream_setting": downstream_setting}


def main() -> None:
    arguments = parse_arguments()
    if arguments.run_arm is not None:
        run_arm(Path(arguments.run_arm))
        return
    import torch

    from bertforge.console import console

    tasks = downstream_tasks(arguments.downstream_rows)
    recipe = Path(arguments.recipe).resolve()
    if "d" in arguments.arms:
        check_recipe(recipe, arguments.model)
    work = Path(arguments.work_dir).resolve()
    work = (work / "quick" if arguments.quick else work) / arguments.corpus
    corpus = corpus_file(arguments.corpus, work)
    store = ResultStore(work / "results")
    torch.set_num_threads(arguments.threads)
    tokenizer_dir, data_dir, manifest = prepare_corpus(corpus, work)
    train_split = manifest["splits"]["train"]
    data = {"train_documents": train_split["documents"], "train_tokens": train_split["tokens"],
            "validation_documents": manifest["splits"]["validation"]["documents"]}
    for report_path in arguments.results_from:
        added = store.import_report(Path(report_path), data)
        console.print(f"{len(added)} run(s) from {report_path} put into the store", soft_wrap=True)
    common = {"corpus": arguments.corpus, "model": arguments.model, "threads": arguments.threads, "seq_len": SEQ_LEN,
              "vocab_size": VOCAB_SIZE, "export_fractions": list(EXPORT_FRACTIONS),
              "calibration": list(arguments.calibration), "downstream_seeds": arguments.downstream_seeds,
              "downstream_lrs": arguments.downstream_lrs, "downstream_dropouts": arguments.downstream_dropouts,
              "downstream_rows": {name: [len(task.train), len(task.test)] for name, task in
                                  zip(DOWNSTREAM_TASKS, tasks, strict=True)}}

    recipe_settings = {"recipe": str(recipe), "recipe_sha256": recipe_fingerprint(recipe) if recipe.is_file() else None}

    def settings_for(arm: str) -> dict[str, Any]:
        return common | (recipe_settings if arm == "d" else {})

    keys = [RunKey(arm, budget, seed) for seed in arguments.seeds for budget in arguments.budgets
            for arm in arguments.arms]
    pending = store.pending(keys, settings_for)
    machine = machine_description("cpu") | {"fp32_matmul_gflops": fp32_matmul_gflops()}  # before any run, on idle cores
    console.print(f"{len(keys) - len(pending)} of {len(keys)} runs already in {store.directory}; "
                  f"{len(pending)} to run")
    quiet_progress_bars()
    validation = packed_validation_batches(data_dir, EVALUATION_SEED)
    guess, baseline = unigram_baseline(data_dir, validation)  # the plateau's bar, on the masks every arm is scored on
    if pending:
        task_texts = task_text_batches(tasks, tokenizer_dir)
        hf_data = group_texts_dataset(work, tokenizer_dir, corpus, manifest)
        for key in pending:
            record = train_run(key, {
                "model": arguments.model, "threads": arguments.threads, "tokenizer_dir": str(tokenizer_dir),
                "data_dir": str(data_dir if key.arm in ("c", "d") else hf_data),
                "recipe": str(recipe) if key.arm == "d" else None, "calibration": arguments.calibration},
                work / "runs")
            quality = score_run(key, record, validation, tasks, task_texts, arguments.downstream_seeds,
                                fine_tuning_grid(arguments.downstream_lrs, arguments.downstream_dropouts), work,
                                arguments.threads)
            store.save(key, {"arm": key.arm, "budget_minutes": key.budget_minutes, "seed": key.seed,
                             "settings": settings_for(key.arm), "machine": machine, "training": record} | quality)
    machine["load_average_end"] = os.getloadavg()[0]
    results = [result for result in store.results()
               if setup_of(result["settings"]) == setup_of(settings_for(result["arm"]))]
    report = {
        "command": shlex.join(["python", *sys.argv]), "machine": machine,
        "settings": common | {"seeds_present": sorted({result["seed"] for result in results})},
        "data": data | {"validation_masked_tokens": results[0]["curve"][-1]["masked_tokens"] if results else 0,
                        "manpages_rows": common["downstream_rows"]["manpages"],
                        "unigram_guess": guess_record(guess), "unigram_accuracy": baseline},
        "results": results}
    target, times = reach_times(cells_of(results))
    report["time_to_quality"] = {"target_accuracy": target, "per_arm": times}
    destination = Path(arguments.report_dir) if arguments.report_dir else work if arguments.quick else RESULTS
    table, written = publish_report(destination / arguments.report_name, report)
    print(table)
    console.print(f"written to {', '.join(str(path) for path in written)}", soft_wrap=True)
