"""benchmarks/dropout_plateau.py's parts that decide its numbers: the step cap (a real bert-tiny run of the budget
recipe stops at the cap while its learning rate follows the arm's planned steps), the unigram baseline (the product's
guess, from the training data) and the summary across pre-training seeds (plateau exit within the cap, step-100
common share, fine-tune means per setting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common.mlm import EVAL_BATCH, guess_record, unigram_baseline
from benchmarks.ttq.plateau_scoring import VALIDATION_MASKS_GUESS, check_validation_cap, scored_validation
from benchmarks.ttq.plateau_seeds import arm_seed_record, render
from benchmarks.ttq.settings import DEFAULT_RECIPE
from benchmarks.ttq.step_cost import measure_step_costs
from benchmarks.ttq.step_matched import StepArm, train_recipe

TINY = ("model.preset=bert-tiny", "train.micro_batch_size=4", "train.global_batch_size=4", "train.log_every=1",
        "log.plots=false")


def test_a_step_cap_stops_the_run_there_and_keeps_the_schedule_of_the_planned_steps(
        tmp_path: Path, prepared_corpus: Path) -> None:
    arm = StepArm("tiny", "recipe", 100, TINY)  # budget-cpu.yaml: 6% warm-up of 100 planned steps = 6 steps
    record = train_recipe(arm, 1, tmp_path / "out", prepared_corpus, 2, DEFAULT_RECIPE, step_cap=5)
    assert [point["step"] for point in record["points"]] == [2, 4, 5]
    assert [Path(point["model_dir"]).name for point in record["points"]] == ["step-00000002", "step-00000004", "final"]
    rows = [json.loads(line) for line in (Path(record["train_loss_log"]) / "metrics.jsonl").read_text().splitlines()]
    lr = {row["step"]: row["lr"] for row in rows if row.get("split") == "train" and "lr" in row}
    assert max(lr) == 5
    # still warming up at the last step (a 5-step schedule would warm up in one step, then decay towards zero)
    assert [lr[step] for step in sorted(lr)] == sorted(lr.values())
    assert lr[5] < 1e-3


def curve(accuracies: list[float], shares: list[float]) -> list[dict[str, Any]]:
    return [{"step": 50 * (index + 1), "accuracy": accuracy,
             "features": {"layers": [{"common_share": 0.0}, {"common_share": share}]}}
            for index, (accuracy, share) in enumerate(zip(accuracies, shares, strict=True))]


SETTING = "lr 0.001, dropout the model's"


def fine_tunes(step: int, accuracies: list[float], matthews: list[float]) -> dict[str, list[dict[str, Any]]]:
    return {str(step): [{"setting": SETTING, "seed": seed, "accuracy": accuracy, "matthews": mcc}
                        for seed, accuracy, mcc in zip((17, 2024, 31337), accuracies, matthews, strict=True)]}


def test_a_seed_record_leaves_the_plateau_at_the_first_export_past_the_margin_within_the_cap() -> None:
    baseline = 0.05
    record = arm_seed_record(curve([0.055, 0.0601, 0.07, 0.09], [0.9, 0.8, 0.5, 0.3]),
                             fine_tunes(100, [0.2, 0.1, 0.3], [0.1, 0.0, 0.2]), baseline, 150, "scores",
                             [SETTING], [17, 2024, 31337])
    assert record["plateau_exit_step"] == 100  # 0.0601 > 0.05 + 0.01
    assert record["plateau_exit_step_100"] == 100
    assert list(record["mlm_accuracy"]) == ["50", "100", "150"]  # step 200 is past the cap
    assert record["common_share_step_100"] == 0.8
    ft = record["fine_tuned"]["100"][SETTING]
    assert (round(ft["accuracy"], 6), ft["one_class_runs"]) == (0.2, 1)
    on_plateau = arm_seed_record(curve([0.055, 0.0599], [0.9, 0.9]), {}, baseline, 300, "x", [SETTING], [17])
    assert on_plateau["plateau_exit_step"] is None


def test_the_seed_table_gives_each_arm_a_mean_and_spread_over_its_seeds() -> None:
    records = {str(seed): arm_seed_record(curve([0.05, 0.06 + 0.01 * seed], [0.5, 0.4 + 0.1 * seed]), {}, 0.05, 300,
                                          "scores", [SETTING], [17]) for seed in (1, 2, 3)}
    report = {"unigram_accuracy": 0.05, "plateau_margin": 0.01, "step_cap": 300, "majority_class_accuracy": 0.124,
              "fine_tuning_settings": [SETTING], "downstream_seeds": [17], "arms": {"recipe": records}}
    text = render(report)
    assert "| **recipe** | mean ± sd (3) | 100 ± 0 | 100 ± 0 | 0.600 ± 0.100 | 0.0500 ± 0.0000 | 0.0800 ± 0.0100 |" in text
    assert VALIDATION_MASKS_GUESS in text  # an older report, written before it kept its guess


def test_a_fine_tuning_mean_over_fewer_than_all_seeds_says_how_many() -> None:
    records = {str(seed): arm_seed_record(curve([0.05, 0.07], [0.5, 0.4]),
                                          fine_tunes(100, [0.2 + 0.1 * seed] * 3, [0.1] * 3) if seed < 3 else {},
                                          0.05, 300, "scores", [SETTING], [17, 2024, 31337]) for seed in (1, 2, 3)}
    report = {"unigram_accuracy": 0.05, "plateau_margin": 0.01, "step_cap": 300, "majority_class_accuracy": 0.124,
              "fine_tuning_settings": [SETTING], "downstream_seeds": [17, 2024, 31337], "arms": {"recipe": records}}
    text = render(report)
    assert "| **recipe** | mean ± sd (3) | 0.350 ± 0.071 (2 of 3 seeds) |" in text
    assert "| recipe | 1 | 0.300 |" in text
    report["arms"]["recipe"]["1"]["fine_tuned"]["100"][SETTING]["seeds"] = [17]  # one fine-tuning seed of the three
    assert "| recipe | 1 | 0.300 (seed 17 only) |" in render(report)


def test_the_baseline_is_the_products_guess_from_the_training_data_not_the_validation_masks_own_favourite(
        prepared_corpus: Path) -> None:
    import torch

    from bertforge.data.shards import PretokenizedDataset
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.tasks.mlm_plateau import unigram_guess

    train = PretokenizedDataset(prepared_corpus, "train")
    product_guess = unigram_guess(train, load_tokenizer(train.tokenizer_path))
    favourite = product_guess.token_id + 1  # the validation masks' most frequent token: 3 of 8, the guess 2 of 8
    labels = torch.full((2, 8), -100)
    labels[0, :4] = torch.tensor([favourite, favourite, product_guess.token_id, 7])
    labels[1, 2:6] = torch.tensor([favourite, product_guess.token_id, 9, 11])
    guess, baseline = unigram_baseline(prepared_corpus, [{"labels": labels}])
    assert guess == product_guess
    assert baseline == 2 / 8
    report = {"unigram_guess": guess_record(guess), "unigram_accuracy": baseline, "plateau_margin": 0.01,
              "step_cap": 300, "majority_class_accuracy": 0.124, "fine_tuning_settings": [], "downstream_seeds": [],
              "arms": {}}
    assert f"always {guess.token!r}, the training data's most frequent maskable token" in render(report)


def test_the_step_cost_times_each_arm_in_turn_and_states_the_ratio_to_the_first(
        tmp_path: Path, prepared_corpus: Path) -> None:
    arms = [StepArm("tiny", "recipe", 100, TINY), StepArm("tiny-dropout", "recipe", 100,
                                                          (*TINY, "train.disable_dropout=false"))]
    costs = measure_step_costs(arms, 1, prepared_corpus, tmp_path, steps=8, rounds=2, threads=1)
    assert len(costs["rounds"]) == 2 and all(set(row) == {"tiny", "tiny-dropout"} for row in costs["rounds"])
    assert all(seconds > 0 for row in costs["rounds"] for seconds in row.values())
    ratios = costs["ratio_to_tiny"]
    assert ratios["tiny"] == 1.0 and ratios["tiny-dropout"] > 0
    assert costs["timed_steps_per_run"] == 2


def test_a_validation_cap_scores_whole_batches_spread_over_the_split_with_the_masks_they_have_in_the_whole(
        tmp_path: Path, corpus_slice: Path, tokenizer_dir: Path) -> None:
    import torch

    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data

    # 16-token samples and half the documents held out: a validation split of many batches, in corpus order
    data = tmp_path / "data"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, data, PrepareSettings(seq_len=16, split=(1, 1)),
                             workers=0, progress=False)
    whole = scored_validation(data, None)
    assert len(whole) >= 8
    subset = scored_validation(data, 3 * EVAL_BATCH - 10)  # rounded up to whole batches
    assert len(subset) == 3
    positions = [next(index for index, batch in enumerate(whole)
                      if torch.equal(batch["input_ids"], chosen["input_ids"])
                      and torch.equal(batch["labels"], chosen["labels"])) for chosen in subset]
    assert positions == sorted(set(positions))  # distinct batches of the whole, masks included, in split order
    assert positions[0] == 0 and positions[-1] >= len(whole) // 2  # not the split's first three: one package's text


def test_a_curve_scored_on_another_validation_subset_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cached = tmp_path / "recipe-seed1.json"
    check_validation_cap({"curve": [], "validation_samples_cap": 1024}, 1024, cached)
    check_validation_cap({}, 512, cached)  # nothing scored yet: any cap
    check_validation_cap({"curve": []}, None, cached)  # reports before the cap existed scored every batch
    with pytest.raises(SystemExit) as stopped:
        check_validation_cap({"curve": [], "validation_samples_cap": 1024}, None, cached)
    assert stopped.value.code == 2
    message = capsys.readouterr().err
    assert message.count("\n") == 1 and str(cached) in message and "--validation-samples 1024" in message


def test_the_score_summary_renders_an_arm_whose_final_model_has_no_features() -> None:
    """`--feature-steps 100,300` with the untrained arm (step 0) leaves its only point without features: the report's
    summary still renders, with dashes (it raised KeyError after the scores were written, 2026-12-02)."""
    from benchmarks.ttq.plateau_scoring import render as render_scores

    layer = {"norm": 1.0, "common_share": 0.3, "effective_rank": 12.0, "attention_entropy": 1.5}
    features = {"layers": [layer, layer], "uniform_entropy": 3.0, "cls": {"mean_cosine": 0.5},
                "mean_pooled": {"mean_cosine": 0.4}}
    run = {"setting": SETTING, "seed": 17, "accuracy": 0.3, "f1_macro": 0.2, "train_loss": [[1, 3.0], [10, 2.0]]}
    report = {"unigram_accuracy": 0.0425, "majority_class_accuracy": 0.124,
              "arms": {"recipe": {"steps": 300, "plateau_exit_step": 150,
                                  "curve": [{"step": 300, "accuracy": 0.14, "features": features}],
                                  "fine_tunes": {"300": [run]}},
                       "untrained": {"steps": 0, "plateau_exit_step": None, "curve": [{"step": 0, "accuracy": 0.0}],
                                     "fine_tunes": {"0": [run]}}}}
    text = render_scores(report)
    assert "| untrained | 0 | not left | 0.0000 | – | – | – | – | – |" in text
    assert "| recipe | 300 | 150 | 0.1400 | 0.300 | 12.0 |" in text
    assert "- untrained: not measured (--feature-steps)" in text
