"""Dynamic masking: BERT's rates, special tokens untouched, and the same masks for the same sample anywhere."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.data.masking import Masker, MaskingSettings

VOCAB = 1000
MASK, CLS, SEP, PAD = 4, 2, 3, 0
SPECIAL = np.array([0, 1, 2, 3, 4, 998, 999])  # the last two stand for [unusedN] padding of the vocab


def batch(num_samples: int = 400, length: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    samples = [np.concatenate([[CLS], rng.integers(5, 998, length - 2), [SEP]]) for _ in range(num_samples)]
    return np.concatenate(samples).astype(np.int64), np.full(num_samples, length)


def masker(**settings: object) -> Masker:
    continuation = np.zeros(VOCAB, dtype=bool)
    continuation[500:998] = True  # ids 500..997 are "##" pieces
    return Masker(MaskingSettings(**settings), mask_id=MASK, special_ids=SPECIAL, vocab_size=VOCAB,  # type: ignore[arg-type]
                  word_continuation=continuation)


@pytest.mark.parametrize("mask_prob", [0.15, 0.30])
def test_mask_rate_and_80_10_10_split_are_within_tolerance(mask_prob: float) -> None:
    ids, lengths = batch()
    result = masker(mask_prob=mask_prob)(ids, lengths, np.arange(len(lengths)), epoch=0)
    maskable = int((~np.isin(ids, SPECIAL)).sum())
    assert abs(len(result.masked_positions) / maskable - mask_prob) < 0.01
    after = result.input_ids[result.masked_positions]
    assert abs((after == MASK).mean() - 0.8) < 0.02
    kept = after == result.masked_labels
    assert abs(kept.mean() - 0.1) < 0.015
    assert abs(((after != MASK) & ~kept).mean() - 0.1) < 0.015  # random replacements (a few hit the same id)
    assert np.array_equal(result.masked_labels, ids[result.masked_positions])
    unmasked = np.setdiff1d(np.arange(len(ids)), result.masked_positions)
    assert np.array_equal(result.input_ids[unmasked], ids[unmasked])
    assert np.all(np.diff(result.masked_positions) > 0)


def test_special_tokens_are_never_masked_nor_drawn_as_random_replacements() -> None:
    ids, lengths = batch()
    ids[5::17] = 999  # [unusedN] in the text must stay too
    result = masker(mask_prob=0.5)(ids, lengths, np.arange(len(lengths)), epoch=0)
    assert not np.isin(ids[result.masked_positions], SPECIAL).any()
    replaced = result.input_ids[result.masked_positions]
    assert not np.isin(replaced[replaced != MASK], SPECIAL).any()


def test_the_same_seed_epoch_and_sample_index_give_the_same_masks_in_any_batch() -> None:
    ids, lengths = batch(num_samples=20)
    apply = masker()
    whole = apply(ids, lengths, np.arange(100, 120), epoch=3)
    # sample 107 alone, and in a reversed batch of other samples, as another worker or rank would see it
    one = apply(ids[7 * 128:8 * 128], lengths[:1], np.array([107]), epoch=3)
    assert np.array_equal(one.input_ids, whole.input_ids[7 * 128:8 * 128])
    reversed_ids = np.concatenate([ids[i * 128:(i + 1) * 128] for i in range(19, -1, -1)])
    shuffled = apply(reversed_ids, lengths, np.arange(119, 99, -1), epoch=3)
    assert np.array_equal(shuffled.input_ids[12 * 128:13 * 128], whole.input_ids[7 * 128:8 * 128])
    assert not np.array_equal(apply(ids, lengths, np.arange(100, 120), epoch=4).input_ids, whole.input_ids)
    other_seed = masker(seed=7)(ids, lengths, np.arange(100, 120), epoch=3)
    assert not np.array_equal(other_seed.input_ids, whole.input_ids)


def test_whole_word_masking_masks_every_piece_of_a_chosen_word() -> None:
    ids, lengths = batch()
    result = masker(whole_word=True)(ids, lengths, np.arange(len(lengths)), epoch=0)
    chosen = np.zeros(len(ids), dtype=bool)
    chosen[result.masked_positions] = True
    is_continuation = (ids >= 500) & (ids < 998)
    # a continuation piece is chosen exactly when the piece before it is (same word)
    previous_is_word = is_continuation & ~np.isin(np.roll(ids, 1), SPECIAL)
    assert np.array_equal(chosen[previous_is_word], np.roll(chosen, 1)[previous_is_word])
    maskable = int((~np.isin(ids, SPECIAL)).sum())
    assert 0.10 < len(result.masked_positions) / maskable < 0.20
