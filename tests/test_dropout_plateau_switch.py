"""`train.disable_dropout_from: plateau_exit`: dropout stays on while the model is on the MLM plateau and goes off at
the evaluation that finds it above the unigram baseline (issue 40)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from bertforge.config import load_config
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.errors import ConfigError
from bertforge.models.dropout import Dropout
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.dropout_off import dropout_is_on, left_plateau
from bertforge.train.task import Batch
from bertforge.train.trainer import Trainer

TINY = ["model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.num_layers=1", "data.seq_len=64", "data.num_workers=0", "optim.lr=3e-3", "schedule.warmup=2",
        "train.micro_batch_size=8", "train.global_batch_size=16", "train.log_every=1", "log.progress=false",
        "log.tensorboard=false", "log.plots=false", "data.validation_samples=32", "model.hidden_dropout=0.1",
        "train.max_steps=4", "train.eval_every=2", "train.disable_dropout=true"]


@pytest.fixture(scope="module")
def prepared_mlm(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "mlm"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, out, PrepareSettings(seq_len=64, split=(9, 1)),
                             workers=0, progress=False)
    return out


class RecordsDropout(PretrainTask):
    """Records the dropout rates each training micro-batch runs under; with `exit_from_step`, the evaluations from
    that step on report the model above the unigram baseline (its baseline lowered below any accuracy), which a
    4-step bert-tiny never reaches by itself."""

    exit_from_step: int | None = None

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.rates: list[set[float]] = []
        self.evaluations = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        if model.training:
            self.rates.append({module.p for module in model.modules() if isinstance(module, Dropout)})
        return super().forward_step(batch, model)

    def evaluate(self, model: nn.Module, batches: Any) -> dict[str, float]:
        results = super().evaluate(model, batches)
        self.evaluations += 1
        step = 2 * self.evaluations  # train.eval_every=2
        if self.exit_from_step is not None and step >= self.exit_from_step:
            results["mlm_unigram_accuracy"] = -1.0
        return results


def run(data: Path, run_dir: Path, *extra: str, exit_from_step: int | None = None) -> tuple[RecordsDropout, Any]:
    config = load_config(None, [*TINY, f"data.path={data}", f"run.output_dir={run_dir.parent}",
                                f"run.name={run_dir.name}", *extra])
    task = RecordsDropout(config)
    task.exit_from_step = exit_from_step
    return task, Trainer(config, task).fit()


def test_dropout_stays_on_until_the_model_leaves_the_plateau(prepared_mlm: Path, tmp_path: Path) -> None:
    """A margin that 4 real steps of bert-tiny never clear (50 points above the unigram baseline): every micro-batch
    trains with the model's 0.1, where train.disable_dropout alone trains every one without dropout."""
    waiting, result = run(prepared_mlm, tmp_path / "waiting", "train.disable_dropout_from=plateau_exit",
                          "train.plateau_exit_margin=0.5")
    assert result.state.metrics["mlm_accuracy"] <= result.state.metrics["mlm_unigram_accuracy"] + 0.5
    assert waiting.rates == [{0.1}] * 8 and result.state.plateau_exit_step is None
    off, _ = run(prepared_mlm, tmp_path / "off")
    assert off.rates == [{0.0}] * 8


def test_dropout_goes_off_at_the_evaluation_that_leaves_the_plateau(prepared_mlm: Path, tmp_path: Path) -> None:
    """The evaluation after step 2 reports the exit: steps 0-1 train with dropout, steps 2-3 without."""
    task, result = run(prepared_mlm, tmp_path / "exit", "train.disable_dropout_from=plateau_exit", exit_from_step=2)
    assert task.rates == [{0.1}] * 4 + [{0.0}] * 4
    assert result.state.plateau_exit_step == 2


def test_left_plateau_and_dropout_is_on() -> None:
    assert not left_plateau({"mlm_accuracy": 0.045, "mlm_unigram_accuracy": 0.04}, 0.01)
    assert left_plateau({"mlm_accuracy": 0.051, "mlm_unigram_accuracy": 0.04}, 0.01)
    assert not left_plateau({"mlm_accuracy": 0.04, "mlm_unigram_accuracy": 0.04}, 0.0)  # at the baseline is on it
    assert dropout_is_on(0.0, 1.0, waiting_for_plateau_exit=True) and not dropout_is_on(0.0, 1.0)
    assert dropout_is_on(0.6, 0.5) and not dropout_is_on(0.4, 0.5)


@pytest.mark.parametrize(("overrides", "message"), [
    (["train.disable_dropout_from=plateau_exit", "train.eval_every=10"], "train.disable_dropout` is false"),
    (["train.disable_dropout=true", "train.disable_dropout_from=plateau_exit"], "train.eval_every is not set"),
    (["train.disable_dropout=true", "train.plateau_exit_margin=0.02"], "train.plateau_exit_margin"),
    (["train.disable_dropout=true", "train.disable_dropout_from=later"], "train.disable_dropout_from"),
    (["train.disable_dropout=true", "train.disable_dropout_from=plateau_exit", "train.eval_every=10",
      "train.plateau_exit_margin=1.5"], "train.plateau_exit_margin"),
])
def test_the_plateau_switch_is_checked(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
