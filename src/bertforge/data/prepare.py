"""`bertforge prepare pretrain`: raw documents -> a sharded, pre-tokenized, sample-materialised dataset.

Two parallel stages, both deterministic whatever the number of worker processes:

1. *tokenize*: the main process reads documents and cuts them into chunks of ~`chunk_bytes` of
   text at document boundaries; worker processes split sentences and tokenize each chunk
   (`bertforge.data.sentences`) into a staging file. At most two chunks per worker are in flight,
   so memory does not grow with the corpus.
2. *build samples*: once the number of documents is known, documents are split into train /
   validation / test by contiguous ranges (Megatron's `--split 980,20` semantics); each
   (chunk, split) piece becomes one shard of samples (`bertforge.data.pretraining_samples`).

Resumable and safe: the output is keyed by a content hash of the inputs, the tokenizer and the
settings. Staged chunks and finished shards of an interrupted run with the same key are reused;
shards go to a fresh `shards-<key>/` directory and `index.json` is replaced atomically at the
very end (in a bucket: uploaded after every shard), so an interruption leaves the previous dataset (if any) intact and readable. Running
again with the same key is a no-op, like the cached dataset artifact of the Union/Flyte example.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertforge import __version__
from bertforge.console import console, log, progress_enabled
from bertforge.data.pretraining_samples import SampleSettings, build_samples
from bertforge.data.sentences import TokenizedDocuments, WordCache, tokenize_documents, word_cache_applies
from bertforge.data.shards import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    cache_root,
    is_local,
    local_path,
    read_text_file,
    token_dtype_for,
    write_file_atomically,
    write_shard,
)
from bertforge.data.sources import Document, Source, fingerprint_sources, iter_documents, resolve_inputs
from bertforge.data.tokenizer import LoadedTokenizer, load_tokenizer
from bertforge.directory_lock import DirectoryLock
from bertforge.disk import disk_write
from bertforge.errors import DataError
from bertforge.output_guard import ClaimedDirectory, claim_directory
from bertforge.processes import die_with_parent
from bertforge.storage import filesystem, storage_errors, with_retries

SPLIT_NAMES = ("train", "validation", "test")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
DATASET_COMMANDS = ("prepare pretrain", "prepare merge")  # both write a dataset, and may replace each other's
BUILD_PREFIXES = ("shards-", ".staging-", ".tokenizer-")  # one build's names, suffixed by its key
EARLIER_BUILD = re.compile(r"(shards|\.staging|\.tokenizer)-[0-9a-f]{12}")


def is_earlier_dataset(names: list[str], directories: set[str]) -> bool:
    """A dataset prepared before the output ledger: the manifest and builds named by their keys only."""
    return MANIFEST_NAME in names and all(name == MANIFEST_NAME or EARLIER_BUILD.fullmatch(name) for name in names)


def claim_dataset(out: str, inputs: Sequence[str], command: str, flag: str = "--out") -> ClaimedDirectory:
    """Where a dataset may be written: never over an input, a stranger's files or another command's output
    (`output_guard`); whether an earlier dataset there may be replaced is decided once its key is known."""
    return claim_directory(out, command=command, flag=flag, what="dataset", overwrite=None,
                           sources=[(path, "an input") for path in inputs], recognise=is_earlier_dataset,
                           kin=DATASET_COMMANDS)


@dataclass(frozen=True)
class PrepareSettings:
    """Everything that decides the content of a prepared dataset (part of its cache key)."""

    seq_len: int = 128  # tokens per sample, [CLS]/[SEP] included
    nsp: bool = False  # sentence pairs with next-sentence labels instead of packed sequences
    line_by_line: bool = False  # every line is one sample (run_mlm.py's --line_by_line), not packed
    short_seq_prob: float = 0.1  # probability that a sample's target length is drawn shorter (BERT: 0.1)
    split: tuple[float, ...] = (980.0, 20.0)  # train,validation[,test] weights over documents (Megatron)
    seed: int = 12345  # seeds sample construction (NSP cuts and negatives, short lengths)
    text_field: str = "text"  # field/column holding the text in jsonl/csv/parquet/HF/MDS inputs
    chunk_bytes: int = 2 << 20  # text per tokenization task; also ~the size of a shard

    def __post_init__(self) -> None:
        # (9, 1) and the CLI's (9.0, 1.0) are one setting: one cache key
        object.__setattr__(self, "split", tuple(float(weight) for weight in self.split))
        if not 8 <= self.seq_len <= 1 << 15:
            raise DataError(f"--seq-len {self.seq_len} must be in [8, 32768] (BERT uses 128 and 512)")
        if self.nsp and self.line_by_line:
            raise DataError("--nsp and --line-by-line cannot be combined: NSP pairs are cut from consecutive "
                            "sentences; choose one")
        if not 0.0 <= self.short_seq_prob < 1.0:
            raise DataError(f"--short-seq-prob {self.short_seq_prob} must be in [0, 1)")
        if not 1 <= len(self.split) <= 3 or any(w < 0 for w in self.split) or sum(self.split) <= 0:
            raise DataError(f"--split {','.join(map(str, self.split))} must be 1 to 3 non-negative weights "
                            "(train,validation[,test]) with a positive sum, e.g. 980,20")


def parse_split(text: str) -> tuple[float, ...]:
    """'980,20' or '969,30,1' (Megatron's --split) -> weights."""
    try:
        return tuple(float(part) for part in text.replace("/", ",").split(","))
    except ValueError:
        raise DataError(f"--split {text!r} is not a list of numbers; use e.g. 980,20 or 969,30,1") from None


def split_boundaries(weights: Sequence[float], num_documents: int) -> list[int]:
    """Megatron's get_train_valid_test_split_: contiguous document ranges, rounding fixed at the end."""
    padded = list(weights) + [0.0] * (3 - len(weights))
    total = sum(padded)
    bounds = [0]
    for weight in padded:
        bounds.append(bounds[-1] + int(round(weight / total * num_documents)))
    difference = bounds[-1] - num_documents
    return [bounds[0]] + [bound - difference for bound in bounds[1:]]


@dataclass(frozen=True)
class Part:
    """Part `index` of `count` of a preparation split across machines: every count-th chunk from `index`."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise DataError(f"--part {self.index} --num-parts {self.count}: the part must be in 0..{self.count - 1} "
                            "and --num-parts at least 1, e.g. --num-parts 8 --part 0 (Slurm: "
                            "--part $SLURM_ARRAY_TASK_ID)")

    def owns(self, chunk: int) -> bool:
        return chunk % self.count == self.index

    def key_for(self, key: str) -> str:
        return hashlib.sha256(f"{key}\0part {self.index} of {self.count}".encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# worker side


_worker_tokenizer: LoadedTokenizer | None = None
_worker_word_cache: WordCache | None = None


def _init_worker(tokenizer_path: str, parent_pid: int) -> None:
    die_with_parent(parent_pid)  # a kill -9 of `prepare` must not leave its workers behind
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _load_tokenizer_here(tokenizer_path)


def _load_tokenizer_here(tokenizer_path: str) -> None:
    global _worker_tokenizer, _worker_word_cache
    _worker_tokenizer = load_tokenizer(tokenizer_path)
    applies = word_cache_applies(_worker_tokenizer.tokenizer)
    _worker_word_cache = WordCache(_worker_tokenizer.tokenizer) if applies else None


def _tokenizer_in_worker(tokenizer_path: str) -> LoadedTokenizer:
    if _worker_tokenizer is None or _worker_tokenizer.path != tokenizer_path:  # workers=0: in this process
        _load_tokenizer_here(tokenizer_path)
    assert _worker_tokenizer is not None
    return _worker_tokenizer


def _tokenize_chunk(tokenizer_path: str, texts: list[str], staged: str, within_lines: bool) -> int:
    """Stage 1 task: tokenize one chunk of documents into a staging file; returns the token count."""
    tokenizer = _tokenizer_in_worker(tokenizer_path)
    documents = tokenize_documents(texts, tokenizer.tokenizer, sep_id=tokenizer.sep_id,
                                   drop_ids=[tokenizer.cls_id, tokenizer.pad_id, tokenizer.mask_id],
                                   dtype=token_dtype_for(tokenizer.vocab_size), word_cache=_worker_word_cache,
                                   within_lines=within_lines)
    _save_staged(Path(staged), documents)
    return int(documents.tokens.size)


def _save_staged(path: Path, documents: TokenizedDocuments) -> None:
    temporary = path.with_name(f"{path.stem}.tmp-{os.getpid()}.npz")
    np.savez(temporary, tokens=documents.tokens, sentence_lengths=documents.sentence_lengths,
             document_sentences=documents.document_sentences)
    os.replace(temporary, path)


def _load_staged(path: Path) -> TokenizedDocuments:
    with np.load(path) as data:
        return TokenizedDocuments(tokens=data["tokens"], sentence_lengths=data["sentence_lengths"],
                                  document_sentences=data["document_sentences"])


@dataclass(frozen=True)
class _Piece:
    """Stage 2 task: the documents [first, last) of one staged chunk that fall into one split."""

    chunk: int
    split: str
    first: int
    last: int
    first_global_document: int

    @property
    def shard_name(self) -> str:
        return f"{self.split}-{self.chunk:05d}"


def _build_piece(tokenizer_path: str, staged: str, piece: _Piece, settings: SampleSettings, shard_dir: str,
                 relative_dir: str) -> dict[str, Any]:
    """Stage 2 task: build one shard of samples; its manifest entry is saved last, as the 'done' mark."""
    tokenizer = _tokenizer_in_worker(tokenizer_path)
    documents = _load_staged(Path(staged))
    samples = build_samples(documents, piece.first, piece.last, settings, cls_id=tokenizer.cls_id,
                            sep_id=tokenizer.sep_id, stream_seed=piece.first_global_document)
    directory = Path(shard_dir)
    entry = write_shard(directory, relative_dir, piece.shard_name, samples.tokens, samples.offsets, samples.pairs)
    entry["documents"] = piece.last - piece.first
    write_file_atomically(directory / f"{piece.shard_name}.entry.json", json.dumps(entry).encode("utf-8"))
    return entry


# ---------------------------------------------------------------------------------------------
# running tasks in order, with a bounded number in flight


class TaskRunner:
    """Runs tasks in worker processes (or inline with workers=0) and yields results in submission order."""

    def __init__(self, workers: int, tokenizer_path: str) -> None:
        self.workers = workers
        self.executor: ProcessPoolExecutor | None = None
        if workers > 0:
            # fork on Linux: instant start and no re-import of the caller's __main__ (which spawn needs
            # to be import-safe); the workers never touch torch or the console.
            context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
            self.executor = ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                                initializer=_init_worker, initargs=(tokenizer_path, os.getpid()))
        self.in_flight: deque[tuple[Any, Future[Any] | Any]] = deque()
        self.limit = max(2 * workers, 1)

    def submit(self, tag: Any, function: Callable[..., Any], *args: Any) -> Iterator[tuple[Any, Any]]:
        """Queue a task; yields the results of older tasks once too many are in flight."""
        if self.executor is None:
            self.in_flight.append((tag, function(*args)))
        else:
            self.in_flight.append((tag, self.executor.submit(function, *args)))
        while len(self.in_flight) > self.limit:
            yield self._pop()

    def drain(self) -> Iterator[tuple[Any, Any]]:
        while self.in_flight:
            yield self._pop()

    def _pop(self) -> tuple[Any, Any]:
        tag, pending = self.in_flight.popleft()
        return tag, pending.result() if isinstance(pending, Future) else pending

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------------------------
# the pipeline


@dataclass
class _Progress:
    """A rich progress bar over the stored input bytes (MB/s and ETA), or nothing when disabled."""

    enabled: bool
    total: int | None
    bar: Any = None
    task: Any = None
    tokens: int = 0
    documents: int = 0
    started: float = field(default_factory=time.perf_counter)

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[detail]}"),
                                console=console, transient=False)
            self.bar.__enter__()
            self.task = self.bar.add_task("tokenizing", total=self.total, detail="")
        return self

    def __exit__(self, *error: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*error)

    def advance(self, stored_bytes: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=stored_bytes)

    def counted(self, documents: int, tokens: int) -> None:
        self.documents += documents
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(self.task, detail=f"{self.documents:,} docs · {self.tokens:,} tokens")


def _chunks(documents: Iterator[Document], chunk_bytes: int) -> Iterator[list[str]]:
    texts: list[str] = []
    size = 0
    for document in documents:
        texts.append(document.text)
        size += len(document.text)
        if size >= chunk_bytes:
            yield texts
            texts, size = [], 0
    if texts:
        yield texts


def cache_key(input_fingerprint: str, tokenizer_fingerprint: str, settings: PrepareSettings) -> str:
    spec = {"format_version": FORMAT_VERSION, "inputs": input_fingerprint, "tokenizer": tokenizer_fingerprint,
            "settings": asdict(settings)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode("utf-8")).hexdigest()


def existing_manifest(out: str) -> dict[str, Any] | None:
    """The manifest already at `out`, if any. For a URL this is also the first contact with the store:
    wrong credentials or a missing bucket stop here, before minutes of tokenization."""
    try:
        return json.loads(read_text_file(out, MANIFEST_NAME))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def is_complete(out: str, manifest: dict[str, Any]) -> bool:
    fs, root = filesystem(out)
    with storage_errors(out, "list"):
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                for entry in shard["files"].values():
                    path = f"{root.rstrip('/')}/{entry['path']}"
                    if not fs.exists(path) or fs.size(path) != entry["bytes"]:
                        return False
    return True


def prepare_pretraining_data(inputs: Sequence[str], tokenizer: str | Path, out: str | Path,
                             settings: PrepareSettings | None = None, *, workers: int | None = None,
                             progress: bool | None = None, part: Part | None = None,
                             overwrite: bool = False) -> dict[str, Any]:
    """Prepare (or reuse) a pre-training dataset at `out` (a directory or fsspec URL); returns its manifest.

    With `part`, only that part's chunks are tokenized and `out` receives a part for `merge_parts`
    (`bertforge.data.prepare_parts`); the returned dict is the part's description. A dataset (or part) of
    other inputs or settings already at `out` is replaced only with `overwrite`.
    """
    settings = settings or PrepareSettings()
    out = str(out).rstrip("/")
    if is_local(out) and local_path(out).exists() and not local_path(out).is_dir():
        raise DataError(f"--out {out} is a file; give a directory (created if missing) or an fsspec URL")
    if part is not None:
        from bertforge.data.prepare_parts import PART_COMMAND, claim_part

        claimed = claim_part(out, [*inputs, str(tokenizer)], PART_COMMAND)
    else:
        claimed = claim_dataset(out, [*inputs, str(tokenizer)], "prepare pretrain")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 0:
        raise DataError(f"--workers {workers} must be >= 0 (0 tokenizes in the main process)")
    sources = resolve_inputs(inputs)
    loaded = load_tokenizer(tokenizer)
    key = cache_key(fingerprint_sources(sources), loaded.fingerprint, settings)
    work_key = part.key_for(key) if part is not None else key  # a part's local work stays apart from a whole's
    work = local_path(out) if is_local(out) else cache_root() / "prepare" / work_key[:20]
    lock = DirectoryLock(work, "the prepared-data directory", "choose another --out")
    lock.acquire()  # two prepares into one --out would delete each other's shard entries
    try:
        if part is not None:
            from bertforge.data.prepare_parts import prepare_part_locked

            return prepare_part_locked(sources, loaded, key, work, out, settings, workers, progress, part, claimed,
                                       overwrite)
        return _prepare_locked(sources, loaded, key, work, out, settings, workers, progress, claimed, overwrite)
    finally:
        lock.release()


def up_to_date_or_claimed(out: str, key: str, claimed: ClaimedDirectory, overwrite: bool) -> dict[str, Any] | None:
    """The manifest at `out` when it is this dataset, complete; else None once `out` may be written: a
    dataset of other inputs or settings there is replaced only with `overwrite`."""
    existing = existing_manifest(out)
    if existing is not None and existing.get("cache_key") == key and is_complete(out, existing):
        log.info(f"{out} is up to date (same inputs, tokenizer and settings); nothing to do")
        return existing
    if existing is not None and existing.get("cache_key") != key:
        claimed.refuse_earlier_unless(overwrite, "--out", "dataset (of other inputs, tokenizer or settings)")
    return None


def _prepare_locked(sources: list[Source], loaded: LoadedTokenizer, key: str, work: Path, out: str,
                    settings: PrepareSettings, workers: int, progress: bool | None, claimed: ClaimedDirectory,
                    overwrite: bool) -> dict[str, Any]:
    existing = up_to_date_or_claimed(out, key, claimed, overwrite)
    if existing is not None:
        return existing

    staging = work / f".staging-{key[:12]}"
    if is_local(out):
        claimed.record(staging.name)  # before it exists: a kill leaves nothing the next run could not clean
    staging.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runner = TaskRunner(workers, str(loaded.path))
    try:
        with disk_write(work, "run the same command again to resume the preparation"):
            chunk_documents, text_bytes = tokenize_stage(runner, sources, settings, str(loaded.path), staging,
                                                          progress_enabled() if progress is None else progress)
        return build_and_publish(runner, loaded, key, work, out, settings, staging, chunk_documents, text_bytes,
                                 source_names(sources), started, claimed)
    except DataError:
        # fixing bad input changes the content hash, so this run's partial work can never be reused
        shutil.rmtree(staging, ignore_errors=True)
        claimed.forget(staging.name)
        raise
    finally:
        runner.close()


def source_names(sources: Sequence[Source]) -> list[str]:
    return [source.url if source.kind != "hf_hub" else f"hf:{source.url}" for source in sources]


def build_and_publish(runner: TaskRunner, loaded: LoadedTokenizer, key: str, work: Path, out: str,
                      settings: PrepareSettings, staging: Path, chunk_documents: list[int], text_bytes: int,
                      inputs: list[str], started: float, claimed: ClaimedDirectory) -> dict[str, Any]:
    """Stage 2 over the staged chunks (`staging/chunk-NNNNNN.npz`), then the manifest, published last."""
    build_name = f"shards-{key[:12]}"
    shard_dir = work / build_name
    claimed.record(build_name, MANIFEST_NAME)  # in a bucket: before the upload
    shard_dir.mkdir(parents=True, exist_ok=True)
    try:
        with disk_write(work, "run the same command again to resume the preparation"):
            splits = _build_stage(runner, chunk_documents, settings, str(loaded.path), staging, shard_dir,
                                  build_name)
    except DataError:
        shutil.rmtree(shard_dir, ignore_errors=True)
        claimed.forget(build_name)
        raise
    tokenizer_dir = shard_dir / "tokenizer"
    tokenizer_dir.mkdir(exist_ok=True)
    for name in TOKENIZER_FILES:
        if (Path(loaded.path) / name).is_file():
            shutil.copyfile(Path(loaded.path) / name, tokenizer_dir / name)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "created_by": f"bertforge {__version__}",
        "cache_key": key,
        "token_dtype": token_dtype_for(loaded.vocab_size).name,
        "tokenizer": {"fingerprint": loaded.fingerprint, "vocab_size": loaded.vocab_size,
                      "padded_vocab_size": loaded.padded_vocab_size, "ids": loaded.ids,
                      "path": f"{build_name}/tokenizer", "source": str(loaded.path)},
        "settings": {**asdict(settings), "split": list(settings.split)},
        "inputs": inputs,
        "text_bytes": text_bytes,
        "splits": splits,
    }
    _publish(out, work, build_name, manifest, claimed)
    shutil.rmtree(staging, ignore_errors=True)
    elapsed = time.perf_counter() - started
    summary = ", ".join(f"{name}: {split['samples']:,} samples / {split['documents']:,} docs"
                        for name, split in splits.items())
    log.info(f"prepared {out} in {elapsed:.1f} s ({text_bytes / 1e6 / max(elapsed, 1e-9):.1f} MB/s of text): {summary}")
    return manifest


def tokenize_stage(runner: TaskRunner, sources: Sequence[Any], settings: PrepareSettings, tokenizer_path: str,
                    staging: Path, show_progress: bool, part: Part | None = None) -> tuple[list[int], int]:
    """Tokenize every chunk (or, with `part`, that part's chunks) into `staging`; returns the document
    count of every chunk and the text bytes of all (a part reads the whole input to know them)."""
    sizes = [source.size for source in sources]
    total = sum(sizes) if all(size is not None for size in sizes) else None  # type: ignore[misc]
    chunk_documents: list[int] = []
    text_bytes = 0
    with _Progress(show_progress, total) as bar:
        documents = iter_documents(sources, text_field=settings.text_field, on_bytes=bar.advance)
        for chunk, texts in enumerate(_chunks(documents, settings.chunk_bytes)):
            chunk_documents.append(len(texts))
            text_bytes += sum(len(text) for text in texts)
            staged = staging / f"chunk-{chunk:06d}.npz"
            if part is not None and not part.owns(chunk):
                continue  # another part tokenizes it
            if staged.is_file():
                bar.counted(len(texts), 0)
                continue  # tokenized by an interrupted run with the same inputs and settings
            for count, tokens in runner.submit(len(texts), _tokenize_chunk, tokenizer_path, texts, str(staged),
                                               not settings.line_by_line):
                bar.counted(count, tokens)
        for count, tokens in runner.drain():
            bar.counted(count, tokens)
    if not chunk_documents:
        raise DataError("the inputs hold no text (every document is empty); check --input and --text-field")
    return chunk_documents, text_bytes


def _build_stage(runner: TaskRunner, chunk_documents: list[int], settings: PrepareSettings, tokenizer_path: str,
                 staging: Path, shard_dir: Path, build_name: str) -> dict[str, Any]:
    total_documents = sum(chunk_documents)
    bounds = split_boundaries(settings.split, total_documents)
    sample_settings = SampleSettings(seq_len=settings.seq_len, nsp=settings.nsp, line_by_line=settings.line_by_line,
                                     short_seq_prob=settings.short_seq_prob, seed=settings.seed)
    pieces: list[_Piece] = []
    chunk_start = 0
    for chunk, count in enumerate(chunk_documents):
        for split, low, high in zip(SPLIT_NAMES, bounds[:-1], bounds[1:], strict=True):
            first, last = max(low, chunk_start), min(high, chunk_start + count)
            if first < last:
                pieces.append(_Piece(chunk, split, first - chunk_start, last - chunk_start, first))
        chunk_start += count
    entries: list[dict[str, Any]] = []
    for piece in pieces:
        done = shard_dir / f"{piece.shard_name}.entry.json"
        if done.is_file():
            entries.append(json.loads(done.read_text(encoding="utf-8")))
            continue
        staged = str(staging / f"chunk-{piece.chunk:06d}.npz")
        for _, entry in runner.submit(piece, _build_piece, tokenizer_path, staged, piece, sample_settings,
                                      str(shard_dir), build_name):
            entries.append(entry)
    entries.extend(entry for _, entry in runner.drain())
    splits: dict[str, Any] = {}
    for split, low, high in zip(SPLIT_NAMES, bounds[:-1], bounds[1:], strict=True):
        shards = sorted((e for e in entries if e["name"].startswith(f"{split}-")), key=lambda e: e["name"])
        if high == low:
            weight_index = SPLIT_NAMES.index(split)
            if weight_index < len(settings.split) and settings.split[weight_index] > 0:
                log.warning(f"the {split} split got no documents ({total_documents} in all); use more data or a larger "
                            "weight in --split")
            continue
        splits[split] = {"documents": high - low, "samples": sum(s["samples"] for s in shards),
                         "tokens": sum(s["tokens"] for s in shards), "shards": shards}
    return splits


def _publish(out: str, work: Path, build_name: str, manifest: dict[str, Any], claimed: ClaimedDirectory) -> None:
    """Make the new build visible: index.json last and atomically; then drop older builds -- only those the
    output ledger says a preparation wrote, never a user's `shards-mine/`."""
    data = (json.dumps(manifest, indent=1) + "\n").encode("utf-8")

    def older_build(name: str) -> bool:
        return name.startswith(BUILD_PREFIXES)

    if is_local(out):
        write_file_atomically(work / MANIFEST_NAME, data)
        claimed.remove_earlier(keep={build_name, MANIFEST_NAME}, matching=older_build)
        for entry in (work / build_name).glob("*.entry.json"):
            entry.unlink()
        return
    # the build's files first, the manifest after all of them: a reader (or a prepare killed midway)
    # never leaves a manifest that points at a shard not yet uploaded; the previous build stays readable
    fs, root = filesystem(out)
    for entry in (work / build_name).glob("*.entry.json"):
        entry.unlink()
    for path in sorted((work / build_name).rglob("*")):
        if path.is_file():
            target = f"{root}/{path.relative_to(work).as_posix()}"
            fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores; memory:// wants it
            with_retries(f"{out}/{path.relative_to(work).as_posix()}", "upload",
                         lambda path=path, target=target: fs.put_file(str(path), target))
    with_retries(f"{out}/{MANIFEST_NAME}", "upload", lambda: fs.pipe_file(f"{root}/{MANIFEST_NAME}", data))
    claimed.remove_earlier(keep={build_name, MANIFEST_NAME}, matching=older_build)
    shutil.rmtree(work, ignore_errors=True)
