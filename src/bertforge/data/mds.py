"""Read and write MDS, the MosaicML streaming format, from its documented layout.

Why hand-written: the `mosaicml-streaming` package cannot be imported next to CPU torch (it
imports torchvision unconditionally) and pins `transformers<5`, yet MDS directories are what the
Mosaic examples produce and consume. The format is small:

* `index.json`: `{"version": 2, "shards": [...]}`; each shard entry carries `format: "mds"`,
  `column_names` (sorted), `column_encodings`, `column_sizes` (bytes, or null when variable),
  `samples`, `compression` (null or `zstd[:level]`), `hashes`, `size_limit`, `version`, and
  `raw_data`/`zip_data` (`{basename, bytes, hashes}`; `zip_data` is null without compression).
* a shard `shard.NNNNN.mds[.zstd]`: uint32 sample count, uint32 offsets (count + 1, from the file
  start), the shard config as JSON, then the samples. A sample is one uint32 size per
  variable-size column followed by every column's bytes in column order.

Compatibility is pinned by fixtures written by the real package (`tests/fixtures/mds/`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec
import numpy as np

from bertforge.errors import DataError

INDEX_NAME = "index.json"
MDS_VERSION = 2
SHARD_EXTRA_BYTES_PER_SAMPLE = 4  # the offset of each sample
_SCALAR_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                  "float16", "float32", "float64")
_NDARRAY_DTYPE_CODES = {"uint8": 8, "int8": 9, "uint16": 16, "int16": 17, "float16": 18, "uint32": 32,
                        "int32": 33, "float32": 34, "uint64": 64, "int64": 65, "float64": 66}
_NDARRAY_DTYPES = {code: name for name, code in _NDARRAY_DTYPE_CODES.items()}
_SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
SUPPORTED_ENCODINGS = ("str", "bytes", "int", "json", "ndarray[:DTYPE[:SHAPE]]", *_SCALAR_DTYPES)


# ---------------------------------------------------------------------------------------------
# encodings


def _parse_ndarray(encoding: str) -> tuple[str | None, tuple[int, ...] | None]:
    parts = encoding.split(":")[1:]
    dtype = parts[0] if parts and parts[0] else None
    shape = tuple(int(x) for x in parts[1].split(",")) if len(parts) > 1 else None
    if dtype is not None and dtype not in _NDARRAY_DTYPE_CODES:
        raise DataError(f"MDS encoding {encoding!r}: unknown dtype {dtype!r}")
    return dtype, shape


def is_supported_encoding(encoding: str) -> bool:
    return encoding in ("str", "bytes", "int", "json") or encoding in _SCALAR_DTYPES or (
        encoding == "ndarray" or encoding.startswith("ndarray:"))


def encoded_size(encoding: str) -> int | None:
    """Bytes of a fixed-size encoding, or None when each sample records its own size."""
    if encoding == "int":
        return 8
    if encoding in _SCALAR_DTYPES:
        return np.dtype(encoding).itemsize
    if encoding.startswith("ndarray:"):
        dtype, shape = _parse_ndarray(encoding)
        if dtype is not None and shape is not None:
            return int(np.prod(shape)) * np.dtype(dtype).itemsize
    return None


def encode_value(encoding: str, value: Any) -> bytes:
    if encoding == "str":
        return str(value).encode("utf-8")
    if encoding == "bytes":
        return bytes(value)
    if encoding == "int":
        return np.int64(value).tobytes()
    if encoding == "json":
        return json.dumps(value.tolist() if isinstance(value, np.ndarray) else value).encode("utf-8")
    if encoding in _SCALAR_DTYPES:
        return np.array(value, dtype=encoding).tobytes()
    return _encode_ndarray(encoding, np.asarray(value))


def _encode_ndarray(encoding: str, array: np.ndarray) -> bytes:
    dtype, shape = _parse_ndarray(encoding)
    if array.dtype.name not in _NDARRAY_DTYPE_CODES:
        raise DataError(f"MDS encoding {encoding!r}: unsupported array dtype {array.dtype.name}")
    if array.size == 0:
        raise DataError(f"MDS encoding {encoding!r}: empty arrays cannot be stored (the format forbids them)")
    parts = []
    if dtype is None:
        parts.append(bytes([_NDARRAY_DTYPE_CODES[array.dtype.name]]))
    elif array.dtype.name != dtype:
        raise DataError(f"MDS encoding {encoding!r}: got an array of dtype {array.dtype.name}")
    if shape is None:
        dims = np.array(array.shape, np.int64)
        top = int(dims.max())
        code = 0 if top < 1 << 8 else 1 if top < 1 << 16 else 2 if top < 1 << 32 else 3
        parts.append(bytes([(array.ndim << 2) | code]))
        parts.append(dims.astype(_SHAPE_DTYPES[code]).tobytes())
    elif tuple(array.shape) != shape:
        raise DataError(f"MDS encoding {encoding!r}: got an array of shape {array.shape}")
    parts.append(np.ascontiguousarray(array).tobytes())
    return b"".join(parts)


def decode_value(encoding: str, data: bytes) -> Any:
    if encoding == "str":
        return data.decode("utf-8")
    if encoding == "bytes":
        return data
    if encoding == "int":
        return int(np.frombuffer(data, np.int64)[0])
    if encoding == "json":
        return json.loads(data.decode("utf-8"))
    if encoding in _SCALAR_DTYPES:
        return np.frombuffer(data, encoding)[0]
    dtype, shape = _parse_ndarray(encoding)
    index = 0
    if dtype is None:
        dtype = _NDARRAY_DTYPES[data[0]]
        index = 1
    if shape is None:
        ndim, code = data[index] >> 2, data[index] & 3
        index += 1
        width = 1 << code
        shape = tuple(int(x) for x in np.frombuffer(data[index:index + ndim * width], _SHAPE_DTYPES[code]))
        index += ndim * width
    return np.frombuffer(data[index:], dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------
# compression and hashes


def _compress(compression: str, data: bytes) -> bytes:
    import zstandard

    algorithm, _, level = compression.partition(":")
    return zstandard.ZstdCompressor(level=int(level or 3)).compress(data)


def _decompress(compression: str, data: bytes) -> bytes:
    import zstandard

    # streaming's zstd frames may omit the content size, so decompress as a stream
    return zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()


def _check_compression(compression: str | None) -> None:
    if compression is None:
        return
    algorithm, _, level = compression.partition(":")
    if algorithm != "zstd" or (level and not level.isdigit()):
        raise DataError(f"MDS compression {compression!r} is not supported; use none or zstd[:LEVEL]")


def _hashes(algorithms: Sequence[str], data: bytes) -> dict[str, str]:
    return {name: hashlib.new(name, data).hexdigest() for name in algorithms}


# ---------------------------------------------------------------------------------------------
# writing


class MDSWriter:
    """Writes an MDS directory that `streaming.StreamingDataset` reads; use as a context manager.

    `out` is a local directory or an fsspec URL. `index.json` is written last, so a reader never
    sees an index that points at a shard that is not complete.
    """

    def __init__(self, out: str, columns: dict[str, str], *, compression: str | None = None,
                 hashes: Sequence[str] = (), size_limit: int | None = 1 << 26) -> None:
        _check_compression(compression)
        for name, encoding in columns.items():
            if not is_supported_encoding(encoding):
                raise DataError(f"MDS column {name!r}: encoding {encoding!r} is not supported; "
                                f"use one of {', '.join(SUPPORTED_ENCODINGS)}")
        for name in hashes:
            if name not in hashlib.algorithms_available:
                raise DataError(f"MDS hash {name!r} is not available; use e.g. sha1 or md5")
        self.out = out.rstrip("/")
        self.compression = compression
        self.hashes = sorted(hashes)
        self.size_limit = size_limit
        self.column_names = sorted(columns)
        self.column_encodings = [columns[name] for name in self.column_names]
        self.column_sizes = [encoded_size(encoding) for encoding in self.column_encodings]
        self._config_bytes = json.dumps(self._config(), sort_keys=True).encode("utf-8")
        self._shards: list[dict[str, Any]] = []
        self._samples: list[bytes] = []
        self._shard_bytes = 8 + len(self._config_bytes)
        self._fs, self._root = fsspec.core.url_to_fs(self.out)
        self._fs.makedirs(self._root, exist_ok=True)

    def _config(self) -> dict[str, Any]:
        return {"version": MDS_VERSION, "format": "mds", "compression": self.compression,
                "hashes": self.hashes, "size_limit": self.size_limit, "column_names": self.column_names,
                "column_encodings": self.column_encodings, "column_sizes": self.column_sizes}

    def __enter__(self) -> MDSWriter:
        return self

    def __exit__(self, error_type: object, error: object, traceback: object) -> None:
        if error_type is None:
            self.finish()

    def encode_sample(self, sample: dict[str, Any]) -> bytes:
        sizes, parts = [], []
        for name, encoding, size in zip(self.column_names, self.column_encodings, self.column_sizes, strict=True):
            if name not in sample:
                raise DataError(f"MDS sample has no column {name!r} (it has {', '.join(sample)})")
            data = encode_value(encoding, sample[name])
            if size is None:
                sizes.append(len(data))
            elif size != len(data):
                raise DataError(f"MDS column {name!r}: {len(data)} bytes where {encoding!r} takes {size}")
            parts.append(data)
        return np.array(sizes, np.uint32).tobytes() + b"".join(parts)

    def write(self, sample: dict[str, Any]) -> None:
        encoded = self.encode_sample(sample)
        size = len(encoded) + SHARD_EXTRA_BYTES_PER_SAMPLE
        if self.size_limit and self._samples and self.size_limit < self._shard_bytes + size:
            self._flush_shard()
        self._samples.append(encoded)
        self._shard_bytes += size

    def _flush_shard(self) -> None:
        count = len(self._samples)
        header = 4 + 4 * (count + 1) + len(self._config_bytes)
        offsets = np.cumsum([0] + [len(s) for s in self._samples], dtype=np.int64) + header
        if offsets[-1] >= 1 << 32:
            raise DataError("MDS shard larger than 4 GiB; lower size_limit")
        raw = (np.uint32(count).tobytes() + offsets.astype(np.uint32).tobytes() + self._config_bytes
               + b"".join(self._samples))
        raw_name = f"shard.{len(self._shards):05}.mds"
        raw_info = {"basename": raw_name, "bytes": len(raw), "hashes": _hashes(self.hashes, raw)}
        zip_info = None
        data, name = raw, raw_name
        if self.compression:
            data, name = _compress(self.compression, raw), f"{raw_name}.zstd"
            zip_info = {"basename": name, "bytes": len(data), "hashes": _hashes(self.hashes, data)}
        _write_atomically(self._fs, f"{self._root}/{name}", data)
        self._shards.append({"samples": count, "raw_data": raw_info, "zip_data": zip_info, **self._config()})
        self._samples = []
        self._shard_bytes = 8 + len(self._config_bytes)

    def finish(self) -> None:
        if self._samples:
            self._flush_shard()
        index = json.dumps({"version": MDS_VERSION, "shards": self._shards}, sort_keys=True)
        _write_atomically(self._fs, f"{self._root}/{INDEX_NAME}", index.encode("utf-8"))


def _write_atomically(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        temporary = f"{path}.tmp-{os.getpid()}"
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, path)
    else:
        fs.pipe_file(path, data)


# ---------------------------------------------------------------------------------------------
# reading


class MDSReader:
    """Reads the samples of an MDS directory (local or fsspec URL) shard by shard."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self._fs, self._path = fsspec.core.url_to_fs(self.root)
        index_path = f"{self._path}/{INDEX_NAME}"
        try:
            index = json.loads(self._fs.cat_file(index_path))
        except FileNotFoundError:
            raise DataError(f"{self.root}: no {INDEX_NAME}; this is not an MDS directory") from None
        except json.JSONDecodeError as error:
            raise DataError(f"{self.root}/{INDEX_NAME}: not valid JSON ({error.msg})") from None
        if index.get("version") != MDS_VERSION:
            raise DataError(f"{self.root}/{INDEX_NAME}: MDS index version {index.get('version')!r}; "
                            f"bertforge reads version {MDS_VERSION}")
        self.shards: list[dict[str, Any]] = index["shards"]
        for shard in self.shards:
            if shard.get("format") != "mds":
                raise DataError(f"{self.root}: shard {shard['raw_data']['basename']} is in format "
                                f"{shard.get('format')!r}; only 'mds' shards are supported (not json/csv/tsv)")
            _check_compression(shard.get("compression"))
        first = self.shards[0] if self.shards else {"column_names": [], "column_encodings": []}
        self.column_encodings: dict[str, str] = dict(zip(first["column_names"], first["column_encodings"], strict=True))

    def __len__(self) -> int:
        return sum(shard["samples"] for shard in self.shards)

    def _shard_bytes(self, shard: dict[str, Any]) -> bytes:
        stored = shard["zip_data"] or shard["raw_data"]
        name = stored["basename"]
        try:
            data = self._fs.cat_file(f"{self._path}/{name}")
        except FileNotFoundError:
            raise DataError(f"{self.root}: shard {name} is missing; the dataset is incomplete") from None
        if len(data) != stored["bytes"]:
            raise DataError(f"{self.root}: shard {name} has {len(data)} bytes, the index says {stored['bytes']}; "
                            "it is truncated or corrupt, re-copy or re-write it")
        for algorithm, expected in stored.get("hashes", {}).items():
            if algorithm in hashlib.algorithms_available and hashlib.new(algorithm, data).hexdigest() != expected:
                raise DataError(f"{self.root}: shard {name} fails its {algorithm} check; it is corrupt, re-copy it")
        if shard["zip_data"]:
            data = _decompress(shard["compression"], data)
        return data

    def iter_rows(self, columns: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
        """Every sample as a dict of decoded values (only `columns`, when given)."""
        for shard in self.shards:
            data = self._shard_bytes(shard)
            count = int(np.frombuffer(data, np.uint32, 1)[0])
            offsets = np.frombuffer(data, np.uint32, count + 1, offset=4).astype(np.int64)
            if count != shard["samples"] or (count and offsets[-1] > len(data)):
                raise DataError(f"{self.root}: shard {shard['raw_data']['basename']} does not match its index; "
                                "it is corrupt, re-write it")
            names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
            wanted = set(columns) if columns is not None else set(names)
            variable = sum(size is None for size in sizes)
            for i in range(count):
                sample = data[offsets[i]:offsets[i + 1]]
                variable_sizes = np.frombuffer(sample, np.uint32, variable) if variable else ()
                position, next_variable = 4 * variable, 0
                row: dict[str, Any] = {}
                for name, encoding, size in zip(names, encodings, sizes, strict=True):
                    if size is None:
                        size = int(variable_sizes[next_variable])
                        next_variable += 1
                    if name in wanted:
                        row[name] = decode_value(encoding, sample[position:position + size])
                    position += size
                yield row
