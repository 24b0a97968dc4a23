"""The pre-tokenized shard format: files, manifest, checksums, and O(1) random access.

A prepared dataset is a directory (or fsspec URL) holding `index.json` and one build directory
`shards-<key>/`. Each shard is a few `.npy` files: `tokens` (the final samples' token ids,
`[CLS] ... [SEP]` included, concatenated; uint16 when the vocabulary fits), `offsets` (int64,
samples + 1) and, for NSP data, `pairs` (int32 [samples, 2]: where segment B starts, and the
next-sentence label). Samples are materialised at prepare time, like BERT's
`create_pretraining_data`, so reading sample i is two memory-mapped slices: no tokenization, no
packing work, and nothing that depends on the number of loader workers. Masking stays dynamic.

`.npy` rather than a bespoke `.bin/.idx` (Megatron) because its header records dtype and shape,
so a truncated file fails loudly and any numpy can read a shard. The manifest records a format
version, the tokenizer fingerprint, the settings, counts and a sha256 per file; it is written last
and atomically, so it never points at a partial shard. Shards at a remote URL are copied into a
local cache when a micro-batch first reads them (`data/shard_cache.py`: prefetched ahead, with
retries, verified against those checksums, shared by the processes of a node).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertforge.console import log
from bertforge.data.shard_cache import ShardCache
from bertforge.errors import DataError
from bertforge.locate import is_relative_inside
from bertforge.storage import cache_root, cat_whole, filesystem, is_remote, with_retries

FORMAT_NAME = "bertforge-pretokenized"
FORMAT_VERSION = 1
MANIFEST_NAME = "index.json"
SHARD_FILES = ("tokens", "offsets", "pairs")


def token_dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def is_local(url: str) -> bool:
    return not is_remote(url)


def local_path(url: str) -> Path:
    return Path(url[len("file://"):] if url.startswith("file://") else url)


def read_text_file(directory: str, name: str) -> str:
    """`name` in a local directory or under a URL (transient store failures retried); FileNotFoundError
    when it is not there."""
    if is_local(directory):
        return (local_path(directory) / name).read_text(encoding="utf-8")
    where = f"{directory.rstrip('/')}/{name}"
    fs, path = filesystem(where)
    return with_retries(where, "read", lambda: fs.cat_file(path)).decode("utf-8")


# ---------------------------------------------------------------------------------------------
# writing


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def write_file_atomically(path: Path, data: bytes) -> dict[str, Any]:
    """Write `data` to `path` via a temporary name; returns its manifest entry (bytes, sha256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as f:
        f.write(data)
    os.replace(temporary, path)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_shard(directory: Path, relative_dir: str, name: str, tokens: np.ndarray, offsets: np.ndarray,
                pairs: np.ndarray | None) -> dict[str, Any]:
    """Write one shard's files; returns its manifest entry."""
    arrays = {"tokens": tokens, "offsets": offsets}
    if pairs is not None:
        arrays["pairs"] = pairs
    files = {}
    for kind, array in arrays.items():
        file_name = f"{name}.{kind}.npy"
        entry = write_file_atomically(directory / file_name, npy_bytes(array))
        files[kind] = {"path": f"{relative_dir}/{file_name}", **entry}
    return {"name": name, "samples": int(len(offsets) - 1), "tokens": int(len(tokens)), "files": files}


# ---------------------------------------------------------------------------------------------
# reading


@dataclass
class _Shard:
    name: str
    samples: int
    files: dict[str, dict[str, Any]]


def read_manifest(url: str) -> dict[str, Any]:
    """The manifest of a prepared dataset, checked for format and version."""
    where = f"{url.rstrip('/')}/{MANIFEST_NAME}"
    try:
        text = read_text_file(url, MANIFEST_NAME)
    except FileNotFoundError:
        raise DataError(f"{where} not found: {url} is not a prepared dataset (or its preparation did not finish); "
                        "run `bertforge prepare pretrain --out ...` first") from None
    except NotADirectoryError:
        raise DataError(f"{url} is a file, not a prepared dataset directory; give the directory that "
                        "`bertforge prepare pretrain --out` wrote") from None
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg}); re-run `bertforge prepare`") from None
    if manifest.get("format") != FORMAT_NAME:
        raise DataError(f"{where}: not a bertforge pre-tokenized dataset (format {manifest.get('format')!r})")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{where}: format version {manifest.get('format_version')} but this bertforge reads "
                        f"version {FORMAT_VERSION}; re-run `bertforge prepare` with this version")
    _check_paths_inside(manifest, where)
    return manifest


def _check_paths_inside(manifest: dict[str, Any], where: str) -> None:
    """Every file a manifest names lies inside the dataset: a crafted `../../elsewhere` is refused before
    anything is opened, so a copied dataset can make bertforge read only its own files."""
    named = [entry.get("path") for split in manifest.get("splits", {}).values() for shard in split.get("shards", [])
             for entry in shard.get("files", {}).values()]
    named.append(manifest.get("tokenizer", {}).get("path") or "tokenizer")
    for path in named:
        if not isinstance(path, str) or not is_relative_inside(path):
            raise DataError(f"{where}: names the file {path!r}, which is not a path inside the dataset; the manifest "
                            "is damaged or crafted: re-copy the dataset or re-run `bertforge prepare`")


def _sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_file(path: Path, entry: dict[str, Any], shard: str, verify_checksum: bool) -> None:
    if not path.is_file():
        raise DataError(f"shard {shard}: file {path} is missing; re-copy the dataset or re-run `bertforge prepare`")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DataError(f"shard {shard}: {path.name} has {size} bytes, the manifest says {entry['bytes']}; "
                        "it is truncated or corrupt: re-copy the dataset or re-run `bertforge prepare`")
    if verify_checksum and _sha256_of(path) != entry["sha256"]:
        raise DataError(f"shard {shard}: {path.name} fails its sha256 check; it is corrupt: re-copy the dataset "
                        "or re-run `bertforge prepare`")


class PretokenizedDataset:
    """One split of a prepared dataset, with O(1) access to any sample.

    `dataset[i]` is the token ids of sample i (int64, `[CLS] ... [SEP]`); `segment_b_start(i)` and
    `next_sentence_label(i)` exist for NSP data. The memory maps are opened lazily in each process,
    so the object pickles cheaply into data-loader workers. A local dataset is checked against its
    manifest when it opens; a remote one fetches its shards when they are first read (`fetch` /
    `prefetch` let the loader do that ahead, in the main process), checked as they arrive.
    """

    def __init__(self, url: str | Path, split: str = "train", *, verify_checksums: bool = True,
                 cache_dir: str | Path | None = None) -> None:
        self.url = str(url).rstrip("/")
        self.manifest = read_manifest(self.url)
        splits = self.manifest["splits"]
        if split not in splits:
            raise DataError(f"{self.url}: no {split!r} split (it has {', '.join(splits) or 'none'}); "
                            "check --split of `bertforge prepare`")
        self.split = split
        self.shards = [_Shard(s["name"], s["samples"], s["files"]) for s in splits[split]["shards"]]
        counts = np.array([s.samples for s in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(counts)])
        self.has_pairs = bool(self.manifest["settings"]["nsp"])
        self.seq_len = int(self.manifest["settings"]["seq_len"])
        self._arrays: list[dict[str, np.ndarray] | None] | None = None
        self.cache: ShardCache | None = None
        if is_local(self.url):
            self.root = local_path(self.url)
            for shard in self.shards:
                for entry in shard.files.values():
                    _check_file(self.root / entry["path"], entry, shard.name, verify_checksums)
            # every shard checked against the manifest now, in this process (memory maps: headers only), so
            # a corrupt one is found when the dataset opens, not later inside a loader worker
            self._open_all()
        else:
            key = hashlib.sha256(f"{self.url}\0{self.manifest['cache_key']}".encode()).hexdigest()[:20]
            self.root = Path(cache_dir) if cache_dir is not None else cache_root() / "datasets" / key
            self.cache = ShardCache(self.url, self.root,
                                    [(shard.name, list(shard.files.values())) for shard in self.shards])
            self._fetch_tokenizer()
            log.debug(f"{self.url}: shards are fetched into {self.root} as they are first read")

    def _fetch_tokenizer(self) -> None:
        tokenizer = self.manifest.get("tokenizer", {}).get("path")
        if not tokenizer:
            return
        url = f"{self.url}/{tokenizer}"
        fs, path = filesystem(url)
        for remote, details in with_retries(url, "list", lambda: fs.find(path, detail=True)).items():
            target = self.root / tokenizer / Path(remote).relative_to(path)
            if not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                # whole or not at all: a copy cut short would stay in the cache for every later run
                data = with_retries(url, "download", lambda r=remote, size=details["size"]: cat_whole(fs, r, size))
                write_file_atomically(target, data)

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer the dataset was prepared with (a copy travels with the dataset)."""
        return self.root / self.manifest["tokenizer"]["path"]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arrays"] = None
        return state

    def shards_of(self, indices: Iterable[int]) -> list[int]:
        """The shards holding these samples, in the order the samples first need them."""
        shards = np.searchsorted(self.shard_starts, np.asarray(list(indices), dtype=np.int64), side="right") - 1
        return list(dict.fromkeys(shards.tolist()))

    def fetch(self, shards: Iterable[int]) -> int:
        """Make these shards local now (a no-op for a local dataset); returns the files this process downloaded."""
        return self.cache.fetch(shards) if self.cache is not None else 0

    def prefetch(self, shards: Iterable[int]) -> None:
        """Start fetching these shards in the background (a no-op for a local dataset)."""
        if self.cache is not None:
            self.cache.prefetch(shards)

    def close(self) -> None:
        """Stop background fetches (the local copies stay)."""
        if self.cache is not None:
            self.cache.close()

    def _open_shard(self, index: int) -> dict[str, np.ndarray]:
        shard = self.shards[index]
        if self.cache is not None and not self.cache.is_local(index):
            self.cache.fetch([index])  # read before the loader asked for it (random access, loader workers)
        opened = {}
        for kind, entry in shard.files.items():
            path = self.root / entry["path"]
            try:
                opened[kind] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as error:
                raise DataError(f"shard {shard.name}: {path.name} cannot be read ({error}); it is corrupt: "
                                "re-copy the dataset or re-run `bertforge prepare`") from None
        if len(opened["offsets"]) != shard.samples + 1:
            raise DataError(f"shard {shard.name}: its offsets do not match the manifest; it is corrupt")
        return opened

    def _open_all(self) -> None:
        self._arrays = [self._open_shard(index) for index in range(len(self.shards))]

    def _shard_arrays(self, index: int) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = [None] * len(self.shards)
        arrays = self._arrays[index]
        if arrays is None:
            arrays = self._arrays[index] = self._open_shard(index)
        return arrays

    def __len__(self) -> int:
        return int(self.shard_starts[-1])

    def locate(self, index: int) -> tuple[dict[str, np.ndarray], int]:
        """The arrays of the shard holding sample `index`, and the sample's index inside it."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        shard = int(np.searchsorted(self.shard_starts, index, side="right")) - 1
        return self._shard_arrays(shard), index - int(self.shard_starts[shard])

    def __getitem__(self, index: int) -> np.ndarray:
        arrays, local = self.locate(index)
        offsets = arrays["offsets"]
        return np.asarray(arrays["tokens"][offsets[local]:offsets[local + 1]], dtype=np.int64)

    def segment_b_start(self, index: int) -> int:
        """Token position where segment B starts (token_type_ids become 1); the length when there is none."""
        arrays, local = self.locate(index)
        if "pairs" not in arrays:
            offsets = arrays["offsets"]
            return int(offsets[local + 1] - offsets[local])
        return int(arrays["pairs"][local, 0])

    def next_sentence_label(self, index: int) -> int:
        """0: segment B continues A; 1: B comes from another document (Hugging Face's convention)."""
        arrays, local = self.locate(index)
        if "pairs" not in arrays:
            raise DataError(f"{self.url} was prepared without --nsp; it has no next-sentence labels")
        return int(arrays["pairs"][local, 1])

    def gather(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Flat token ids, lengths and (for NSP) pairs of several samples, in the given order."""
        shards = np.searchsorted(self.shard_starts, indices, side="right") - 1
        locals_ = indices - self.shard_starts[shards]
        pieces, lengths = [], np.empty(len(indices), dtype=np.int64)
        pairs = np.empty((len(indices), 2), dtype=np.int64) if self.has_pairs else None
        for i, (shard, local) in enumerate(zip(shards.tolist(), locals_.tolist(), strict=True)):
            shard_arrays = self._shard_arrays(shard)
            start, end = shard_arrays["offsets"][local:local + 2]
            pieces.append(shard_arrays["tokens"][start:end])
            lengths[i] = end - start
            if pairs is not None:
                pairs[i] = shard_arrays["pairs"][local]
        flat = np.concatenate(pieces).astype(np.int64) if pieces else np.empty(0, dtype=np.int64)
        return flat, lengths, pairs
