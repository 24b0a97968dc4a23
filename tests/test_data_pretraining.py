"""Sentence splitting and sample construction: packed MLM sequences and NSP pairs, as BERT builds them."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from tokenizers import Tokenizer

from bertforge.data.bundled import corpus_path
from bertforge.data.pretraining_samples import SampleSettings, build_samples
from bertforge.data.sentences import (
    TokenizedDocuments,
    WordCache,
    split_sentences,
    tokenize_documents,
    word_cache_applies,
)
from bertforge.data.tokenizer import train_wordpiece

CLS, SEP = 2, 3
DOC_ID_STRIDE = 1000


def synthetic_documents(num_documents: int = 60, seed: int = 0) -> TokenizedDocuments:
    """Documents whose token ids tell which document they come from: id // 1000 - 1."""
    rng = np.random.default_rng(seed)
    tokens, sentence_lengths, document_sentences = [], [], []
    for d in range(num_documents):
        sentences = rng.integers(1, 25)
        document_sentences.append(sentences)
        for _ in range(sentences):
            length = int(rng.integers(3, 40))
            sentence_lengths.append(length)
            tokens.append(rng.integers(10, DOC_ID_STRIDE, length) + (d + 1) * DOC_ID_STRIDE)
    return TokenizedDocuments(tokens=np.concatenate(tokens).astype(np.uint32),
                              sentence_lengths=np.array(sentence_lengths, dtype=np.int32),
                              document_sentences=np.array(document_sentences, dtype=np.int32))


def samples_of(built: object) -> list[np.ndarray]:
    offsets = built.offsets  # type: ignore[attr-defined]
    return [built.tokens[a:b].astype(np.int64) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]  # type: ignore[attr-defined]


def test_mlm_samples_pack_whole_sentences_of_one_document_and_lose_no_token() -> None:
    documents = synthetic_documents()
    built = build_samples(documents, 0, documents.num_documents, SampleSettings(seq_len=64, short_seq_prob=0.0),
                          cls_id=CLS, sep_id=SEP, stream_seed=0)
    samples = samples_of(built)
    assert built.pairs is None
    for sample in samples:
        assert len(sample) <= 64 and sample[0] == CLS and sample[-1] == SEP
        assert len(set((sample[1:-1] // DOC_ID_STRIDE).tolist())) == 1  # never spans two documents
    body = np.concatenate([s[1:-1] for s in samples])
    assert np.array_equal(body, documents.tokens.astype(np.int64))  # in order, nothing dropped
    full = sum(len(s) >= 64 - 39 for s in samples)  # at most one sentence short of full
    assert full >= len(samples) - documents.num_documents


def test_line_by_line_samples_are_one_line_each_and_a_long_line_is_cut_not_truncated() -> None:
    documents = synthetic_documents()
    settings = SampleSettings(seq_len=20, line_by_line=True, short_seq_prob=0.5)  # a line is a line
    built = build_samples(documents, 3, 40, settings, cls_id=CLS, sep_id=SEP, stream_seed=0)
    starts = np.concatenate([[0], np.cumsum(documents.sentence_lengths)])
    sentence_range = np.cumsum(np.concatenate([[0], documents.document_sentences]))[[3, 40]]
    expected = []
    for sentence in range(*sentence_range):
        line = documents.tokens[starts[sentence]:starts[sentence + 1]].astype(np.int64)
        expected.extend(np.concatenate([[CLS], line[i:i + 18], [SEP]]) for i in range(0, len(line), 18))
    samples = samples_of(built)
    assert len(samples) == len(expected) > documents.document_sentences[3:40].sum()  # some lines were cut
    assert all(np.array_equal(got, want) for got, want in zip(samples, expected, strict=True))


def test_short_seq_prob_makes_some_samples_shorter() -> None:
    documents = synthetic_documents()
    lengths = {p: np.diff(build_samples(documents, 0, documents.num_documents, SampleSettings(seq_len=256,
                                                                                             short_seq_prob=p),
                                        cls_id=CLS, sep_id=SEP, stream_seed=0).offsets) for p in (0.0, 0.5)}
    assert lengths[0.5].mean() < lengths[0.0].mean() - 20


def test_nsp_labels_are_about_half_and_negatives_come_from_other_documents() -> None:
    documents = synthetic_documents(num_documents=200)
    built = build_samples(documents, 0, documents.num_documents, SampleSettings(seq_len=64, nsp=True),
                          cls_id=CLS, sep_id=SEP, stream_seed=3)
    assert built.pairs is not None
    labels = built.pairs[:, 1]
    assert 0.42 < labels.mean() < 0.6
    for sample, (b_start, label) in zip(samples_of(built), built.pairs, strict=True):
        assert len(sample) <= 64 and sample[0] == CLS and sample[b_start - 1] == SEP and sample[-1] == SEP
        a, b = sample[1:b_start - 1], sample[b_start:-1]
        assert len(a) > 0 and len(b) > 0
        a_doc, b_doc = set((a // DOC_ID_STRIDE).tolist()), set((b // DOC_ID_STRIDE).tolist())
        assert len(a_doc) == 1 and len(b_doc) == 1
        assert (a_doc != b_doc) == bool(label)


def test_nsp_true_continuations_follow_segment_a_in_the_document() -> None:
    documents = synthetic_documents(num_documents=50)
    built = build_samples(documents, 0, documents.num_documents, SampleSettings(seq_len=2048, nsp=True),
                          cls_id=CLS, sep_id=SEP, stream_seed=1)
    stream = documents.tokens.astype(np.int64)
    for sample, (b_start, label) in zip(samples_of(built), built.pairs, strict=True):  # type: ignore[arg-type]
        if label == 0:  # no truncation at 2048: A and B are adjacent spans of the document
            joined = np.concatenate([sample[1:b_start - 1], sample[b_start:-1]])
            starts = np.flatnonzero(stream == joined[0])
            assert any(np.array_equal(stream[start:start + len(joined)], joined) for start in starts)


def test_sample_construction_is_deterministic_per_seed_and_stream() -> None:
    documents = synthetic_documents()
    settings = SampleSettings(seq_len=64, nsp=True)
    first = build_samples(documents, 0, 60, settings, cls_id=CLS, sep_id=SEP, stream_seed=7)
    again = build_samples(documents, 0, 60, settings, cls_id=CLS, sep_id=SEP, stream_seed=7)
    other = build_samples(documents, 0, 60, settings, cls_id=CLS, sep_id=SEP, stream_seed=8)
    assert np.array_equal(first.tokens, again.tokens) and np.array_equal(first.pairs, again.pairs)  # type: ignore[arg-type]
    assert not np.array_equal(first.pairs, other.pairs)  # type: ignore[arg-type]


def test_sentences_are_split_at_line_breaks_and_sentence_ends() -> None:
    text = 'He said "Go." Then left!\nNew line here. e.g. lower case stays. 3 items? Yes.'
    assert split_sentences(text) == ['He said "Go."', "Then left!", "New line here. e.g. lower case stays.",
                                     "3 items?", "Yes."]


def test_line_by_line_tokenization_ends_sentences_at_line_breaks_only() -> None:
    text = 'He said "Go." Then left!\nNew line here. 3 items? Yes.'
    tokenizer: Tokenizer = train_wordpiece([text], vocab_size=200)
    sep = tokenizer.token_to_id("[SEP]")
    lines = tokenize_documents([text], tokenizer, sep_id=sep, drop_ids=[], dtype=np.dtype(np.uint16),
                               within_lines=False)
    assert lines.sentence_lengths.tolist() == [len(tokenizer.encode(line, add_special_tokens=False).ids)
                                               for line in text.split("\n")]
    assert lines.tokens.tolist() == tokenizer.encode(text.replace("\n", " "), add_special_tokens=False).ids


@pytest.fixture(scope="module")
def bundled_documents() -> list[str]:
    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        documents = f.read().rstrip("\n").split("\n\n")
    return documents[:40] + documents[-40:]


def test_tokenizing_whole_documents_matches_tokenizing_each_sentence(bundled_documents: list[str]) -> None:
    tokenizer: Tokenizer = train_wordpiece(bundled_documents, vocab_size=1500)
    sep = tokenizer.token_to_id("[SEP]")
    documents = tokenize_documents(bundled_documents, tokenizer, sep_id=sep, drop_ids=[], dtype=np.dtype(np.uint16))
    expected_tokens, expected_lengths, expected_counts = [], [], []
    for text in bundled_documents:
        sentences = [tokenizer.encode(s, add_special_tokens=False).ids for s in split_sentences(text)]
        sentences = [s for s in sentences if s]
        expected_counts.append(len(sentences))
        expected_lengths.extend(len(s) for s in sentences)
        expected_tokens.extend(t for s in sentences for t in s)
    assert documents.document_sentences.tolist() == expected_counts
    assert documents.sentence_lengths.tolist() == expected_lengths
    assert documents.tokens.tolist() == expected_tokens


@pytest.mark.parametrize("lowercase", [True, False])
def test_the_word_cache_gives_exactly_the_ids_of_encoding_whole_documents(bundled_documents: list[str],
                                                                          lowercase: bool) -> None:
    tokenizer = train_wordpiece(bundled_documents, vocab_size=1500, lowercase=lowercase)
    assert word_cache_applies(tokenizer)
    hostile = ["Ünïcödé façade — naïve café. 中文字符 and emoji 🎉! Tabs\there [CLS] literal [SEP]inside ##hash.",
               "x" * 300 + " over-long word. ¿Qué? ¡Sí! 3.14 is pi. Mr. Smith went.", "  \n  ",
               "zero\u200bwidth and soft\xadhyphen, non\xa0breaking and ideographic\u3000space."]
    documents = bundled_documents + hostile
    options = {"sep_id": tokenizer.token_to_id("[SEP]"), "drop_ids": [tokenizer.token_to_id("[CLS]")],
               "dtype": np.dtype(np.uint16)}
    plain = tokenize_documents(documents, tokenizer, **options)
    cache = WordCache(tokenizer)
    for _ in range(2):  # cold, then warm
        cached = tokenize_documents(documents, tokenizer, word_cache=cache, **options)
        assert np.array_equal(cached.tokens, plain.tokens)
        assert np.array_equal(cached.sentence_lengths, plain.sentence_lengths)
        assert np.array_equal(cached.document_sentences, plain.document_sentences)
    with_control = tokenize_documents(["split\x1cjoined by a control char. Next."], tokenizer, word_cache=cache,
                                      **options)
    assert np.array_equal(with_control.tokens, tokenize_documents(["split\x1cjoined by a control char. Next."],
                                                                  tokenizer, **options).tokens)


def test_the_word_cache_takes_a_sequence_normalizer_that_deletes_characters_within_words(
        bundled_documents: list[str]) -> None:
    from tokenizers import Regex, normalizers

    arabic = ["قال الرجلُ: مرحـــبا بكم. تعذّر الوصول ـ إلى الموقع!", "سأل عن الكتابِ. ثم ذهب إلى البيت."]
    tokenizer = train_wordpiece(bundled_documents[:20] + arabic * 10, vocab_size=1500, lowercase=False,
                                normalize=("arabic-diacritics", "tatweel"))
    assert json.loads(tokenizer.to_str())["normalizer"]["type"] == "Sequence"  # the removal, then BERT's
    assert word_cache_applies(tokenizer)
    documents = arabic + bundled_documents[:5]
    options = {"sep_id": tokenizer.token_to_id("[SEP]"), "drop_ids": [], "dtype": np.dtype(np.uint16)}
    plain = tokenize_documents(documents, tokenizer, **options)
    cached = tokenize_documents(documents, tokenizer, word_cache=WordCache(tokenizer), **options)
    assert np.array_equal(cached.tokens, plain.tokens)
    assert np.array_equal(cached.sentence_lengths, plain.sentence_lengths)
    # a deletion that can join words (a space in its class) keeps the plain path
    tokenizer.normalizer = normalizers.Sequence([normalizers.Replace(Regex("[ ـ]"), ""), normalizers.BertNormalizer()])
    assert not word_cache_applies(tokenizer)
