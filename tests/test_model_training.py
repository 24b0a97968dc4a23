"""What the trainer relies on: loss sums, accuracy counts, weight-decay groups, init, and learning."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.models import (
    BertforgeForPreTraining,
    BertforgeForSequenceClassification,
    EncoderConfig,
)
from bertforge.train.optim import default_parameter_groups


def tiny(**switches: object) -> EncoderConfig:
    values: dict[str, object] = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                                     max_position_embeddings=32)
    values.update(switches)
    return EncoderConfig(**values)  # type: ignore[arg-type]


def packed(lengths: list[int], seed: int = 0) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(4, 64, (sum(lengths),), generator=generator),
            "cu_seqlens": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32),
            "max_seqlen": max(lengths), "num_samples": len(lengths)}


def test_pretraining_losses_are_sums_and_accuracies_are_counts() -> None:
    torch.manual_seed(0)
    model = BertforgeForPreTraining(tiny(), nsp=True).eval()
    batch = packed([10, 7, 12])
    masked_positions = torch.tensor([1, 4, 11, 20, 27])
    masked_labels = torch.tensor([9, 9, 30, 41, 5])
    nsp_labels = torch.tensor([0, 1, 1])
    output = model(**batch, masked_positions=masked_positions, masked_labels=masked_labels,
                   next_sentence_label=nsp_labels)
    assert output.mlm_logits.shape == (5, 64) and output.nsp_logits.shape == (3, 2)
    assert output.num_masked == 5
    assert torch.allclose(output.mlm_loss_sum, F.cross_entropy(output.mlm_logits, masked_labels, reduction="sum"))
    assert torch.allclose(output.nsp_loss_sum, F.cross_entropy(output.nsp_logits, nsp_labels, reduction="sum"))
    assert output.mlm_correct.item() == (output.mlm_logits.argmax(-1) == masked_labels).sum().item()
    assert 0 <= output.nsp_correct.item() <= 3


def test_classification_loss_honours_class_weights_and_regression_sums_squared_errors() -> None:
    torch.manual_seed(0)
    batch = packed([6, 9])
    classifier = BertforgeForSequenceClassification(tiny(), 3).eval()
    weights = torch.tensor([1.0, 2.0, 0.5])
    labels = torch.tensor([1, 2])
    output = classifier(**batch, labels=labels, class_weights=weights)
    expected = F.cross_entropy(output.logits, labels, weight=weights, reduction="sum")
    assert torch.allclose(output.loss_sum, expected)
    regressor = BertforgeForSequenceClassification(tiny(pooling="mean"), 1, "regression").eval()
    targets = torch.tensor([0.5, -1.0])
    output = regressor(**batch, labels=targets)
    assert output.logits.shape == (2, 1) and output.correct is None
    assert torch.allclose(output.loss_sum, ((output.logits.squeeze(1) - targets) ** 2).sum())


def test_no_weight_decay_on_biases_and_norms_and_each_parameter_once() -> None:
    model = BertforgeForPreTraining(tiny(), nsp=True)
    decay, no_decay = default_parameter_groups(model, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert "encoder.embeddings.word_embeddings.weight" in decayed  # tied with the decoder: listed once
    assert "encoder.embeddings.norm.weight" in not_decayed
    assert "encoder.layers.0.attention.qkv.bias" in not_decayed
    assert "mlm_head.transform.norm.weight" in not_decayed
    assert all(name.endswith("weight") and "norm" not in name for name in decayed)
    assert len(decayed) + len(not_decayed) == len(list(model.parameters()))


def test_deep_pre_norm_stacks_scale_down_the_residual_projections() -> None:
    torch.manual_seed(0)
    config = tiny(norm="pre", num_layers=8, hidden_size=256, intermediate_size=512, num_heads=4)
    model = BertforgeForPreTraining(config)
    layer = model.encoder.layers[3]
    expected_residual = config.initializer_range / math.sqrt(2 * config.num_layers)
    assert layer.attention.qkv.weight.std().item() == pytest.approx(config.initializer_range * 0.88, rel=0.05)
    assert layer.mlp.output.weight.std().item() == pytest.approx(expected_residual * 0.88, rel=0.05)
    assert layer.attention.output.weight.abs().max().item() <= 2 * expected_residual  # truncated at 2 std
    # redrawn, not clamped: clamping would pile the 4.6% beyond 2 std onto the bounds
    assert (layer.attention.qkv.weight.abs() > 1.98 * config.initializer_range).float().mean().item() < 0.01
    assert torch.equal(layer.mlp_norm.weight, torch.ones(256))
    post = BertforgeForPreTraining(tiny(num_layers=8, hidden_size=256, intermediate_size=512, num_heads=4))
    assert post.encoder.layers[3].mlp.output.weight.std().item() == pytest.approx(0.02 * 0.88, rel=0.05)


@pytest.mark.parametrize("switches", [dict(), dict(position="rope", mlp="geglu", norm="pre", bias=False,
                                                   type_vocab_size=0, local_attention_window=4, global_every_n=2)],
                         ids=["classic", "modern"])
def test_a_few_adamw_steps_learn_a_fixed_batch(switches: dict[str, object]) -> None:
    torch.manual_seed(0)
    model = BertforgeForPreTraining(tiny(hidden_dropout=0.0, attention_dropout=0.0, **switches))
    optimizer = torch.optim.AdamW(default_parameter_groups(model, 0.01), lr=3e-3)
    batch = packed([12, 5, 12, 9], seed=3)
    masked_positions = torch.tensor([0, 3, 8, 13, 20, 25, 33])
    masked_labels = batch["input_ids"][masked_positions]  # type: ignore[index]
    losses = []
    for _ in range(25):
        output = model(**batch, masked_positions=masked_positions, masked_labels=masked_labels)
        loss = output.mlm_loss_sum / output.num_masked
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_alibi_slopes_move_with_the_model_but_stay_out_of_the_state_dict() -> None:
    model = BertforgeForPreTraining(tiny(position="alibi")).to(torch.float64)
    slopes = model.encoder.layers[0].attention.alibi_slopes
    assert isinstance(slopes, torch.Tensor) and slopes.dtype == torch.float64
    assert not any("alibi" in key for key in model.state_dict())
