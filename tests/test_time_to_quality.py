"""benchmarks/time_to_quality.py's parts (`benchmarks.ttq`, `benchmarks.common`) that decide its numbers without
a long run: the time-to-reach interpolation and its target, the resumable result store, the dev split and rule that choose each model's
fine-tuning settings, the reuse of a finished fine-tune, the recipe check of arm (d) and the budgets its
step-keyed switches get, and the budget clock that stops Hugging Face's `Trainer` (a real one, on a 2-layer
BertForMaskedLM)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.common.corpora import corpus_documents, write_mixed_corpus
from benchmarks.common.hf_arms import MIN_TIMED_STEPS, BudgetClock, StepTiming, calibration_done
from benchmarks.common.reports import fp32_matmul_gflops
from benchmarks.common.tasks import TaskData
from benchmarks.ttq.downstream import (
    FineTuning,
    best_setting,
    code_fingerprint,
    dev_split,
    fine_tune_accuracy,
    fine_tuning_grid,
    finished_fine_tune,
)
from benchmarks.ttq.inputs import check_recipe
from benchmarks.ttq.planning import (
    StepCost,
    calibration_overrides,
    cheapest_calibration_overrides,
    cheapest_step,
    step_cost,
    step_tokens,
    steps_filling,
)
from benchmarks.ttq.report import (
    against_b,
    cells_of,
    matmul_speeds,
    reach_times,
    render,
    render_against_b,
    runs_by_cpu,
    time_to_reach,
    write_report,
)
from benchmarks.ttq.settings import CODE_FILE, DEFAULT_RECIPE, RunSpec, bertforge_config
from benchmarks.ttq.store import ResultStore, RunKey
from tests.helpers.docs_workspace import supersense_rows
from tests.helpers.finetuning import minilm_dir


def run_result(arm: str, budget: float, curve: list[tuple[float, float]], seed: int = 42,
               masked_tokens: int | None = None) -> dict[str, Any]:
    """A stored run's record; `masked_tokens`, where given, on every curve point, as the stored runs carry it."""
    counted = {} if masked_tokens is None else {"masked_tokens": masked_tokens}
    return {"arm": arm, "budget_minutes": budget, "seed": seed,
            "curve": [{"minutes": minutes, "accuracy": accuracy, "loss": 1.0, **counted} for minutes, accuracy in curve]}


def test_time_to_reach_interpolates_between_the_exports_around_the_first_crossing() -> None:
    curve = [(1.0, 0.10), (2.0, 0.30), (4.0, 0.50), (5.0, 0.20), (6.0, 0.60)]
    assert time_to_reach(curve, 0.40) == pytest.approx(3.0)
    assert time_to_reach(curve, 0.50) == pytest.approx(4.0)


def test_time_to_reach_is_none_when_never_reached_and_the_first_export_when_reached_there() -> None:
    assert time_to_reach([(1.0, 0.1), (2.0, 0.2)], 0.5) is None
    assert time_to_reach([(1.5, 0.6), (3.0, 0.7)], 0.5) == 1.5


def test_the_target_is_b_at_its_largest_budget_and_each_arm_reaches_it_in_its_earliest_run() -> None:
    results = [
        run_result("b", 10.0, [(5.0, 0.20), (10.0, 0.30)]),
        run_result("b", 40.0, [(20.0, 0.30), (40.0, 0.40)]),
        # the 10-minute run reaches 0.40 at 7.5 minutes, the 40-minute run only at 15
        run_result("d", 10.0, [(5.0, 0.30), (10.0, 0.50)]),
        run_result("d", 40.0, [(10.0, 0.30), (20.0, 0.50)]),
        run_result("a", 40.0, [(20.0, 0.10), (40.0, 0.20)]),
    ]
    target, times = reach_times(cells_of(results))
    assert target == pytest.approx(0.40)
    assert times["d"] == (pytest.approx(7.5), 10.0)
    assert times["b"] == (pytest.approx(40.0), 40.0)
    assert times["a"] is None


def with_downstream(result: dict[str, Any], supersense: list[float], manpages: list[float]) -> dict[str, Any]:
    return {**result, "downstream": {"supersense": supersense, "manpages": manpages}}


def test_each_arm_is_held_against_b_at_its_own_budget_with_intervals_over_fine_tunes_and_seed_means() -> None:
    """Issue 40's cell: (b)'s accuracy at the same budget (not its largest) is the target, and a budget (b) did not
    run has no row; the seed-mean interval needs 2+ seeds a side."""
    results = [
        with_downstream(run_result("b", 10.0, [(5.0, 0.04), (10.0, 0.10)], seed=1), [0.30, 0.32], [0.60, 0.62]),
        with_downstream(run_result("b", 10.0, [(5.0, 0.05), (10.0, 0.14)], seed=2), [0.40, 0.42], [0.70, 0.72]),
        with_downstream(run_result("d", 10.0, [(5.0, 0.10), (10.0, 0.20)], seed=1), [0.50, 0.52], [0.80, 0.82]),
        with_downstream(run_result("d", 10.0, [(5.0, 0.14), (10.0, 0.22)], seed=2), [0.51, 0.53], [0.81, 0.79]),
        with_downstream(run_result("b", 20.0, [(10.0, 0.15), (20.0, 0.30)], seed=1), [0.5], [0.8]),
        with_downstream(run_result("d", 20.0, [(10.0, 0.25), (20.0, 0.35)], seed=1), [0.6], [0.9]),
        with_downstream(run_result("d", 40.0, [(20.0, 0.4), (40.0, 0.5)], seed=1), [0.6], [0.9]),
    ]
    rows = against_b(cells_of(results))
    assert [(row.budget_minutes, row.arm, row.seeds, row.b_seeds) for row in rows] == [(10.0, "d", 2, 2),
                                                                                      (20.0, "d", 1, 1)]
    ten, twenty = rows
    assert ten.target == pytest.approx(0.12)  # (b)'s mean at 10 minutes
    assert ten.minutes_to_target is not None and ten.first_export_minutes == 5.0
    assert ten.minutes_to_target == pytest.approx(5.0)  # d's mean curve is at 0.12 at its first export
    supersense = ten.downstream["supersense"]
    assert supersense is not None and supersense.points == pytest.approx(100 * (0.515 - 0.36))
    assert supersense.over_fine_tunes is not None and supersense.over_seed_means is not None
    low, high = supersense.over_seed_means
    assert low < supersense.points < high and high - low > 0
    assert twenty.target == pytest.approx(0.30) and twenty.minutes_to_target == pytest.approx(15.0)
    manpages = twenty.downstream["manpages"]
    assert manpages is not None and manpages.points == pytest.approx(10.0)
    assert manpages.over_fine_tunes is None and manpages.over_seed_means is None
    table = "\n".join(render_against_b(rows))
    assert "| 10 | (d) bertforge, budget recipe | 2 / 2 | 0.1200 | ≤ 5.00 | ≥ 2.00× |" in table
    assert "| 20 | (d) bertforge, budget recipe | 1 / 1 | 0.3000 | 15.00 | 1.33× | — | +10.0, —; — | +10.0, —; — |" in table


def test_the_ratio_is_also_given_with_b_accuracy_one_standard_error_higher_and_lower() -> None:
    """Where both arms cross a shelf (bundled, 40 minutes: (d) rose 0.1695 -> 0.1770 in ten minutes), (b)'s accuracy
    moved by its measurement's noise moves the ratio a long way; the cell shows both ends."""
    masked_tokens = 7474
    b_final, d_curve = 0.1751, [(5.0, 0.1547), (10.0, 0.1695), (20.0, 0.1770), (30.0, 0.2141), (40.0, 0.2474)]
    b_run = run_result("b", 40.0, [(20.0, 0.1715), (40.0, b_final)], masked_tokens=masked_tokens)
    d_run = run_result("d", 40.0, d_curve, masked_tokens=masked_tokens)
    (row,) = against_b(cells_of([with_downstream(b_run, [0.6], [0.8]), with_downstream(d_run, [0.65], [0.82])]))
    error = math.sqrt(b_final * (1 - b_final) / masked_tokens)
    assert error == pytest.approx(0.0044, abs=1e-4)
    assert row.minutes_to_target == pytest.approx(time_to_reach(d_curve, b_final))
    assert row.minutes_within_error == (pytest.approx(time_to_reach(d_curve, b_final - error)),
                                        pytest.approx(time_to_reach(d_curve, b_final + error)))
    low, high = (40.0 / minutes for minutes in reversed(row.minutes_within_error))
    assert low < 40.0 / row.minutes_to_target < high and high - low > 1.0  # a shelf: 1.93x to 3.45x around 2.29x
    table = "\n".join(render_against_b([row]))
    assert f"| 2.29× | {low:.2f}× / {high:.2f}× |" in table

    # a target one error higher that the arm never reaches has no ratio at that end
    short = run_result("d", 40.0, [(20.0, 0.1700), (40.0, 0.1760)], masked_tokens=masked_tokens)
    (row,) = against_b(cells_of([with_downstream(b_run, [0.6], [0.8]), with_downstream(short, [0.65], [0.82])]))
    assert row.minutes_within_error is not None and row.minutes_within_error[1] is None
    assert "| — / " in "\n".join(render_against_b([row]))


def full_result(arm: str, seed: int, final_accuracy: float, supersense: list[float]) -> dict[str, Any]:
    curve = [{"minutes": 5.0, "accuracy": 0.05, "loss": 7.0, "step": 100, "tokens": 400_000},
             {"minutes": 10.0, "accuracy": final_accuracy, "loss": 6.0, "step": 200, "tokens": 800_000}]
    return {"arm": arm, "budget_minutes": 10.0, "seed": seed, "curve": curve, "machine": {"cpu": "a CPU"},
            "training": {"planned_steps": 200}, "downstream": {"supersense": supersense, "manpages": [0.8]},
            "downstream_setting": {}, "task_text_mlm": {task: {"accuracy": 0.1} for task in ("supersense", "manpages")}}


def full_report(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "command": "python benchmarks/time_to_quality.py", "results": results,
        "machine": {"cpu": "a CPU", "cpu_count": 2, "torch": "2", "transformers": "5", "load_average_start": 0.1,
                    "load_average_end": 0.2},
        "settings": {"model": "bert-mini", "corpus": "tech-dictionaries", "threads": 2, "downstream_seeds": 1,
                     "downstream_lrs": [1e-3], "downstream_dropouts": [None], "seeds_present": [1, 2],
                     "downstream_rows": {"supersense": [8000, 2000], "manpages": [2999, 387]}},
        "data": {"train_documents": 10, "train_tokens": 100, "validation_documents": 2, "validation_masked_tokens": 50,
                 "manpages_rows": [2999, 387], "unigram_guess": {"token": "."}, "unigram_accuracy": 0.0526},
    }


def test_the_report_counts_the_seeds_that_ended_on_the_plateau_against_the_unigram_baseline() -> None:
    """Issue 40: the plateau decides the downstream figures, so each cell says how many of its seeds ended on it
    (no more than 0.01 above always answering the training data's most frequent token, on the same masks)."""
    results = [full_result("b", 1, 0.0600, [0.3]), full_result("b", 2, 0.0900, [0.5]),
               full_result("d", 1, 0.1700, [0.5]), full_result("d", 2, 0.1650, [0.52])]
    table = render(full_report(results), cells_of(results))
    assert "most frequent maskable token ('.', as `bertforge pretrain` does) scores 0.0526" in table
    main_table = next(part for part in table.split("\n\n") if "| on the plateau |" in part)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in main_table.splitlines() if line.startswith("| (")}
    assert rows["| (b) HF Trainer, tuned"][6] == "1 of 2"  # 0.0600 is within 0.01 of 0.0526; 0.0900 is not
    assert rows["| (d) bertforge, budget recipe"][6] == "0 of 2"


def test_the_top_table_gives_a_lower_bound_where_an_arm_reaches_the_target_at_its_first_export() -> None:
    """An arm already past the target at its first export reached it at most that export's minutes in, so its ratio
    is at least the budget over them: the top table says so as the per-budget table does."""
    results = [full_result("b", 1, 0.0600, [0.3]), full_result("b", 2, 0.0900, [0.5]),
               full_result("d", 1, 0.1700, [0.5])]
    results[2]["curve"][0]["accuracy"] = 0.1000  # above (b)'s 0.0750 at 5 minutes
    table = render(full_report(results), cells_of(results))
    top = next(part for part in table.split("\n\n") if "| in the run of |" in part)
    assert "| (d) bertforge, budget recipe | ≤ 5.00 | 10 min | ≥ 2.00× |" in top
    assert "| (b) HF Trainer, tuned | 10.00 | 10 min | 1.00× |" in top


def test_a_named_report_writes_its_three_files_and_leaves_another_corpus_report_alone(tmp_path: Path) -> None:
    """`--report-name`: each corpus's study keeps its own report in benchmarks/results."""
    other = tmp_path / "time_to_quality.md"
    other.write_text("the debian-docs study", encoding="utf-8")
    results = [run_result("b", 10.0, [(5.0, 0.05), (10.0, 0.07)]), run_result("d", 10.0, [(5.0, 0.1), (10.0, 0.17)])]
    cells = cells_of(results)
    target, _ = reach_times(cells)
    written = write_report(tmp_path / "time_to_quality_tech_dictionaries", {"results": results}, "| table |", cells,
                           target, "a title")
    assert [path.name for path in written] == [f"time_to_quality_tech_dictionaries.{suffix}"
                                               for suffix in ("md", "json", "png")]
    assert written[0].read_text(encoding="utf-8") == "| table |"
    assert json.loads(written[1].read_text(encoding="utf-8")) == {"results": results}
    assert written[2].stat().st_size > 0
    assert other.read_text(encoding="utf-8") == "the debian-docs study"
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(
        [other.name, *(path.name for path in written)])


def test_curves_are_averaged_over_seeds_point_by_point() -> None:
    cells = cells_of([run_result("c", 10.0, [(2.0, 0.2), (10.0, 0.4)], seed=1),
                      run_result("c", 10.0, [(2.2, 0.3), (10.0, 0.6)], seed=2)])
    assert cells["c", 10.0].mean_curve() == [(pytest.approx(2.1), pytest.approx(0.25)),
                                             (pytest.approx(10.0), pytest.approx(0.5))]


def test_the_dev_split_holds_out_every_tenth_training_row_and_leaves_the_test_rows_unseen() -> None:
    train = [{"text": f"row {i}", "label": str(i % 3)} for i in range(25)]
    test = [{"text": "a test row", "label": "0"}]
    task = TaskData("supersense", "classification", train, test, ["0", "1", "2"], False)
    dev = dev_split(task)
    assert dev.name == "supersense-dev" and dev.labels == task.labels
    assert [row["text"] for row in dev.test] == ["row 9", "row 19"]
    assert sorted(dev.train + dev.test, key=lambda row: int(row["text"].split()[1])) == train
    assert test[0] not in dev.train + dev.test and task.test == test  # the real test split is neither used nor changed


def test_the_best_dev_accuracy_chooses_the_setting_and_a_tie_goes_to_the_gentler_one() -> None:
    own, off = FineTuning(5e-4), FineTuning(5e-4, 0.0)
    assert best_setting({FineTuning(1e-3): 0.40, own: 0.50, off: 0.52, FineTuning(3e-4): 0.51}) == off
    # equal scores: the lower lr, then the model's own dropout before a rate
    assert best_setting({FineTuning(1e-3): 0.52, own: 0.40, FineTuning(3e-4, 0.0): 0.52}) == \
        FineTuning(3e-4, 0.0)
    assert best_setting({off: 0.52, own: 0.52, FineTuning(5e-4, 0.1): 0.52}) == own
    assert best_setting({off: 0.52, FineTuning(5e-4, 0.1): 0.52}) == FineTuning(5e-4, 0.1)


def test_a_fine_tuning_setting_overrides_the_lr_and_every_dropout_or_keeps_the_models_own() -> None:
    assert FineTuning(5e-4).overrides == ("optim.lr=0.0005",)
    assert FineTuning(5e-4, 0.0).overrides == ("optim.lr=0.0005", "model.hidden_dropout=0.0",
                                               "model.attention_dropout=0.0", "model.classifier_dropout=0.0")
    assert FineTuning(5e-4).slug == "lr0.0005" and FineTuning(5e-4, 0.0).slug == "lr0.0005-dropout0"
    assert [str(setting) for setting in fine_tuning_grid([1e-3, 3e-4], [None, 0.0])] == [
    "lr 0.001, dropout the model's", "lr 0.001, dropout 0", "lr 0.0003, dropout the model's", "lr 0.0003, dropout 0"]


def test_a_finished_fine_tune_is_reused_only_with_the_same_config_and_code_after_the_models_last_write(
        tmp_path: Path) -> None:
    from bertforge.config import config_to_yaml, finetune_defaults, load_config

    model_dir, run_dir = tmp_path / "model", tmp_path / "run"
    model_dir.mkdir(), run_dir.mkdir()
    (model_dir / "model.safetensors").write_bytes(b"weights")
    config = load_config(None, ["optim.lr=0.0005"], base=finetune_defaults())
    (run_dir / "config.yaml").write_text(config_to_yaml(config), encoding="utf-8")
    assert not finished_fine_tune(run_dir, config, model_dir)  # no test results: it did not finish
    results = run_dir / "test_results.json"
    results.write_text("{}")
    os.utime(model_dir / "model.safetensors", (time.time() - 60, time.time() - 60))
    assert not finished_fine_tune(run_dir, config, model_dir)  # run by unknown code
    (run_dir / CODE_FILE).write_text("0" * 64)
    assert not finished_fine_tune(run_dir, config, model_dir)  # run by other code
    (run_dir / CODE_FILE).write_text(code_fingerprint())
    assert finished_fine_tune(run_dir, config, model_dir)
    other = load_config(None, ["optim.lr=0.0003"], base=finetune_defaults())
    assert not finished_fine_tune(run_dir, other, model_dir)
    os.utime(model_dir / "model.safetensors", (time.time() + 60, time.time() + 60))  # the model was written again
    assert not finished_fine_tune(run_dir, config, model_dir)


def test_a_scored_fine_tune_keeps_its_scores_not_its_weights_and_is_read_back_without_them(tmp_path: Path) -> None:
    train, test = supersense_rows("train", 32), supersense_rows("test", 16)
    task = TaskData("glosses", "classification", train, test, sorted({row["label"] for row in train + test}), False)

    def score() -> float:  # one epoch of real all-MiniLM-L6-v2 on 32 glosses
        return fine_tune_accuracy(str(minilm_dir()), task, "minilm", 17, tmp_path, 1,
                                  ("train.max_epochs=1", "log.plots=false"))

    accuracy = score()
    run_dir = tmp_path / "downstream" / "minilm-glosses-ft17"
    kept = {path.name for path in run_dir.iterdir()}
    assert {"test_results.json", "config.yaml", CODE_FILE} <= kept and not kept & {"checkpoints", "final"}
    scored_at = (run_dir / "test_results.json").stat().st_mtime_ns
    assert score() == accuracy
    assert (run_dir / "test_results.json").stat().st_mtime_ns == scored_at  # read back, not fine-tuned again


def test_the_mixed_corpus_takes_every_kth_large_document_and_spreads_both_parts_through_the_file(
        tmp_path: Path) -> None:
    large, small = tmp_path / "large.txt", tmp_path / "small.txt"
    large_documents = [f"large {i:02d} ".ljust(20, "x") for i in range(60)]  # 1,200 characters
    small_documents = [f"small {i} ".ljust(60, "y") for i in range(10)]  # 600 characters
    large.write_text("".join(f"{d}\n\n" for d in large_documents), encoding="utf-8")
    small.write_text("".join(f"{d}\n\n" for d in small_documents), encoding="utf-8")
    out = tmp_path / "mixed" / "corpus.txt"
    taken = write_mixed_corpus(large, small, 0.5, out)  # half of the text from large: every 2nd document
    documents = corpus_documents(out)
    assert taken == {"large": 30, "small": 10} and len(documents) == 40
    assert [d for d in documents if d.startswith("large")] == large_documents[::2]
    assert [d for d in documents if d.startswith("small")] == small_documents
    # evenly spread: each quarter of the file holds a quarter of each part, so the validation tail holds both
    for quarter in range(4):
        part = documents[quarter * 10:(quarter + 1) * 10]
        assert sum(d.startswith("small") for d in part) in (2, 3)
    assert write_mixed_corpus(large, small, 0.75, tmp_path / "three-quarters.txt")["large"] == 60
    assert not list(out.parent.glob(".*"))  # written atomically, no temporary left
    write_mixed_corpus(large, small, 0.5, tmp_path / "again.txt")
    assert (tmp_path / "again.txt").read_bytes() == out.read_bytes()


def test_the_store_skips_done_runs_and_refuses_results_measured_with_other_settings(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results")
    keys = [RunKey("c", 10.0, 42), RunKey("d", 10.0, 42), RunKey("c", 0.5, 7)]
    settings = {"c": {"model": "bert-mini"}, "d": {"model": "bert-mini", "recipe_sha256": "abc"}}
    assert store.pending(keys, settings.__getitem__) == keys
    store.save(keys[0], run_result("c", 10.0, [(10.0, 0.3)]) | {"settings": settings["c"]})
    store.save(keys[2], run_result("c", 0.5, [(0.5, 0.1)], seed=7) | {"settings": settings["c"]})
    assert store.pending(keys, settings.__getitem__) == [keys[1]]
    assert sorted(path.name for path in store.directory.iterdir()) == ["c-0.5min-seed7.json", "c-10min-seed42.json"]
    assert [result["seed"] for result in store.results()] == [7, 42]
    changed = settings | {"c": {"model": "bert-tiny"}}
    with pytest.raises(SystemExit, match="other settings \\(model"):
        store.pending(keys, changed.__getitem__)


def test_the_calibration_is_sixty_seconds_after_twenty_steps_unless_given_and_a_bad_one_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.ttq.cli import parse_arguments

    monkeypatch.setattr("sys.argv", ["time_to_quality.py"])
    assert parse_arguments().calibration == (60.0, 20)
    monkeypatch.setattr("sys.argv", ["time_to_quality.py", "--calibration", "20,5"])  # the first studies' setting
    assert parse_arguments().calibration == (20.0, 5)
    for bad in ("20", "20,5.5", "0,5", "20,-1"):
        monkeypatch.setattr("sys.argv", ["time_to_quality.py", "--calibration", bad])
        with pytest.raises(SystemExit) as exit_info:
            parse_arguments()
        assert exit_info.value.code == 2
        assert f"--calibration {bad!r}" in capsys.readouterr().err


def test_a_recipe_is_the_same_set_up_at_another_path_and_another_one_with_other_content(tmp_path: Path) -> None:
    """A study resumed from a checkout at another path (a fresh machine, a worktree) keeps arm (d)'s runs: the
    recipe's content, not where the file lay, is part of the set-up."""
    store = ResultStore(tmp_path / "results")
    key = RunKey("d", 10.0, 1)
    here = {"model": "bert-mini", "recipe": "/work/main/configs/pretrain/budget-cpu.yaml", "recipe_sha256": "abc"}
    store.save(key, run_result("d", 10.0, [(10.0, 0.3)], seed=1) | {"settings": here})
    elsewhere = here | {"recipe": "/home/someone/bertforge/configs/pretrain/budget-cpu.yaml"}
    assert store.pending([key], lambda arm: elsewhere) == []
    with pytest.raises(SystemExit, match="other settings \\(recipe_sha256"):
        store.pending([key], lambda arm: elsewhere | {"recipe_sha256": "def"})


def test_a_committed_report_seeds_the_store_so_a_study_resumes_on_another_machine(tmp_path: Path) -> None:
    settings = {"model": "bert-mini"}
    done = [run_result("b", 10.0, [(10.0, 0.2)], seed=1) | {"settings": settings, "machine": {"cpu": "Xeon"}},
            run_result("d", 10.0, [(10.0, 0.3)], seed=1) | {"settings": settings, "machine": {"cpu": "EPYC"}}]
    data = {"train_documents": 32337, "train_tokens": 31819248, "validation_documents": 660}
    report = tmp_path / "time_to_quality.json"
    report.write_text(json.dumps({"data": data | {"unigram_accuracy": 0.06}, "results": done}), encoding="utf-8")
    store = ResultStore(tmp_path / "results")
    kept = run_result("d", 10.0, [(10.0, 0.9)], seed=1) | {"settings": settings, "machine": {"cpu": "EPYC"}}
    store.save(RunKey("d", 10.0, 1), kept)

    assert store.import_report(report, data) == [RunKey("b", 10.0, 1)]
    keys = [RunKey(arm, 10.0, seed) for seed in (1, 2) for arm in ("b", "d")]
    assert store.pending(keys, lambda arm: settings) == [RunKey("b", 10.0, 2), RunKey("d", 10.0, 2)]
    assert store.results()[1]["curve"][0]["accuracy"] == 0.9  # the store's own run is kept, not replaced
    assert runs_by_cpu(store.results()) == "1 on EPYC, 1 on Xeon"
    assert matmul_speeds(store.results()) == "2 run(s) from before the probe"
    probed = [result | {"machine": result["machine"] | {"fp32_matmul_gflops": 171.4}} for result in store.results()[:1]]
    assert matmul_speeds(probed + store.results()[1:]) == "b-10min-seed1 171, 1 run(s) from before the probe"
    with pytest.raises(SystemExit, match="other settings"):
        store.pending(keys, lambda arm: {"model": "bert-tiny"})

    report.write_text("{}", encoding="utf-8")
    with pytest.raises(SystemExit, match="is not a time-to-quality report"):
        store.import_report(report, data)


def test_the_matmul_probe_measures_a_rate_in_gflops_from_the_median_product() -> None:
    rate = fp32_matmul_gflops(size=128, rounds=3)
    assert 0.01 < rate < 1e5  # 2·128³ flops in between 4 s and 40 ns: GFLOP/s, not flops or seconds


def test_a_report_measured_on_another_build_of_the_corpus_is_refused_and_nothing_is_imported(tmp_path: Path) -> None:
    """A corpus rebuilt from Debian packages that moved on, or with other evaluation tasks built to keep out, is
    another corpus (debian-docs held 32,342, 32,337 and 32,341 training documents in three builds): a study resumed
    on it must not put the old build's runs in its table."""
    report = tmp_path / "time_to_quality.json"
    reported = {"train_documents": 32342, "train_tokens": 31831288, "validation_documents": 660}
    result = run_result("b", 10.0, [(10.0, 0.2)], seed=1) | {"settings": {"model": "bert-mini"}}
    report.write_text(json.dumps({"data": reported, "results": [result]}), encoding="utf-8")
    store = ResultStore(tmp_path / "results")
    rebuilt = {"train_documents": 32337, "train_tokens": 31819248, "validation_documents": 660}
    with pytest.raises(SystemExit, match="another corpus .*train_documents: 32342 there, 32337 here, "
                                         "train_tokens: 31831288 there, 31819248 here"):
        store.import_report(report, rebuilt)
    assert not store.directory.exists() or not any(store.directory.iterdir())
    assert store.import_report(report, reported) == [RunKey("b", 10.0, 1)]


def test_arm_d_refuses_a_missing_recipe_and_one_that_changes_the_model_shape(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="does not exist yet"):
        check_recipe(tmp_path / "budget-cpu.yaml", "bert-mini")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\n  hidden_dropout: 0.0\nschedule:\n  name: one_cycle\n", encoding="utf-8")
    check_recipe(recipe, "bert-mini")  # dropout and schedule are the recipe's to choose
    recipe.write_text("model:\n  preset: bert-small\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="--model bert-small"):
        check_recipe(recipe, "bert-mini")
    recipe.write_text("model:\n  num_layers: 2\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="model.num_layers"):
        check_recipe(recipe, "bert-mini")
    recipe.write_text("data:\n  mask_schedule: linear\n  mask_prob_start: 0.3\n", encoding="utf-8")
    check_recipe(recipe, "bert-mini")  # step-keyed: arm d gives it train.max_steps as well
    check_recipe(DEFAULT_RECIPE, "bert-mini")  # the shipped recipe is one arm d can train


STEP_KEYED_RECIPE = """\
data:
  mask_schedule: linear
  mask_prob_start: 0.3
  seq_len_schedule:
  - {seq_len: 64, until: 0.5}
train:
  micro_batch_size: 8
  global_batch_size: 32
  batch_ramp_start: 8
  ema: 0.999
"""


def arm_d_spec(tmp_path: Path, recipe_text: str) -> Any:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(recipe_text, encoding="utf-8")
    return RunSpec(arm="d", budget_minutes=10.0, seed=42, model="bert-mini", threads=1, out_dir=str(tmp_path / "out"),
                   tokenizer_dir=str(tmp_path / "tokenizer"), data_dir=str(tmp_path / "data"), recipe=str(recipe),
                   calibration=(20.0, 5))


@pytest.mark.parametrize(("recipe_text", "switches"), [
    (STEP_KEYED_RECIPE, ["data.mask_schedule", "data.seq_len_schedule", "train.batch_ramp_start"]),
    ("data:\n  seq_len_schedule:\n  - {seq_len: 64, until: 0.9}\n", ["data.seq_len_schedule"]),
    ("train:\n  micro_batch_size: 8\n  batch_ramp_start: 16\n", ["train.batch_ramp_start"]),
    ("schedule:\n  name: one_cycle\ntrain:\n  ema: 0.999\noptim:\n  name: stable_adamw\n", []),
], ids=["all-three", "sequence-length-phases", "batch-ramp", "time-keyed-only"])
def test_step_keyed_switches_are_the_mask_schedule_the_sequence_length_phases_and_the_batch_ramp(
        tmp_path: Path, recipe_text: str, switches: list[str]) -> None:
    assert bertforge_config(arm_d_spec(tmp_path, recipe_text)).step_keyed_switches() == switches


def test_arm_d_with_step_keyed_switches_trains_for_planned_steps_with_the_time_budget_as_a_hard_stop(
        tmp_path: Path) -> None:
    spec = arm_d_spec(tmp_path, STEP_KEYED_RECIPE)
    time_only = bertforge_config(spec)
    assert (time_only.train.max_steps, time_only.train.max_time_minutes) == (None, 10.0)

    both = bertforge_config(spec, max_steps=1234)
    assert (both.train.max_steps, both.train.max_time_minutes) == (1234, 10.0)
    assert (both.data.mask_schedule, both.data.mask_prob_start, both.train.batch_ramp_start) == ("linear", 0.3, 8)

    # the calibration times the recipe's most expensive step: full batch and length, the higher mask rate
    calibration = bertforge_config(spec, max_steps=1_000_000, overrides=calibration_overrides(time_only))
    assert calibration.step_keyed_switches() == []
    assert (calibration.data.mask_prob, calibration.train.global_batch_size, calibration.data.seq_len) == (0.3, 32, 128)
    assert (calibration.train.max_steps, calibration.train.max_time_minutes) == (1_000_000, None)
    assert (calibration.run.name, calibration.train.ema) == ("calibration", 0.999)


def test_the_cheapest_calibration_runs_the_first_ramp_step_at_the_shortest_phase_length(tmp_path: Path) -> None:
    time_only = bertforge_config(arm_d_spec(tmp_path, STEP_KEYED_RECIPE))
    assert cheapest_step(time_only) == (8, 64)
    cheapest = bertforge_config(arm_d_spec(tmp_path, STEP_KEYED_RECIPE), max_steps=1_000_000,
                                    overrides=cheapest_calibration_overrides(time_only))
    assert (cheapest.train.global_batch_size, cheapest.train.batch_ramp_start, cheapest.data.mask_prob) == (8, None, 0.3)
    assert [(phase.seq_len, phase.until) for phase in cheapest.data.seq_len_schedule] == [(64, 0.999999)]
    mask_only = bertforge_config(arm_d_spec(tmp_path, "data:\n  mask_schedule: linear\n  mask_prob_start: 0.3\n"))
    assert cheapest_step(mask_only) == (32, 128)  # the mask rate changes no shape: one calibration is enough


def test_step_tokens_follow_the_batch_ramp_and_the_sequence_length_phases(tmp_path: Path) -> None:
    config = bertforge_config(arm_d_spec(tmp_path, STEP_KEYED_RECIPE), max_steps=10)
    # the ramp grows 8 -> 32 over ceil(0.6 * 10) = 6 steps in multiples of the micro-batch (8); 64 tokens until
    # half the steps
    samples = [8, 8, 16, 16, 24, 24, 32, 32, 32, 32]
    lengths = [64] * 5 + [128] * 5
    assert step_tokens(config, 10).tolist() == [s * n for s, n in zip(samples, lengths, strict=True)]


def test_the_planned_steps_are_the_most_whose_modelled_seconds_fit_the_budget(tmp_path: Path) -> None:
    config = bertforge_config(arm_d_spec(tmp_path, STEP_KEYED_RECIPE))
    cost = StepCost(cheap_tokens=8 * 64, cheap_seconds=0.05, full_tokens=32 * 128, full_seconds=0.5)
    budget = 600.0
    planned = steps_filling(budget, cost, config)
    assert cost.seconds(step_tokens(config, planned)).sum() <= budget
    assert cost.seconds(step_tokens(config, planned + 1)).sum() > budget
    # the old plan, every step at the dearest shape, leaves a third of this budget unused
    assert planned > 1.4 * budget / cost.full_seconds
    same_shape = StepCost(32 * 128, 0.5, 32 * 128, 0.5)
    mask_only = bertforge_config(arm_d_spec(tmp_path, "data:\n  mask_schedule: linear\n  mask_prob_start: 0.3\n"))
    assert steps_filling(budget, same_shape, mask_only) == 1200


def test_both_calibrations_train_the_recipe_on_real_data_and_leave_nothing_behind(
        tmp_path: Path, corpus_slice: Path, tokenizer_dir: Path) -> None:
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data

    mlm_data = tmp_path / "mlm"  # MLM-only samples: sequence-length phases refuse NSP pairs
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, mlm_data, PrepareSettings(nsp=False, split=(9, 1)),
                             workers=0, progress=False)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(STEP_KEYED_RECIPE.replace("{seq_len: 64", "{seq_len: 32"), encoding="utf-8")
    spec = RunSpec(arm="d", budget_minutes=1.0, seed=42, model="bert-tiny", threads=1,
                   out_dir=str(tmp_path / "out"), tokenizer_dir=str(tokenizer_dir), data_dir=str(mlm_data),
                   recipe=str(recipe), calibration=(0.5, 2))
    cost = step_cost(spec, bertforge_config(spec))
    assert (cost.cheap_tokens, cost.full_tokens) == (8 * 32, 32 * 128)
    assert cost.cheap_seconds > 0 and cost.full_seconds > 0
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # both runs thrown away


def tiny_hf_trainer(output_dir: Path, callback: Any) -> Any:
    """HF `Trainer` on a 2-layer BertForMaskedLM and 8 random rows, with steps enough to outlast any budget here."""
    from transformers import BertConfig, BertForMaskedLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=32, max_position_embeddings=32))
    rows = [{"input_ids": torch.randint(5, 64, (16,))} for _ in range(8)]

    def collate(features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        input_ids = torch.stack([feature["input_ids"] for feature in features])
        return {"input_ids": input_ids, "labels": input_ids.clone()}

    arguments = TrainingArguments(output_dir=str(output_dir), max_steps=1_000_000, per_device_train_batch_size=4,
                                  use_cpu=True, report_to="none", save_strategy="no", logging_strategy="no",
                                  disable_tqdm=True)
    return Trainer(model=model, args=arguments, train_dataset=rows, data_collator=collate, callbacks=[callback])


def test_budget_clock_stops_hf_trainer_at_its_budget_and_leaves_export_time_out(tmp_path: Path) -> None:
    export_seconds = 0.4

    def export(model: Any, seconds: float, step: int) -> dict[str, Any]:
        model.save_pretrained(str(tmp_path / f"step-{step}"))
        time.sleep(export_seconds)  # a slow disk: none of it may count against the budget
        return {"seconds": seconds, "step": step}

    from transformers import TrainerCallback

    class ClockReadings(TrainerCallback):
        """The budget clock's reading at the end of each step, after the clock has seen it."""

        def __init__(self) -> None:
            self.readings: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.readings.append(clock.elapsed())

    budget, marks = 1.5, (0.5, 1.0)
    clock = BudgetClock(budget, marks, export)
    trainer = tiny_hf_trainer(tmp_path / "trainer", clock)
    readings = ClockReadings()
    trainer.add_callback(readings)
    began = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - began

    assert 0 < trainer.state.global_step < 1_000_000
    assert clock.stopped_at >= budget
    # It stopped at the first step that ended past the budget, however slow the machine's steps are.
    assert readings.readings[-2] < budget <= readings.readings[-1]
    assert [export["seconds"] >= mark for export, mark in zip(clock.exports, marks, strict=True)] == [True, True]
    assert [export["step"] for export in clock.exports] == sorted(export["step"] for export in clock.exports)
    assert all((tmp_path / f"step-{export['step']}" / "config.json").is_file() for export in clock.exports)
    assert wall >= clock.stopped_at + len(marks) * export_seconds


def test_the_calibration_stops_hf_trainer_after_its_seconds_and_times_the_steps_after_warmup(tmp_path: Path) -> None:
    timing = StepTiming(seconds=0.5, warmup=3)
    trainer = tiny_hf_trainer(tmp_path / "calibration", timing)
    trainer.train()

    steps = trainer.state.global_step
    assert len(timing.starts) == steps >= 3 + 1 + MIN_TIMED_STEPS
    timed, timed_steps = timing.starts[-1] - timing.starts[3], steps - 1 - 3
    assert calibration_done(timed_steps, timed, 0.5)
    # It stopped at the first step that met the rule, however slow the machine's steps are: one step earlier it had not.
    assert not calibration_done(timed_steps - 1, timing.starts[-2] - timing.starts[3], 0.5)
    assert timing.seconds_per_step() == pytest.approx(timed / timed_steps)


def test_a_calibration_replayed_on_recorded_steps_says_what_step_timing_would_have_measured() -> None:
    from benchmarks.ttq.step_times import calibration_estimate

    durations = [3.0] * 5 + [1.0] * 100  # five slow first steps, then a steady second a step
    starts = [sum(durations[:index]) for index in range(len(durations) + 1)]
    past_the_slow_steps = calibration_estimate(starts, 20.0, 5)
    assert past_the_slow_steps == {"seconds": 20.0, "warmup": 5, "timed_steps": 20, "seconds_per_step": 1.0}
    within_them = calibration_estimate(starts, 20.0, 2)  # times three slow steps: 20 s over 14 steps
    assert within_them is not None and within_them["timed_steps"] == 14
    assert within_them["seconds_per_step"] == pytest.approx(20 / 14)
    assert calibration_estimate(starts[:20], 20.0, 5) is None  # the steps ran out first


def test_export_marks_exports_at_each_mark_its_clock_passes_and_costs_the_run_no_budget(tmp_path: Path) -> None:
    from helpers import trainer_tasks

    from benchmarks.ttq.clock import ExportMarks, curve_points
    from bertforge.config import load_config
    from bertforge.train.trainer import Trainer

    config = load_config(None, ["train.micro_batch_size=32", "train.global_batch_size=32", "train.max_steps=6",
                                "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false",
                                f"run.output_dir={tmp_path}", "run.name=run"])
    exports = ExportMarks((0.0, 0.0, 3600.0), tmp_path / "exports")  # two marks passed at once, one never
    slow_export = exports.export

    def export_slowly(trainer: Any, state: Any) -> dict[str, Any]:
        time.sleep(1.0)  # outside the run's clock
        return slow_export(trainer, state)

    exports.export = export_slowly  # type: ignore[method-assign]
    began = time.perf_counter()
    result = Trainer(config, trainer_tasks.NoDropout(config), on_step_end=[exports]).fit()
    wall = time.perf_counter() - began
    assert result.stopped_by == "budget" and result.state.step == 6
    assert [point["step"] for point in exports.exports] == [1, 1]
    assert all(Path(point["model_dir"]).is_dir() for point in exports.exports)
    assert exports.pending_marks == [3600.0]
    assert result.state.elapsed_seconds <= wall - 2.0  # the exports' two seconds are not on the clock
    final = {"step": 6, "minutes": result.state.elapsed_seconds / 60}
    assert [point["step"] for point in curve_points(exports.exports, final)] == [1, 1, 6]


def one_run_a_side() -> list[dict[str, Any]]:
    """The smallest study a report can be rendered from: one (b) and one (d) run, fresh for each test to edit."""
    return [full_result("b", 1, 0.0600, [0.3]), full_result("d", 1, 0.1700, [0.5])]


def committed_report(directory: Path, stem: str, report: dict[str, Any], table_text: str) -> tuple[Path, Path]:
    """A report's .json and its older .md, as benchmarks/results holds them."""
    stored, table = directory / f"{stem}.json", directory / f"{stem}.md"
    stored.write_text(json.dumps(report), encoding="utf-8")
    table.write_text(table_text, encoding="utf-8")
    return stored, table


def test_a_committed_report_is_re_rendered_from_its_json_alone(tmp_path: Path) -> None:
    """`python -m benchmarks.ttq.rerender`: an older report gains today's columns without its corpus; its runs stay
    as they were."""
    from benchmarks.ttq.rerender import rerender

    results = one_run_a_side()
    report = full_report(results)
    stored, _ = committed_report(tmp_path, "time_to_quality_tech_dictionaries", report, "| an older table |")
    written = rerender(stored)
    assert [path.name for path in written] == [f"time_to_quality_tech_dictionaries.{suffix}"
                                               for suffix in ("md", "json", "png")]
    assert written[0].read_text(encoding="utf-8") == render(report, cells_of(results))
    assert json.loads(written[1].read_text(encoding="utf-8")) == report


def test_a_report_from_before_the_plateau_baseline_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    from benchmarks.ttq.rerender import rerender

    results = one_run_a_side()
    report = full_report(results)
    del report["data"]["unigram_guess"]
    stored, table = committed_report(tmp_path, "time_to_quality_mixed", report, "| the table of its day |")
    with pytest.raises(ValueError, match="time_to_quality_mixed.json: written before reports recorded 'unigram_guess'"):
        rerender(stored)
    assert table.read_text(encoding="utf-8") == "| the table of its day |"
    assert not (tmp_path / "time_to_quality_mixed.png").exists()


def test_a_report_broken_otherwise_is_not_called_old(tmp_path: Path) -> None:
    """Only the fields the first studies lack earn the "written before" message; a report missing a field every
    report has fails as the bug it is, and its files stay as they were."""
    from benchmarks.ttq.rerender import rerender

    results = one_run_a_side()
    del results[1]["curve"]
    stored, table = committed_report(tmp_path, "time_to_quality_bundled_seeds", full_report(results),
                                     "| the committed table |")
    with pytest.raises(KeyError, match="curve"):
        rerender(stored)
    assert table.read_text(encoding="utf-8") == "| the committed table |"


def test_the_re_render_rewrites_nothing_when_one_of_its_paths_is_not_a_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.ttq import rerender

    results = one_run_a_side()
    stored, table = committed_report(tmp_path, "time_to_quality_bundled_seeds", full_report(results),
                                     "| the committed table |")
    monkeypatch.setattr("sys.argv", ["rerender", str(stored), str(tmp_path / "time_to_quality_typo.json")])
    with pytest.raises(SystemExit) as exit_info:
        rerender.main()
    assert exit_info.value.code == 2
    assert "time_to_quality_typo.json: not a report's .json file" in capsys.readouterr().err
    assert table.read_text(encoding="utf-8") == "| the committed table |"
