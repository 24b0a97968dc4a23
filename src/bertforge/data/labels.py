"""The label set and the splits of labeled data: columns checked, labels fixed once, errors by row.

- Labels are given by name or by integer id. `label_map` merges raw labels first (keys compared as
  strings, so 5 and "5" are the same key). The label list is `labels` if given, else the sorted
  labels of the train split (numerically when they are all integers); a label outside it in
  validation or test data is an error, never a silent new class.
- Rows come from `bertforge.data.records`; `bertforge.data.labeled` tokenizes and batches them.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.data.records import DELIMITER_NAMES, Records, describe_value, read_records
from bertforge.errors import ConfigError, DataError

if TYPE_CHECKING:
    from bertforge.config import FinetuneSection

TASK_TYPES = ("classification", "regression")
INTEGER = re.compile(r"-?[0-9]+")


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

    ITEM = "class"  # what one name is, in messages

    def __init__(self, names: Sequence[str], origin: str = "finetune.labels") -> None:
        duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
        if duplicates:
            raise ConfigError(f"{origin} lists {', '.join(duplicates)} more than once; give each {self.ITEM} once")
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
    group: str | None = None  # finetune.classification.group_column: metrics are also reported per value of it


@dataclass
class LabeledSplit:
    """One split, checked and encoded: texts, optional text pairs, label ids (or floats)."""

    source: str
    task_type: str
    texts: list[str]
    text_pairs: list[str] | None
    labels: list[int] | list[float] | None  # None: read without labels (prediction input)
    label_names: list[str]  # class names in id order; empty for regression
    groups: list[str] | None = None  # each row's value of `group_column` (e.g. its language), when one is set
    group_column: str | None = None

    @classmethod
    def unlabeled(cls, source: str, texts: Sequence[str], text_pairs: Sequence[str] | None = None) -> LabeledSplit:
        """Texts to run a model on, read without labels (predict's input, an export's check batch)."""
        return cls(source, "classification", list(texts), list(text_pairs) if text_pairs is not None else None,
                   None, [])

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


# the column keys that live in a task kind's sub-section of finetune:
KIND_SETTINGS = {"tokens_column": "tagging", "tags_column": "tagging", "negative_column": "embedding",
                 "group_column": "classification"}


def setting_name(key: str, cli_flags: bool) -> str:
    """How the user sets `key`: `--text-column` on predict/evaluate's command line, else `finetune.text_column`
    (`finetune.tagging.tokens_column` for a key of a kind's own sub-section)."""
    if cli_flags:
        return f"--{key.replace('_', '-')}"
    return f"finetune.{KIND_SETTINGS[key]}.{key}" if key in KIND_SETTINGS else f"finetune.{key}"


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
    if not isinstance(value, str):
        # str() would turn 12345, ["a"] or true into text the user never wrote: a wrong column, or a file
        # whose writer lost the quotes; either way the fix is in the data
        raise DataError(f"{where}: column {column!r} holds {describe_value(value)}, not a string; give "
                        "every text as a string (in quotes in JSON), or check that this is the text column")
    if not value.strip():
        raise DataError(f"{where}: empty text in column {column!r}; fill it in or remove the row")
    return value


def _checked_class_label(value: Any, column: str, where: str) -> Any:
    """A raw classification label as given, when it is of a type a label can be: a string, an integer
    (5.0 from a pandas-written file is 5), or nothing (None/NaN: "no label")."""
    if value is None or isinstance(value, str) or (isinstance(value, float) and (math.isnan(value)
                                                                                  or value.is_integer())):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    advice = ("for a number per row set finetune.task_type: regression" if isinstance(value, float)
              else "give one label per row as a string or an integer")
    raise DataError(f"{where}: the label in column {column!r} is {describe_value(value)}; a class label is a "
                    f"string or an integer, so {advice}")


def _regression_target(value: Any, column: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float | None):
        # float(True) is 1.0: a boolean or a list is never read as a score
        raise DataError(f"{where}: the regression label in column {column!r} is {describe_value(value)}, not a "
                        "number; give a finite number per row")
    try:
        target = float(value)  # type: ignore[arg-type]
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
        if columns.group is not None:
            needed["group_column"] = columns.group
    records = read_records(source, split=split, delimiter=delimiter, columns=list(needed.values()))
    _check_columns(records, needed, cli_flags)

    texts: list[str] = []
    pairs: list[str] | None = [] if columns.text_pair is not None else None
    raw_labels: list[Any] = []
    numbers: list[int] = []
    groups: list[str] | None = [] if "group_column" in needed else None
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
        if groups is not None:
            group = label_key(row[columns.group])  # type: ignore[index]
            if group is None:
                raise DataError(f"{where}: no value in column {columns.group!r} "
                                f"({setting_name('group_column', cli_flags)}); give every row its group")
            groups.append(group)
    if not texts:
        raise DataError(f"{records.source}: no rows; the {split} split needs at least one example")

    if not with_labels:
        return LabeledSplit(records.source, task_type, texts, pairs, None, labels.names if labels else [])
    if task_type == "regression":
        targets = [_regression_target(v, columns.label, records.where(n)) for v, n in zip(raw_labels, numbers,
                                                                                         strict=True)]
        return LabeledSplit(records.source, task_type, texts, pairs, targets, [], groups, columns.group)

    keys: list[str] = []
    for value, number in zip(raw_labels, numbers, strict=True):
        key = label_key(_checked_class_label(value, columns.label, records.where(number)))
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
    return LabeledSplit(records.source, task_type, texts, pairs, ids, list(label_set.names), groups, columns.group)


def _unknown_label(where: str, value: Any, key: str, label_set: LabelSet) -> DataError:
    shown = f"{value!r}" if label_key(value) == key else f"{value!r} (mapped to {key!r})"
    known = ", ".join(label_set.names[:10]) + (", ..." if len(label_set) > 10 else "")
    return DataError(f"{where}: label {shown} is not one of the {len(label_set)} labels of {label_set.origin} "
                     f"({known}); fix the row, add it to finetune.labels, or merge it into a known label with "
                     "finetune.classification.label_map")


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
    if section.task_type == "regression":  # FinetuneSection refuses labels and finetune.classification.* for it
        return None
    if not section.labels:
        return None
    label_set = LabelSet(section.labels)
    for raw, target in section.classification.label_map.items():
        if label_set.id_of(str(target)) is None:
            raise ConfigError(f"finetune.classification.label_map maps {raw!r} to {target!r}, which is not in finetune.labels "
                              f"({', '.join(label_set.names)}); fix the map or the list")
    return label_set


def load_labeled_data(section: FinetuneSection) -> LabeledData:
    """Read the train/validation/test splits a `finetune:` config section names."""
    if not section.train_file:
        raise ConfigError("finetune.train_file is not set; give a csv/tsv/jsonl/parquet file, a saved Hugging "
                          "Face dataset directory or a hub name")
    read = functools.partial(read_labeled_split, task_type=section.task_type, label_map=section.classification.label_map,
                             columns=Columns(section.text_column, section.text_pair_column, section.label_column,
                                             section.classification.group_column),
                             delimiter=section.delimiter)
    train = read(section.train_file, labels=_checked_label_config(section), split="train")
    origin = "finetune.labels" if section.labels else "the training data"
    fixed = LabelSet(train.label_names, origin) if section.task_type == "classification" else None
    validation = read(section.validation_file, labels=fixed, split="validation") if section.validation_file else None
    test = read(section.test_file, labels=fixed, split="test") if section.test_file else None
    weights = list(section.classification.class_weights) or None
    if weights is not None:
        if len(weights) != train.num_labels:
            raise ConfigError(f"finetune.classification.class_weights has {len(weights)} values but there are {train.num_labels} "
                              f"labels ({', '.join(train.label_names)}); give one weight per label, in that order")
        if any(not math.isfinite(w) or w < 0 for w in weights):
            raise ConfigError(f"finetune.classification.class_weights {weights} must be finite and >= 0")
    return LabeledData(train, validation, test, weights)

