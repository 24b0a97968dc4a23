"""Documents from every input format a user is likely to have, local or behind an fsspec URL.

One place answers "what are the documents of this input?" so the tokenizer trainer and `prepare`
see the same text. Formats: `.txt` (a blank line ends a document; one or more sentences per
line), `.jsonl`/`.json`, `.csv`/`.tsv`, `.parquet`, a Hugging Face dataset saved with
`save_to_disk`, a dataset for `datasets.load_dataset` named as `hf:NAME[:CONFIG][@SPLIT]`, MDS
directories (the MosaicML streaming format, read by `bertforge.data.mds`), and `bundled:corpus`
(the corpus shipped with bertforge). Inputs may be files,
directories or globs; `.gz`/`.zst` files are decompressed on the fly.

Compression is handled here rather than by fsspec's `compression="infer"` so the progress bar can
count the bytes actually read from storage (its ETA is against the stored sizes). Text is decoded
as UTF-8; invalid bytes are replaced (U+FFFD) with one warning per file naming the first line,
because one bad byte in a 100 GB crawl must not stop a preparation run.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import hashlib
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import fsspec

from bertforge.console import log
from bertforge.data.records import HUB_PREFIX, describe_value, parse_hub_reference
from bertforge.errors import CORRUPT_GZIP_ERRORS, DataError, corrupt_compressed_file, first_line, location
from bertforge.storage import storage_errors

TEXT_SUFFIXES = (".txt", ".text")
JSON_SUFFIXES = (".jsonl", ".json", ".ndjson")
TABLE_SUFFIXES = (".csv", ".tsv")
PARQUET_SUFFIXES = (".parquet",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
BUNDLED_CORPUS = "bundled:corpus"  # the corpus shipped in the package, for examples and quick starts
KNOWN_SUFFIXES = TEXT_SUFFIXES + JSON_SUFFIXES + TABLE_SUFFIXES + PARQUET_SUFFIXES

READ_BLOCK_BYTES = 8 << 20
# A line this long is almost certainly not prose (a minified dump, a missing newline conversion);
# it is still used, but the user hears about it.
LONG_LINE_BYTES = 1 << 20
_BLANK_LINE_SEPARATOR = re.compile(rb"\r?\n(?:[ \t\r\f\v]*\n)+")

ProgressCallback = Callable[[int], None]


@dataclass(frozen=True)
class Document:
    """One document's text (lines separated by newlines) and where it starts, for messages."""

    text: str
    origin: str


@dataclass(frozen=True)
class Source:
    """One resolved input: a file, a dataset directory or a hub dataset."""

    url: str  # local path or fsspec URL; for `hf_hub`, the dataset name or local script/dir
    kind: str  # txt | jsonl | json | csv | tsv | parquet | hf_disk | hf_hub | mds
    compression: str | None = None  # gzip | zstd | None
    size: int | None = None  # stored bytes, for progress; None when unknown
    hub_config: str | None = None
    hub_split: str = "train"

    @property
    def name(self) -> str:
        return self.url


# ---------------------------------------------------------------------------------------------
# resolving inputs


def resolve_inputs(inputs: Sequence[str]) -> list[Source]:
    """Expand files, directories and globs (local or fsspec URLs) into sources, in a stable order."""
    if not inputs:
        raise DataError(f"no input given; pass --input FILE (several allowed, globs too), e.g. --input {BUNDLED_CORPUS}")
    sources: list[Source] = []
    for given in inputs:
        if given == BUNDLED_CORPUS:
            from bertforge.data.bundled import corpus_path

            given = str(corpus_path())
        if given.startswith(HUB_PREFIX):
            sources.append(_hub_source(given))
            continue
        with storage_errors(given, "read"):  # wrong credentials or endpoint: one line naming the URL
            sources.extend(_sources_of(given))
    return sources


def _sources_of(given: str) -> list[Source]:
    fs, path = fsspec.core.url_to_fs(given)
    if any(ch in path for ch in "*?["):
        matches = sorted(fs.glob(path))
        if not matches:
            raise DataError(f"input glob {given!r} matched no files; check the pattern")
        return [source for match in matches for source in _sources_at(fs, match, given)]
    if fs.exists(path):
        return _sources_at(fs, path, given)
    raise DataError(f"input {given!r} does not exist; give a file, directory, glob, URL or hf:NAME")


def _hub_source(given: str) -> Source:
    name, config, split = parse_hub_reference(given)
    return Source(url=name, kind="hf_hub", hub_config=config, hub_split=split)


def _join(fs: fsspec.AbstractFileSystem, path: str) -> str:
    return fs.unstrip_protocol(path) if _protocol(fs) != "file" else path


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    protocol = fs.protocol
    return protocol[0] if isinstance(protocol, (tuple, list)) else protocol


def _sources_at(fs: fsspec.AbstractFileSystem, path: str, given: str) -> list[Source]:
    if fs.isdir(path):
        if fs.exists(f"{path}/index.json"):
            return [Source(url=_join(fs, path), kind="mds")]
        if any(fs.exists(f"{path}/{marker}") for marker in ("dataset_info.json", "state.json", "dataset_dict.json")):
            return [Source(url=_join(fs, path), kind="hf_disk")]
        files = sorted(p for p in fs.find(path) if _kind_of(p) is not None)
        if not files:
            raise DataError(f"input directory {given!r} holds no readable files "
                            f"({', '.join(KNOWN_SUFFIXES)}, optionally .gz/.zst)")
        return [_file_source(fs, p, given) for p in files]
    return [_file_source(fs, path, given)]


def _kind_of(path: str) -> tuple[str, str | None] | None:
    lower = path.lower()
    compression = None
    for suffix, name in COMPRESSION_SUFFIXES.items():
        if lower.endswith(suffix):
            compression, lower = name, lower[: -len(suffix)]
            break
    for suffixes, kind in ((TEXT_SUFFIXES, "txt"), (TABLE_SUFFIXES, None), (PARQUET_SUFFIXES, "parquet")):
        if lower.endswith(suffixes):
            return (kind or lower.rsplit(".", 1)[1], compression)
    if lower.endswith(JSON_SUFFIXES):
        return ("json" if lower.endswith(".json") else "jsonl", compression)
    return None


def _file_source(fs: fsspec.AbstractFileSystem, path: str, given: str) -> Source:
    kind = _kind_of(path)
    if kind is None:
        raise DataError(f"input {path!r} (from {given!r}) has an unknown extension; use one of "
                        f"{', '.join(KNOWN_SUFFIXES)}, optionally with .gz or .zst")
    if kind[0] == "parquet" and kind[1] is not None:
        raise DataError(f"input {path!r}: compressed parquet files are not supported; parquet compresses "
                        "internally, so decompress the file")
    size = fs.size(path)
    return Source(url=_join(fs, path), kind=kind[0], compression=kind[1], size=size)


# ---------------------------------------------------------------------------------------------
# fingerprints for the preparation cache


def fingerprint_sources(sources: Sequence[Source]) -> str:
    """A hash of the inputs' content: local bytes are hashed, remote files use their checksum/etag."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(f"{source.kind}\0{source.url}\0{source.hub_config}\0{source.hub_split}\0".encode())
        if source.kind == "hf_hub":
            continue  # `iter_documents` adds nothing stable here; the cache key includes the dataset fingerprint
        with storage_errors(source.url, "read"):
            fs, path = fsspec.core.url_to_fs(source.url)
            files = sorted(fs.find(path)) if fs.isdir(path) else [path]
            for file in files:
                digest.update(file.encode() + b"\0")
                if _protocol(fs) == "file":
                    with open(file, "rb") as f:
                        digest.update(hashlib.file_digest(f, "sha256").digest())
                else:
                    digest.update(str(fs.checksum(file)).encode())
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# reading


class _CountingReader(io.RawIOBase):
    """Reports the stored (possibly compressed) bytes read, for the progress bar."""

    def __init__(self, raw: IO[bytes], on_bytes: ProgressCallback | None) -> None:
        self._raw = raw
        self._on_bytes = on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        if self._on_bytes is not None and data:
            self._on_bytes(len(data))
        return len(data)


@contextlib.contextmanager
def open_binary(source: Source, on_bytes: ProgressCallback | None = None) -> Iterator[IO[bytes]]:
    """The decompressed byte stream of a file source; `on_bytes` hears of every stored byte read."""
    with fsspec.open(source.url, "rb") as raw:
        counted = io.BufferedReader(_CountingReader(raw, on_bytes), buffer_size=1 << 20)
        if source.compression is None:
            yield counted
            return
        # a decompression error surfaces in the caller's read; it becomes one line naming the file
        try:
            if source.compression == "gzip":
                yield gzip.GzipFile(fileobj=counted, mode="rb")  # type: ignore[misc]
            else:
                import zstandard

                yield zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True)  # type: ignore[misc]
        except CORRUPT_GZIP_ERRORS as error:
            raise corrupt_compressed_file(source.url, error) from None
        except Exception as error:
            if type(error).__name__ == "ZstdError":  # zstandard is imported only for .zst inputs
                raise corrupt_compressed_file(source.url, error) from None
            raise


class _Decoder:
    """UTF-8 decoding that replaces invalid bytes and warns once per file with the first place."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.bad_places = 0
        self.first_bad: str | None = None

    def __call__(self, data: bytes, line: int) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.bad_places += 1
            if self.first_bad is None:
                self.first_bad = location(self.source.url, line)
            return data.decode("utf-8", errors="replace")

    def report(self) -> None:
        if self.bad_places:
            log.warning(f"{self.first_bad}: invalid UTF-8 bytes replaced by U+FFFD in {self.bad_places} "
                        f"document(s)/row(s) of this file; re-encode it as UTF-8 to keep those characters")


def iter_documents(sources: Sequence[Source], *, text_field: str = "text",
                   on_bytes: ProgressCallback | None = None) -> Iterator[Document]:
    """Every non-empty document of the sources, in order. Empty ones are skipped and counted."""
    for source in sources:
        reader = _READERS[source.kind]
        empty = 0
        for document in reader(source, text_field, on_bytes):
            if document.text.strip():
                yield document
            else:
                empty += 1
        if empty:
            log.info(f"{source.url}: skipped {empty} empty document(s)")


def _read_txt(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    decode = _Decoder(source)
    line = 1  # the line number of pending[0]
    pending = b""
    with open_binary(source, on_bytes) as stream:
        while True:
            block = stream.read(READ_BLOCK_BYTES)
            data = pending + block
            start = 0
            for separator in _BLANK_LINE_SEPARATOR.finditer(data):
                piece = data[start:separator.start()]
                if piece.strip():
                    yield _txt_document(piece, line, decode, source)
                line += data.count(b"\n", start, separator.end())
                start = separator.end()
            pending = data[start:]
            if not block:
                if pending.strip():
                    yield _txt_document(pending, line, decode, source)
                break
    decode.report()


def _txt_document(piece: bytes, line: int, decode: _Decoder, source: Source) -> Document:
    if len(piece) > LONG_LINE_BYTES:
        longest = max(len(x) for x in piece.split(b"\n"))
        if longest > LONG_LINE_BYTES:
            log.warning(f"{location(source.url, line)}: a line of {longest / 1e6:.1f} MB; it is split into "
                        "sentences at sentence ends and, where there are none, at spaces")
    return Document(decode(piece.strip(), line), location(source.url, line))


def _read_jsonl(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    decode = _Decoder(source)
    with open_binary(source, on_bytes) as opened:
        stream = opened if hasattr(opened, "peek") else io.BufferedReader(opened)  # type: ignore[arg-type]
        head = stream.peek(64)[:64]
        if source.kind == "json" and head.lstrip().startswith(b"["):
            rows = json.loads(decode(stream.read(), 1))
            for number, row in enumerate(rows, start=1):
                yield Document(_text_of(row, text_field, source, number, "item"), f"{source.url}[{number - 1}]")
            decode.report()
            return
        for number, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(decode(raw, number))
            except json.JSONDecodeError as error:
                raise DataError(f"{location(source.url, number)}: not valid JSON ({error.msg}); "
                                "JSON Lines files need one object per line") from None
            yield Document(_text_of(row, text_field, source, number, "line"), location(source.url, number))
    decode.report()


def _text_of(row: Any, text_field: str, source: Source, number: int, unit: str) -> str:
    if not isinstance(row, dict):
        raise DataError(f"{location(source.url, number)}: expected a JSON object with a {text_field!r} field, "
                        f"got {type(row).__name__}")
    if text_field not in row:
        raise DataError(f"{location(source.url, number)}: no field {text_field!r} (fields: "
                        f"{', '.join(map(str, row)) or 'none'}); choose one with --text-field")
    return _document_text(row[text_field], text_field, location(source.url, number))


def _document_text(value: Any, text_field: str, where: str) -> str:
    """A document's text field: a string, or None for an empty document. Anything else (12345, ["a"], true) is
    refused: str() would invent text the corpus never held, and the tokenizer would learn it."""
    if value is None or isinstance(value, str):
        return value or ""
    raise DataError(f"{where}: field {text_field!r} holds {describe_value(value)}, not a string; give every text as a "
                    "string (in quotes in JSON), or choose the text field with --text-field")


def _read_table(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    with open_binary(source, on_bytes) as stream:
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
        reader = csv.DictReader(text, delimiter="\t" if source.kind == "tsv" else ",")
        if reader.fieldnames is None:
            return
        if text_field not in reader.fieldnames:
            raise DataError(f"{location(source.url, 1)}: no column {text_field!r} (columns: "
                            f"{', '.join(reader.fieldnames)}); choose one with --text-field")
        csv.field_size_limit(1 << 30)
        for row in reader:
            value = row.get(text_field)
            yield Document("" if value is None else value, location(source.url, reader.line_num))


def _read_parquet(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    import pyarrow.parquet as pq

    with fsspec.open(source.url, "rb") as raw:
        try:
            table_file = pq.ParquetFile(raw)
        except Exception as error:  # pyarrow raises several types for a non-parquet file
            raise DataError(f"{source.url}: not a readable parquet file ({error})") from None
        names = table_file.schema_arrow.names
        if text_field not in names:
            raise DataError(f"{source.url}: no column {text_field!r} (columns: {', '.join(names)}); "
                            "choose one with --text-field")
        groups = max(table_file.num_row_groups, 1)
        row = 0
        for group in range(table_file.num_row_groups):
            column = table_file.read_row_group(group, columns=[text_field]).column(0).to_pylist()
            for value in column:
                row += 1
                where = f"{source.url} row {row}"
                yield Document(_document_text(value, text_field, where), where)
            if on_bytes is not None and source.size:
                on_bytes(source.size // groups)


def _read_hf_disk(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    import datasets

    loaded = datasets.load_from_disk(source.url)
    if isinstance(loaded, datasets.DatasetDict):
        split = "train" if "train" in loaded else next(iter(loaded))
        log.info(f"{source.url}: a DatasetDict; reading its {split!r} split")
        loaded = loaded[split]
    yield from _hf_rows(loaded, text_field, source)


def _read_hf_hub(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    import datasets

    try:
        loaded = datasets.load_dataset(source.url, source.hub_config, split=source.hub_split)
    except Exception as error:  # datasets raises many types (offline, missing config, missing split)
        raise DataError(f"hf:{source.url}: datasets.load_dataset failed: {first_line(error)}") from None
    yield from _hf_rows(loaded, text_field, source)


def _hf_rows(dataset: Any, text_field: str, source: Source) -> Iterator[Document]:
    if text_field not in dataset.column_names:
        raise DataError(f"{source.url}: no column {text_field!r} (columns: {', '.join(dataset.column_names)}); "
                        "choose one with --text-field")
    column = dataset.select_columns([text_field])
    for start in range(0, len(column), 10_000):
        values = column[start:start + 10_000][text_field]
        for offset, value in enumerate(values):
            where = f"{source.url} row {start + offset + 1}"
            yield Document(_document_text(value, text_field, where), where)


def _read_mds(source: Source, text_field: str, on_bytes: ProgressCallback | None) -> Iterator[Document]:
    from bertforge.data.mds import MDSReader

    reader = MDSReader(source.url)
    if text_field not in reader.column_encodings:
        raise DataError(f"{source.url}: MDS dataset has no column {text_field!r} (columns: "
                        f"{', '.join(reader.column_encodings)}); choose one with --text-field")
    for number, row in enumerate(reader.iter_rows(columns=[text_field]), start=1):
        value = row[text_field]
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        yield Document("" if value is None else str(value), f"{source.url} sample {number - 1}")


_READERS: dict[str, Callable[[Source, str, ProgressCallback | None], Iterator[Document]]] = {
    "txt": _read_txt,
    "jsonl": _read_jsonl,
    "json": _read_jsonl,
    "csv": _read_table,
    "tsv": _read_table,
    "parquet": _read_parquet,
    "hf_disk": _read_hf_disk,
    "hf_hub": _read_hf_hub,
    "mds": _read_mds,
}
