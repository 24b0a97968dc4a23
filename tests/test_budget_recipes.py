"""The budget-recipe switches: each one's values at chosen steps, and exact resume where it changes the run.

Every switch is a pure function of the step (of the run's total steps), so a run stopped and resumed
across a change of value ends bitwise equal to one that was never stopped.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import HANG_TIMEOUT
from safetensors.torch import load_file
from torch import nn

from bertforge.config import load_config
from bertforge.data.curriculum import DataCurriculum, cut_samples
from bertforge.data.masking import MaskingSettings
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.pretraining_loader import PretrainingLoader
from bertforge.data.sampler import BatchGeometry
from bertforge.data.shards import PretokenizedDataset
from bertforge.errors import ConfigError
from bertforge.models.dropout import Dropout
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.dropout_off import dropout_is_on
from bertforge.train.task import Batch
from bertforge.train.trainer import FitResult, Trainer

TINY = ["model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
        "model.num_layers=1", "data.seq_len=64", "data.num_workers=0", "optim.lr=3e-3", "schedule.warmup=2",
        "train.micro_batch_size=8", "train.global_batch_size=16", "train.log_every=1", "log.progress=false",
        "log.tensorboard=false", "log.plots=false", "data.validation_samples=32", "model.hidden_dropout=0.1"]


@pytest.fixture(scope="module")
def prepared_mlm(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`corpus_slice` in MLM-only samples of at most 64 tokens, 90/10 split."""
    out = tmp_path_factory.mktemp("prepared") / "mlm"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, out, PrepareSettings(seq_len=64, split=(9, 1)),
                             workers=0, progress=False)
    return out


def run_config(data: Path, run_dir: Path, *extra: str):  # type: ignore[no-untyped-def]
    return load_config(None, [*TINY, f"data.path={data}", f"run.output_dir={run_dir.parent}",
                              f"run.name={run_dir.name}", *extra])


class StopsWithSigterm(PretrainTask):
    """Sends itself SIGTERM during training micro-batch number `stop_at` (1-based): the trainer finishes that
    step, saves a checkpoint and returns, as it does for a scheduler's SIGTERM."""

    stop_at = 0

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.calls = 0

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        if model.training:
            self.calls += 1
            if self.calls == self.stop_at:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().forward_step(batch, model)


def assert_resume_is_exact(data: Path, tmp_path: Path, overrides: list[str], *, steps: int,
                           stop_at_micro_batch: int) -> tuple[FitResult, FitResult]:
    """An uninterrupted run and one stopped by SIGTERM during micro-batch `stop_at_micro_batch`, then resumed,
    end with bitwise-equal weights, in the last checkpoint and in final/."""
    reference = tmp_path / "reference"
    config = run_config(data, reference, f"train.max_steps={steps}", *overrides)
    reference_result = Trainer(config, PretrainTask(config)).fit()
    interrupted = tmp_path / "interrupted"
    config = run_config(data, interrupted, f"train.max_steps={steps}", *overrides)
    stopping = type("Stops", (StopsWithSigterm,), {"stop_at": stop_at_micro_batch})(config)
    first = Trainer(config, stopping).fit()
    assert first.stopped_by == "signal" and 0 < first.state.step < steps
    resumed = Trainer(config, PretrainTask(config)).fit()
    assert resumed.stopped_by == "budget" and resumed.state.step == steps
    assert resumed.state.consumed_samples == reference_result.state.consumed_samples
    for name in (f"checkpoints/step-{steps:08d}/model", "final"):  # final/ differs from the last weights with train.ema
        a, b = (load_file(run / name / "model.safetensors") for run in (reference, interrupted))
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"
    return first, resumed


# --- the shipped budget recipes ---------------------------------------------------------------------

RECIPES = Path(__file__).resolve().parents[1] / "configs" / "pretrain"


def test_the_cpu_budget_recipe_trains_for_its_time_budget_without_dropout(prepared_mlm: Path, tmp_path: Path) -> None:
    """configs/pretrain/budget-cpu.yaml as shipped (only where, on what and for how long changed): its keys work
    together under a time-only budget, the trainer stops on the clock, and dropout, the switch it turns on, is off
    in the model that trains, while the exported config keeps bert-mini's rates for fine-tuning."""
    run_dir = tmp_path / "budget-cpu"
    config = load_config(RECIPES / "budget-cpu.yaml", [
        f"data.path={prepared_mlm}", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
        "train.max_time_minutes=0.03", "train.eval_every=null", "train.checkpoint_every=null", "log.progress=false",
        "log.tensorboard=false", "log.plots=false", "data.num_workers=0", "data.validation_samples=16"])
    assert config.train.max_steps is None and config.train.disable_dropout
    trainer = Trainer(config, PretrainTask(config))
    result = trainer.fit()
    assert result.stopped_by == "budget" and result.state.step > 0
    probabilities = [module.p for module in trainer.raw_model.modules() if isinstance(module, Dropout)]
    assert probabilities and set(probabilities) == {0.0}
    exported = json.loads((run_dir / "final" / "config.json").read_text(encoding="utf-8"))
    assert exported["hidden_dropout_prob"] == exported["attention_probs_dropout_prob"] == 0.1


def test_the_gpu_budget_recipe_is_the_cpu_recipe_at_bert_base_scale() -> None:
    """budget-gpu.yaml (not run here) carries the same switches as the measured CPU recipe."""
    cpu, gpu = (load_config(RECIPES / name) for name in ("budget-cpu.yaml", "budget-gpu.yaml"))
    assert gpu.model.preset == "bert-base" and gpu.train.max_time_minutes == 24 * 60
    switches = ("train.disable_dropout", "train.disable_dropout_until", "model.hidden_dropout", "model.attention_dropout",
                "data.mask_schedule", "data.seq_len_schedule", "train.batch_ramp_start", "train.ema", "train.average_last_k", "optim.name", "schedule.name")
    for key in switches:
        section, name = key.split(".")
        assert getattr(getattr(gpu, section), name) == getattr(getattr(cpu, section), name), key


# --- train.disable_dropout ---------------------------------------------------------------------------


def test_disable_dropout_trains_as_a_model_without_dropout_and_exports_the_model_s_rates(prepared_mlm: Path,
                                                                                        tmp_path: Path) -> None:
    """train.disable_dropout on a model with dropout 0.1 trains bitwise as the same model built with dropout 0, and
    its final/config.json keeps 0.1 (the rates fine-tuning will use); without the switch the dropout changes the run."""
    runs = {}
    for name, overrides in (("switched", ["train.disable_dropout=true"]),
                            ("zero", ["model.hidden_dropout=0.0", "model.attention_dropout=0.0"]),
                            ("dropout", [])):
        config = run_config(prepared_mlm, tmp_path / name, "train.max_steps=3", "model.attention_dropout=0.1",
                            *overrides)
        Trainer(config, PretrainTask(config)).fit()
        runs[name] = (load_file(str(tmp_path / name / "final" / "model.safetensors")),
                      json.loads((tmp_path / name / "final" / "config.json").read_text(encoding="utf-8")))
    (switched, switched_config), (zero, zero_config), (dropout, _) = runs["switched"], runs["zero"], runs["dropout"]
    assert switched.keys() == zero.keys() and all(torch.equal(switched[key], zero[key]) for key in switched)
    assert not all(torch.equal(switched[key], dropout[key]) for key in switched)
    assert switched_config["hidden_dropout_prob"] == switched_config["attention_probs_dropout_prob"] == 0.1
    assert zero_config["hidden_dropout_prob"] == 0.0


def test_dropout_comes_back_on_at_disable_dropout_until() -> None:
    assert [dropout_is_on(fraction, 0.5) for fraction in (0.0, 0.49, 0.5, 0.9, 1.0)] == [False, False, True, True, True]
    assert not any(dropout_is_on(fraction, 1.0) for fraction in (0.0, 0.5, 0.99, 1.0))


class RecordsDropout(PretrainTask):
    """Records, for each training micro-batch, the dropout probabilities the model trains it with."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.rates: list[set[float]] = []

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        if model.training:
            self.rates.append({module.p for module in model.modules() if isinstance(module, Dropout)})
        return super().forward_step(batch, model)


def test_dropout_is_off_for_the_first_part_of_the_run_then_at_the_model_s_rates(prepared_mlm: Path,
                                                                                  tmp_path: Path) -> None:
    """train.disable_dropout_until=0.5 over 4 steps of 2 micro-batches: steps 0 and 1 train without dropout,
    steps 2 and 3 with the model's 0.1; the export keeps 0.1."""
    config = run_config(prepared_mlm, tmp_path / "late", "train.max_steps=4", "train.disable_dropout=true",
                        "train.disable_dropout_until=0.5")
    task = RecordsDropout(config)
    Trainer(config, task).fit()
    assert task.rates == [{0.0}] * 4 + [{0.1}] * 4
    exported = json.loads((tmp_path / "late" / "final" / "config.json").read_text(encoding="utf-8"))
    assert exported["hidden_dropout_prob"] == 0.1


def test_pretraining_resumes_exactly_across_the_step_where_dropout_comes_back(prepared_mlm: Path,
                                                                              tmp_path: Path) -> None:
    # 6 steps of 2 micro-batches: stopped in step 2 (micro-batch 3), resumed from its checkpoint across step 3
    first, _ = assert_resume_is_exact(prepared_mlm, tmp_path, ["train.disable_dropout=true",
                                                              "train.disable_dropout_until=0.5",
                                                              "model.attention_dropout=0.1"],
                                      steps=6, stop_at_micro_batch=3)
    assert first.state.step == 2


def test_disable_dropout_until_is_checked() -> None:
    with pytest.raises(ConfigError, match="train.disable_dropout_until"):
        load_config(None, ["train.disable_dropout_until=0.5"])
    for wrong in ("0", "1.5"):
        with pytest.raises(ConfigError, match="train.disable_dropout_until"):
            load_config(None, ["train.disable_dropout=true", f"train.disable_dropout_until={wrong}"])


# --- data.mask_schedule ------------------------------------------------------------------------------


def test_mask_schedules_go_from_the_start_rate_to_mask_prob_over_the_steps() -> None:
    linear = DataCurriculum(mask_prob=0.15, mask_schedule="linear", mask_prob_start=0.30)
    cosine = DataCurriculum(mask_prob=0.15, mask_schedule="cosine", mask_prob_start=0.30)
    constant = DataCurriculum(mask_prob=0.15)
    rates = {name: [c.at(step, 100).mask_prob for step in (0, 25, 50, 100, 150)]
             for name, c in (("linear", linear), ("cosine", cosine), ("constant", constant))}
    assert rates["linear"] == pytest.approx([0.30, 0.2625, 0.225, 0.15, 0.15])
    assert rates["cosine"] == pytest.approx([0.30, 0.15 + 0.15 * 0.5 * (1 + 2 ** -0.5), 0.225, 0.15, 0.15])
    assert rates["constant"] == [0.15] * 5


def masked_fraction(batch: dict[str, Any]) -> float:
    return batch["masked_positions"].numel() / batch["input_ids"].numel()


def test_the_loader_masks_each_step_at_its_scheduled_rate_and_resumes_exactly(prepared_mlm: Path) -> None:
    dataset = PretokenizedDataset(prepared_mlm, "train")
    curriculum = DataCurriculum(mask_prob=0.1, mask_schedule="linear", mask_prob_start=0.6)
    loader = PretrainingLoader(dataset, BatchGeometry(8, 16), seed=3, masking=MaskingSettings(mask_prob=0.1, seed=3),
                               curriculum=curriculum)
    total = 6
    run = list(itertools.islice(loader.iterate(0, step=0, total_steps=total), 2 * total))  # 2 micro-batches a step
    rates = [(masked_fraction(a) + masked_fraction(b)) / 2 for a, b in zip(run[::2], run[1::2], strict=True)]
    assert rates[0] > 0.45 and rates[-1] < 0.25 and rates == sorted(rates, reverse=True)
    resumed = list(itertools.islice(loader.iterate(3 * 16, step=3, total_steps=total), 2 * (total - 3)))
    for a, b in zip(run[6:], resumed, strict=True):
        assert all(torch.equal(a[key], b[key]) for key in ("input_ids", "masked_positions", "masked_labels"))
    # the step, not the position in the data, sets the rate: step 0's samples at step 3's rate mask fewer tokens,
    # and those a subset of step 0's (one hash per token compared with the rate)
    late = list(itertools.islice(loader.iterate(0, step=3, total_steps=total), 1))[0]
    assert set(late["masked_positions"].tolist()) < set(run[0]["masked_positions"].tolist())


def test_a_mask_schedule_needs_a_step_budget_and_its_keys_are_checked() -> None:
    assert load_config(None, ["data.mask_schedule=cosine", "data.mask_prob_start=0.3"]).step_keyed_switches() == [
        "data.mask_schedule"]  # so the trainer asks for a step budget (test_a_batch_ramp_is_checked_...)
    cases = {"data.mask_schedule=sqrt": r"config key `data.mask_schedule` is 'sqrt'; expected one of constant, linear",
             "data.mask_schedule=linear": r"config key `data.mask_prob_start` is not set",
             "data.mask_prob_start=0.3": r"config key `data.mask_prob_start` is set but data.mask_schedule is constant"}
    for override, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, [override])
    with pytest.raises(ConfigError, match=r"config key `data.mask_prob_start` is 1.2"):
        load_config(None, ["data.mask_schedule=linear", "data.mask_prob_start=1.2"])


def test_pretraining_with_a_mask_schedule_resumes_exactly(prepared_mlm: Path, tmp_path: Path) -> None:
    assert_resume_is_exact(prepared_mlm, tmp_path, ["data.mask_schedule=cosine", "data.mask_prob_start=0.4"],
                           steps=8, stop_at_micro_batch=2 * 3)


# --- schedule.name: one_cycle ------------------------------------------------------------------------


def test_the_trainer_follows_the_one_cycle_schedule_and_checks_peak_at(prepared_mlm: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = run_config(prepared_mlm, run_dir, "train.max_steps=8", "schedule.name=one_cycle",
                        "schedule.peak_at=0.25", "schedule.min_lr_ratio=0.0")
    Trainer(config, PretrainTask(config)).fit()
    logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    lrs = [record["lr"] for record in logged if record["split"] == "train"]
    # 2 steps up ((s + 1) / 3 of the peak), the peak at step 2, then down by an eighth of the run per step / 0.75
    expected = [1 / 3, 2 / 3, 1.0, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]
    assert lrs == pytest.approx([3e-3 * factor for factor in expected])
    for value in ("0.0", "1.0", "-0.5"):
        with pytest.raises(ConfigError, match=rf"config key `schedule.peak_at` is {value}; it must be in \(0.0, 1.0\)"):
            load_config(None, [f"schedule.peak_at={value}"])


# --- train.ema and train.average_last_k -------------------------------------------------------------

BAG_OF_WORDS = ["optim.lr=3e-2", "optim.weight_decay=0.0", "train.micro_batch_size=32", "train.global_batch_size=32",
                "train.checkpoint_every=1", "train.keep_last=10", "data.num_workers=0", "log.progress=false",
                "log.tensorboard=false", "log.plots=false"]


def bag_of_words_run(run_dir: Path, *extra: str) -> Any:
    from helpers.trainer_tasks import SmallWithDropout

    config = load_config(None, [*BAG_OF_WORDS, f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *extra])
    Trainer(config, SmallWithDropout(config)).fit()
    return config


def checkpoint_state(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"step-{step:08d}" / "model.pt", weights_only=True)


def test_final_holds_the_moving_average_of_the_weights_after_every_step(tmp_path: Path) -> None:
    from helpers.trainer_tasks import SmallWithDropout

    run_dir = tmp_path / "ema"
    config = bag_of_words_run(run_dir, "train.max_steps=4", "train.ema=0.5")
    task = SmallWithDropout(config)  # the initial weights, drawn as the trainer draws them
    torch.manual_seed(config.run.seed)
    task.build_datasets()
    average = {name: tensor.detach().clone() for name, tensor in task.build_model().state_dict().items()}
    for step in range(1, 5):
        for name, tensor in checkpoint_state(run_dir, step).items():
            average[name].mul_(0.5).add_(tensor, alpha=0.5)
    final = torch.load(run_dir / "final" / "model.pt", weights_only=True)
    assert final.keys() == average.keys()
    assert all(torch.equal(final[name], average[name]) for name in final)
    last = checkpoint_state(run_dir, 4)
    assert not all(torch.equal(final[name], last[name]) for name in final)  # not the last weights
    assert json.loads((run_dir / "final" / "origin.json").read_text()) == {"weights": "ema", "ema_decay": 0.5,
                                                                           "steps": 4}
    assert (run_dir / "checkpoints" / "step-00000004" / "ema.safetensors").is_file()


def test_final_holds_the_mean_of_the_last_k_checkpoints(tmp_path: Path) -> None:
    run_dir = tmp_path / "average"
    bag_of_words_run(run_dir, "train.max_steps=6", "train.checkpoint_every=2", "train.keep_last=3",
                     "train.average_last_k=3")
    states = [checkpoint_state(run_dir, step) for step in (2, 4, 6)]
    final = torch.load(run_dir / "final" / "model.pt", weights_only=True)
    for name in final:
        assert torch.equal(final[name], (states[0][name] + states[1][name] + states[2][name]) / 3), name
    assert json.loads((run_dir / "final" / "origin.json").read_text()) == {
        "weights": "average_of_checkpoints", "checkpoints": ["step-00000002", "step-00000004", "step-00000006"]}


def test_weight_averaging_keys_are_checked() -> None:
    cases = {("train.ema=1.0",): r"config key `train.ema` is 1.0; it must be in \(0.0, 1.0\)",
             ("train.average_last_k=1",): r"config key `train.average_last_k` is 1; it must be in \[2",
             ("train.ema=0.99", "train.average_last_k=2", "train.checkpoint_every=5"):
                 r"`train.ema` and `train.average_last_k` both choose the weights of final/",
             ("train.ema=0.99", "train.best_metric=loss"):
                 r"`train.ema` and `train.best_metric` both choose .*; set only one of them, e.g. train.best_metric=null",
             ("train.average_last_k=3",): r"`train.checkpoint_every` is not set",
             ("train.average_last_k=3", "train.checkpoint_every=5"): r"`train.keep_last` is 2: the older checkpoints"}
    for overrides, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, list(overrides))


def test_pretraining_with_an_ema_resumes_exactly(prepared_mlm: Path, tmp_path: Path) -> None:
    assert_resume_is_exact(prepared_mlm, tmp_path, ["train.ema=0.7"], steps=6, stop_at_micro_batch=2 * 3)


# --- train.batch_ramp_start ---------------------------------------------------------------------------


def test_pretraining_resumes_exactly_in_a_batch_ramp_and_across_its_end(prepared_mlm: Path, tmp_path: Path) -> None:
    # global 32 from 8 over the first 4 of 8 steps: steps of 8, 8, 16, 24, then 32 (1, 1, 2, 3, 4 micro-batches)
    ramp = ["train.global_batch_size=32", "train.batch_ramp_start=8", "train.batch_ramp_fraction=0.5"]
    first, resumed = assert_resume_is_exact(prepared_mlm, tmp_path, ramp, steps=8, stop_at_micro_batch=3)
    assert (first.state.step, first.state.consumed_samples) == (3, 8 + 8 + 16)
    assert resumed.state.consumed_samples == 8 + 8 + 16 + 24 + 4 * 32


def test_a_batch_ramp_is_checked_against_the_batch_sizes_and_the_budget(prepared_mlm: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config key `train.batch_ramp_start` is 16; it must be in \[1, 15\]"):
        load_config(None, ["train.global_batch_size=16", "train.batch_ramp_start=16"])
    cases = {"unit": (["train.batch_ramp_start=4", "train.max_steps=4"],
                      r"`train.batch_ramp_start` \(4\) must be a multiple of `train.micro_batch_size` × world size \(8\)"),
             "time": (["train.batch_ramp_start=8", "train.max_time_minutes=1"],
                      r"train.batch_ramp_start follow\(s\) the step count, but the run has only a wall-clock budget"),
             "every step-keyed switch": (["train.batch_ramp_start=8", "train.max_time_minutes=1",
                                          "data.mask_schedule=linear", "data.mask_prob_start=0.3"],
                                         r"data.mask_schedule and train.batch_ramp_start follow\(s\) the step count")}
    for name, (overrides, message) in cases.items():
        config = run_config(prepared_mlm, tmp_path / name, *overrides)
        with pytest.raises(ConfigError, match=message):
            Trainer(config, PretrainTask(config)).fit()


# --- data.seq_len_schedule --------------------------------------------------------------------------


def test_sequence_length_phases_follow_the_steps_then_the_prepared_length() -> None:
    curriculum = DataCurriculum(seq_len_phases=((16, 0.5), (32, 0.75)))
    assert [curriculum.at(step, 8).seq_len for step in range(9)] == [16, 16, 16, 16, 32, 32, None, None, None]
    flat = np.array([2, 10, 11, 12, 13, 3, 2, 20, 3, 2, 30, 31, 32, 33, 34, 35, 3])
    cut, lengths = cut_samples(flat, np.array([6, 3, 8]), 4, sep_id=3)
    assert lengths.tolist() == [4, 3, 4]
    assert cut.tolist() == [2, 10, 11, 3, 2, 20, 3, 2, 30, 31, 3]


def test_the_loader_cuts_samples_to_the_phase_length_with_the_masks_they_had(prepared_mlm: Path) -> None:
    dataset = PretokenizedDataset(prepared_mlm, "train")
    masking = MaskingSettings(mask_prob=0.3, seed=3)
    phased = PretrainingLoader(dataset, BatchGeometry(8, 8), seed=3, masking=masking,
                               curriculum=DataCurriculum(mask_prob=0.3, seq_len_phases=((24, 0.5),)))
    whole = PretrainingLoader(dataset, BatchGeometry(8, 8), seed=3, masking=masking)
    short, full = (next(iter(loader.iterate(0, total_steps=4))) for loader in (phased, whole))
    assert full["max_seqlen"] > 24 and short["max_seqlen"] <= 24
    cu, full_cu = short["cu_seqlens"].tolist(), full["cu_seqlens"].tolist()
    full_masked = set(full["masked_positions"].tolist())
    assert any(full_cu[row + 1] - full_cu[row] > 24 for row in range(8))
    for row in range(8):
        tokens = short["input_ids"][cu[row]:cu[row + 1]]
        assert int(tokens[0]) == 2  # [CLS]
        if full_cu[row + 1] - full_cu[row] > 24:  # cut: the first 23 tokens with their masks, then [SEP]
            assert cu[row + 1] - cu[row] == 24 and int(tokens[-1]) == 3
            expected = {p - full_cu[row] for p in full_masked if full_cu[row] <= p < full_cu[row] + 23}
            assert {p - cu[row] for p in short["masked_positions"].tolist() if cu[row] <= p < cu[row + 1]} == expected
    after = next(iter(phased.iterate(2 * 8, step=2, total_steps=4)))  # the second half: samples as prepared
    assert after["max_seqlen"] > 24


def test_a_sequence_length_schedule_is_checked(prepared_corpus: Path, tmp_path: Path) -> None:
    cases = {"[{seq_len: 64, until: 0.5}]": r"`data.seq_len_schedule\[0\].seq_len` is 64; it must be in \[8, 63\]",
             "[{seq_len: 16, until: 1.0}]": r"`data.seq_len_schedule\[0\].until` is 1.0; it must be in \(0.0, 1.0\)",
             "[{seq_len: 16, until: 0.5}, {seq_len: 32, until: 0.5}]":
                 r"`data.seq_len_schedule\[1\].until` is 0.5, not after the previous phase's end \(0.5\)"}
    for value, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_config(None, ["data.seq_len=64", f"data.seq_len_schedule={value}"])
    with pytest.raises(ConfigError, match=r"`seq_len:16` in override .* is read as one key; write a space after each "):
        load_config(None, ["data.seq_len=64", "data.seq_len_schedule=[{seq_len:16,until:0.5}]"])
    assert load_config(None, ["data.seq_len=64", "data.seq_len_schedule=[{seq_len: 16, until: 0.5}]"]
                       ).step_keyed_switches() == ["data.seq_len_schedule"]
    config = run_config(prepared_corpus, tmp_path / "nsp", "train.max_steps=2", "data.seq_len=128",
                        "data.seq_len_schedule=[{seq_len: 32, until: 0.5}]")
    with pytest.raises(ConfigError, match=r"`data.seq_len_schedule` cuts samples, and .* holds NSP pairs"):
        Trainer(config, PretrainTask(config)).fit()


def test_pretraining_resumes_exactly_across_a_sequence_length_phase_change(prepared_mlm: Path, tmp_path: Path) -> None:
    # 32 tokens for the first 4 of 8 steps, then 64; stopped during step 2, resumed at step 3
    assert_resume_is_exact(prepared_mlm, tmp_path, ["data.seq_len_schedule=[{seq_len: 32, until: 0.5}]"], steps=8,
                           stop_at_micro_batch=2 * 2 + 1)


# --- all of them, through a kill -9 ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
EVERY_SWITCH = ["data.mask_schedule=cosine", "data.mask_prob_start=0.4", "train.global_batch_size=32",
                "train.batch_ramp_start=8", "train.batch_ramp_fraction=0.5", "data.seq_len_schedule=[{seq_len: 32, until: 0.5}]",
                "train.ema=0.7", "schedule.name=one_cycle", "schedule.peak_at=0.25", "train.checkpoint_every=2",
                "optim.name=stable_adamw", "train.disable_dropout=true", "train.disable_dropout_until=0.5",
                "train.max_steps=8", "data.num_workers=1"]

# trains in a child process that kills itself (SIGKILL: no handler, no checkpoint) at training micro-batch argv[2]
KILLED_AT = """
import os, signal, sys, tempfile
from bertforge.config import load_config
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.trainer import Trainer

class KilledAt(PretrainTask):
    calls = 0
    def forward_step(self, batch, model):
        if model.training:
            KilledAt.calls += 1
            if KilledAt.calls == int(sys.argv[2]):
                os.kill(os.getpid(), signal.SIGKILL)
        return super().forward_step(batch, model)

path = tempfile.mktemp(suffix=".yaml")
open(path, "w").write(sys.argv[1])
config = load_config(path)
Trainer(config, KilledAt(config)).fit()
"""


@pytest.mark.slow
def test_a_run_with_every_switch_killed_with_sigkill_resumes_to_the_uninterrupted_weights(
        prepared_mlm: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    from bertforge.config import config_to_yaml

    reference = tmp_path / "reference"
    config = run_config(prepared_mlm, reference, *EVERY_SWITCH)
    Trainer(config, PretrainTask(config)).fit()
    killed = tmp_path / "killed"
    config = run_config(prepared_mlm, killed, *EVERY_SWITCH)
    # micro-batches per step 1, 1, 2, 3, 4, ...: number 6 is in step 3, after the checkpoint of step 2
    done = subprocess.run([sys.executable, "-c", KILLED_AT, config_to_yaml(config), "6"], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT, env=os.environ | {"PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert (killed / "checkpoints" / "latest").read_text() == "step-00000002"
    result = Trainer(config, PretrainTask(config)).fit()
    assert result.state.step == 8
    for name in ("checkpoints/step-00000008/model/model.safetensors", "checkpoints/step-00000008/ema.safetensors",
                 "final/model.safetensors"):
        a, b = (load_file(run / name) for run in (reference, killed))
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), name
