"""`bertforge pretrain`'s run summary says when the model is still on the MLM plateau (issue 40 item 4).

The unigram baseline is the accuracy of always answering the training data's most frequent token, counted once
from the run's own shards; a model no more than 0.01 above it has learnt token frequencies and little else. A few steps of a
tiny model sit far below it, so the real run here is on the plateau; a model off the plateau takes longer than
a test should, so that case is built from its figures (the quickstart's 700 steps: 0.157 against 0.102).
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.cli import main
from bertforge.commands.pretrain import write_summary
from bertforge.data.shards import PretokenizedDataset
from bertforge.data.tokenizer import load_tokenizer
from bertforge.tasks.mlm_plateau import (
    WARN_AFTER_FRACTION,
    MlmStanding,
    PlateauWatch,
    UnigramGuess,
    unigram_accuracy,
    unigram_guess,
)
from bertforge.train.checkpoint import TrainingState
from bertforge.train.trainer import FitResult

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "pretrain" / "quickstart.yaml"
TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=128"]
QUIET = ["data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false"]
STEPS = 4


@pytest.fixture(scope="module")
def plateau_run(prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """A 4-step pre-training run evaluated at every step: (run directory, stdout, stderr)."""
    out = tmp_path_factory.mktemp("runs")
    capture = pytest.MonkeyPatch()  # a module fixture cannot use capsys: the run is read by three tests
    stdout, stderr = io.StringIO(), io.StringIO()
    capture.setattr(sys, "stdout", stdout)
    capture.setattr(sys, "stderr", stderr)
    try:
        code = main(["-q", "pretrain", str(RECIPE), f"data.path={prepared_corpus}", f"run.output_dir={out}",
                     "run.name=plateau", *TINY, *QUIET, f"train.max_steps={STEPS}", "train.eval_every=1",
                     "train.checkpoint_every=1000", "train.micro_batch_size=8", "train.global_batch_size=8",
                     "data.validation_samples=32"])
    finally:
        capture.undo()
    assert code == 0, stderr.getvalue()
    return out / "plateau", " ".join(stdout.getvalue().split()), " ".join(stderr.getvalue().split())


def test_a_run_on_the_plateau_says_so_in_its_summary_json_with_the_figures(plateau_run: tuple[Path, str, str]) -> None:
    run_dir, _, _ = plateau_run
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    validation = summary["validation"]
    assert summary["on_mlm_plateau"] is True and summary["steps"] == STEPS and summary["tokens"] > 0
    assert validation["mlm_accuracy"] <= validation["mlm_unigram_accuracy"]
    guess = summary["unigram_guess"]
    warning = summary["warning"]
    assert f"after {STEPS:,} steps and {summary['tokens'] / 1e6:,.1f} M tokens" in warning
    assert (f"its validation MLM accuracy {validation['mlm_accuracy']:.4f} is not 0.01 above the unigram baseline "
            f"{validation['mlm_unigram_accuracy']:.4f} (always predicting {guess['token']!r}") in warning
    assert "train longer" in warning and "docs/guide.md" in warning


def test_a_run_on_the_plateau_says_so_on_the_console_at_its_end_and_once_during_it(
        plateau_run: tuple[Path, str, str]) -> None:
    _, stdout, stderr = plateau_run
    assert f"pre-trained {STEPS:,} steps" in stdout and "unigram baseline" in stdout and "summary.json" in stdout
    assert "the model is still on the MLM plateau after 4 steps" in stderr  # the end of the run
    # evaluations at steps 1-3 are at 25%, 50% and 75% of the budget: one warning, at the first past half
    assert stderr.count("of its budget the model is still on the MLM plateau") == 1
    assert "at 50% of its budget the model is still on the MLM plateau after 2 steps" in stderr
    assert "it may still leave it before the end" in stderr


def test_the_unigram_guess_is_the_training_datas_most_frequent_maskable_token(
        prepared_corpus: Path, plateau_run: tuple[Path, str, str]) -> None:
    train = PretokenizedDataset(prepared_corpus, "train")
    tokenizer = load_tokenizer(train.tokenizer_path)
    tokens, _, _ = train.gather(np.arange(len(train)))  # the slice is small: every sample is counted
    counts = np.bincount(tokens, minlength=tokenizer.vocab_size)
    counts[tokenizer.special_ids()] = 0
    guess = unigram_guess(train, tokenizer)
    assert guess.token_id == int(counts.argmax()) and guess.counted_tokens == int(counts.sum())
    assert guess.train_share == pytest.approx(counts.max() / counts.sum())
    summary = json.loads((plateau_run[0] / "summary.json").read_text(encoding="utf-8"))
    assert summary["unigram_guess"]["token_id"] == guess.token_id


def test_the_baseline_scores_the_training_guess_not_the_validation_sets_own_most_frequent_token() -> None:
    """Always answering the most frequent token of the masked tokens themselves would peek at the answers."""
    batches = [{"masked_labels": torch.tensor([7, 7, 7, 5])}, {"masked_labels": torch.tensor([7, 5, 9])}]
    assert unigram_accuracy(batches, UnigramGuess(5, "the", 0.06, 1000)) == pytest.approx(2 / 7)


def test_a_model_off_the_plateau_gets_no_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quickstart's 700 steps: validation MLM accuracy 0.157 against the unigram baseline 0.102."""
    metrics = {"mlm_accuracy": 0.157, "mlm_unigram_accuracy": 0.102, "mlm_loss": 6.18}
    state = TrainingState(step=700, consumed_tokens=2_700_000, elapsed_seconds=180.0, metrics=metrics)
    write_summary(FitResult(tmp_path, state, "budget"), UnigramGuess(12, "the", 0.06, 100_000))
    summary = json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert summary["on_mlm_plateau"] is False and summary["warning"] is None and summary["steps"] == 700
    captured = capsys.readouterr()
    assert "MLM plateau" not in captured.out + captured.err and "unigram baseline 0.102" in captured.out
    assert PlateauWatch().check(metrics, step=400, tokens=1_500_000, fraction_done=0.6, guess=None) is None


@pytest.mark.parametrize(("accuracy", "unigram", "on_plateau"),
                         [(0.0217, 0.0224, True), (0.0415, 0.0415, True), (0.0224, 0.0217, True),
                          (0.064, 0.043, False), (0.157, 0.102, False), (None, 0.1, False)])
def test_the_plateau_is_an_accuracy_at_most_a_point_above_the_unigram_baseline(
        accuracy: float | None, unigram: float, on_plateau: bool) -> None:
    """On it: the multilingual DistilBERT at 400 steps (0.0217 vs 0.0224) and at 40 (0.0224 vs 0.0217: it answers a
    token more frequent in the validation masks than the training text's first), issue 40's 10-minute runs (0.0415).
    Off it: arabic-tiny at 600 steps, 'barely off' (0.064 vs 0.043), the quickstart at 700 (0.157 vs 0.102)."""
    assert MlmStanding(accuracy, unigram).on_plateau() is on_plateau


def test_the_watch_speaks_once_past_half_the_budget_and_leaves_the_last_evaluation_to_the_summary() -> None:
    watch, plateau = PlateauWatch(), {"mlm_accuracy": 0.02, "mlm_unigram_accuracy": 0.03}
    assert watch.check(plateau, step=10, tokens=1000, fraction_done=WARN_AFTER_FRACTION / 2, guess=None) is None
    assert watch.check(plateau, step=20, tokens=2000, fraction_done=WARN_AFTER_FRACTION, guess=None) is not None
    assert watch.check(plateau, step=30, tokens=3000, fraction_done=0.9, guess=None) is None
    assert PlateauWatch().check(plateau, step=40, tokens=4000, fraction_done=1.0, guess=None) is None
