"""Train and load tokenizers (WordPiece, byte-level BPE, Unigram), in the Hugging Face directory format.

Training is Hugging Face `tokenizers` (Rust, multi-threaded); the BPE and Unigram models, as RoBERTa
and XLM-R train them, are in `data/tokenizer_models.py`. What we add: the vocabulary is padded
with inert `[unusedN]` entries to a multiple of 64 (embedding and MLM-head matmuls are faster on
GPUs when the vocab is a multiple of 64, and BERT's own vocab has `[unused]` slots for the same
reason), and the directory carries every file stock `transformers` expects (`tokenizer.json`,
`vocab.txt`, `tokenizer_config.json`, `special_tokens_map.json`) so `AutoTokenizer.from_pretrained`
loads it and an exported model ships with it unchanged.

`load_tokenizer` accepts any HF tokenizer directory (ours, bert-base-uncased, MiniLM, ...) and
returns the raw fast tokenizer with padding/truncation switched off, the special-token ids, and a
fingerprint that prepared datasets record so a mismatch is caught before training.
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import re
import signal
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from bertforge.console import log, setup_logging, verbosity
from bertforge.data.normalization import normalizer_steps, removals_of, resolve, with_removals
from bertforge.errors import BertforgeError, DataError, first_line
from bertforge.size_limits import check_vocab_size
from bertforge.special_tokens import ROLES, SPECIAL_TOKENS, special_tokens_of

if TYPE_CHECKING:
    from bertforge.data.sources import Source

VOCAB_MULTIPLE = 64
UNUSED_TOKEN = "[unused{}]"


def padded_vocab_size(size: int) -> int:
    return math.ceil(size / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass
class LoadedTokenizer:
    """A fast tokenizer plus what the data pipeline needs to know about its vocabulary."""

    tokenizer: Tokenizer
    path: str
    special_tokens: dict[str, str]  # role (pad/unk/cls/sep/mask) -> token
    ids: dict[str, int]  # role -> id
    fingerprint: str
    lowercase: bool | None
    vocab_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self.ids["pad"]

    @property
    def cls_id(self) -> int:
        return self.ids["cls"]

    @property
    def sep_id(self) -> int:
        return self.ids["sep"]

    @property
    def mask_id(self) -> int:
        return self.ids["mask"]

    @property
    def unk_id(self) -> int:
        return self.ids["unk"]

    @property
    def padded_vocab_size(self) -> int:
        return padded_vocab_size(self.vocab_size)

    def special_ids(self) -> np.ndarray:
        """Ids that are never masked nor drawn as random replacements (specials and [unusedN])."""
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        special = {token.content for token in self.tokenizer.get_added_tokens_decoder().values() if token.special}
        special |= set(self.special_tokens.values())
        ids = [i for token, i in vocab.items() if token in special or (token.startswith("[unused") and token.endswith("]"))]
        return np.array(sorted(ids), dtype=np.int64)

    def word_continuation_table(self) -> np.ndarray:
        """bool[vocab]: True for tokens that continue the previous token's word (whole-word masking)."""
        table = np.zeros(self.padded_vocab_size, dtype=bool)
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        model = self.tokenizer.model
        if isinstance(model, models.WordPiece):
            prefix = model.continuing_subword_prefix
            for token, i in vocab.items():
                table[i] = token.startswith(prefix)
            return table
        # byte-level BPE (GPT-2/RoBERTa) and SentencePiece mark word *starts* instead
        starts = ("Ġ", "▁")
        special = set(self.special_tokens.values())
        for token, i in vocab.items():
            table[i] = not token.startswith(starts) and token not in special
        return table


# ---------------------------------------------------------------------------------------------
# training


def check_requested_vocab_size(vocab_size: int, model: str = "wordpiece") -> None:
    from bertforge.data.tokenizer_models import tokenizer_model

    minimum = tokenizer_model(model).minimum_vocab_size
    if vocab_size < minimum:
        raise DataError(f"--vocab-size {vocab_size} is too small for --model {model}; give at least {minimum}")
    check_vocab_size(vocab_size)  # the Rust trainer aborts with a panic on absurd sizes


def build_wordpiece_tokenizer(lowercase: bool, strip_accents: bool | None = None,
                              normalize: tuple[str, ...] = ()) -> Tokenizer:
    """An untrained BERT tokenizer: BERT normalizer and pre-tokenizer, `##` continuations. `strip_accents` None
    follows `lowercase` (BERT's rule); `normalize` (resolved names of data/normalization.py) goes first."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##"))
    tokenizer.normalizer = with_removals(normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                                    strip_accents=strip_accents, lowercase=lowercase),
                                         normalize)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def train_wordpiece(texts: Iterable[str], *, vocab_size: int, lowercase: bool = True, strip_accents: bool | None = None,
                    normalize: tuple[str, ...] = (), min_frequency: int = 2, show_progress: bool = False) -> Tokenizer:
    """Train a WordPiece vocabulary of (at most) `vocab_size`, then pad it to a multiple of 64.

    `texts` is read twice (a list, or any re-iterable collection; not a one-shot iterator): once here to fix the
    alphabet, once by the trainer. The same texts give the same vocabulary, in the same order, every run.
    """
    if iter(texts) is texts:
        raise TypeError("train_wordpiece reads its texts twice: give a list or another re-iterable, not an iterator")
    check_requested_vocab_size(vocab_size)
    tokenizer = build_wordpiece_tokenizer(lowercase, strip_accents, normalize)
    # the trainer keeps every character it saw, beyond vocab_size if need be: a corpus with thousands of
    # distinct characters (CJK, emoji) gave 3,072 tokens for --vocab-size 2048 and no word of it. The
    # alphabet is capped at half the vocabulary; rarer characters become [UNK], as in BERT's own vocab.
    raw_counts = np.zeros(_UNICODE_SIZE, dtype=np.int64)
    alphabet, continuations = _alphabet_of(texts, tokenizer, limit=vocab_size // 2, raw_counts=raw_counts)
    _warn_if_the_hamza_is_stripped(tokenizer.normalizer, raw_counts)
    # HF's trainer numbers each "##c" in the order it meets it in a hash map, which changes every process, and
    # breaks ties between merges of equal count by those numbers: the vocabulary's order, and at large sizes the
    # vocabulary itself, differed between two runs on the same input (tokenizers issue #1794). Registering the
    # alphabet and its ## forms first, in code-point order, fixes every id, so ties break the same way each run.
    # limit_alphabet=0: the trainer adds no character of its own beyond these.
    initial = list(SPECIAL_TOKENS) + alphabet + ["##" + character for character in continuations]
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=initial,
                                        continuing_subword_prefix="##", limit_alphabet=0,
                                        show_progress=show_progress)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    trained = tokenizer.get_vocab_size()
    if trained <= len(SPECIAL_TOKENS):
        raise DataError("the inputs hold no text to train a tokenizer on; check --input and --text-field")
    if trained > vocab_size:
        log.warning(f"the tokenizer has {trained:,} tokens, more than --vocab-size {vocab_size:,}: WordPiece keeps "
                    "every character of its alphabet and every ## form of them")
    vocab = tokenizer.get_vocab()
    target = padded_vocab_size(trained)
    for n in range(target - trained):
        vocab[UNUSED_TOKEN.format(n)] = trained + n
    # a fresh tokenizer: the trained one holds the alphabet as added special tokens, which would be split out
    # of the text before normalization; only BERT's five are special
    tokenizer = build_wordpiece_tokenizer(lowercase, strip_accents, normalize)
    tokenizer.model = models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##",
                                       max_input_chars_per_word=100)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    if target != trained:
        log.info(f"vocabulary: {trained:,} trained tokens, padded with {target - trained} [unusedN] to {target:,}")
    return tokenizer


_UNICODE_SIZE = 0x110000
_CHUNK_CHARS = 1 << 20


def _alphabet_of(texts: Iterable[str], tokenizer: Tokenizer, *, limit: int,
                 raw_counts: np.ndarray | None = None) -> tuple[list[str], list[str]]:
    """The characters the trainer would keep (the `limit` most frequent, ties by code point) and those of them
    that continue a word somewhere (their ## forms), both in code-point order. `raw_counts` (int64, one per
    code point), when given, receives the count of each character of the raw text.

    Why it is cheap: BERT's normalizer maps one character at a time and its pre-tokenizer splits on a character
    alone (whitespace, punctuation) whatever its neighbours. So the raw text's code points are counted (numpy),
    each distinct character is normalized and classified once, and a chunk of text is searched for characters
    inside words (one regular expression) only while it holds a character not yet seen there.
    """
    normalizer, pre_tokenizer = tokenizer.normalizer, tokenizer.pre_tokenizer
    raw_counts = np.zeros(_UNICODE_SIZE, dtype=np.int64) if raw_counts is None else raw_counts
    settled = np.zeros(_UNICODE_SIZE, dtype=bool)  # raw characters with nothing left to learn about
    normalized_of: dict[str, str] = {}  # raw character -> what the normalizer makes of it
    continuing: set[str] = set()  # normalized characters seen after the first character of a word
    split_off: set[str] = set()  # normalized characters never inside a word: whitespace, punctuation
    for chunk in _chunks_of(texts):
        present = np.bincount(np.frombuffer(chunk.encode("utf-32-le", "surrogatepass"), dtype="<u4"),
                              minlength=_UNICODE_SIZE)
        raw_counts += present
        unsettled = [chr(code) for code in np.flatnonzero((present > 0) & ~settled)]
        for raw in unsettled:
            if raw not in normalized_of:
                normalized_of[raw] = normalizer.normalize_str(raw)
                split_off.update(c for c in normalized_of[raw]
                                 if [word for word, _ in pre_tokenizer.pre_tokenize_str("a" + c)] != ["a" + c])
        pending = {c for raw in unsettled for c in normalized_of[raw]} - continuing - split_off
        if pending:
            normalized = chunk.translate({ord(raw): text for raw, text in normalized_of.items() if raw != text})
            inside_a_word = f"[^{_class_of(split_off)}]" if split_off else "(?s:.)"
            continuing.update(re.findall(f"(?<={inside_a_word})[{_class_of(pending)}]", normalized))
        for raw in unsettled:
            if continuing.issuperset(set(normalized_of[raw]) - split_off):
                settled[ord(raw)] = True
    counts: Counter[str] = Counter()
    for code in np.flatnonzero(raw_counts):
        for character in normalized_of[chr(code)]:
            counts[character] += int(raw_counts[code])
    in_words = [c for c in counts if c not in split_off or pre_tokenizer.pre_tokenize_str(c)]  # not whitespace
    kept = sorted(sorted(in_words, key=lambda c: (-counts[c], c))[:limit])
    return kept, [c for c in kept if c in continuing]


ARABIC_HAMZA_LETTERS = "آأؤإئ"  # U+0622-U+0626: under NFD a letter and a combining madda or hamza


def _warn_if_the_hamza_is_stripped(normalizer: normalizers.Normalizer, raw_counts: np.ndarray) -> None:
    """BERT's accent stripping (the uncased default) drops a combining mark whatever the script: in Arabic it
    drops the hamza and madda of أ إ آ ؤ ئ, which are letters (سأل, asked, becomes سال, flowed)."""
    stripped = int(sum(raw_counts[ord(letter)] for letter in ARABIC_HAMZA_LETTERS))
    if stripped and normalizer.normalize_str(ARABIC_HAMZA_LETTERS) != ARABIC_HAMZA_LETTERS:
        log.warning(f"accent stripping (--uncased's default) removes the hamza or madda of {stripped:,} Arabic letters "
                    "(أ إ آ ؤ ئ become ا ا ا و ي); give --normalize arabic or --keep-accents to keep them")


def _chunks_of(texts: Iterable[str]) -> Iterator[str]:
    """The texts joined by newlines (a word boundary) into strings of about `_CHUNK_CHARS` characters."""
    chunk: list[str] = []
    size = 0
    for text in texts:
        chunk.append(text)
        size += len(text) + 1
        if size >= _CHUNK_CHARS:
            yield "\n".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield "\n".join(chunk)


def _class_of(characters: set[str]) -> str:
    return "".join(re.escape(c) for c in sorted(characters))


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, *, lowercase: bool) -> Path:
    """Write the HF tokenizer files so `AutoTokenizer.from_pretrained(out_dir)` builds the same tokenizer
    (a BertTokenizerFast for WordPiece, RoBERTa's for byte-level BPE, XLM-R's for Unigram; the generic fast
    tokenizer, which reads tokenizer.json as it is, where --normalize added what those classes would drop)."""
    from bertforge.data.tokenizer_models import TOKENIZER_MODELS, model_of_saved

    model = TOKENIZER_MODELS[model_of_saved(tokenizer)]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    if model.name == "wordpiece":  # BERT's own file; BertTokenizer (slow) reads only this
        vocab = tokenizer.get_vocab()
        ordered = sorted(vocab, key=vocab.__getitem__)
        (out / "vocab.txt").write_text("".join(token + "\n" for token in ordered), encoding="utf-8")
    special_map = {f"{role}_token": token for role, token in model.roles.items()}
    case = {"do_lower_case": lowercase} if model.name == "wordpiece" else {}
    config = {"tokenizer_class": model.tokenizer_class, **case, **model.config, **special_map}
    if model.name == "wordpiece":  # BertTokenizerFast builds its normalizer from these
        config["strip_accents"] = _bert_normalizer_setting(tokenizer, "strip_accents")
    if removals_of(tokenizer):
        config.update(tokenizer_class=GENERIC_TOKENIZER_CLASS, model_input_names=list(model.input_names))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")
    return out


GENERIC_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # transformers' class that takes tokenizer.json as it is


def _bert_normalizer_setting(tokenizer: Tokenizer, key: str) -> Any:
    return next((step.get(key) for step in normalizer_steps(tokenizer) if step.get("type") == "BertNormalizer"), None)


# ---------------------------------------------------------------------------------------------
# loading


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """Hash of everything that decides token ids (vocab, normalizer, pre-tokenizer, model settings)."""
    spec = json.loads(tokenizer.to_str())
    spec.pop("padding", None)
    spec.pop("truncation", None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode("utf-8")).hexdigest()


def _special_tokens_of(directory: Path, tokenizer: Tokenizer) -> dict[str, str]:
    found = special_tokens_of(directory, tokenizer)
    for role in ROLES:
        if role not in found:
            raise DataError(f"tokenizer {directory}: it has no {role} token; give a tokenizer with BERT's [PAD] [UNK] "
                            "[CLS] [SEP] [MASK] or RoBERTa's <pad> <unk> <s> </s> <mask> (or the tokens named in its "
                            "special_tokens_map.json)")
    return found


def load_tokenizer(path: str | Path) -> LoadedTokenizer:
    """Any Hugging Face tokenizer directory (with `tokenizer.json`, or `vocab.txt` for BERT)."""
    directory = Path(path)
    if not directory.is_dir():
        raise DataError(f"tokenizer directory {directory} does not exist; train one with `bertforge tokenizer "
                        "train` or give any Hugging Face tokenizer directory")
    if (directory / "tokenizer.json").is_file():
        try:
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as error:  # the Rust side raises a plain Exception for a malformed file
            raise DataError(f"{directory / 'tokenizer.json'}: unreadable ({error})") from None
    else:
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(directory))
        except Exception as error:  # transformers raises many types for a directory it cannot use
            raise DataError(f"tokenizer {directory}: transformers could not load it "
                            f"({first_line(error)})") from None
        if not getattr(hf, "is_fast", False):
            raise DataError(f"tokenizer {directory}: only fast (Rust) tokenizers are supported")
        tokenizer = hf.backend_tokenizer
    tokenizer.no_padding()
    tokenizer.no_truncation()
    special = _special_tokens_of(directory, tokenizer)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lowercase = None
    config_path = directory / "tokenizer_config.json"
    if config_path.is_file():
        lowercase = json.loads(config_path.read_text(encoding="utf-8")).get("do_lower_case")
    return LoadedTokenizer(tokenizer=tokenizer, path=str(directory), special_tokens=special,
                           ids={role: vocab[token] for role, token in special.items()},
                           fingerprint=tokenizer_fingerprint(tokenizer), lowercase=lowercase)


def train_tokenizer_from_inputs(inputs: list[str], out_dir: str | Path, *, model: str = "wordpiece",
                                vocab_size: int = 32768, lowercase: bool | None = None,
                                strip_accents: bool | None = None, normalize: Iterable[str] = (),
                                text_field: str = "text", min_frequency: int = 2,
                                show_progress: bool = False) -> LoadedTokenizer:
    """Train a `model` (wordpiece, bpe, unigram) on the documents of `inputs` (any format `bertforge.data.sources`
    reads) and save to `out_dir`. `lowercase` None: WordPiece lower-cases, BPE and Unigram keep case.
    `strip_accents` None: WordPiece strips accents when it lower-cases (BERT's rule), except with `normalize`
    (names of data/normalization.py, for Arabic): stripping would also fold the hamza those keep."""
    from bertforge.data.sources import resolve_inputs
    from bertforge.data.tokenizer_models import tokenizer_model

    check_requested_vocab_size(vocab_size, model)
    if lowercase and tokenizer_model(model).cased_only:
        raise DataError(f"--uncased is WordPiece's: --model {model} keeps case, as RoBERTa's and XLM-R's tokenizers "
                        "do (transformers rebuilds them with no normalizer); drop --uncased or use --model wordpiece")
    if strip_accents and tokenizer_model(model).cased_only:
        raise DataError(f"--strip-accents is WordPiece's: --model {model} keeps the text's accents, as RoBERTa's and "
                        "XLM-R's tokenizers do; drop --strip-accents or use --model wordpiece")
    lowercase = model == "wordpiece" if lowercase is None else lowercase
    removals = resolve(normalize)
    if strip_accents is None and removals and model == "wordpiece":
        strip_accents = False
    sources = resolve_inputs(inputs)
    settings = dict(model=model, vocab_size=vocab_size, lowercase=lowercase, strip_accents=strip_accents,
                    normalize=removals, min_frequency=min_frequency, show_progress=show_progress)
    tokenizer = Tokenizer.from_str(_in_child_process(sources, text_field, settings))
    save_tokenizer(tokenizer, out_dir, lowercase=lowercase)
    return load_tokenizer(out_dir)


# ---------------------------------------------------------------------------------------------
# training in a child process, so that Ctrl-C stops it at once


CHILD_POLL_S = 0.1


def _in_child_process(sources: list[Source], text_field: str, settings: dict[str, Any]) -> str:
    """The trained tokenizer (as JSON) from `_train_in_child`, run in a spawned process this one waits for.

    The Rust trainer does not return to Python until it has finished, so a Ctrl-C in the process that
    called it waits for the whole training (minutes on a large corpus). Here the wait is ours: a
    KeyboardInterrupt kills the child at once and propagates. The child starts with SIGINT blocked, so
    a Ctrl-C at a terminal, which reaches the whole process group, prints nothing from it. Spawned, not
    forked: the caller may hold threads or CUDA state a fork would copy.
    """
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    shown = verbosity() if log.handlers else None  # the CLI's console settings; a library caller's own logging else
    child = context.Process(target=_train_in_child, args=(sources, text_field, settings, shown, send),
                            name="bertforge-tokenizer-training", daemon=True)
    # blocked, not ignored, while the child starts: the child inherits the blocked mask (so it never sees a
    # Ctrl-C), and one that arrives meanwhile is delivered here when it is unblocked, not lost
    blocked_before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with _callers_script_not_rerun():
            child.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked_before)
    send.close()
    try:
        while not receive.poll(CHILD_POLL_S):
            if not child.is_alive() and not receive.poll():
                raise BertforgeError(f"tokenizer training stopped with exit code {child.exitcode} before it finished "
                                     "(killed by the system for lack of memory?); try a smaller --vocab-size or input")
        kind, value = receive.recv()
    except BaseException:
        child.kill()
        child.join()
        raise
    finally:
        receive.close()
    child.join()
    if kind == "error":
        raise value
    return value


@contextmanager
def _callers_script_not_rerun() -> Iterator[None]:
    """A spawned child runs the caller's `__main__` script again before its target, to find functions
    defined there. Ours is a bertforge function, so the child needs none of it, and a user's script that
    calls the Python API without the `if __name__ == "__main__":` guard would start its own work over in
    the child and fail. Hiding the script's path while the child starts makes spawn skip it."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(main, "__spec__", None) is not None:  # `-m module` (guarded), a REPL
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


@dataclass
class _DocumentTexts:
    """The texts of `sources`, read afresh on each iteration (the tokenizer's training reads them twice)."""

    sources: list[Source]
    text_field: str

    def __iter__(self) -> Iterator[str]:
        from bertforge.data.sources import iter_documents

        return (document.text for document in iter_documents(self.sources, text_field=self.text_field))


def _train_in_child(sources: list[Source], text_field: str, settings: dict[str, Any], parent_verbosity: int | None,
                    send: Connection) -> None:
    if parent_verbosity is not None:
        setup_logging(parent_verbosity)
    try:
        outcome: tuple[str, Any] = ("done", _train(_DocumentTexts(sources, text_field), **settings).to_str())
    except BertforgeError as error:
        outcome = ("error", error)
    except Exception as error:  # a bug: its type and message reach the parent, which reports it as one
        outcome = ("error", RuntimeError(f"{type(error).__name__}: {error}"))
    send.send(outcome)
    send.close()


def _train(texts: _DocumentTexts, *, model: str, vocab_size: int, lowercase: bool, strip_accents: bool | None,
           normalize: tuple[str, ...], min_frequency: int, show_progress: bool) -> Tokenizer:
    from bertforge.data.tokenizer_models import tokenizer_model, train_subword

    if model == "wordpiece":
        return train_wordpiece(texts, vocab_size=vocab_size, lowercase=lowercase, strip_accents=strip_accents,
                               normalize=normalize, min_frequency=min_frequency, show_progress=show_progress)
    return train_subword(texts, tokenizer_model(model), vocab_size=vocab_size, min_frequency=min_frequency,
                         normalize=normalize, show_progress=show_progress)
