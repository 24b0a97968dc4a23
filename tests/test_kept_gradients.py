"""The word-embedding gradient added in place into a kept buffer gives the gradients and steps autograd's
fresh dense gradient gives, tied MLM decoder and accumulation over micro-batches included, in one buffer."""

from __future__ import annotations

import copy

import pytest
import torch
from test_model_training import packed, tiny

from bertforge.models import BertforgeForPreTraining, BertforgeForSequenceClassification
from bertforge.train.kept_gradients import KeptGradients


def pretraining_loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    batch = packed([9, 14, 6], seed=seed)
    positions = torch.tensor([1, 3, 10, 17, 25])
    labels = torch.randint(4, 64, (5,), generator=torch.Generator().manual_seed(seed))
    return model(**batch, masked_positions=positions, masked_labels=labels).mlm_loss_sum


def classification_loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    return model(**packed([9, 14, 6], seed=seed), labels=torch.tensor([0, 2, 1])).loss_sum


@pytest.mark.parametrize(("build", "loss_of"), [
    (lambda: BertforgeForPreTraining(tiny()), pretraining_loss),  # the decoder shares the word embeddings
    (lambda: BertforgeForSequenceClassification(tiny(), num_labels=3), classification_loss),
], ids=["pretraining-tied", "classification"])
def test_kept_word_gradients_step_like_fresh_ones(build, loss_of) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    fresh = build().train()
    kept = copy.deepcopy(fresh)
    keeper = KeptGradients(kept, enabled=True)
    assert len(keeper.parameters) == 1
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (fresh, kept)]
    buffer_address = None
    for step in range(3):
        for micro_batch in range(2):  # accumulation: both micro-batches add into the same .grad
            for model in (fresh, kept):
                torch.manual_seed(step)  # the same dropout masks on both
                loss_of(model, seed=10 * step + micro_batch).backward()
        word = kept.encoder.embeddings.word_embeddings.weight
        torch.testing.assert_close(word.grad, fresh.encoder.embeddings.word_embeddings.weight.grad)
        for (name, a), b in zip(fresh.named_parameters(), kept.parameters(), strict=True):
            torch.testing.assert_close(a.grad, b.grad, msg=name)
        buffer_address = buffer_address or word.grad.data_ptr()
        assert word.grad.data_ptr() == buffer_address  # one buffer for the whole run
        for optimizer in optimizers:
            optimizer.step()
        optimizers[0].zero_grad(set_to_none=True)
        keeper.zero_grad(optimizers[1])
        assert torch.count_nonzero(word.grad) == 0
        assert all(p.grad is None for p in kept.parameters() if p is not word)
    # the tied decoder's gradient and the rows are summed in another order: float rounding, which Adam's
    # normalised first steps magnify on near-zero gradients (each step moves a weight by up to lr = 1e-2)
    for a, b in zip(fresh.parameters(), kept.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def dense_backward_ops(model: torch.nn.Module) -> int:
    """How many times autograd's dense embedding backward (a fresh [vocab, hidden] gradient) runs in a backward."""
    from torch.profiler import ProfilerActivity, profile

    loss = classification_loss(model, seed=2)
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        loss.backward()
    return sum(event.count for event in profiler.key_averages() if event.key == "aten::embedding_dense_backward")


def test_the_kept_path_allocates_no_dense_word_gradient() -> None:
    torch.manual_seed(0)
    fresh = BertforgeForSequenceClassification(tiny(), num_labels=3)
    kept = copy.deepcopy(fresh)
    KeptGradients(kept, enabled=True)
    # position and token-type embeddings keep autograd's backward: only the word embeddings are kept
    assert dense_backward_ops(fresh) == dense_backward_ops(kept) + 1


def test_evaluation_and_disabled_runs_use_the_stock_lookup() -> None:
    torch.manual_seed(0)
    model = BertforgeForSequenceClassification(tiny(), num_labels=3)
    KeptGradients(model, enabled=False)
    classification_loss(model, seed=1).backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad is not None  # autograd's own dense gradient
    KeptGradients(model, enabled=True)
    with torch.no_grad():
        classification_loss(model, seed=1)  # no graph, no in-place add


def test_a_single_process_cpu_fine_tune_keeps_the_word_gradient(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from helpers.finetuning import TINY_MODEL, minilm_dir, run_config, supersense_files

    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer

    config = run_config(tmp_path / "run", *TINY_MODEL, *supersense_files(tmp_path / "data", train=64, validation=16,
                                                                          test=16),
                        f"model.tokenizer={minilm_dir()}", "train.max_steps=3", "train.micro_batch_size=16",
                        "train.global_batch_size=16", "run.device=cpu")
    trainer = Trainer(config, ClassificationTask(config))
    trainer.fit()
    (word,) = trainer.kept_gradients.parameters
    assert word is trainer.raw_model.encoder.embeddings.word_embeddings.weight
    assert word.grad is not None and torch.count_nonzero(word.grad) == 0  # kept and zeroed after the last step
