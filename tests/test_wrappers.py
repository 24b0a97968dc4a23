"""The wrappers `train/distributed.py: parallelize` applies to a built model: activation checkpointing
and torch.compile, each against the plain model on CPU in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import packed_batch, tiny_config
from helpers.tiny_pretraining import train, train_losses

from bertforge.config import DistSection
from bertforge.models import BertforgeForPreTraining
from bertforge.train.distributed import DistEnv, parallelize


def pretraining_batch() -> dict[str, object]:
    batch = packed_batch([5, 9, 3, 7])
    batch.update(masked_positions=torch.tensor([1, 4, 7, 12, 20]), masked_labels=torch.tensor([3, 5, 7, 9, 11]),
                 next_sentence_label=torch.tensor([0, 1, 0, 1]))
    return batch


def gradients_and_layer_calls(checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    """One forward + backward with dropout on; how many times the first layer's MLP ran."""
    torch.manual_seed(0)
    model = BertforgeForPreTraining(tiny_config(hidden_dropout=0.1, attention_dropout=0.1), nsp=True)
    wrapped = parallelize(model, list(model.encoder.layers), DistSection(activation_checkpointing=checkpointing),
                          DistEnv(), torch.device("cpu"), None)
    calls = 0

    def count(*_: object) -> None:
        nonlocal calls
        calls += 1

    model.encoder.layers[0].mlp.register_forward_hook(count)
    torch.manual_seed(1)  # the same dropout masks in both runs
    output = wrapped(**pretraining_batch())
    (output.mlm_loss_sum + output.nsp_loss_sum).backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}, calls


def test_activation_checkpointing_recomputes_each_layer_and_gives_the_plain_runs_gradients_bitwise() -> None:
    """Tolerance: none. The recomputation runs the same kernels on the same inputs, and torch's
    checkpoint restores the RNG state, so even the dropout masks of the second forward are the same."""
    plain, plain_calls = gradients_and_layer_calls(checkpointing=False)
    checkpointed, checkpointed_calls = gradients_and_layer_calls(checkpointing=True)
    assert (plain_calls, checkpointed_calls) == (1, 2)  # the layer really ran again in backward
    assert plain.keys() == checkpointed.keys()
    for name, gradient in plain.items():
        assert torch.equal(checkpointed[name], gradient), name


@pytest.mark.slow
def test_compiled_training_matches_eager(prepared_corpus: Path, tmp_path: Path) -> None:
    """`dist.compile=true` through the trainer, 2 steps of a tiny pre-training model against eager.

    Compiled with the `aot_eager` backend: dynamo's capture, guards and graph breaks and AOTAutograd's
    traced backward (the parts our model code can break) without inductor's C++ code generation,
    which took 150 s for this tiny model on the 2-core CI machine. Measured: the losses are bitwise
    equal; the tolerance is 1e-6 relative, for other CPUs' kernels.
    """
    torch._dynamo.reset()
    eager = train(prepared_corpus, tmp_path / "eager", "train.max_steps=2")
    compiled = train(prepared_corpus, tmp_path / "compiled", "train.max_steps=2", "dist.compile=true",
                     "dist.compile_backend=aot_eager")
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert graphs > 0  # the model really went through torch.compile
    assert train_losses(compiled) == pytest.approx(train_losses(eager), rel=1e-6)
