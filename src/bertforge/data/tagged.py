"""Tagged sentences for token classification (NER, supersense tagging): words, one tag each, errors by line.

The token-level sibling of `bertforge.data.labels`. Formats:

- CoNLL-style text (`.conll`, `.iob`, `.bio`, `.txt`, optionally `.gz`): one token per line, columns
  separated by spaces or tabs, the word in the first column and its tag in the LAST one (CoNLL-2003
  has four columns: word, POS, chunk, NER tag; most other files have two), a blank line between
  sentences. `-DOCSTART-` lines (document breaks) are skipped. Every token line of a file has the
  same number of columns. Read without tags (prediction input), a file may have one column.
- JSON lines (`.jsonl`, `.json`, optionally `.gz`), parquet, and Hugging Face datasets (a directory
  saved with `save_to_disk`, or `hf:NAME[:CONFIG][@SPLIT]`), read through
  `bertforge.data.records`: one sentence per row, `finetune.tagging.tokens_column` a list of words and
  `finetune.tagging.tags_column` a list of as many tags. Tags are names, or integer ids: the names of a
  dataset's `Sequence(ClassLabel)` feature when it has one, else ids into `finetune.labels` (or, in
  `read_tagged_split`, into the given tag list).

A tag is `O` or `<P>-<TYPE>` with P one of B, I, E, S (`TAG_PATTERN`): the IO, BIO/IOB1/IOB2 and
BIOES schemes, all of which seqeval's default mode scores. The tag list (the model's output ids) is
`finetune.labels` if given, else `O` first, then the training tags sorted by entity type and then
prefix (B, I, E, S): deterministic, and a type's tags side by side. A tag outside that list in any
split is an error, never a silent new class.

Why hand-written readers instead of `datasets`' conll2003 loading script or pandas: a tagged file
is often subtly wrong (a tag column of POS tags, a stray one-column line, a BILOU tag, a
tokens/tags length mismatch), and the fix is quick only when the error names the file and the
line. So every sentence keeps its line (or row) number, and every error is one `DataError` naming
file:line, what is wrong and what to do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.data.labels import LabelSet, _check_columns, setting_name
from bertforge.data.records import (
    HUB_PREFIX,
    SAVED_DATASET_MARKERS,
    Records,
    _decoding_error,
    _hf_records,
    _load_hub_dataset,
    _load_saved_dataset,
    _open_text,
    parse_hub_reference,
    read_records,
)
from bertforge.errors import CORRUPT_GZIP_ERRORS, ConfigError, DataError, corrupt_compressed_file
from bertforge.storage import origin

if TYPE_CHECKING:
    from bertforge.config import FinetuneSection

TAG_PATTERN = re.compile(r"O|(?P<prefix>[BIES])-(?P<type>\S+)")  # use with fullmatch
PREFIX_ORDER = "BIES"
ACCEPTED_TAGS = "O, or B-, I-, E- or S- followed by the entity type (B-PER, I-LOC, S-MISC)"
CONLL_EXTENSIONS = (".conll", ".iob", ".bio", ".txt")
RECORD_EXTENSIONS = (".jsonl", ".json", ".parquet")
DOCSTART = "-DOCSTART-"
KNOWN_SHOWN = 10  # known tags listed in an unknown-tag error
COLUMN_SEPARATOR = re.compile(r"[ \t]+")  # not str.split(): a no-break space inside a word stays in the word


# ---------------------------------------------------------------------------------------------
# tags


def entity_type(tag: str) -> str | None:
    """The TYPE of `<P>-<TYPE>`; None for `O` and for anything that is not a tag."""
    match = TAG_PATTERN.fullmatch(tag)
    return match["type"] if match else None


def sorted_tags(tags: Iterable[str]) -> list[str]:
    """`O` first (if present), then the other tags by (TYPE, prefix in B, I, E, S order)."""
    distinct = set(tags)
    others = sorted((t for t in distinct if t != "O"), key=lambda t: (t[2:], PREFIX_ORDER.index(t[0]), t))
    return (["O"] if "O" in distinct else []) + others


class TagSet(LabelSet):
    """Tag names in id order, and where the list came from (for error messages). Unlike a class label,
    a tag is always its name: an integer is never read as an id here (ids are `read_tagged_file`'s)."""

    ITEM = "tag"

    def id_of(self, tag: str) -> int | None:
        return self._ids.get(tag)

    def known(self) -> str:
        return ", ".join(self.names[:KNOWN_SHOWN]) + (", ..." if len(self.names) > KNOWN_SHOWN else "")


def _configured_tags(labels: Sequence[str]) -> TagSet:
    """`finetune.labels` as the tag list: each a well-formed tag, each once."""
    for name in labels:
        if not isinstance(name, str) or TAG_PATTERN.fullmatch(name) is None:
            raise ConfigError(f"finetune.labels lists {name!r}, which is not a tag; token classification tags are "
                              f"{ACCEPTED_TAGS}")
    return TagSet(labels, "finetune.labels")


# ---------------------------------------------------------------------------------------------
# reading: words and raw tag strings per sentence, with the line or row each sentence starts on


@dataclass
class _Sentences:
    """What a reader found, before tags become ids. `unit` says how `numbers` locate a word:
    "conll": word i of a sentence starting on line n is on line n+i; "line"/"row": the sentence's
    JSON line or record (then the word is named by its position)."""

    source: str
    words: list[list[str]]
    tags: list[list[str]] | None
    numbers: list[int]
    unit: str
    tag_column: str  # how an error names where the tag is: "the last column" or the column name

    def where(self, sentence: int, word: int | None = None) -> str:
        number = self.numbers[sentence]
        if self.unit == "conll":
            return f"{self.source}:{number + (word or 0)}"
        place = f"{self.source}:{number}" if self.unit == "line" else f"{self.source} row {number}"
        return place if word is None else f"{place}, word {word + 1}"


def _extension(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def _conll_sentences(path: Path, with_tags: bool) -> _Sentences:
    words: list[list[str]] = []
    tags: list[list[str]] = []
    numbers: list[int] = []
    sentence_words: list[str] = []
    sentence_tags: list[str] = []
    columns, columns_line = 0, 0  # the first token line fixes the column count for the whole file
    shown = origin(path)  # the URL of a copy from object storage

    def close() -> None:
        if sentence_words:
            words.append(list(sentence_words))
            tags.append(list(sentence_tags))
            sentence_words.clear()
            sentence_tags.clear()

    try:
        with _open_text(path) as handle:
            for number, line in enumerate(handle, start=1):
                text = line.rstrip("\r\n").strip(" \t")
                if not text.strip():
                    close()  # a blank line ends the sentence; runs of blank lines are one break
                    continue
                fields = COLUMN_SEPARATOR.split(text)
                if fields[0] == DOCSTART:
                    close()  # a document break; its own columns (often "-X- -X- O") are not counted
                    continue
                if not columns:
                    columns, columns_line = len(fields), number
                    if with_tags and columns == 1:
                        raise DataError(f"{shown}:{number}: one column ({fields[0]!r}) and no tag; a tagged file "
                                        "has the word first and its tag last on each line (e.g. `Paris B-LOC`), "
                                        "separated by a space or a tab")
                elif len(fields) != columns:
                    counted = f"{len(fields)} column{'s' * (len(fields) != 1)}"
                    raise DataError(f"{shown}:{number}: {counted} but the first token line ({columns_line}) has "
                                    f"{columns}; every token line needs the same columns "
                                    "(the word first, the tag last), and a word cannot contain a space")
                if not fields[0].strip():  # e.g. a lone no-break space: no piece would carry its tag
                    raise DataError(f"{shown}:{number}: the word {fields[0]!r} is only whitespace; remove the line "
                                    "or fill the word in")
                if not sentence_words:
                    numbers.append(number)
                sentence_words.append(fields[0])
                sentence_tags.append(fields[-1])
    except UnicodeDecodeError:
        raise _decoding_error(path) from None
    except CORRUPT_GZIP_ERRORS as error:
        raise corrupt_compressed_file(shown, error) from None
    close()
    if not words:
        raise DataError(f"{shown}: no sentences; a CoNLL file has one token per line (the word first, the tag "
                        "last) and a blank line between sentences")
    return _Sentences(shown, words, tags if with_tags else None, numbers, "conll", "the last column")


def _sequence_class_names(feature: Any) -> list[str] | None:
    """The names of a `Sequence(ClassLabel)` (in datasets 4+: `List(ClassLabel)`) feature, else None."""
    inner = feature[0] if isinstance(feature, list) and len(feature) == 1 else getattr(feature, "feature", None)
    names = getattr(inner, "names", None)
    return list(names) if names else None


def _open_records(source: str | Path, split: str, columns: Sequence[str], tags_column: str
                  ) -> tuple[Records, list[str] | None]:
    """The rows, and the tags column's ClassLabel names when the source is a Hugging Face dataset.

    `read_records` turns a plain ClassLabel column into names but not a sequence of them, and it
    does not hand out the dataset; so a dataset is loaded here (as `read_records` would) to read its
    features, and everything else goes to `read_records`, errors included."""
    text = str(source)
    dataset = None
    if text.startswith(HUB_PREFIX):
        name, config, split = parse_hub_reference(text, split)
        dataset = _load_hub_dataset(name, config, split, text)
    else:
        path = Path(text).expanduser()
        if not path.exists() and "@" in text and Path(text.rpartition("@")[0]).expanduser().is_dir():
            directory, _, split = text.rpartition("@")
            path = Path(directory).expanduser()
        if path.is_dir() and any((path / marker).is_file() for marker in SAVED_DATASET_MARKERS):
            dataset = _load_saved_dataset(path, split, origin(text))
    if dataset is None:
        return read_records(source, split=split, columns=columns), None
    return _hf_records(dataset, origin(text), columns), _sequence_class_names(dataset.features.get(tags_column))


def _word_list(value: Any, column: str, where: str) -> list[str]:
    if isinstance(value, str):
        raise DataError(f"{where}: column {column!r} holds a string, not a list of words; split the sentence "
                        'into words, e.g. ["John", "lives", "in", "Paris"]')
    if not isinstance(value, list | tuple):
        raise DataError(f"{where}: column {column!r} holds {type(value).__name__} {value!r}, not a list of words")
    if not value:
        raise DataError(f"{where}: no words in column {column!r}; remove the row")
    for index, word in enumerate(value):
        if not isinstance(word, str):
            raise DataError(f"{where}, word {index + 1}: {word!r} in column {column!r} is not a string; give "
                            "every word as a string")
        # a word with inner spaces is fine (its pieces all belong to it); an empty one has no first
        # piece to carry its tag, which would shift every later tag of the sentence
        if not word.strip():
            raise DataError(f"{where}, word {index + 1}: empty word {word!r} in column {column!r}; remove it and "
                            "its tag, or fill it in")
    return list(value)


def _tag_name(value: Any, where: str, column: str, id_names: Sequence[str] | None, id_origin: str) -> str:
    """A raw tag as a tag string: names pass through (checked later), integer ids become names."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 3.0 from a pandas-written file is id 3
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataError(f"{where}: tag {value!r} in column {column!r} is neither a tag name nor an integer id; "
                        f"use {ACCEPTED_TAGS}")
    if id_names is None:
        raise DataError(f"{where}: tag {value} in column {column!r} is an integer id, and nothing says which tag "
                        "it means; list the tags in id order in finetune.labels (e.g. [O, B-PER, I-PER]) or write "
                        "the tags by name")
    if not 0 <= value < len(id_names):
        raise DataError(f"{where}: tag id {value} in column {column!r} is out of range for the {len(id_names)} "
                        f"tags of {id_origin}; fix the row or the tag list")
    return id_names[value]


def _record_sentences(source: str | Path, tokens_column: str, tags_column: str, with_tags: bool, split: str,
                      id_tags: TagSet | None, cli_flags: bool) -> _Sentences:
    needed = {"tokens_column": tokens_column}
    if with_tags:
        needed["tags_column"] = tags_column
    records, class_names = _open_records(source, split, list(needed.values()), tags_column)
    _check_columns(records, needed, cli_flags)
    # a dataset's own ClassLabel names say what its ids mean; finetune.labels only orders the output
    names, origin = ((class_names, f"the dataset's {tags_column!r} feature") if class_names
                     else (id_tags.names, id_tags.origin) if id_tags else (None, ""))
    words: list[list[str]] = []
    tags: list[list[str]] = []
    numbers: list[int] = []
    for number, row in records.rows:
        where = records.where(number)
        for config_key, column in needed.items():
            if column not in row:
                raise DataError(f"{where}: the row has no field {column!r}; add it "
                                f"({setting_name(config_key, cli_flags)})")
        sentence = _word_list(row[tokens_column], tokens_column, where)
        if with_tags:
            raw = row[tags_column]
            if not isinstance(raw, list | tuple):
                raise DataError(f"{where}: column {tags_column!r} holds {type(raw).__name__} {raw!r}, not a list "
                                'of tags; give one tag per word, e.g. ["B-PER", "O", "O", "B-LOC"]')
            if len(raw) != len(sentence):
                raise DataError(f"{where}: {len(sentence)} words in column {tokens_column!r} but {len(raw)} tags in "
                                f"column {tags_column!r}; give each word exactly one tag")
            tags.append([_tag_name(value, f"{where}, word {i + 1}", tags_column, names, origin)
                         for i, value in enumerate(raw)])
        words.append(sentence)
        numbers.append(number)
    if not words:
        raise DataError(f"{records.source}: no rows; it needs at least one sentence")
    return _Sentences(records.source, words, tags if with_tags else None, numbers, records.unit,
                      f"column {tags_column!r}")


def _read(source: str | Path, tokens_column: str, tags_column: str, with_tags: bool, split: str,
          id_tags: TagSet | None, cli_flags: bool) -> _Sentences:
    path = Path(str(source)).expanduser()
    if path.is_file():
        extension = _extension(path)
        if extension in CONLL_EXTENSIONS:
            sentences = _conll_sentences(path, with_tags)
        elif extension in (".csv", ".tsv"):
            raise DataError(f"{origin(path)}: a csv/tsv row holds one text per cell, not a sentence's words and tags; "
                            "give a CoNLL file (one token per line: rename it to .conll) or jsonl with "
                            f"{tokens_column!r} and {tags_column!r} lists")
        elif extension in RECORD_EXTENSIONS:
            sentences = _record_sentences(path, tokens_column, tags_column, with_tags, split, id_tags, cli_flags)
        else:
            raise DataError(f"{origin(path)}: unknown file type {''.join(path.suffixes)!r} for tagged data; use "
                            f"{', '.join(CONLL_EXTENSIONS)} (CoNLL: one token per line) or .jsonl, .json, .parquet "
                            f"(optionally .gz), a saved Hugging Face dataset directory, or {HUB_PREFIX}NAME")
    else:  # directories, hf:NAME, DIR@SPLIT and missing files: read_records names what is wrong
        sentences = _record_sentences(source, tokens_column, tags_column, with_tags, split, id_tags, cli_flags)
    if sentences.tags is not None:
        _check_tag_forms(sentences)
    return sentences


def _check_tag_forms(sentences: _Sentences) -> None:
    valid: set[str] = set()  # a file holds few distinct tags: match each once
    for s, tags in enumerate(sentences.tags or []):
        for w, tag in enumerate(tags):
            if tag in valid:
                continue
            if TAG_PATTERN.fullmatch(tag) is None:
                raise DataError(f"{sentences.where(s, w)}: {tag!r} ({sentences.tag_column}, word "
                                f"{sentences.words[s][w]!r}) is not a tag; use {ACCEPTED_TAGS}{_tag_hint(tag)}")
            valid.add(tag)


def _tag_hint(tag: str) -> str:
    if re.fullmatch(r"[UL]-\S+", tag):
        return "; BILOU tags map to BIOES: U- is S-, L- is E-"
    if re.fullmatch(r"[bieso]-\S+|o", tag):
        return "; the prefix is upper case"
    if re.fullmatch(r"-?[0-9]+", tag):
        return "; integer tag ids are numbers, not strings (with finetune.labels naming them in id order)"
    return ""


def read_tagged_file(source: str | Path, *, tokens_column: str = "tokens", tags_column: str = "tags",
                     with_tags: bool = True, split: str = "train", id_names: Sequence[str] | None = None,
                     cli_flags: bool = False) -> tuple[list[list[str]], list[list[str]] | None, list[int]]:
    """Each sentence's words, its tag strings (None when `with_tags=False`) and its line/row number.

    `split` picks the split of a saved DatasetDict or hub dataset. `id_names` names integer tag ids
    (`finetune.labels`); a dataset's `Sequence(ClassLabel)` names take precedence. `cli_flags`:
    errors name `--tokens-column`, not `finetune.tagging.tokens_column`. Tags are checked against
    `TAG_PATTERN` but not against a tag list.
    """
    id_tags = TagSet(id_names, "finetune.labels") if id_names is not None else None
    sentences = _read(source, tokens_column, tags_column, with_tags, split, id_tags, cli_flags)
    return sentences.words, sentences.tags, sentences.numbers


# ---------------------------------------------------------------------------------------------
# splits


@dataclass
class TaggedSplit:
    """One split, checked and encoded: each sentence's words and their tag ids."""

    source: str
    words: list[list[str]]  # one list of words per sentence
    tags: list[list[int]] | None  # tag ids per word; None: read without tags (prediction input)
    tag_names: list[str]  # tag names in id order

    def __len__(self) -> int:
        return len(self.words)

    @property
    def entity_types(self) -> list[str]:
        return sorted({t for t in map(entity_type, self.tag_names) if t is not None})


def _encoded(sentences: _Sentences, tag_set: TagSet | None) -> TaggedSplit:
    if sentences.tags is None:
        return TaggedSplit(sentences.source, sentences.words, None, list(tag_set.names) if tag_set else [])
    if tag_set is None:  # the train split without finetune.labels fixes the list
        tag_set = TagSet(sorted_tags(t for tags in sentences.tags for t in tags), "the training data")
    advice = ("list every tag in finetune.labels" if tag_set.origin in ("finetune.labels", "the training data")
              else "use a model trained with this tag")
    ids: list[list[int]] = []
    for s, tags in enumerate(sentences.tags):
        sentence_ids = []
        for w, tag in enumerate(tags):
            tag_id = tag_set.id_of(tag)
            if tag_id is None:
                raise DataError(f"{sentences.where(s, w)}: tag {tag!r} (word {sentences.words[s][w]!r}) is not one "
                                f"of the {len(tag_set)} tags of {tag_set.origin} ({tag_set.known()}); fix the "
                                f"file, or {advice}")
            sentence_ids.append(tag_id)
        ids.append(sentence_ids)
    return TaggedSplit(sentences.source, sentences.words, ids, list(tag_set.names))


def read_tagged_split(source: str | Path, tag_names: Sequence[str], *, tokens_column: str, tags_column: str,
                      with_tags: bool = True, split: str = "train", origin: str = "the model's tags",
                      cli_flags: bool = False) -> TaggedSplit:
    """Read one split against a known tag list (a trained model's, for predict/evaluate).

    Integer tag ids are ids into `tag_names`; a tag outside it is an error naming `origin`.
    """
    tag_set = TagSet(tag_names, origin)
    sentences = _read(source, tokens_column, tags_column, with_tags, split, tag_set, cli_flags)
    return _encoded(sentences, tag_set)


@dataclass
class TaggedData:
    """The splits of a token classification run, sharing one tag list."""

    train: TaggedSplit
    validation: TaggedSplit | None
    test: TaggedSplit | None

    @property
    def tag_names(self) -> list[str]:
        return self.train.tag_names


def load_tagged_data(section: FinetuneSection, tokens_column: str, tags_column: str) -> TaggedData:
    """Read the train/validation/test splits a `finetune:` section names (paths already resolved)."""
    if not section.train_file:
        raise ConfigError("finetune.train_file is not set; give a CoNLL file (.conll/.iob/.bio/.txt), a "
                          "jsonl/parquet file, a saved Hugging Face dataset directory or a hub name")
    configured = _configured_tags(section.labels) if section.labels else None

    def read(source: str, split: str, tag_set: TagSet | None) -> TaggedSplit:
        # integer ids always mean finetune.labels, in every split (never the training data's sorted tags)
        return _encoded(_read(source, tokens_column, tags_column, True, split, configured, False), tag_set)

    train = read(section.train_file, "train", configured)
    fixed = configured or TagSet(train.tag_names, "the training data")
    validation = read(section.validation_file, "validation", fixed) if section.validation_file else None
    test = read(section.test_file, "test", fixed) if section.test_file else None
    return TaggedData(train, validation, test)
