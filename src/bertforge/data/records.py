"""Strict record readers for labeled data: (row number, {column: value}) from any supported source.

Why hand-written readers instead of `datasets.load_dataset("csv", ...)`: a user's file is wrong
more often than not (a .csv that is really tab-separated, an empty cell, "5 stars" in a numeric
column, Latin-1 bytes), and the fix is quick only when the error names the file and the line.
pandas/arrow report a byte offset or nothing. So csv/tsv/jsonl/parquet are read here row by row
with their row numbers; Hugging Face datasets (saved with `save_to_disk`, or `hf:NAME` / a local
dataset repository through the real `datasets.load_dataset`) go through `datasets`, numbered by row.
(`bertforge.data.sources` reads the same formats for pre-training documents, leniently and
streaming; labeled rows need the opposite: every row checked, every error a stop. Both parse
`hf:NAME[:CONFIG][@SPLIT]` with `parse_hub_reference`.)

Conventions: `.tsv` (or `delimiter: "\\t"`) is read with csv quoting off, the GLUE convention: a
tab-separated field cannot contain a tab, and text that starts with `"` must not swallow the rows
after it. `.csv` uses standard csv quoting. `.gz` is decompressed transparently; a UTF-8 BOM is
ignored.
"""

from __future__ import annotations

import csv
import gzip
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bertforge.errors import (
    CORRUPT_GZIP_ERRORS,
    DataError,
    corrupt_compressed_file,
    directory_listing,
    first_line,
)
from bertforge.storage import origin

FILE_FORMATS = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
EXTENSION_DELIMITERS = {".csv": ",", ".tsv": "\t"}
DELIMITER_NAMES = {",": "comma", "\t": "tab", ";": "semicolon", "|": "pipe"}
SAVED_DATASET_MARKERS = ("dataset_dict.json", "dataset_info.json", "state.json")
HUB_PREFIX = "hf:"


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


def describe_value(value: Any, limit: int = 60) -> str:
    """A raw JSON/parquet value for a message, kind and text: `a list (['noun.act', 'noun.Tops'])`."""
    if isinstance(value, bool):
        kind = "a boolean"
    elif isinstance(value, int | float):
        kind = "a number"
    elif isinstance(value, list | tuple):
        kind = "a list"
    elif isinstance(value, dict):
        kind = "an object"
    else:
        kind = f"a {type(value).__name__}"
    shown = repr(value)
    return f"{kind} ({shown if len(shown) <= limit else shown[:limit - 3] + '...'})"


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
    where = f"{origin(path)}:{line}" if line else origin(path)
    return DataError(f"{where}: not valid UTF-8 (bytes {bad.hex(' ')}); re-save the file as UTF-8, "
                     "e.g. `iconv -f latin1 -t utf-8 in.csv > out.csv`")


def _csv_records(path: Path, delimiter: str) -> Records:
    # tab-separated files are read with quoting off: see the module docstring
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    name, shown = DELIMITER_NAMES.get(delimiter, repr(delimiter)), origin(path)
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
                        f"{shown}:{number}: {len(fields)} fields but the header has {len(header)} "
                        f"({', '.join(header)}) when split on {name}; check finetune.delimiter, or quote "
                        "fields that contain the delimiter")
                rows.append((number, dict(zip(header, fields, strict=True))))
        except UnicodeDecodeError:
            raise _decoding_error(path) from None
        except csv.Error as error:
            raise DataError(f"{shown}:{reader.line_num}: unreadable csv row ({error}); fix the quoting or set "
                            "finetune.delimiter") from None
    if header is None:
        raise DataError(f"{shown}: the file is empty; it needs a header line naming the columns and rows below it")
    return Records(shown, header, rows, unit="line", delimiter=delimiter)


def _jsonl_records(path: Path) -> Records:
    shown = origin(path)
    with _open_text(path) as handle:
        try:
            text = handle.read()
        except UnicodeDecodeError:
            raise _decoding_error(path) from None
    if text.lstrip().startswith("["):  # a .json file holding one array of objects
        try:
            array = json.loads(text)
        except json.JSONDecodeError as error:
            raise DataError(f"{shown}:{error.lineno}: not valid JSON ({error.msg}); fix the syntax") from None
        records = Records(shown, [], list(enumerate(array, start=1)), unit="row")
    else:
        objects = []
        # split on "\n" only: str.splitlines would also break inside strings holding U+2028 or \x0c
        for number, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                objects.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                raise DataError(f"{shown}:{number}: not valid JSON ({error.msg}); each line must be one "
                                "JSON object") from None
        records = Records(shown, [], objects, unit="line")
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
        raise DataError(f"{origin(path)}: not a readable parquet file ({error}); check the file") from None
    columns = list(parquet.schema_arrow.names)
    present = [c for c in wanted if c in columns]
    table = parquet.read(columns=present).to_pydict()
    return Records(origin(path), columns, _numbered_columns(table), unit="row")


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


def parse_hub_reference(given: str, default_split: str = "train") -> tuple[str, str | None, str]:
    """`hf:NAME[:CONFIG][@SPLIT]` -> (name, config, split), for labeled rows and pre-training inputs alike.

    The split follows the last `@`. A local dataset repository's path (starting with `/`, `.` or
    `~`) may contain `:`, a hub name may not, so only a name is split at its `:`.
    """
    spec = given.removeprefix(HUB_PREFIX)
    name, _, split = spec.rpartition("@") if "@" in spec else (spec, "", "")
    config = None
    if not name.startswith(("/", ".", "~")):
        name, _, config = name.partition(":")
    if not name:
        raise DataError(f"{given!r} names no dataset; use {HUB_PREFIX}NAME[:CONFIG][@SPLIT], "
                        f"e.g. {HUB_PREFIX}wikitext:wikitext-2-raw-v1")
    return name, config or None, split or default_split


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
        name, config, split = parse_hub_reference(text, split)
        return _hf_records(_load_hub_dataset(name, config, split, text), text, columns)
    path = Path(text).expanduser()
    if not path.exists() and "@" in text and Path(text.rpartition("@")[0]).expanduser().is_dir():
        directory, _, split = text.rpartition("@")
        path = Path(directory).expanduser()
    if path.is_dir():
        if any((path / marker).is_file() for marker in SAVED_DATASET_MARKERS):
            return _hf_records(_load_saved_dataset(path, split, origin(text)), origin(text), columns)
        # a folder of loose files is not read by guesswork: `datasets.load_dataset` would merge every
        # file with "train" in its name (train.csv and reg_train.csv alike) and exit 0
        found = sorted(entry.name for entry in path.iterdir())
        raise DataError(f"{origin(text)} is a directory but not a dataset saved with save_to_disk (it holds "
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
        raise corrupt_compressed_file(origin(path), error) from None
    if file_format == "parquet":
        return _parquet_records(path, columns)
    raise DataError(f"{origin(path)}: unknown file type {''.join(path.suffixes)!r}; use .csv, .tsv, .jsonl, .json or "
                    f".parquet (optionally .gz), a saved Hugging Face dataset directory, or {HUB_PREFIX}NAME")

