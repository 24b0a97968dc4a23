"""Preparation split across machines: `prepare pretrain --num-parts N --part I`, then `prepare merge`.

Tokenization is the expensive stage. Each part reads the whole input — reading and decompressing
run at hundreds of MB/s, tokenizing at a few — to cut it into exactly the chunks of ~`chunk_bytes`
at document boundaries that one machine would cut, and tokenizes every N-th chunk from I. It writes
its staged chunks, a copy of the tokenizer and `part.json` (last: a part without it did not finish)
to its `--out`, a directory or a URL. `merge` checks that the parts belong together (one cache key
— same inputs, tokenizer and settings — and every part 0..N-1 exactly once), gathers the staged
chunks and runs the second stage (the train/validation/test split by documents, samples, shards)
and the manifest exactly as a one-machine preparation does: the merged dataset equals it sample
for sample and has its cache key. Any scheduler can run the parts (a Slurm array, a Kubernetes
indexed job, a shell loop); docs/scaling.md shows a Slurm array.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bertforge.console import log, progress_enabled
from bertforge.data.prepare import (
    TOKENIZER_FILES,
    Part,
    PrepareSettings,
    TaskRunner,
    build_and_publish,
    claim_dataset,
    source_names,
    tokenize_stage,
    up_to_date_or_claimed,
)
from bertforge.data.shards import is_local, local_path, read_text_file, write_file_atomically
from bertforge.data.sources import Source
from bertforge.data.tokenizer import LoadedTokenizer, load_tokenizer
from bertforge.directory_lock import DirectoryLock
from bertforge.disk import disk_write
from bertforge.errors import DataError
from bertforge.output_guard import ClaimedDirectory, claim_directory
from bertforge.storage import cache_root, filesystem, with_retries

PART_FORMAT = "bertforge-prepare-part"
PART_FILE = "part.json"
CHUNKS_DIR = "chunks"
TOKENIZER_DIR = "tokenizer"
PART_COMMAND = "prepare pretrain --part"
PART_NAMES = (PART_FILE, CHUNKS_DIR, TOKENIZER_DIR)


def claim_part(out: str, inputs: Sequence[str], command: str) -> ClaimedDirectory:
    """Where a part may be written (`output_guard`): a part of other inputs or settings there is replaced only
    with --overwrite, decided once the key is known."""
    def earlier_part(names: list[str], directories: set[str]) -> bool:  # written before the output ledger
        return PART_FILE in names and set(names) <= set(PART_NAMES)

    return claim_directory(out, command=command, flag="--out", what="prepared part", overwrite=None,
                           sources=[(path, "an input") for path in inputs], recognise=earlier_part)


def chunk_name(chunk: int) -> str:
    return f"chunk-{chunk:06d}.npz"


def prepare_part_locked(sources: list[Source], loaded: LoadedTokenizer, key: str, work: Path, out: str,
                        settings: PrepareSettings, workers: int, progress: bool | None, part: Part,
                        claimed: ClaimedDirectory, overwrite: bool) -> dict[str, Any]:
    """Stage 1 for this part's chunks into `out`: chunks/, tokenizer/, then part.json."""
    existing = _read_part(out, missing_ok=True)
    if existing is not None and existing["cache_key"] == key and existing["part"] == part.index \
            and existing["num_parts"] == part.count:
        log.info(f"{out} already holds part {part.index} of {part.count} of this preparation; nothing to do")
        return existing
    if existing is not None:  # another preparation's part: its chunks must not be taken for this one's
        claimed.refuse_earlier_unless(overwrite, "--out", "prepared part (of other inputs, settings or --part)")
        claimed.remove_earlier(keep=())
    claimed.record(*PART_NAMES)
    # a local part stages straight into its chunks/ (an interrupted part resumes from them); a remote
    # one stages in the cache and uploads
    staging = work / (CHUNKS_DIR if is_local(out) else f".staging-{key[:12]}")
    staging.mkdir(parents=True, exist_ok=True)
    runner = TaskRunner(workers, str(loaded.path))
    try:
        with disk_write(work, "run the same command again to resume this part"):
            chunk_documents, text_bytes = tokenize_stage(runner, sources, settings, str(loaded.path), staging,
                                                          progress_enabled() if progress is None else progress,
                                                          part)
    except DataError:
        shutil.rmtree(staging, ignore_errors=True)
        claimed.forget(*PART_NAMES)  # nothing of the part is written yet
        raise
    finally:
        runner.close()
    description = {
        "format": PART_FORMAT, "format_version": 1, "cache_key": key, "part": part.index, "num_parts": part.count,
        "chunks": [chunk for chunk in range(len(chunk_documents)) if part.owns(chunk)],
        "chunk_documents": chunk_documents, "text_bytes": text_bytes,
        "settings": {**asdict(settings), "split": list(settings.split)}, "inputs": source_names(sources),
        "tokenizer_fingerprint": loaded.fingerprint,
    }
    files = {f"{CHUNKS_DIR}/{chunk_name(chunk)}": staging / chunk_name(chunk) for chunk in description["chunks"]}
    files.update({f"{TOKENIZER_DIR}/{name}": Path(loaded.path) / name for name in TOKENIZER_FILES
                  if (Path(loaded.path) / name).is_file()})
    _publish_part(out, work, files, description)
    log.info(f"part {part.index} of {part.count}: {len(description['chunks'])} of {len(chunk_documents)} chunks "
             f"tokenized into {out}; merge the parts with `bertforge prepare merge`")
    return description


def _publish_part(out: str, work: Path, files: dict[str, Path], description: dict[str, Any]) -> None:
    data = (json.dumps(description, indent=1) + "\n").encode("utf-8")
    if is_local(out):
        for relative, source in files.items():
            target = work / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            if source != target:  # the chunks were staged in place
                shutil.copyfile(source, target)
        write_file_atomically(work / PART_FILE, data)  # last: the part is complete
        return
    fs, root = filesystem(out)
    for relative, source in files.items():
        with_retries(f"{out}/{relative}", "upload",
                     lambda source=source, relative=relative: fs.put_file(str(source), f"{root}/{relative}"))
    with_retries(f"{out}/{PART_FILE}", "upload", lambda: fs.pipe_file(f"{root}/{PART_FILE}", data))
    shutil.rmtree(work, ignore_errors=True)


def _read_part(url: str, missing_ok: bool = False) -> dict[str, Any] | None:
    url = url.rstrip("/")
    where = f"{url}/{PART_FILE}"
    try:
        text = read_text_file(url, PART_FILE)
    except (FileNotFoundError, NotADirectoryError):
        if missing_ok:
            return None
        raise DataError(f"{where} not found: {url} is not a finished part; run its `bertforge prepare pretrain "
                        "--num-parts N --part I --out ...` (again) first") from None
    description = json.loads(text)
    if description.get("format") != PART_FORMAT:
        raise DataError(f"{where}: not a part written by `bertforge prepare pretrain --part`")
    return description


def _check_parts(parts: Sequence[str], descriptions: list[dict[str, Any]]) -> None:
    first = descriptions[0]
    for url, description in zip(parts, descriptions, strict=True):
        if description["cache_key"] != first["cache_key"] or description["num_parts"] != first["num_parts"]:
            raise DataError(f"{url} belongs to another preparation than {parts[0]} (different inputs, tokenizer, "
                            "settings or --num-parts); merge only the parts of one `prepare pretrain --num-parts N`")
    seen: dict[int, str] = {}
    for url, description in zip(parts, descriptions, strict=True):
        if description["part"] in seen:
            raise DataError(f"{url} and {seen[description['part']]} are both part {description['part']}; give each "
                            "part once")
        seen[description["part"]] = url
    missing = sorted(set(range(first["num_parts"])) - set(seen))
    if missing:
        raise DataError(f"part(s) {', '.join(map(str, missing))} of {first['num_parts']} are missing from the merge; "
                        "prepare them (`--part I`) and give every part's --out")


def merge_parts(parts: Sequence[str], out: str | Path, *, workers: int | None = None,
                overwrite: bool = False) -> dict[str, Any]:
    """One dataset at `out` from the parts of a split preparation, equal to a one-machine preparation.
    A dataset of another preparation already at `out` is replaced only with `overwrite`."""
    if not parts:
        raise DataError("no parts given; pass the --out directories (or URLs) of every part")
    parts = [str(part).rstrip("/") for part in parts]
    out = str(out).rstrip("/")
    claimed = claim_dataset(out, parts, "prepare merge")
    descriptions = [description for part in parts if (description := _read_part(part)) is not None]
    _check_parts(parts, descriptions)
    first = descriptions[0]
    key = first["cache_key"]
    existing = up_to_date_or_claimed(out, key, claimed, overwrite)
    if existing is not None:
        return existing
    workers = (os.cpu_count() or 1) if workers is None else workers
    work = local_path(out) if is_local(out) else cache_root() / "prepare" / key[:20]
    lock = DirectoryLock(work, "the prepared-data directory", "choose another --out")
    lock.acquire()
    try:
        started = time.perf_counter()
        staging = work / f".staging-{key[:12]}"
        tokenizer_dir = work / f".tokenizer-{key[:12]}"
        if is_local(out):
            claimed.record(staging.name, tokenizer_dir.name)
        staging.mkdir(parents=True, exist_ok=True)
        for part, description in zip(parts, descriptions, strict=True):
            for chunk in description["chunks"]:
                _fetch(f"{part}/{CHUNKS_DIR}/{chunk_name(chunk)}", staging / chunk_name(chunk))
        for name in TOKENIZER_FILES:
            _fetch(f"{parts[0]}/{TOKENIZER_DIR}/{name}", tokenizer_dir / name, missing_ok=True)
        loaded = load_tokenizer(tokenizer_dir)
        settings_values = {**first["settings"], "split": tuple(first["settings"]["split"])}
        runner = TaskRunner(workers, str(loaded.path))
        try:
            manifest = build_and_publish(runner, loaded, key, work, out, PrepareSettings(**settings_values), staging,
                                         first["chunk_documents"], first["text_bytes"], first["inputs"], started,
                                         claimed)
        finally:
            runner.close()
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        return manifest
    finally:
        lock.release()


def _fetch(url: str, target: Path, missing_ok: bool = False) -> None:
    """A part's file into the merge's work directory (copied, or downloaded for a URL)."""
    if target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        if is_local(url):
            shutil.copyfile(local_path(url), target)
            return
        fs, path = filesystem(url)
        write_file_atomically(target, with_retries(url, "download", lambda: fs.cat_file(path)))
    except FileNotFoundError:
        if missing_ok:
            return
        raise DataError(f"{url} is missing although its part.json lists it; the part is damaged: prepare that "
                        "part again") from None
