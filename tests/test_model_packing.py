"""Packed (unpadded) sequences never see each other, whatever the backend or position scheme."""

from __future__ import annotations

import pytest
import torch
from helpers.models import VARIANTS, packed_batch, tiny_config

from bertforge.models import BertforgeModel, pack_inputs, pad_tokens, unpad_inputs
from bertforge.models.alibi import alibi_slopes
from bertforge.models.attention import PackedAttention, eager_attention, place_in_rows


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_changing_one_sequence_leaves_its_neighbours_outputs_unchanged(variant: str, backend: str) -> None:
    torch.manual_seed(0)
    model = BertforgeModel(tiny_config(attention_backend=backend, **VARIANTS[variant])).eval()
    lengths = [7, 12, 3, 12]
    batch = packed_batch(lengths)
    changed = dict(batch, input_ids=batch["input_ids"].clone())  # type: ignore[union-attr]
    changed["input_ids"][7:19] = (changed["input_ids"][7:19] + 1) % 64  # the second sequence only
    with torch.no_grad():
        before, after = model(**batch), model(**changed)
    untouched = torch.ones(sum(lengths), dtype=torch.bool)
    untouched[7:19] = False
    assert torch.equal(before[untouched], after[untouched])
    assert not torch.allclose(before[~untouched], after[~untouched])


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_sequences_equal_each_sequence_encoded_alone(variant: str) -> None:
    torch.manual_seed(0)
    model = BertforgeModel(tiny_config(attention_backend="sdpa", **VARIANTS[variant])).eval()
    lengths = [9, 2, 14, 5]
    batch = packed_batch(lengths, seed=1)
    with torch.no_grad():
        packed = model(**batch)
        alone = torch.cat([model(batch["input_ids"][int(start):int(start) + n])  # type: ignore[index]
                           for start, n in zip(batch["cu_seqlens"][:-1], lengths, strict=True)])  # type: ignore[index]
    assert (packed - alone).abs().max().item() <= 1e-5


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_encoding_only_some_rows_equals_slicing_the_full_output_forward_and_backward(variant: str,
                                                                                    backend: str) -> None:
    torch.manual_seed(0)
    model = BertforgeModel(tiny_config(attention_backend=backend, **VARIANTS[variant])).eval()
    batch = packed_batch([9, 2, 14, 5], seed=2)
    packed = pack_inputs(**batch)  # type: ignore[arg-type]
    rows = torch.tensor([20, 3, 11, 0, 3, 29])  # any order, repeats allowed
    weights = torch.randn(rows.numel(), 32)
    full = model.encode(packed)[rows]
    (full * weights).sum().backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    some = model.encode(packed, rows)
    (some * weights).sum().backward()
    assert some.shape == (6, 32)
    assert (some - full).abs().max().item() <= 1e-5
    for parameter, expected in zip(model.parameters(), full_grads, strict=True):
        assert torch.allclose(parameter.grad, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("use_alibi", [False, True])
def test_sdpa_backend_matches_the_eager_reference_forward_and_backward(window: int | None, use_alibi: bool) -> None:
    torch.manual_seed(0)
    lengths = [16, 5, 16, 11, 3]  # full rows need no mask; the short ones share rows
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    heads = 4
    slopes = alibi_slopes(heads) if use_alibi else None
    leaves = [torch.randn(sum(lengths), heads, 8, requires_grad=True) for _ in range(3)]
    upstream = torch.randn(sum(lengths), heads, 8)

    reference = eager_attention(*leaves, cu_seqlens, window=window, alibi_slopes=slopes)
    reference_grads = torch.autograd.grad(reference, leaves, upstream)
    output = PackedAttention(cu_seqlens, max(lengths), "sdpa").attend(*leaves, window=window, alibi_slopes=slopes)
    grads = torch.autograd.grad(output, leaves, upstream)

    assert (output - reference).abs().max().item() <= 1e-5
    for got, expected in zip(grads, reference_grads, strict=True):
        assert (got - expected).abs().max().item() <= 1e-5


def test_row_placement_puts_short_sequences_into_shared_rows() -> None:
    lengths = [8, 3, 5, 2, 6]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    placement = place_in_rows(cu_seqlens, max_seqlen=8)
    assert placement.num_rows == 3  # first fit, longest first: [8], [6 + 2], [5 + 3]
    assert not placement.is_identity
    owner = placement.sequence_of_slot.flatten()
    assert placement.slot_of_token.unique().numel() == sum(lengths)  # every token has its own slot
    sequence_of_token = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    assert torch.equal(owner[placement.slot_of_token], sequence_of_token)
    assert (owner == -1).sum().item() == placement.num_rows * 8 - sum(lengths)


def test_one_gather_of_the_fused_projection_attends_as_three_separate_ones() -> None:
    """SDPA's rows are filled by one gather of the fused [tokens, 3, heads, head_dim] projection, empty slots
    reading token 0 (kept off real queries by the mask): outputs and gradients equal the per-tensor path's."""
    lengths = [8, 3, 5, 2, 6]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    torch.manual_seed(0)
    qkv = torch.randn(sum(lengths), 3, 2, 4, requires_grad=True)
    fused = PackedAttention(cu_seqlens, 8, "sdpa")
    output = fused.attend(*qkv.unbind(1), fused=qkv)
    separate = PackedAttention(cu_seqlens, 8, "sdpa").attend(*qkv.unbind(1))
    placement = fused.placement
    assert placement.token_of_slot is not None
    assert torch.equal(placement.token_of_slot[placement.slot_of_token], torch.arange(sum(lengths)))
    assert torch.equal(output, separate)
    assert (output - eager_attention(*qkv.unbind(1), cu_seqlens)).abs().max().item() <= 1e-6
    upstream = torch.randn_like(output)
    (fused_grad,) = torch.autograd.grad(output, qkv, upstream)
    (separate_grad,) = torch.autograd.grad(separate, qkv, upstream)
    assert torch.allclose(fused_grad, separate_grad, atol=1e-6)


def test_full_length_sequences_are_attended_without_copies_or_masks() -> None:
    cu_seqlens = torch.tensor([0, 6, 12, 18], dtype=torch.int32)
    attention = PackedAttention(cu_seqlens, 6, "sdpa")
    assert attention.placement.is_identity
    assert attention._boolean_mask(window=None) is None


def test_unpadding_a_padded_batch_and_padding_back_restores_it() -> None:
    input_ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    attention_mask = (input_ids != 0).long()
    attention_mask[2] = 1
    packed = unpad_inputs(input_ids, attention_mask, token_type_ids=torch.ones_like(input_ids))
    assert packed.input_ids.tolist() == [5, 6, 7, 8, 9, 1, 2, 3, 4]
    assert packed.cu_seqlens.tolist() == [0, 3, 5, 9] and packed.cu_seqlens.dtype == torch.int32
    assert packed.position_ids.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert packed.max_seqlen == 4 and packed.token_type_ids is not None
    assert torch.equal(pad_tokens(packed.input_ids, attention_mask), input_ids)


def test_missing_packed_fields_are_derived_from_the_boundaries() -> None:
    packed = pack_inputs(torch.arange(7), cu_seqlens=torch.tensor([0, 4, 7], dtype=torch.int32))
    assert packed.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert packed.max_seqlen == 4 and packed.num_sequences == 2
    assert packed.first_token_index.tolist() == [0, 4]


def test_padded_convenience_input_equals_the_unpadded_batch_fields() -> None:
    torch.manual_seed(0)
    model = BertforgeModel(tiny_config()).eval()
    input_ids = torch.tensor([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]])
    with torch.no_grad():
        padded = model(input_ids, attention_mask=(input_ids != 0).long())
        unpadded = model(torch.tensor([3, 4, 5, 6, 7, 8]), cu_seqlens=torch.tensor([0, 4, 6], dtype=torch.int32),
                         max_seqlen=4, position_ids=torch.tensor([0, 1, 2, 3, 0, 1]))
    assert torch.equal(padded, unpadded)


def test_alibi_slopes_follow_the_paper() -> None:
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    twelve = alibi_slopes(12)  # not a power of two: 8 geometric slopes + every other one of 16
    assert twelve.shape == (12,) and torch.allclose(twelve[:8], alibi_slopes(8))
    assert torch.allclose(twelve[8:], alibi_slopes(16)[0::2][:4])
