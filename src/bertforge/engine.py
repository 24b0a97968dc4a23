"""The inference engine: inputs in, one model output per input out, in input order, as fast as one process goes.

Every command that runs a model over many texts (`predict`, `evaluate`, `embed`, `fill-mask`) hands it
its inputs, a `Workload` (how its inputs become token ids, a batch, and one result each) and a
`Backend` (a batch in, the model's outputs out: eager PyTorch today; any callable fits). The engine

- sorts the inputs by length (characters, before tokenizing), longest first, so a batch holds texts of
  similar length: attention costs what the batch's longest text costs, and the rate shown climbs as
  the texts get shorter instead of stalling at the end;
- tokenizes on a thread ahead of the model (the fast tokenizer's `encode_batch` releases the GIL), a
  bounded queue apart, so tokenization overlaps the forward passes and memory stays flat;
- cuts token-budget batches (`max_batch_tokens` real tokens, no padding: the batches are unpadded;
  `batch_size` inputs at most), a text longer than the budget alone in its batch;
- runs each batch under `torch.inference_mode()` and puts each result back at its input's position;
- counts the inputs the tokenizer truncated at the model's length, for the command's summary line.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bertforge.console import console, progress_enabled

# the settings live in a module without torch, so a command checks its flags before it imports the engine;
# re-exported here for the engine's users
from bertforge.engine_settings import BACKENDS as BACKENDS
from bertforge.engine_settings import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
from bertforge.engine_settings import DEFAULT_MAX_BATCH_TOKENS as DEFAULT_MAX_BATCH_TOKENS
from bertforge.engine_settings import EngineSettings as EngineSettings
from bertforge.engine_settings import settings_of as settings_of
from bertforge.errors import BertforgeError, first_line

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from torch import nn

Item = TypeVar("Item")
Example = TypeVar("Example")
Batch = dict[str, Any]
Backend = Callable[[Batch], Any]  # a batch (bertforge.batch's unpadded layout + the kind's extras) -> model outputs

ENCODE_CHUNK = 1024  # inputs per encode_batch call on the tokenizer thread
QUEUE_CHUNKS = 4  # encoded chunks waiting for the model at most: the tokenizer runs ahead, memory stays bounded


@dataclass(frozen=True)
class Workload(Generic[Item, Example]):
    """What the engine needs to know about one kind of input: plain functions of the kind's own module."""

    encode: Callable[[list[Item]], list[Example]]  # on the tokenizer thread: inputs -> tokenized examples
    tokens: Callable[[Example], int]  # what an example costs against the token budget
    collate: Callable[[list[Example]], Batch]  # examples -> one unpadded batch
    split: Callable[[Any, list[Example]], list[Any]]  # a batch's model outputs -> one result per example
    size: Callable[[Item], int] = len  # the length inputs are sorted by, known before tokenizing
    truncated: Callable[[Example], bool] = lambda example: False  # noqa: E731  (cut at the model's length?)


@dataclass
class EngineRun:
    results: list[Any]  # one per input, in input order
    truncated: int  # inputs cut at the model's length


def run(items: Sequence[Item], workload: Workload[Item, Example], backend: Backend,
        settings: EngineSettings) -> EngineRun:
    """One result per item, in the order of `items` (see the module's docstring for how)."""
    started = time.perf_counter()
    order = sorted(range(len(items)), key=lambda index: -workload.size(items[index]))
    results: list[Any] = [None] * len(items)
    truncated = 0
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn())
    encoded = _encoded_ahead(items, order, workload)
    with Progress(*columns, console=console, transient=True, disable=not progress_enabled()) as progress, \
            torch.inference_mode():
        bar = progress.add_task(settings.label, total=len(items), rate="")
        done = 0
        try:
            for positions, examples in _batches(encoded, workload, settings):
                outputs = workload.split(backend(workload.collate(examples)), examples)
                for position, example, result in zip(positions, examples, outputs, strict=True):
                    results[position] = result
                    truncated += workload.truncated(example)
                done += len(examples)
                rate = done / max(time.perf_counter() - started, 1e-9)
                progress.update(bar, advance=len(examples), rate=f"{rate:,.0f} texts/s")
        finally:
            encoded.close()  # stops and joins the tokenizer thread now, also when the model failed
    return EngineRun(results, truncated)


def _encoded_ahead(items: Sequence[Item], order: list[int], workload: Workload[Item, Example],
                   ) -> Iterator[tuple[list[int], list[Example]]]:
    """(positions, examples) chunks in `order`, encoded on a thread a bounded queue ahead of the caller.

    An error on the thread comes out here, as one line (a bug in a tokenizer must not hang the command);
    a caller that stops early (an error in the model) lets the thread go on the next chunk."""
    chunks: queue.Queue[tuple[list[int], list[Example]] | BaseException | None] = queue.Queue(QUEUE_CHUNKS)
    stop = threading.Event()

    def put(entry: tuple[list[int], list[Example]] | BaseException | None) -> bool:
        while not stop.is_set():
            try:
                chunks.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def encode_all() -> None:
        try:
            for start in range(0, len(order), ENCODE_CHUNK):
                positions = order[start:start + ENCODE_CHUNK]
                if not put((positions, workload.encode([items[p] for p in positions]))):
                    return
            put(None)
        except BaseException as error:  # noqa: BLE001  (handed to the main thread, raised there)
            put(error)

    thread = threading.Thread(target=encode_all, name="bertforge-tokenizer", daemon=True)
    thread.start()
    try:
        while (entry := chunks.get()) is not None:
            if isinstance(entry, BertforgeError):
                raise entry
            if isinstance(entry, BaseException):
                raise BertforgeError(f"tokenizing the inputs failed: {first_line(entry)}") from entry
            yield entry
    finally:
        stop.set()
        thread.join()


def _batches(chunks: Iterator[tuple[list[int], list[Example]]], workload: Workload[Item, Example],
             settings: EngineSettings) -> Iterator[tuple[list[int], list[Example]]]:
    """Token-budget batches: add examples while their tokens fit `max_batch_tokens` and they number at most
    `batch_size`; an example over the budget by itself is a batch of one."""
    positions: list[int] = []
    examples: list[Example] = []
    tokens = 0
    for chunk_positions, chunk_examples in chunks:
        for position, example in zip(chunk_positions, chunk_examples, strict=True):
            cost = workload.tokens(example)
            if examples and (tokens + cost > settings.max_batch_tokens or len(examples) >= settings.batch_size):
                yield positions, examples
                positions, examples, tokens = [], [], 0
            positions.append(position)
            examples.append(example)
            tokens += cost
    if examples:
        yield positions, examples


# ---------------------------------------------------------------------------------------------
# the common case: one text or a text pair per input, BERT's layout


def size_of_text(item: str | tuple[str, ...]) -> int:
    """Characters of a text, or of a pair's texts together."""
    return len(item) if isinstance(item, str) else sum(len(text) for text in item)


def text_encoder(tokenizer: Tokenizer | str | Path, max_length: int) -> Callable[[list[Any]], list[dict[str, Any]]]:
    """`encode` for texts or (text, pair) tuples: BERT's layout, longest-first truncation at `max_length`.
    Each example holds `input_ids` and `token_type_ids` (what `collate_unpadded` reads), the tokenizer's
    `encoding` (offsets, words) and whether truncation cut it."""
    from bertforge.data.labeled import bert_tokenizer

    if isinstance(tokenizer, str | Path):
        file = Path(tokenizer) / "tokenizer.json" if Path(tokenizer).is_dir() else Path(tokenizer)
        stamp = file.stat().st_mtime_ns if file.is_file() else None  # a missing file: bert_tokenizer says so
        configured = _configured_tokenizer(str(tokenizer), stamp, max_length)
    else:
        configured = bert_tokenizer(tokenizer, max_length)

    def encode(items: list[Any]) -> list[dict[str, Any]]:
        return [{"input_ids": np.asarray(e.ids, dtype=np.int32), "token_type_ids": np.asarray(e.type_ids, dtype=np.int8),
                 "encoding": e, "truncated": bool(e.overflowing)} for e in configured.encode_batch(items)]

    return encode


@functools.lru_cache(maxsize=16)
def _configured_tokenizer(path: str, stamp: int | None, max_length: int) -> Tokenizer:
    """One configured copy per tokenizer file (and its modification time) and length: reading a 30k-entry
    tokenizer.json takes 0.14-0.3 s, which a server or a Ray actor would otherwise pay on every batch it runs.
    The copy is only read from (encode_batch), so the runs that share it cannot change it."""
    from bertforge.data.labeled import bert_tokenizer

    return bert_tokenizer(path, max_length)


def tokens_of(example: dict[str, Any]) -> int:
    return len(example["input_ids"])


def was_truncated(example: dict[str, Any]) -> bool:
    return bool(example["truncated"])


def text_workload(tokenizer: Tokenizer | str | Path, max_length: int,
                  split: Callable[[Any, list[dict[str, Any]]], list[Any]]) -> Workload[Any, dict[str, Any]]:
    """Texts (or pairs) -> `collate_unpadded` batches; `split` turns a batch's outputs into one result each."""
    from bertforge.data.labeled import collate_unpadded

    return Workload(encode=text_encoder(tokenizer, max_length), tokens=tokens_of, collate=collate_unpadded,
                    split=split, size=size_of_text, truncated=was_truncated)


def rows_of(outputs: torch.Tensor, examples: list[Any]) -> list[torch.Tensor]:
    """`split` for a model that returns one row per input (logits, vectors)."""
    return list(outputs.float().unbind(0))


def torch_backend(model: nn.Module, output: Callable[[Any], Any] = lambda out: out,
                  extra: tuple[str, ...] = ()) -> Backend:
    """Eager PyTorch on the model's device: its forward on the batch's model inputs (plus the head's `extra`
    fields), and `output` of what it returns (e.g. the logits)."""
    from bertforge.batch import model_inputs
    from bertforge.device import batch_on_device, model_device

    device = model_device(model)

    def forward(batch: Batch) -> Any:
        result = output(model(**batch_on_device(model_inputs(batch, extra=extra), device)))
        return result.cpu() if isinstance(result, torch.Tensor) else result

    return forward
