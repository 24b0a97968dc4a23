"""Sentence embeddings: strict pair reading, unpadded role blocks, the losses, in-batch negatives that stay
global under accumulation (GradCache) and under 2-rank DDP, exact resume, retrieval metrics."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.finetuning import QUIET_RUN, TINY_MODEL, metrics_records, minilm_dir
from helpers.pairs import gloss_pairs, write_jsonl

from bertforge.config import config_to_yaml, load_config
from bertforge.data.pairs import PairColumns, PairDataset, PairSplit, collate_pairs, read_pair_split
from bertforge.errors import ConfigError, DataError
from bertforge.tasks.contrastive import (
    embed,
    global_batch_step,
    mnrl_over,
    multiple_negatives_ranking,
    roles_of,
)
from bertforge.tasks.embedding import EmbeddingTask
from bertforge.tasks.retrieval import retrieval_metrics, retrieval_scores, retrieval_set
from bertforge.train.task import StepRunner
from bertforge.train.trainer import Trainer


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pairs")
    return {"train": write_jsonl(root / "train.jsonl", gloss_pairs(96)),
            "validation": write_jsonl(root / "validation.jsonl", gloss_pairs(24, "validation"))}


def pair_overrides(files: dict[str, Path], *extra: str) -> list[str]:
    return [*QUIET_RUN, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", "finetune.task_type=embedding",
            f"finetune.train_file={files['train']}", f"finetune.validation_file={files['validation']}",
            "finetune.text_column=anchor", "finetune.text_pair_column=positive", "finetune.max_length=48",
            "optim.lr=1e-3", *extra]


# ---------------------------------------------------------------------------------------------
# data


def test_pairs_are_read_strictly_naming_the_file_line_and_the_setting(tmp_path: Path) -> None:
    good = read_pair_split(write_jsonl(tmp_path / "ok.jsonl", gloss_pairs(3)),
                           PairColumns("anchor", "positive", negative="negative"))
    assert len(good) == 3 and good.negatives is not None and good.scores is None
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"anchor": "a dog", "positive": "a canine"},
                                               {"anchor": "a cat", "positive": " "}])
    with pytest.raises(DataError, match=rf"{bad}:2: empty text in column 'positive'"):
        read_pair_split(bad, PairColumns("anchor", "positive"))
    with pytest.raises(DataError, match=r"no column 'negative'.*finetune.embedding.negative_column"):
        read_pair_split(bad, PairColumns("anchor", "positive", negative="negative"))
    scored = tmp_path / "scored.csv"
    scored.write_text("a,b,score\nthe dog,a canine,0.9\nthe cat,a car,lots\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{scored}:3: regression label 'lots'"):
        read_pair_split(scored, PairColumns("a", "b", score="score"))


def test_an_embedding_config_without_the_positive_column_is_refused() -> None:
    from bertforge.data.pairs import pair_columns

    section = load_config(None, ["finetune.task_type=embedding", "finetune.train_file=x.jsonl"]).finetune
    with pytest.raises(ConfigError, match="finetune.text_pair_column"):
        pair_columns(section)


def test_a_batch_holds_every_text_unpadded_in_blocks_by_role() -> None:
    split = PairSplit("memory", ["a dog", "the cat sat"], ["a canine animal", "a feline"],
                      ["a car", "a tree in the park"])
    dataset = PairDataset(split, minilm_dir(), max_length=16)
    batch = collate_pairs([dataset[0], dataset[1]])
    lengths = (batch["cu_seqlens"][1:] - batch["cu_seqlens"][:-1]).tolist()
    expected = [len(dataset.columns[role][row]) for role in range(3) for row in range(2)]
    assert lengths == expected and batch["input_ids"].numel() == sum(expected)  # no padding
    assert batch["num_samples"] == 2 and batch["texts_per_example"] == 3
    embeddings = torch.arange(6.0).unsqueeze(1)
    assert [r.flatten().tolist() for r in roles_of(embeddings, batch)] == [[0, 1], [2, 3], [4, 5]]


# ---------------------------------------------------------------------------------------------
# losses and metrics


def test_mnrl_is_cross_entropy_of_scaled_cosines_against_the_own_positive() -> None:
    torch.manual_seed(0)
    anchors, candidates = torch.randn(3, 8), torch.randn(5, 8)
    cos = torch.nn.functional.normalize(anchors, dim=1) @ torch.nn.functional.normalize(candidates, dim=1).T
    by_hand = -torch.stack([torch.log_softmax(20 * cos[i], 0)[i] for i in range(3)]).mean()
    torch.testing.assert_close(multiple_negatives_ranking(anchors, candidates, 20.0), by_hand)


def test_retrieval_metrics_match_a_hand_checked_case() -> None:
    # query 0: relevant doc ranked 1st; query 1: relevant docs {3, 4} ranked 2nd and 12th; query 2: none in top 10
    ranked = np.array([[0, 1, 2], [2, 3, 1], [1, 2, 0]])
    relevant = [{0}, {3, 4}, {5}]
    metrics = retrieval_metrics(ranked, relevant)
    assert metrics["mrr_at_10"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    assert metrics["recall_at_1"] == pytest.approx((1 + 0 + 0) / 3)
    assert metrics["recall_at_5"] == pytest.approx((1 + 1 / 2 + 0) / 3)
    ideal_two = 1 + 1 / np.log2(3)
    assert metrics["ndcg_at_10"] == pytest.approx((1 + (1 / np.log2(3)) / ideal_two + 0) / 3)


def test_queries_and_corpus_are_the_distinct_texts_of_the_pairs() -> None:
    split = PairSplit("memory", ["bank", "bank", "dog"], ["river side", "money place", "a canine"],
                      ["money place", "a cat", "a cat"])
    found = retrieval_set(split)
    assert found.query_rows == [0, 2]
    assert found.corpus_rows == [(1, 0), (1, 1), (1, 2), (2, 1)]  # "money place" once, from the positives
    assert found.relevant == [{0, 1}, {2}]
    # embeddings that put each anchor on its positives: perfect scores
    roles = [torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]]),
             torch.tensor([[1.0, 0.1, 0], [1.0, -0.1, 0], [0, 1.0, 0]]), torch.tensor([[0, 0, 1.0]] * 3)]
    assert retrieval_scores(split, roles)["ndcg_at_10"] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# in-batch negatives stay global


def tiny_embedder(dropout: float) -> torch.nn.Module:
    from bertforge.models import BertforgeForEmbedding
    from bertforge.models.config import get_preset

    torch.manual_seed(0)
    config = dataclasses.replace(get_preset("bert-tiny"), vocab_size=30528, hidden_dropout=dropout,
                                 attention_dropout=0.0, pooling="mean")  # MiniLM's vocabulary
    return BertforgeForEmbedding(config)


def plain_runner(model: torch.nn.Module) -> StepRunner:
    return StepRunner(model, torch.device("cpu"), 1, lambda last: nullcontext(), nullcontext,
                      lambda loss: loss.backward(), lambda rows: rows)


def micro_batches(size: int, rows: int = 8) -> list[dict]:
    dataset = PairDataset(PairSplit("memory", *zip(*[(r["anchor"], r["positive"], r["negative"])
                                                     for r in gloss_pairs(rows)], strict=True)),
                          minilm_dir(), max_length=32)
    return [collate_pairs([dataset[i] for i in range(start, start + size)]) for start in range(0, rows, size)]


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_accumulated_micro_batches_give_the_loss_and_gradients_of_one_big_batch() -> None:
    """GradCache: 4 micro-batches of 2 triplets score each anchor against all 16 candidates, as one batch of 8."""
    model = tiny_embedder(dropout=0.0).train()

    def loss(embeddings, batches, gather):  # type: ignore[no-untyped-def]
        return mnrl_over(embeddings, batches, gather, 20.0)

    whole = global_batch_step(micro_batches(8), plain_runner(model), loss)
    reference = gradients(model)
    model.zero_grad(set_to_none=True)
    accumulated = global_batch_step(micro_batches(2), plain_runner(model), loss)
    assert accumulated == pytest.approx(whole, rel=1e-6)
    with torch.no_grad():
        local_only = np.mean([float(loss([embed(model, b)], [b], lambda rows: rows)) for b in micro_batches(2)])
    assert abs(local_only - whole) > 0.1  # per-micro-batch negatives would be a different (easier) loss
    for name, grad in gradients(model).items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-6)


def test_the_second_pass_replays_the_dropout_masks_of_the_first() -> None:
    """Dropout on: the cached step's gradients equal those of embedding the micro-batches one after another
    with a graph from the same RNG state, and the RNG ends where that run leaves it."""
    model = tiny_embedder(dropout=0.1).train()
    batches = micro_batches(2)

    def loss(embeddings, batches_, gather):  # type: ignore[no-untyped-def]
        return mnrl_over(embeddings, batches_, gather, 20.0)

    torch.manual_seed(7)
    direct = loss([embed(model, b) for b in batches], batches, lambda rows: rows)
    direct.backward()
    reference, rng_after = gradients(model), torch.get_rng_state()
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    cached = global_batch_step(batches, plain_runner(model), loss)
    assert cached == pytest.approx(float(direct.detach()), rel=1e-6)
    assert torch.equal(torch.get_rng_state(), rng_after)
    for name, grad in gradients(model).items():
        torch.testing.assert_close(grad, reference[name], rtol=1e-4, atol=1e-6)


def three_steps_of_16(pair_files: dict[str, Path], micro: int) -> list[str]:
    """3 steps of a global batch of 16 in micro-batches of `micro`, dropout off."""
    return pair_overrides(pair_files, "model.hidden_dropout=0", "model.attention_dropout=0",
                          "train.global_batch_size=16", f"train.micro_batch_size={micro}", "train.max_steps=3",
                          "train.log_every=1", "train.eval_every=3")


@pytest.fixture(scope="module")
def one_big_batch_losses(pair_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """One process, one micro-batch of 16: the reference of the accumulating run and of the 2-rank run."""
    root = tmp_path_factory.mktemp("one-big-batch")
    config = load_config(None, [f"run.output_dir={root}", "run.name=big", *three_steps_of_16(pair_files, 16)])
    assert Trainer(config, EmbeddingTask(config)).fit().exit_code == 0
    losses = [r["loss"] for r in metrics_records(root / "big", "train")]
    assert len(losses) == 3 and losses[-1] < losses[0]
    return losses


def test_training_with_accumulation_follows_training_with_one_big_batch(pair_files: dict[str, Path],
                                                                       one_big_batch_losses: list[float],
                                                                       tmp_path: Path) -> None:
    config = load_config(None, [f"run.output_dir={tmp_path}", "run.name=accumulated", *three_steps_of_16(pair_files, 4)])
    assert Trainer(config, EmbeddingTask(config)).fit().exit_code == 0
    accumulated = [r["loss"] for r in metrics_records(tmp_path / "accumulated", "train")]
    assert accumulated == pytest.approx(one_big_batch_losses, rel=1e-5)


def test_two_ranks_share_their_negatives_like_one_process(pair_files: dict[str, Path], one_big_batch_losses: list[float],
                                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun, 2 ranks x 2 micro-batches of 4 against 1 process x 1 micro-batch of 16: the same losses.
    (The one process is the module's in-process run, and torchrun's launcher runs in this process
    (`helpers.torchrun`): a second interpreter for either only added start-up CPU; the ranks are processes.)"""
    from helpers.torchrun import torchrun_in_this_process

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the ranks' environment
    config = tmp_path / "ranks-2.yaml"
    config.write_text(config_to_yaml(load_config(None, [f"run.output_dir={tmp_path}", "run.name=ranks-2",
                                                        *three_steps_of_16(pair_files, 4)])))
    torchrun_in_this_process("--standalone", "--nproc_per_node=2", "-m", "bertforge.cli", "-q", "finetune",
                             str(config))
    two_ranks = [r["loss"] for r in metrics_records(tmp_path / "ranks-2", "train")]
    assert two_ranks == pytest.approx(one_big_batch_losses, rel=1e-5, abs=1e-6)


def test_cosine_regression_on_scored_pairs_accumulates_like_one_batch_and_reports_correlations(
        tmp_path: Path) -> None:
    rows = [row for pair in gloss_pairs(48) for row in ({"a": pair["anchor"], "b": pair["positive"], "score": 1.0},
                                                        {"a": pair["anchor"], "b": pair["negative"], "score": 0.0})]
    files = {"train": write_jsonl(tmp_path / "train.jsonl", rows[:64]),
             "validation": write_jsonl(tmp_path / "validation.jsonl", rows[64:])}
    runs = {}
    for name, micro in (("big", 16), ("accumulated", 8)):
        config = load_config(None, [f"run.output_dir={tmp_path}", f"run.name={name}", *QUIET_RUN, *TINY_MODEL,
                                    f"model.tokenizer={minilm_dir()}", "model.hidden_dropout=0",
                                    "model.attention_dropout=0", "finetune.task_type=embedding",
                                    "finetune.embedding.loss=cosine", f"finetune.train_file={files['train']}",
                                    f"finetune.validation_file={files['validation']}", "finetune.text_column=a",
                                    "finetune.text_pair_column=b", "finetune.label_column=score",
                                    "finetune.max_length=48", "optim.lr=1e-3", "train.global_batch_size=16",
                                    f"train.micro_batch_size={micro}", "train.max_steps=3", "train.log_every=1",
                                    "train.eval_every=3", "train.best_metric=spearman", "train.best_mode=max"])
        assert Trainer(config, EmbeddingTask(config)).fit().exit_code == 0
        runs[name] = [r["loss"] for r in metrics_records(tmp_path / name, "train")]
    assert runs["accumulated"] == pytest.approx(runs["big"], rel=1e-5)
    validation = metrics_records(tmp_path / "big", "validation")[-1]
    assert {"pearson", "spearman", "mse", "loss"} <= set(validation) and validation["mse"] == pytest.approx(validation["loss"], rel=1e-5)


class _SigtermDuringStep(EmbeddingTask):
    """The embedding task, sending itself SIGTERM during training step `at` (1-based)."""

    at = 0
    calls = 0

    def train_step(self, micro_batches, runner):  # type: ignore[no-untyped-def]
        _SigtermDuringStep.calls += 1
        if _SigtermDuringStep.calls == _SigtermDuringStep.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().train_step(micro_batches, runner)


def test_an_accumulating_run_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights_bit_for_bit(
        pair_files: dict[str, Path], tmp_path: Path) -> None:
    """Dropout on, GradCache's two passes, a linear schedule: the resumed run draws the same masks."""
    from safetensors.torch import load_file

    def config(name: str):  # type: ignore[no-untyped-def]
        return load_config(None, [f"run.output_dir={tmp_path}", f"run.name={name}", *pair_overrides(
            pair_files, "schedule.name=linear", "schedule.warmup=2", "train.micro_batch_size=8",
            "train.global_batch_size=16", "train.max_steps=5", "train.log_every=1", "train.eval_every=100",
            "train.checkpoint_every=100")])

    whole = Trainer(config("whole"), EmbeddingTask(config("whole"))).fit()
    _SigtermDuringStep.at, _SigtermDuringStep.calls = 3, 0
    stopped = Trainer(config("stopped"), _SigtermDuringStep(config("stopped"))).fit()
    assert stopped.stopped_by == "signal" and stopped.state.step == 3
    resumed = Trainer(config("stopped"), EmbeddingTask(config("stopped"))).fit()
    assert resumed.state.step == whole.state.step == 5
    ours, reference = (load_file(run.run_dir / "final" / "model.safetensors") for run in (resumed, whole))
    assert ours.keys() == reference.keys()
    for name in reference:
        assert torch.equal(ours[name], reference[name]), name
    assert [r["loss"] for r in metrics_records(tmp_path / "stopped", "train")] == \
        [r["loss"] for r in metrics_records(tmp_path / "whole", "train")]


# ---------------------------------------------------------------------------------------------
# a real fine-tune: all-MiniLM-L6-v2 on WordNet "find the gloss of this usage"


def test_minilm_fine_tuned_on_wordnet_usages_finds_their_glosses(tmp_path_factory: pytest.TempPathFactory) -> None:
    from helpers.parity_slices import parity_task_slices

    from bertforge.tasks.retrieval import RETRIEVAL_METRICS

    root = tmp_path_factory.mktemp("wordnet-embedding")
    files, _ = parity_task_slices("wordnet-embedding", root, {"train": 192, "validation": 64, "test": 96})
    config = load_config(None, [
        f"run.output_dir={root}", "run.name=minilm", *QUIET_RUN, "model.init_from=all-MiniLM-L6-v2",
        "finetune.task_type=embedding", f"finetune.train_file={files['train']}",
        f"finetune.validation_file={files['validation']}", f"finetune.test_file={files['test']}",
        "finetune.text_column=anchor", "finetune.text_pair_column=positive", "finetune.max_length=48",
        "finetune.embedding.normalize=true", "optim.lr=5e-5", "schedule.name=linear", "schedule.warmup=0.1",
        "train.micro_batch_size=32", "train.global_batch_size=32", "train.max_steps=6", "train.log_every=1",
        "train.eval_every=3", "train.best_metric=ndcg_at_10", "train.best_mode=max"])
    assert Trainer(config, EmbeddingTask(config)).fit().exit_code == 0
    run_dir = root / "minilm"
    report = json.loads((run_dir / "test_results.json").read_text())
    assert report["task_type"] == "embedding" and report["metrics"]["examples"] == 96
    validations = metrics_records(run_dir, "validation")
    assert len(validations) == 2 and set(RETRIEVAL_METRICS) <= set(validations[-1])
    # MiniLM already finds a usage's gloss among 96 far more often than chance (1/96)
    assert report["metrics"]["recall_at_10"] > 0.5 and report["metrics"]["mrr_at_10"] > 0.3
    losses = [r["loss"] for r in metrics_records(run_dir, "train")]
    assert sum(losses[-3:]) < sum(losses[:3])
    modules = json.loads((run_dir / "final" / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling", "2_Normalize"]
    assert json.loads((run_dir / "final" / "sentence_bert_config.json").read_text())["max_seq_length"] == 48
