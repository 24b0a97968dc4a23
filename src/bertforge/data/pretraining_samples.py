"""Tokenized documents -> pre-training samples: packed MLM sequences and NSP sentence pairs.

MLM samples (`nsp=False`) pack consecutive sentences of one document into `[CLS] ... [SEP]` up to
`seq_len` tokens without cutting a sentence unless it alone is longer than a sample (RoBERTa's
FULL-SENTENCES within a document): no token is thrown away and no sample spans two documents.

NSP pairs follow BERT's `create_pretraining_data`: sentences are gathered up to the target
length, cut at a random sentence into A and B; with probability 1/2 (always when there is only
one sentence) B is replaced by a span of a random *other* document of the same split and piece,
and the unused sentences are put back. `[CLS] A [SEP] B [SEP]`, `next_sentence_label` 1 for a
random B (Hugging Face's convention: 0 means "B continues A"). An over-long pair is trimmed from
the longer segment first, half the cut from its front and half from its back (BERT trims token
by token with a coin flip per token; the expected cut is the same).

Line-by-line samples (`line_by_line=True`, Hugging Face `run_mlm.py`'s `--line_by_line`, and how
the Union/Flyte example feeds its model) are one line each, `[CLS] line [SEP]`; the tokenizer then
marks line ends only, not sentence ends inside a line. A line longer than a sample is cut into
several samples rather than truncated, so no token is thrown away. The loader still packs these
short samples into full rows without padding; only what the model attends over changes.

With `short_seq_prob` a sample's target length is drawn uniformly from [2, max] instead, so the
model also sees short inputs (BERT's default 0.1).

Everything is driven by one `random.Random` per piece seeded by (seed, first document index), so
the samples do not depend on how many worker processes built them. The token copying is
vectorised with numpy; only the per-sentence decisions are a Python loop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bertforge.data.sentences import TokenizedDocuments

NEGATIVE_DRAW_ATTEMPTS = 10


@dataclass(frozen=True)
class SampleSettings:
    seq_len: int = 128
    nsp: bool = False
    line_by_line: bool = False
    short_seq_prob: float = 0.0  # packed sequences and NSP pairs; a line is a line
    seed: int = 12345


@dataclass
class BuiltSamples:
    """Samples ready for a shard: flat token ids, offsets, and (for NSP) (segment B start, label)."""

    tokens: np.ndarray
    offsets: np.ndarray
    pairs: np.ndarray | None

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1


class _Ranges:
    """Token spans (start, length) of segments A and B, collected sample by sample."""

    def __init__(self) -> None:
        self.a_start: list[int] = []
        self.a_length: list[int] = []
        self.b_start: list[int] = []
        self.b_length: list[int] = []
        self.labels: list[int] = []


def _target_length(rng: random.Random, max_tokens: int, short_seq_prob: float) -> int:
    if short_seq_prob > 0 and rng.random() < short_seq_prob:
        return rng.randint(2, max_tokens) if max_tokens > 2 else max_tokens
    return max_tokens


def build_samples(documents: TokenizedDocuments, first: int, last: int, settings: SampleSettings, *,
                  cls_id: int, sep_id: int, stream_seed: int) -> BuiltSamples:
    """Samples from documents [first, last) of `documents`; `stream_seed` names this piece's RNG stream."""
    rng = random.Random(f"{settings.seed}:{stream_seed}")
    sentence_starts = np.concatenate([[0], np.cumsum(documents.sentence_lengths, dtype=np.int64)]).tolist()
    document_starts = np.concatenate([[0], np.cumsum(documents.document_sentences, dtype=np.int64)]).tolist()
    ranges = _Ranges()
    if settings.nsp:
        _nsp_pairs(ranges, sentence_starts, document_starts, first, last, settings, rng)
    elif settings.line_by_line:
        _line_samples(ranges, sentence_starts, document_starts[first], document_starts[last], settings.seq_len - 2)
    else:
        _packed_sequences(ranges, sentence_starts, document_starts, first, last, settings, rng)
    return _assemble(documents.tokens, ranges, settings.nsp, cls_id, sep_id)


def _packed_sequences(ranges: _Ranges, sentence_starts: list[int], document_starts: list[int], first: int,
                      last: int, settings: SampleSettings, rng: random.Random) -> None:
    max_tokens = settings.seq_len - 2

    def emit(start: int, length: int) -> None:
        ranges.a_start.append(start)
        ranges.a_length.append(length)

    for document in range(first, last):
        first_sentence, end_sentence = document_starts[document], document_starts[document + 1]
        if first_sentence == end_sentence:
            continue
        target = _target_length(rng, max_tokens, settings.short_seq_prob)
        start = sentence_starts[first_sentence]
        length = 0
        for sentence in range(first_sentence, end_sentence):
            sentence_length = sentence_starts[sentence + 1] - sentence_starts[sentence]
            if length and length + sentence_length > max_tokens:
                emit(start, length)
                start, length = start + length, 0
                target = _target_length(rng, max_tokens, settings.short_seq_prob)
            length += sentence_length
            while length > max_tokens:  # one sentence longer than a sample: cut it
                emit(start, max_tokens)
                start, length = start + max_tokens, length - max_tokens
            if length >= target:
                emit(start, length)
                start, length = start + length, 0
                target = _target_length(rng, max_tokens, settings.short_seq_prob)
        if length:
            emit(start, length)


def _line_samples(ranges: _Ranges, sentence_starts: list[int], first_sentence: int, end_sentence: int,
                  max_tokens: int) -> None:
    for sentence in range(first_sentence, end_sentence):
        start, end = sentence_starts[sentence], sentence_starts[sentence + 1]
        for piece_start in range(start, end, max_tokens):
            ranges.a_start.append(piece_start)
            ranges.a_length.append(min(max_tokens, end - piece_start))


def _nsp_pairs(ranges: _Ranges, sentence_starts: list[int], document_starts: list[int], first: int, last: int,
               settings: SampleSettings, rng: random.Random) -> None:
    max_tokens = settings.seq_len - 3
    candidates = [d for d in range(first, last) if document_starts[d + 1] > document_starts[d]]
    for document in candidates:
        first_sentence, end_sentence = document_starts[document], document_starts[document + 1]
        target = _target_length(rng, max_tokens, settings.short_seq_prob)
        chunk_first = first_sentence
        sentence = first_sentence
        while sentence < end_sentence:
            chunk_tokens = sentence_starts[sentence + 1] - sentence_starts[chunk_first]
            if sentence == end_sentence - 1 or chunk_tokens >= target:
                count = sentence - chunk_first + 1
                a_sentences = 1 if count == 1 else rng.randint(1, count - 1)
                a_start = sentence_starts[chunk_first]
                a_length = sentence_starts[chunk_first + a_sentences] - a_start
                other = _other_document(rng, candidates, document) if count == 1 or rng.random() < 0.5 else None
                if other is not None:
                    b_start, b_length = _random_span(rng, sentence_starts, document_starts, other,
                                                     max(1, target - a_length))
                    label = 1
                    sentence = chunk_first + a_sentences - 1  # put the unused sentences back
                elif count > 1:
                    b_start = sentence_starts[chunk_first + a_sentences]
                    b_length = sentence_starts[sentence + 1] - b_start
                    label = 0
                else:  # a one-sentence chunk and no other document to pair it with
                    chunk_first = sentence + 1
                    sentence += 1
                    continue
                a_start, a_length, b_start, b_length = _truncate_pair(rng, a_start, a_length, b_start, b_length,
                                                                      max_tokens)
                ranges.a_start.append(a_start)
                ranges.a_length.append(a_length)
                ranges.b_start.append(b_start)
                ranges.b_length.append(b_length)
                ranges.labels.append(label)
                chunk_first = sentence + 1
                target = _target_length(rng, max_tokens, settings.short_seq_prob)
            sentence += 1


def _other_document(rng: random.Random, candidates: list[int], document: int) -> int | None:
    if len(candidates) < 2:
        return None
    for _ in range(NEGATIVE_DRAW_ATTEMPTS):
        other = candidates[rng.randrange(len(candidates))]
        if other != document:
            return other
    return next(d for d in candidates if d != document)


def _random_span(rng: random.Random, sentence_starts: list[int], document_starts: list[int], document: int,
                 target: int) -> tuple[int, int]:
    """Consecutive sentences of `document` from a random one, up to `target` tokens."""
    first, end = document_starts[document], document_starts[document + 1]
    sentence = rng.randrange(first, end)
    start = sentence_starts[sentence]
    while sentence < end and sentence_starts[sentence + 1] - start < target:
        sentence += 1
    return start, sentence_starts[min(sentence + 1, end)] - start


def _truncate_pair(rng: random.Random, a_start: int, a_length: int, b_start: int, b_length: int,
                   max_tokens: int) -> tuple[int, int, int, int]:
    excess = a_length + b_length - max_tokens
    if excess <= 0:
        return a_start, a_length, b_start, b_length
    gap = abs(a_length - b_length)
    from_longer = min(excess, gap)
    rest = excess - from_longer
    # after the lengths meet, BERT trims B first on a tie and then alternates
    cut_a = rest // 2 + (from_longer if a_length > b_length else 0)
    cut_b = (rest + 1) // 2 + (from_longer if a_length <= b_length else 0)

    def trim(start: int, length: int, cut: int) -> tuple[int, int]:
        front = cut // 2 + (cut % 2 if rng.random() < 0.5 else 0)
        return start + front, length - cut

    a_start, a_length = trim(a_start, a_length, cut_a)
    b_start, b_length = trim(b_start, b_length, cut_b)
    return a_start, a_length, b_start, b_length


def _copy_ranges(out: np.ndarray, source: np.ndarray, source_starts: np.ndarray, lengths: np.ndarray,
                 destination_starts: np.ndarray) -> None:
    """out[d_i : d_i + n_i] = source[s_i : s_i + n_i] for all i, without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return
    run_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    within = np.arange(total) - np.repeat(run_starts, lengths)
    out[np.repeat(destination_starts, lengths) + within] = source[np.repeat(source_starts, lengths) + within]


def _assemble(tokens: np.ndarray, ranges: _Ranges, nsp: bool, cls_id: int, sep_id: int) -> BuiltSamples:
    a_start = np.asarray(ranges.a_start, dtype=np.int64)
    a_length = np.asarray(ranges.a_length, dtype=np.int64)
    b_start = np.asarray(ranges.b_start, dtype=np.int64)
    b_length = np.asarray(ranges.b_length, dtype=np.int64)
    lengths = a_length + b_length + 3 if nsp else a_length + 2
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    out = np.empty(int(offsets[-1]), dtype=tokens.dtype)
    out[offsets[:-1]] = cls_id
    a_destination = offsets[:-1] + 1
    _copy_ranges(out, tokens, a_start, a_length, a_destination)
    out[a_destination + a_length] = sep_id
    pairs = None
    if nsp:
        b_destination = a_destination + a_length + 1
        _copy_ranges(out, tokens, b_start, b_length, b_destination)
        out[b_destination + b_length] = sep_id
        pairs = np.stack([b_destination - offsets[:-1], np.asarray(ranges.labels, dtype=np.int64)], axis=1)
        pairs = pairs.astype(np.int32)
    return BuiltSamples(tokens=out, offsets=offsets, pairs=pairs)
