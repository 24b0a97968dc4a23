"""Documents -> token ids with sentence boundaries, fast.

BERT's sample construction works on sentences (packing consecutive ones, cutting NSP pairs between
them), so we need the token ids *and* where each sentence ends. Encoding every sentence as its own
string costs one Rust `Encoding` object and one Python list per sentence; instead each document is
encoded as one string in which sentence ends are marked by the tokenizer's own separator (`[SEP]`,
RoBERTa's `</s>`: the tokenizer recognises special tokens in text), and the boundaries are recovered
with numpy from the marker positions. On the bundled corpus this is ~1.6x faster than encoding lines.
The mark keeps the space after it with the next word, so a byte-level BPE (`Ġword`) or SentencePiece
(`▁word`) tokenizer encodes that word as it does mid-text: the ids are those of the whole text.

Sentence splitting is a rule, not a model: a line break always ends a sentence (the `.txt` format
puts one or more sentences on a line) and so does `.`, `!` or `?` (plus closing quotes/brackets)
followed by space and an upper-case letter, digit or opening quote. Abbreviations such as "Mr."
are occasionally split; for MLM packing that costs nothing, for NSP it moves a cut point.

Word cache: natural text is Zipfian (the whole bundled corpus, 2 M words, has 120 k distinct
ones), and BERT's normalizer and pre-tokenizer never act across whitespace, so encoding each
distinct whitespace-delimited word once and concatenating the cached ids gives exactly the ids of
encoding the whole text: on the bundled corpus 2x faster with a cold cache, 4x with a warm one.
It is used only where that identity holds: a tokenizer with BERT's pre-tokenizer, a normalizer that
acts within words (BERT's, case and accent steps, and deletions of non-space characters such as
`--normalize arabic`'s, alone or in a `Sequence`), added tokens without spaces, and documents free of
the control characters that Python's `str.split` and BERT's `clean_text` treat differently. Everything else takes the plain path, in which very long
documents are encoded in pieces of at most `PIECE_CHARS` characters cut at sentence ends (or at
spaces), so a 10 MB line cannot stall a worker.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

_SPLIT_MARK = "\n"  # split_sentences' own mark: no sentence holds a line break once marked
_WHITESPACE_DROPPING = ("BertPreTokenizer", "Whitespace", "WhitespaceSplit")
PIECE_CHARS = 1 << 16
_SENTENCE_END = re.compile(r"([.!?][\"'”’)\]]*)[ \t]+(?=[\"'“‘(\[]?[A-Z0-9À-Þ])")
_LINE_BREAK = re.compile(r"[ \t]*\r?\n[\s]*")
# characters on which str.split() and BERT's clean_text + whitespace rules may disagree
_SPLIT_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_DOCUMENT_END = ""  # str.split() never yields an empty word, so this cannot collide
WORD_CACHE_LIMIT = 2_000_000


@dataclass
class TokenizedDocuments:
    """Token ids of several documents, with sentence and document boundaries.

    `tokens` holds every sentence's ids back to back (no special tokens); `sentence_lengths[k]`
    is the length of sentence k; `document_sentences[d]` the number of sentences of document d.
    """

    tokens: np.ndarray
    sentence_lengths: np.ndarray
    document_sentences: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.document_sentences)


def sentence_mark(tokenizer: Tokenizer, sep_id: int) -> str:
    """The text that ends a sentence: the tokenizer's separator and the space that stays with the next word.
    A tokenizer that drops whitespace (BERT's) gets a space before it too, so that every word of the marked
    text stays whole for the word cache (`end. [SEP] Next`, not `end.[SEP]`)."""
    sep = tokenizer.id_to_token(sep_id)
    pre_tokenizer = json.loads(tokenizer.to_str()).get("pre_tokenizer") or {}
    first = (pre_tokenizer.get("pretokenizers") or [{}])[0] if pre_tokenizer.get("type") == "Sequence" else pre_tokenizer
    return f" {sep} " if first.get("type") in _WHITESPACE_DROPPING else f"{sep} "


def mark_sentences(text: str, mark: str, *, within_lines: bool = True) -> str:
    """The document with every sentence end (and the whitespace there) replaced by `mark`.

    `within_lines=False` marks line breaks only, so each line is one "sentence" (line-by-line samples).
    """
    text = text.strip()
    if within_lines:
        text = _SENTENCE_END.sub(lambda match: match.group(1) + mark, text)
    return _LINE_BREAK.sub(lambda _: mark, text)


def split_sentences(text: str) -> list[str]:
    """The sentences of a document (the same rule `tokenize_documents` uses)."""
    return [s for s in mark_sentences(text, _SPLIT_MARK).split(_SPLIT_MARK) if s.strip()]


def _pieces_of(marked: str, mark: str) -> list[str]:
    """Cut a long marked document into pieces of at most PIECE_CHARS, at sentence marks or spaces."""
    if len(marked) <= PIECE_CHARS:
        return [marked]
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for sentence in marked.split(mark):
        while len(sentence) > PIECE_CHARS:  # a sentence longer than a piece: cut at a space
            cut = sentence.rfind(" ", 0, PIECE_CHARS)
            cut = cut if cut > 0 else PIECE_CHARS
            if current:
                pieces.append(mark.join(current))
                current, size = [], 0
            pieces.append(sentence[:cut])
            sentence = sentence[cut:]
        if size + len(sentence) > PIECE_CHARS and current:
            pieces.append(mark.join(current))
            current, size = [], 0
        current.append(sentence)
        size += len(sentence) + len(mark)
    if current:
        pieces.append(mark.join(current))
    return pieces


@dataclass
class WordCache:
    """Word -> token ids, kept across chunks by one worker; emptied when it grows past a limit."""

    tokenizer: Tokenizer
    ids: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids[_DOCUMENT_END] = (-1,)

    def encode(self, words: list[str]) -> np.ndarray:
        """The ids of the words back to back; -1 where a word is `_DOCUMENT_END`."""
        if len(self.ids) > WORD_CACHE_LIMIT:
            self.ids = {_DOCUMENT_END: (-1,)}
        known = self.ids
        missing = [word for word in set(words) if word not in known]
        if missing:
            for word, encoding in zip(missing, self.tokenizer.encode_batch_fast(missing, add_special_tokens=False),
                                      strict=True):
                known[word] = tuple(encoding.ids)
        return np.fromiter(itertools.chain.from_iterable(map(known.__getitem__, words)), dtype=np.int64)


def word_cache_applies(tokenizer: Tokenizer) -> bool:
    """True when encoding word by word provably gives the ids of encoding the whole text."""
    spec = json.loads(tokenizer.to_str())
    pre_tokenizer = spec.get("pre_tokenizer") or {}
    return (pre_tokenizer.get("type") == "BertPreTokenizer"
            and _normalizes_within_words(spec.get("normalizer") or {})
            and all(not any(ch.isspace() for ch in token["content"]) for token in spec.get("added_tokens", [])))


_WORD_LOCAL_NORMALIZERS = (None, "BertNormalizer", "Lowercase", "NFD", "StripAccents")
_CHARACTER_CLASS = re.compile(r"\[[^\]]*\]")


def _normalizes_within_words(normalizer: dict) -> bool:
    """True when the normalizer never adds, removes or moves whitespace, so it acts on each word alone.

    A `Sequence` qualifies when each of its steps does: `--normalize arabic` puts a `Replace` that deletes a
    class of non-space characters (tatweel, diacritics) before BERT's normalizer, and such a tokenizer took
    the slow path although deleting a character inside a word cannot join or split words."""
    kind = normalizer.get("type")
    if kind == "Sequence":
        return all(_normalizes_within_words(step) for step in normalizer.get("normalizers", []))
    if kind == "Replace":
        return normalizer.get("content") == "" and _deletes_no_whitespace((normalizer.get("pattern") or {}).get("Regex"))
    return kind in _WORD_LOCAL_NORMALIZERS


def _deletes_no_whitespace(pattern: str | None) -> bool:
    """True for a regular expression that is one character class matching no whitespace character (a class
    Python's `re` cannot read, e.g. `\\p{Mn}` of the Rust side's Oniguruma, counts as unknown: False)."""
    if pattern is None or not _CHARACTER_CLASS.fullmatch(pattern):
        return False
    try:
        character_class = re.compile(pattern)
    except re.error:
        return False
    return not any(character_class.fullmatch(ch) for ch in _WHITESPACE)


# every character Python's str.split() or BERT's normalizer takes for a space (U+0000-U+001F are included:
# BERT's clean_text turns some into spaces and drops others)
_WHITESPACE = tuple(ch for ch in map(chr, range(0x3001)) if ch.isspace() or ch < " ")


def tokenize_documents(texts: Sequence[str], tokenizer: Tokenizer, *, sep_id: int, drop_ids: Sequence[int],
                       dtype: np.dtype, word_cache: WordCache | None = None,
                       within_lines: bool = True) -> TokenizedDocuments:
    """Tokenize documents; sentence ends come from `mark_sentences` (and piece ends on the plain path).

    `drop_ids` are ids removed from the text (special tokens typed literally, e.g. "[CLS]"): they
    would otherwise reach the model as real special tokens. Pass a `WordCache` (only where
    `word_cache_applies`) to take the fast path for the documents it can handle.
    """
    mark = sentence_mark(tokenizer, sep_id)
    if word_cache is None or any(_SPLIT_UNSAFE.search(text) for text in texts):
        return _tokenize_in_pieces(texts, tokenizer, mark, sep_id=sep_id, drop_ids=drop_ids, dtype=dtype,
                                   within_lines=within_lines)
    words: list[str] = []
    for text in texts:
        words.extend(mark_sentences(text, mark, within_lines=within_lines).split())
        words.append(_DOCUMENT_END)
    ids = word_cache.encode(words)
    document_end = ids == -1
    ends = np.flatnonzero(document_end)
    ids = ids[~document_end]
    piece_ends = ends - np.arange(len(ends))  # every document is one piece here
    return _boundaries(ids, piece_ends, np.ones(len(texts), dtype=np.int64), sep_id=sep_id, drop_ids=drop_ids,
                       dtype=dtype, num_documents=len(texts))


def _tokenize_in_pieces(texts: Sequence[str], tokenizer: Tokenizer, mark: str, *, sep_id: int,
                        drop_ids: Sequence[int], dtype: np.dtype, within_lines: bool) -> TokenizedDocuments:
    pieces: list[str] = []
    pieces_per_document = np.empty(len(texts), dtype=np.int64)
    for d, text in enumerate(texts):
        document_pieces = _pieces_of(mark_sentences(text, mark, within_lines=within_lines), mark)
        # a piece cut at a sentence end lost the space before its first word to the mark: BPE's `Ġword` needs it
        document_pieces[1:] = [piece if piece[:1].isspace() else " " + piece for piece in document_pieces[1:]]
        pieces.extend(document_pieces)
        pieces_per_document[d] = len(document_pieces)
    encodings = tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
    piece_lengths = np.fromiter((len(e) for e in encodings), dtype=np.int64, count=len(encodings))
    ids = np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64,
                      count=int(piece_lengths.sum()))
    return _boundaries(ids, np.cumsum(piece_lengths), pieces_per_document, sep_id=sep_id, drop_ids=drop_ids,
                       dtype=dtype, num_documents=len(texts))


def _boundaries(ids: np.ndarray, piece_ends: np.ndarray, pieces_per_document: np.ndarray, *, sep_id: int,
                drop_ids: Sequence[int], dtype: np.dtype, num_documents: int) -> TokenizedDocuments:
    """Sentence and document boundaries from the marks and piece ends; marks and `drop_ids` removed."""
    is_mark = ids == sep_id
    removed = is_mark | np.isin(ids, np.asarray(drop_ids, dtype=np.int64))
    removed_before = np.concatenate([[0], np.cumsum(removed)])
    # sentence ends, as positions in the ids without the removed tokens
    mark_positions = np.flatnonzero(is_mark)
    ends = np.concatenate([mark_positions - removed_before[mark_positions], piece_ends - removed_before[piece_ends]])
    ends = np.unique(ends)
    ends = ends[ends > 0]
    starts = np.concatenate([[0], ends[:-1]])
    sentence_lengths = ends - starts
    document_ends = piece_ends[np.cumsum(pieces_per_document) - 1] if num_documents else piece_ends[:0]
    document_ends = document_ends - removed_before[document_ends]
    # a sentence belongs to the document in which it ends; empty sentences are dropped
    sentence_document = np.searchsorted(document_ends, ends, side="left")
    keep = sentence_lengths > 0
    document_sentences = np.bincount(sentence_document[keep], minlength=num_documents).astype(np.int32)
    tokens = ids[~removed].astype(dtype)
    return TokenizedDocuments(tokens=tokens, sentence_lengths=sentence_lengths[keep].astype(np.int32),
                              document_sentences=document_sentences)
