"""Dynamic MLM masking, seeded by (seed, epoch, sample index), vectorised over a whole micro-batch.

Masks are drawn at load time (RoBERTa's dynamic masking: each epoch sees new masks) and must not
depend on how samples are spread over ranks or loader workers. A `numpy.random.Generator` per
sample would do that but costs ~15 us to create; instead every random number is a counter-based
hash (splitmix64) of (seed, epoch, sample index, position, stream), computed for all tokens of a
micro-batch at once. Same inputs, same masks, in any process, in any order.

BERT's recipe (Hugging Face `DataCollatorForLanguageModeling`): each token is chosen with
probability `mask_prob` (15%; 30% for Mosaic-style recipes); a chosen token becomes `[MASK]` with
probability 0.8, a random token with 0.1, and stays with 0.1. Special tokens (and the `[unusedN]`
padding of the vocabulary) are never chosen nor drawn as random replacements. With whole-word
masking the choice is made per word (a token plus its `##` continuations) instead of per token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM_CHOOSE, _STREAM_ACTION, _STREAM_RANDOM_TOKEN = (np.uint64(s) for s in (0x1F3D, 0x2C81, 0x3B97))


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A bijective 64-bit mixer (SplitMix64's finaliser); uint64 arithmetic wraps by design."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _uniform(keys: np.ndarray, counters: np.ndarray, stream: np.uint64) -> np.ndarray:
    """Uniform [0, 1) doubles from (key, counter, stream)."""
    bits = _splitmix64(keys + (counters.astype(np.uint64) + stream) * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def sample_keys(seed: int, epoch: int, sample_indices: np.ndarray) -> np.ndarray:
    """One 64-bit key per sample: the root of all its random numbers."""
    base = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    base = _splitmix64(base + np.array([epoch & 0xFFFFFFFF], dtype=np.uint64) * _GOLDEN)
    return _splitmix64(base + np.asarray(sample_indices, dtype=np.uint64) * _GOLDEN)


@dataclass(frozen=True)
class MaskingSettings:
    mask_prob: float = 0.15  # fraction of (non-special) tokens chosen for MLM
    mask_replace_prob: float = 0.8  # of the chosen, the fraction replaced by [MASK]
    random_replace_prob: float = 0.1  # of the chosen, the fraction replaced by a random token
    whole_word: bool = False  # choose whole words (a token and its ## continuations)
    seed: int = 42


@dataclass
class MaskedTokens:
    input_ids: np.ndarray  # the ids after replacement, same shape as the input
    masked_positions: np.ndarray  # sorted flat indices of the chosen tokens
    masked_labels: np.ndarray  # the original ids there


class Masker:
    """Applies `MaskingSettings` to flat micro-batches; small enough to pickle into loader workers."""

    def __init__(self, settings: MaskingSettings, *, mask_id: int, special_ids: np.ndarray, vocab_size: int,
                 word_continuation: np.ndarray | None = None) -> None:
        self.settings = settings
        self.mask_id = mask_id
        table_size = max(vocab_size, int(special_ids.max()) + 1 if len(special_ids) else 0)
        self.is_special = np.zeros(table_size, dtype=bool)
        self.is_special[special_ids] = True
        self.random_pool = np.flatnonzero(~self.is_special[:vocab_size]).astype(np.int64)
        self.word_continuation = word_continuation
        if settings.whole_word and word_continuation is None:
            raise ValueError("whole-word masking needs the tokenizer's word-continuation table")

    def __call__(self, input_ids: np.ndarray, lengths: np.ndarray, sample_indices: np.ndarray,
                 epoch: int, mask_prob: float | None = None) -> MaskedTokens:
        """Mask a flat micro-batch: `input_ids` of the samples back to back, `lengths` per sample; `mask_prob`
        (a mask schedule's rate of this step) replaces the settings' rate."""
        settings = self.settings
        mask_prob = settings.mask_prob if mask_prob is None else mask_prob
        keys = np.repeat(sample_keys(settings.seed, epoch, sample_indices), lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        positions = np.arange(len(input_ids)) - np.repeat(starts, lengths)
        special = self.is_special[input_ids]
        if settings.whole_word:
            assert self.word_continuation is not None
            word_start = ~self.word_continuation[input_ids] | special
            word_start[starts] = True
            word_number = np.cumsum(word_start) - 1
            word_in_sample = word_number - np.repeat(word_number[starts], lengths)
            chosen = _uniform(keys, word_in_sample, _STREAM_CHOOSE) < mask_prob
        else:
            chosen = _uniform(keys, positions, _STREAM_CHOOSE) < mask_prob
        chosen &= ~special
        masked_positions = np.flatnonzero(chosen)
        masked_labels = input_ids[masked_positions]
        chosen_keys, chosen_positions = keys[masked_positions], positions[masked_positions]
        action = _uniform(chosen_keys, chosen_positions, _STREAM_ACTION)
        replaced = input_ids.copy()
        to_mask = action < settings.mask_replace_prob
        replaced[masked_positions[to_mask]] = self.mask_id
        to_random = (~to_mask) & (action < settings.mask_replace_prob + settings.random_replace_prob)
        if to_random.any():
            draw = _uniform(chosen_keys[to_random], chosen_positions[to_random], _STREAM_RANDOM_TOKEN)
            replaced[masked_positions[to_random]] = self.random_pool[(draw * len(self.random_pool)).astype(np.int64)]
        return MaskedTokens(input_ids=replaced, masked_positions=masked_positions, masked_labels=masked_labels)
