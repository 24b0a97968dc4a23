"""Labeled rows for fine-tuning: read them, fix the label set, tokenize once, batch with no padding.

Why hand-written readers instead of `datasets.load_dataset("csv", ...)`: a user's file is wrong
more often than not (a .csv that is really tab-separated, an empty cell, "5 stars" in a numeric
column, Latin-1 bytes), and the fix is quick only when the error names the file and the line.
pandas/arrow report a byte offset or nothing. So csv/tsv/jsonl/parquet are read here row by row
with their row numbers; Hugging Face datasets (saved with `save_to_disk`, or `hf:NAME` / a local
dataset repository through the real `datasets.load_dataset`) go through `datasets`, numbered by row.
(`bertforge.data.sources` reads the same formats for pre-training documents, leniently and
streaming; labeled rows need the opposite: every row checked, every error a stop.)

Conventions:
- `.tsv` (or `delimiter: "\\t"`) is read with csv quoting off, the GLUE convention: a tab-separated
  field cannot contain a tab, and text that starts with `"` must not swallow the rows after it.
  `.csv` uses standard csv quoting. `.gz` is decompressed transparently; a UTF-8 BOM is ignored.
- Labels are given by name or by integer id. `label_map` merges raw labels first (keys compared as
  strings, so 5 and "5" are the same key). The label list is `labels` if given, else the sorted
  labels of the train split (numerically when they are all integers); a label outside it in
  validation or test data is an error, never a silent new class.
- Examples are tokenized once, with BERT's `[CLS] a [SEP] b [SEP]` layout, longest-first truncation
  and no padding; `collate_unpadded` concatenates them into the unpadded batch the encoder consumes.
  `collate_padded` (dynamic padding) exists only for the Hugging Face reference path.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import torch
from rich.progress import Progress

from bertforge.console import console, progress_enabled
from bertforge.errors import (
    CORRUPT_GZIP_ERRORS,
    ConfigError,
    DataError,
    corrupt_compressed_file,
    directory_listing,
    first_line,
)

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from bertforge.config import FinetuneSection

TASK_TYPES = ("classification", "regression")
FILE_FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
EXTENSION_DELIMITERS = {".csv": ",", ".tsv": "\t"}
DELIMITER_NAMES = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}
SAVED_DATASET_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")
HUB_PREFIX = "hf:"
INTEGER = re.compile(r"-?[0-9]+")
TOKENIZE_CHUNK = 8192  # examples per `encode_batch` call: big enough to keep the Rust threads busy


# ---------------------------------------------------------------------------------------------
# records: (row number, {column: value}) from any supported source


@dataclass
class Records:
    """The rows of one source before any checking. `where(n)` names row n for error messages."""

    source: str
    columns: list[str]
    rows: Iterable[tuple[int, Mapping[str, Any]]]
    unit: str  # "line": rows are numbered by file line (source:N); "row": by record (source row N)
    delimiter: str | None = None  # for csv/tsv, to hint at a wrong delimiter

    def where(self, number: int) -> str:
        return f"{self.source}:{number}" if self.unit == "line" else f"{self.source} row {number}"


def _file_format(path: Path) -> tuple[str | None, str]:
    """(format, extension) of a file, looking through a trailing .gz."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    extension = suffixes[-1] if suffixes else ""
    return FILE_FORMATS.get(extension), extension


def _open_text(path: Path) -> IO[str]:
    # utf-8-sig drops the byte-order mark Excel and the GLUE MRPC files put before the header
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return open(path, encoding="utf-8-sig", newline="")


def _first_undecodable_line(path: Path) -> tuple[int, bytes]:
    """Only on the error path: rescan the bytes to name the line a UnicodeDecodeError came from."""
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as error:
                return number, raw[error.start:error.end]
    return 0, b""


def _decoding_error(path: Path) -> DataError:
    line, bad = _first_undecodable_line(path)
    where = f"{path}:{line}" if line else str(path)
    return DataError(f"{where}: not valid UTF-8 (bytes {bad.hex(' ')}); re-save the file as UTF-8, "
                     "e.g. `iconv -f latin1 -t utf-8 in.csv > out.csv`")


def _csv_records(path: Path, delimiter: str) -> Records:
    # tab-separated files are read with quoting off: see the module docstring
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    name = DELIMITER_NAMES.get(delimiter, repr(delimiter))
    rows: list[tuple[int, dict[str, str]]] = []
    with _open_text(path) as handle:
        reader = csv.reader(handle, delimiter=delimiter, quoting=quoting)
        header: list[str] | None = None
        start = 1  # a record may span lines (quoted newlines): report the line it starts on
        try:
            for fields in reader:
                number, start = start, reader.line_num + 1
                if not fields or fields == [""]:
                    continue  # blank line
                if header is None:
                    header = [field.strip() for field in fields]
                    continue
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}:{number}: {len(fields)} fields but the header has {len(header)} "
                        f"({', '.join(header)}) when split on {name}; check finetune.delimiter, or quote "
                        "fields that contain the delimiter")
                rows.append((number, dict(zip(header, fields, strict=True))))
        except UnicodeDecodeError:
            raise _decoding_error(path) from None
        except csv.Error as error:
            raise DataError(f"{path}:{reader.line_num}: unreadable csv row ({error}); fix the quoting or set "
                            "finetune.delimiter") from None
    if header is None:
        raise DataError(f"{path}: the file is empty; it needs a header line naming the columns and rows below it")
    return Records(str(path), header, rows, unit="line", delimiter=delimiter)


def _jsonl_records(path: Path) -> Records:
    with _open_text(path) as handle:
        try:
            text = handle.read()
        except UnicodeDecodeError:
            raise _decoding_error(path) from None
    if text.lstrip().startswith("["):  # a .json file holding one array of objects
        try:
            array = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg}); fix the syntax") from None
        records = Records(str(path), [], list(enumerate(array, start=1)), unit="row")
    else:
        objects = []
        # split on "\n" only: str.splitlines would also break inside strings holding U+2028 or \x0c
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                objects.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{path}:{number}: not valid JSON ({error.msg}); each line must be one "
                                "JSON object") from None
        records = Records(str(path), [], objects, unit="line")
    for number, value in records.rows:
        if not isinstance(value, dict):
            raise DataError(f"{records.where(number)}: expected a JSON object with named fields, got "
                            f"{type(value).__name__}")
        if not records.columns:
            records.columns = list(value)
    return records


def _parquet_records(path: Path, wanted: Sequence[str]) -> Records:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises several types for a corrupt or non-parquet file
        raise DataError(f"{path}: not a readable parquet file ({error}); check the file") from None
    columns = list(parquet.schema_arrow.names)
    present = [c for c in wanted if c in columns]
    table = parquet.read(columns=present).to_pydict()
    return Records(str(path), columns, _numbered_columns(table), unit="row")


def _numbered_columns(table: Mapping[str, list[Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    names = list(table)
    for number, values in enumerate(zip(*(table[n] for n in names), strict=True), start=1):
        yield number, dict(zip(names, values, strict=True))


def _hf_records(dataset: Any, source: str, wanted: Sequence[str]) -> Records:
    """Rows of a `datasets.Dataset`; ClassLabel ids become their names so labels work by name."""
    columns = list(dataset.column_names)
    present = [c for c in wanted if c in columns]
    table = dataset.select_columns(present).to_dict()
    for name in present:
        names = getattr(dataset.features[name], "names", None)  # a ClassLabel feature
        if names:
            table[name] = [names[v] if isinstance(v, int) and 0 <= v < len(names) else None for v in table[name]]
    return Records(source, columns, _numbered_columns(table), unit="row")


def _hub_spec(spec: str, split: str) -> tuple[str, str | None, str]:
    """`NAME[:CONFIG][@SPLIT]` -> (name, config, split), as `bertforge.data.sources` reads `hf:` inputs."""
    name, _, explicit_split = spec.partition("@")
    config = None
    if not name.startswith(("/", ".", "~")):  # a local path may contain ':'; a hub name may not
        name, _, config = name.partition(":")
    return name, config or None, explicit_split or split


def _load_saved_dataset(directory: Path, split: str, source: str) -> Any:
    import datasets

    loaded = datasets.load_from_disk(str(directory))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{source}: no split {split!r} in the saved dataset (splits: {', '.join(loaded)}); "
                            f"name one as {directory}@SPLIT")
        return loaded[split]
    return loaded


def _load_hub_dataset(name: str, config: str | None, split: str, source: str) -> Any:
    import datasets

    try:
        return datasets.load_dataset(name, config, split=split)
    except (ValueError, KeyError) as error:
        raise DataError(f"{source}: could not load split {split!r} with datasets.load_dataset ({first_line(error)}); "
                        f"check the dataset name, config and split ({HUB_PREFIX}NAME[:CONFIG][@SPLIT])") from None
    except Exception as error:  # network, hub and file-pattern errors have no common base class
        raise DataError(f"{source}: could not load it with datasets.load_dataset ({type(error).__name__}: "
                        f"{first_line(error)}); check the name and your network, or give a local file") from None


def read_records(source: str | Path, *, split: str = "train", delimiter: str | None = None,
                 columns: Sequence[str] = ()) -> Records:
    """Open any supported source.

    `source` is a csv/tsv/jsonl/json/parquet file (optionally .gz); a directory saved with
    `save_to_disk` (a DatasetDict one gives `split`, or the split named as `DIR@SPLIT`); or a hub
    dataset `hf:NAME[:CONFIG][@SPLIT]` (the syntax of `bertforge prepare` inputs), NAME also a local
    copy of a dataset repository. Any other directory is an error listing what it holds. `columns` lists the
    columns that will be used, so columnar formats read only those.
    """
    text = str(source)
    if text.startswith(HUB_PREFIX):
        name, config, split = _hub_spec(text[len(HUB_PREFIX):], split)
        return _hf_records(_load_hub_dataset(name, config, split, text), text, columns)
    path = Path(text).expanduser()
    if not path.exists() and "@" in text and Path(text.rpartition("@")[0]).expanduser().is_dir():
        directory, _, split = text.rpartition("@")
        path = Path(directory).expanduser()
    if path.is_dir():
        if any((path / marker).is_file() for marker in SAVED_DATASET_MARKERS):
            return _hf_records(_load_saved_dataset(path, split, text), text, columns)
        # a folder of loose files is not read by guesswork: `datasets.load_dataset` would merge every
        # file with "train" in its name (train.csv and reg_train.csv alike) and exit 0
        found = sorted(entry.name for entry in path.iterdir())
        raise DataError(f"{text} is a directory but not a dataset saved with save_to_disk (it holds "
                        f"{directory_listing(path)}); "
                        f"give one file, e.g. {path / (found[0] if found else 'train.csv')}, or "
                        f"{HUB_PREFIX}{text} for a local copy of a Hugging Face hub dataset repository")
    if not path.exists():
        raise DataError(f"{text}: no such file or directory (relative paths start from {Path.cwd()}); for a "
                        f"Hugging Face hub dataset write {HUB_PREFIX}NAME[:CONFIG][@SPLIT]")
    file_format, extension = _file_format(path)
    try:
        if file_format == "csv":
            chosen = delimiter or EXTENSION_DELIMITERS[extension]
            return _csv_records(path, chosen)
        if file_format == "jsonl":
            return _jsonl_records(path)
    except CORRUPT_GZIP_ERRORS as error:
        raise corrupt_compressed_file(path, error) from None
    if file_format == "parquet":
        return _parquet_records(path, columns)
    raise DataError(f"{path}: unknown file type {''.join(path.suffixes)!r}; use .csv, .tsv, .jsonl, .json or "
                    f".parquet (optionally .gz), a saved Hugging Face dataset directory, or {HUB_PREFIX}NAME")


# ---------------------------------------------------------------------------------------------
# labels


def label_key(value: Any) -> str | None:
    """The string form of a raw label: 5, 5.0 and "5" are one key; None/"" mean no label."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    key = str(value).strip()
    return key or None


def _is_integer(text: str) -> bool:
    return INTEGER.fullmatch(text) is not None


class LabelSet:
    """Class names in id order; turns raw labels (a name or an integer id) into class ids."""

    def __init__(self, names: Sequence[str], origin: str = "finetune.labels") -> None:
        duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
        if duplicates:
            raise ConfigError(f"finetune.labels lists {', '.join(duplicates)} more than once; give each class once")
        self.names = [str(n) for n in names]
        self.origin = origin  # where the list came from, for error messages
        self._ids = {name: i for i, name in enumerate(self.names)}
        # integer raw labels are ids only when the names themselves are not integers ("0", "1")
        self._accepts_ids = not any(_is_integer(n) for n in self.names)

    @classmethod
    def from_training_labels(cls, keys: Iterable[str]) -> LabelSet:
        """Sorted distinct labels; numerically when all are integers, so "10" comes after "9"."""
        distinct = set(keys)
        ordered = sorted(distinct, key=int) if all(_is_integer(k) for k in distinct) else sorted(distinct)
        return cls(ordered, origin="the training data")

    def __len__(self) -> int:
        return len(self.names)

    def id_of(self, key: str) -> int | None:
        if key in self._ids:
            return self._ids[key]
        if self._accepts_ids and _is_integer(key) and 0 <= int(key) < len(self.names):
            return int(key)
        return None


# ---------------------------------------------------------------------------------------------
# splits


@dataclass(frozen=True)
class Columns:
    """Which columns hold the text, the optional second text, and the label."""

    text: str = "text"
    text_pair: str | None = None
    label: str = "label"


@dataclass
class LabeledSplit:
    """One split, checked and encoded: texts, optional text pairs, label ids (or floats)."""

    source: str
    task_type: str
    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int] | list[float] | None  # None: read without labels (prediction input)
    label_names: list[str]  # class names in id order; empty for regression

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def num_labels(self) -> int:
        """Outputs of the head: one per class, or 1 for regression."""
        return 1 if self.task_type == "regression" else len(self.label_names)

    @property
    def id2label(self) -> dict[int, str]:
        return dict(enumerate(self.label_names))

    @property
    def label2id(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.label_names)}


def setting_name(key: str, cli_flags: bool) -> str:
    """How the user sets `key`: `--text-column` on predict/evaluate's command line, else `finetune.text_column`."""
    return f"--{key.replace('_', '-')}" if cli_flags else f"finetune.{key}"


def _column_hint(records: Records, cli_flags: bool) -> str:
    if records.delimiter is None or len(records.columns) != 1:
        return ""
    only = records.columns[0]
    for candidate, name in DELIMITER_NAMES.items():
        if candidate != records.delimiter and candidate in only:
            return (f"; the header looks {name}-separated — set {setting_name('delimiter', cli_flags)} to "
                    f"{candidate!r} (or give the file the matching extension)")
    return ""


def _check_columns(records: Records, needed: Mapping[str, str], cli_flags: bool) -> None:
    if not records.columns:
        raise DataError(f"{records.source}: no rows; the file is empty")
    # line files take their columns from line 1 (the header, or the first JSON record)
    where = f"{records.source}:1" if records.unit == "line" else records.source
    for config_key, column in needed.items():
        if column not in records.columns:
            found = ", ".join(repr(c) for c in records.columns) or "none"
            raise DataError(f"{where}: no column {column!r} (columns found: {found}); set "
                            f"{setting_name(config_key, cli_flags)} to one of them{_column_hint(records, cli_flags)}")


def _text(value: Any, column: str, where: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        value = ""
    text = str(value)
    if not text.strip():
        raise DataError(f"{where}: empty text in column {column!r}; fill it in or remove the row")
    return text


def _regression_target(value: Any, column: str, where: str) -> float:
    try:
        target = float(value)
    except (TypeError, ValueError):
        target = math.nan
        if label_key(value) is not None:
            raise DataError(f"{where}: regression label {value!r} in column {column!r} is not a number; "
                            "fix the row, or set finetune.task_type: classification") from None
    if not math.isfinite(target):
        raise DataError(f"{where}: regression label {value!r} in column {column!r} is missing or not finite; "
                        "give a number")
    return target


def read_labeled_split(source: str | Path, *, task_type: str = "classification", columns: Columns = Columns(),
                       labels: LabelSet | None = None, label_map: Mapping[str, str] | None = None,
                       delimiter: str | None = None, split: str = "train", with_labels: bool = True,
                       cli_flags: bool = False) -> LabeledSplit:
    """Read, check and encode one split.

    Classification labels are encoded against `labels`; when it is None (the train split with no
    `finetune.labels`) the sorted labels of this split become the label set. `label_map` (raw label
    -> class name) is applied first. `with_labels=False` reads only the texts (prediction input).
    `cli_flags`: errors name the command-line flags (`--text-column`), not the config keys.
    """
    if task_type not in TASK_TYPES:
        raise ConfigError(f"task_type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
    mapping = {str(k): str(v) for k, v in (label_map or {}).items()}
    needed = {"text_column": columns.text}
    if columns.text_pair is not None:
        needed["text_pair_column"] = columns.text_pair
    if with_labels:
        needed["label_column"] = columns.label
    records = read_records(source, split=split, delimiter=delimiter, columns=list(needed.values()))
    _check_columns(records, needed, cli_flags)

    texts: list[str] = []
    pairs: list[str] | None = [] if columns.text_pair is not None else None
    raw_labels: list[Any] = []
    numbers: list[int] = []
    for number, row in records.rows:
        where = records.where(number)
        for config_key, column in needed.items():
            if column not in row:
                raise DataError(f"{where}: the row has no field {column!r}; add it "
                                f"({setting_name(config_key, cli_flags)})")
        texts.append(_text(row[columns.text], columns.text, where))
        if pairs is not None:
            pairs.append(_text(row[columns.text_pair], columns.text_pair, where))  # type: ignore[index]
        if with_labels:
            raw_labels.append(row[columns.label])
            numbers.append(number)
    if not texts:
        raise DataError(f"{records.source}: no rows; the {split} split needs at least one example")

    if not with_labels:
        return LabeledSplit(records.source, task_type, texts, pairs, None, labels.names if labels else [])
    if task_type == "regression":
        targets = [_regression_target(v, columns.label, records.where(n)) for v, n in zip(raw_labels, numbers,
                                                                                         strict=True)]
        return LabeledSplit(records.source, task_type, texts, pairs, targets, [])

    keys: list[str] = []
    for value, number in zip(raw_labels, numbers, strict=True):
        key = label_key(value)
        if key is None:
            raise DataError(f"{records.where(number)}: no label in column {columns.label!r}; give one or remove "
                            "the row")
        keys.append(mapping.get(key, key))
    label_set = labels if labels is not None else LabelSet.from_training_labels(keys)
    ids: list[int] = []
    for key, value, number in zip(keys, raw_labels, numbers, strict=True):
        label_id = label_set.id_of(key)
        if label_id is None:
            raise _unknown_label(records.where(number), value, key, label_set)
        ids.append(label_id)
    return LabeledSplit(records.source, task_type, texts, pairs, ids, list(label_set.names))


def _unknown_label(where: str, value: Any, key: str, label_set: LabelSet) -> DataError:
    shown = f"{value!r}" if label_key(value) == key else f"{value!r} (mapped to {key!r})"
    known = ", ".join(label_set.names[:10]) + (", ..." if len(label_set) > 10 else "")
    return DataError(f"{where}: label {shown} is not one of the {len(label_set)} labels of {label_set.origin} "
                     f"({known}); fix the row, add it to finetune.labels, or merge it into a known label with "
                     "finetune.label_map")


@dataclass
class LabeledData:
    """The splits of a fine-tuning run, sharing one label set."""

    train: LabeledSplit
    validation: LabeledSplit | None
    test: LabeledSplit | None
    class_weights: list[float] | None

    @property
    def task_type(self) -> str:
        return self.train.task_type

    @property
    def label_names(self) -> list[str]:
        return self.train.label_names

    @property
    def num_labels(self) -> int:
        return self.train.num_labels


def _checked_label_config(section: FinetuneSection) -> LabelSet | None:
    if section.task_type == "regression":
        if section.labels or section.label_map or section.class_weights:
            raise ConfigError("finetune.labels, label_map and class_weights apply to classification only; "
                              "remove them or set finetune.task_type: classification")
        return None
    if not section.labels:
        return None
    label_set = LabelSet(section.labels)
    for raw, target in section.label_map.items():
        if label_set.id_of(str(target)) is None:
            raise ConfigError(f"finetune.label_map maps {raw!r} to {target!r}, which is not in finetune.labels "
                              f"({', '.join(label_set.names)}); fix the map or the list")
    return label_set


def load_labeled_data(section: FinetuneSection) -> LabeledData:
    """Read the train/validation/test splits a `finetune:` config section names."""
    if not section.train_file:
        raise ConfigError("finetune.train_file is not set; give a csv/tsv/jsonl/parquet file, a saved Hugging "
                          "Face dataset directory or a hub name")
    read = functools.partial(read_labeled_split, task_type=section.task_type, label_map=section.label_map,
                             columns=Columns(section.text_column, section.text_pair_column, section.label_column),
                             delimiter=section.delimiter)
    train = read(section.train_file, labels=_checked_label_config(section), split="train")
    origin = "finetune.labels" if section.labels else "the training data"
    fixed = LabelSet(train.label_names, origin) if section.task_type == "classification" else None
    validation = read(section.validation_file, labels=fixed, split="validation") if section.validation_file else None
    test = read(section.test_file, labels=fixed, split="test") if section.test_file else None
    weights = list(section.class_weights) or None
    if weights is not None:
        if len(weights) != train.num_labels:
            raise ConfigError(f"finetune.class_weights has {len(weights)} values but there are {train.num_labels} "
                              f"labels ({', '.join(train.label_names)}); give one weight per label, in that order")
        if any(not math.isfinite(w) or w < 0 for w in weights):
            raise ConfigError(f"finetune.class_weights {weights} must be finite and >= 0")
    return LabeledData(train, validation, test, weights)


# ---------------------------------------------------------------------------------------------
# tokenization: once, into flat arrays


def bert_tokenizer(tokenizer: Tokenizer | str | Path, max_length: int) -> Tokenizer:
    """A copy of `tokenizer` set up for BERT inputs: no padding, longest-first truncation.

    The `[CLS] a [SEP] b [SEP]` template is set here rather than trusted from tokenizer.json, so a
    tokenizer saved with another post-processor (or none) still gives BERT's layout and segment ids.
    """
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    if isinstance(tokenizer, Tokenizer):
        configured = Tokenizer.from_str(tokenizer.to_str())
    else:
        path = Path(tokenizer)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise DataError(f"{path}: no tokenizer.json; point at a tokenizer directory (bertforge or Hugging Face "
                            "format) or re-save it with AutoTokenizer.from_pretrained(dir).save_pretrained(dir)")
        try:
            configured = Tokenizer.from_file(str(file))
        except Exception as error:  # the tokenizers library raises a bare Exception for a bad file
            raise DataError(f"{file}: not a readable tokenizer.json ({error}); re-save the tokenizer") from None
    special = {}
    for token in ("[CLS]", "[SEP]", "[PAD]"):
        token_id = configured.token_to_id(token)
        if token_id is None:
            raise DataError(f"the tokenizer has no {token} token; fine-tuning needs a BERT-style WordPiece vocabulary")
        special[token] = token_id
    configured.no_padding()
    configured.enable_truncation(max_length, strategy="longest_first")
    configured.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", special["[CLS]"]), ("[SEP]", special["[SEP]"])],
    )
    return configured


class LabeledDataset(torch.utils.data.Dataset):
    """A tokenized split: every example's token ids in one flat array, sliced by `offsets`.

    Flat int32 arrays instead of a list of tensors: a few bytes per token, cheap to pickle into
    data-loader workers, and the lengths come for free (`lengths`) for token budgets and stats.
    """

    def __init__(self, split: LabeledSplit, tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        configured = bert_tokenizer(tokenizer, max_length)
        self.pad_token_id = int(configured.token_to_id("[PAD]"))
        self.task_type = split.task_type
        self.label_names = list(split.label_names)
        self.source = split.source
        ids: list[np.ndarray] = []
        type_ids: list[np.ndarray] = []
        inputs: list[str] | list[tuple[str, str]] = (
            split.texts if split.text_pairs is None else list(zip(split.texts, split.text_pairs, strict=True)))
        with Progress(console=console, transient=True, disable=not progress_enabled()) as progress:
            bar = progress.add_task(f"tokenizing {Path(split.source).name}", total=len(inputs))
            for start in range(0, len(inputs), TOKENIZE_CHUNK):
                chunk = inputs[start:start + TOKENIZE_CHUNK]
                for encoding in configured.encode_batch(chunk):
                    ids.append(np.asarray(encoding.ids, dtype=np.int32))
                    type_ids.append(np.asarray(encoding.type_ids, dtype=np.int8))
                progress.advance(bar, len(chunk))
        lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
        self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.token_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
        self.token_type_ids = np.concatenate(type_ids) if type_ids else np.zeros(0, dtype=np.int8)
        self.labels: np.ndarray | None = None
        if split.labels is not None:
            dtype = np.float32 if split.task_type == "regression" else np.int64
            self.labels = np.asarray(split.labels, dtype=dtype)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example, [CLS]/[SEP] included."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        start, end = self.offsets[index], self.offsets[index + 1]
        example: dict[str, Any] = {"input_ids": self.token_ids[start:end],
                                   "token_type_ids": self.token_type_ids[start:end]}
        if self.labels is not None:
            label = self.labels[index]
            example["label"] = float(label) if self.task_type == "regression" else int(label)
        return example


# ---------------------------------------------------------------------------------------------
# batches


def _labels_tensor(examples: Sequence[Mapping[str, Any]]) -> torch.Tensor | None:
    if "label" not in examples[0]:
        return None
    values = [e["label"] for e in examples]
    dtype = torch.float32 if isinstance(values[0], float) else torch.long
    return torch.tensor(values, dtype=dtype)


def collate_unpadded(examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The unpadded batch: all sequences concatenated, `cu_seqlens` marking where each starts."""
    lengths = torch.tensor([len(e["input_ids"]) for e in examples], dtype=torch.long)
    cu_seqlens = torch.zeros(len(examples) + 1, dtype=torch.int32)
    torch.cumsum(lengths, dim=0, out=cu_seqlens[1:])
    total = int(cu_seqlens[-1])
    starts = torch.repeat_interleave(cu_seqlens[:-1].long(), lengths)
    batch: dict[str, Any] = {
        "input_ids": torch.from_numpy(np.concatenate([e["input_ids"] for e in examples]).astype(np.int64)),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
        "position_ids": torch.arange(total, dtype=torch.long) - starts,
        "token_type_ids": torch.from_numpy(np.concatenate([e["token_type_ids"] for e in examples]).astype(np.int64)),
        "num_samples": len(examples),
    }
    labels = _labels_tensor(examples)
    if labels is not None:
        batch["labels"] = labels
    return batch


def collate_padded(examples: Sequence[Mapping[str, Any]], pad_token_id: int = 0,
                   pad_to_length: int | None = None) -> dict[str, Any]:
    """[B, L] batch for Hugging Face models: padded to the longest example, or to `pad_to_length`."""
    longest = max(len(e["input_ids"]) for e in examples)
    width = max(longest, pad_to_length or 0)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(examples), width), dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        length = len(example["input_ids"])
        input_ids[row, :length] = torch.from_numpy(example["input_ids"].astype(np.int64))
        token_type_ids[row, :length] = torch.from_numpy(example["token_type_ids"].astype(np.int64))
        attention_mask[row, :length] = 1
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids, "num_samples": len(examples)}
    labels = _labels_tensor(examples)
    if labels is not None:
        batch["labels"] = labels
    return batch

