"""Local copies of a remote dataset's shards: fetched on first use, prefetched ahead, shared on a node.

Opening a dataset in a bucket downloads only its manifest and tokenizer; training starts once the
shards of its first micro-batch are here, not after the whole dataset is copied. The loader tells
the cache which shards the next micro-batches read (`prefetch`), and background threads fetch
them in that order while the model trains.

The cache directory is keyed by the dataset's URL and content, so every process of a node that
opens the dataset (torchrun ranks, repeated runs) finds the same files. One download per file per
node: a downloader holds an exclusive POSIX lock (`lockf`) on the file's lock file while it fetches
(and, inside one process, a thread lock), and a process that waited for it finds the file there.
POSIX locks rather than `flock`: a loader worker forked while a prefetch thread held an `flock`
would inherit the lock with the descriptor and wait for itself forever. A file appears only by `os.replace` after its size
and sha256 matched the manifest, so a reader never sees a partial or unverified file, even when a
downloader is killed (the kernel drops its lock; the next process starts over).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bertforge.console import log
from bertforge.errors import DataError
from bertforge.storage import cat_whole, filesystem, with_retries

PREFETCH_THREADS = 4  # concurrent downloads: object stores serve parallel GETs faster than one stream
LOCK_DIR = ".locks"


def _write_verified(target: Path, data: bytes) -> None:
    temporary = target.with_name(f"{target.name}.tmp-{os.getpid()}-{id(data)}")
    with open(temporary, "wb") as f:
        f.write(data)
    os.replace(temporary, target)


class ShardCache:
    """Fetches the files of a remote dataset's shards into `root`, each at most once per node."""

    def __init__(self, url: str, root: Path, shard_files: list[tuple[str, list[dict[str, Any]]]]) -> None:
        self.url = url.rstrip("/")
        self.root = root
        self.shard_files = shard_files  # per shard: its name and its files' manifest entries
        self._executor: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future[int]] = {}
        self._file_locks: dict[str, threading.Lock] = {}  # threads of this process, per file
        self._locks_guard = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:  # loader workers get the paths, not the threads
        return {**self.__dict__, "_executor": None, "_pending": {}, "_file_locks": {}, "_locks_guard": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _locks_guard=threading.Lock())

    def _threads_here(self) -> None:
        """A forked loader worker inherits the parent's futures and thread locks, not its threads: forget them."""
        if self._pid != os.getpid():
            self._executor, self._pending, self._pid = None, {}, os.getpid()
            self._file_locks, self._locks_guard = {}, threading.Lock()

    def _thread_lock(self, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._file_locks.setdefault(key, threading.Lock())

    def path(self, entry: dict[str, Any]) -> Path:
        return self.root / entry["path"]

    def is_local(self, shard: int) -> bool:
        return all(self._present(entry) for entry in self.shard_files[shard][1])

    def _present(self, entry: dict[str, Any]) -> bool:
        path = self.path(entry)
        return path.is_file() and path.stat().st_size == entry["bytes"]  # verified before it was renamed in

    def fetch(self, shards: Iterable[int]) -> int:
        """Make these shards local (waiting for their prefetches); returns the files this process downloaded."""
        self._threads_here()
        downloaded = 0
        for shard in shards:
            pending = self._pending.pop(shard, None)
            if pending is not None:
                downloaded += pending.result()  # a prefetch's failure surfaces here, in the caller's thread
            elif not self.is_local(shard):
                downloaded += self._fetch_shard(shard)
        return downloaded

    def prefetch(self, shards: Iterable[int]) -> None:
        """Start fetching these shards in the background, in this order, unless they are local or on their way."""
        self._threads_here()
        for shard in shards:
            if shard in self._pending or self.is_local(shard):
                continue
            if self._executor is None:
                self._executor = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="bertforge-prefetch")
            self._pending[shard] = self._executor.submit(self._fetch_shard, shard)

    def close(self) -> None:
        self._threads_here()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        self._pending.clear()

    def _fetch_shard(self, shard: int) -> int:
        name, entries = self.shard_files[shard]
        return sum(self._fetch_file(name, entry) for entry in entries)

    def _fetch_file(self, shard: str, entry: dict[str, Any]) -> int:
        target = self.path(entry)
        if self._present(entry):
            return 0
        self._threads_here()
        lock_path = self.root / LOCK_DIR / (entry["path"].replace("/", "__") + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._thread_lock(entry["path"]), open(lock_path, "a+b") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)  # another process of this node may be fetching it now
            if self._present(entry):
                return 0
            url = f"{self.url}/{entry['path']}"
            fs, path = filesystem(url)
            try:
                # a body cut short is fetched again; an object of another length is named below
                data = with_retries(url, "download", lambda: cat_whole(fs, path, entry["bytes"]))
            except FileNotFoundError:
                raise DataError(f"shard {shard}: {url} is missing; the remote dataset is incomplete: re-upload it "
                                "or re-run `bertforge prepare`") from None
            if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                raise DataError(f"shard {shard}: {url} does not match its checksum in the manifest (changed after "
                                "preparation?); re-upload it or re-run `bertforge prepare`")
            _write_verified(target, data)
        log.debug(f"shard {shard}: fetched {url} ({len(data):,} bytes)")
        return 1
