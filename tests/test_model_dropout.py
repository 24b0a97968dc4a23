"""The CPU dropout: F.dropout's distribution and gradients, in the model and in attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.models import VARIANTS, packed_batch, tiny_config

from bertforge.models import BertforgeModel
from bertforge.models.attention import PackedAttention, attention_with_dropout
from bertforge.models.dropout import Dropout, cpu_keep_mask, dropout, keep_scale


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_every_element_is_kept_with_probability_one_minus_p(p: float) -> None:
    torch.manual_seed(0)
    count = 1 << 22
    keep = cpu_keep_mask((count,), p).view(-1, 4).float()  # 4 elements share one 64-bit draw
    tolerance = 5 * (p * (1 - p) / (count // 4)) ** 0.5
    for lane in range(4):
        assert abs(keep[:, lane].mean().item() - (1 - p)) < tolerance
    # neighbours are independent: both kept as often as (1 - p)^2
    both = (keep[:, 0] * keep[:, 1]).mean().item()
    assert abs(both - (1 - p) ** 2) < 5 * ((1 - p) ** 2 / (count // 4)) ** 0.5


def test_the_expectation_is_kept_and_dropped_elements_are_zero() -> None:
    torch.manual_seed(1)
    x = torch.full((1 << 20,), 3.0)
    y = dropout(x, 0.1)
    kept = y != 0
    assert torch.allclose(y[kept], torch.full_like(y[kept], 3.0 * keep_scale(0.1)))
    assert abs(y.mean().item() - 3.0) < 0.01
    assert keep_scale(0.1) == pytest.approx(1 / 0.9, rel=1e-4)


def test_backward_masks_and_scales_the_gradient_like_the_forward() -> None:
    x = torch.randn(3, 50, dtype=torch.float64, requires_grad=True)

    def reseeded(tensor: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(5)
        return dropout(tensor, 0.25)

    assert torch.autograd.gradcheck(reseeded, (x,))
    y = reseeded(x)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert torch.equal(grad, (y != 0).double() * keep_scale(0.25))


def test_seeded_reproducible_off_in_eval_and_f_dropout_at_the_edges() -> None:
    x = torch.randn(1000)
    torch.manual_seed(3)
    first = dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(first, dropout(x, 0.1))
    assert dropout(x, 0.1, training=False) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    torch.manual_seed(4)
    tiny = dropout(x, 1e-6)  # below the mask's resolution: F.dropout's own mask
    torch.manual_seed(4)
    assert torch.equal(tiny, F.dropout(x, 1e-6))
    module = Dropout(0.2).eval()
    assert module(x) is x and "p=0.2" in repr(module)


@pytest.mark.parametrize("variant", VARIANTS)
def test_with_dropout_on_packed_sequences_still_never_see_each_other(variant: str) -> None:
    model = BertforgeModel(tiny_config(attention_backend="sdpa", hidden_dropout=0.3, attention_dropout=0.3,
                                       **VARIANTS[variant])).train()
    lengths = [7, 12, 3, 12]
    batch = packed_batch(lengths)
    changed = dict(batch, input_ids=batch["input_ids"].clone())  # type: ignore[union-attr]
    changed["input_ids"][7:19] = (changed["input_ids"][7:19] + 1) % 64
    torch.manual_seed(0)  # the same seed draws the same masks: they depend on the layout, not the values
    before = model(**batch)
    torch.manual_seed(0)
    after = model(**changed)
    untouched = torch.ones(sum(lengths), dtype=torch.bool)
    untouched[7:19] = False
    assert torch.equal(before[untouched], after[untouched])
    torch.manual_seed(1)
    assert not torch.equal(model(**batch), before)  # dropout is on


def test_attention_dropout_averages_to_attention_without_it() -> None:
    torch.manual_seed(0)
    lengths = [16, 5, 11]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    query, key, value = (torch.randn(sum(lengths), 2, 8) for _ in range(3))
    attention = PackedAttention(cu_seqlens, max(lengths), "sdpa")
    expected = attention.attend(query, key, value)
    draws = 2000
    mean = sum(attention.attend(query, key, value, dropout_p=0.2) for _ in range(draws)) / draws
    assert (mean - expected).abs().max().item() < 0.05
    assert not torch.allclose(attention.attend(query, key, value, dropout_p=0.2), expected)


def test_attention_with_dropout_has_the_gradients_of_its_forward() -> None:
    rows = [torch.randn(2, 2, 6, 4, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    bias = torch.zeros(2, 1, 6, 6, dtype=torch.float64)
    bias[0, :, :3, 3:] = bias[0, :, 3:, :3] = float("-inf")  # two sequences share the first row

    def reseeded(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(7)
        return attention_with_dropout(query, key, value, bias, 0.3)

    assert torch.autograd.gradcheck(reseeded, tuple(rows))
