"""Dynamic batching: one batcher task per served model gathers concurrent requests into one engine run.

A request's inputs wait in the model's queue; the batcher takes the first, then every request with the same
work (`served.Work`) that arrives within `max_wait` seconds, until the group holds about `max_batch_tokens`
tokens (estimated from characters before tokenizing). The group's inputs go to the model's worker thread as
one `ServedModel.run` call, which is one run of the inference engine: it sorts them by length and cuts the
exact token-budget batches. While the model runs, new requests queue up and form the next group, so the
busier the server, the fuller its batches.

Lingering (`--linger`, off by default): clients that send their next request as soon as the last one is
answered (a closed loop) fall into alternating groups: at 8 clients, 4 of them run while the other 4 queue;
when the run ends the queued 4 start at once, and the first 4 resend while they run, so every run holds ~4
texts. With `linger` > 0 a group waits, beyond `max_wait`, while it holds fewer requests than were queued or
running during the last model run (the requests just answered are likely to come back), for at most `linger`
times the merged run's estimated time; a lone client is never held by it (its group of one holds as many
requests as the last run saw). It merges the groups (8 clients: 5.7-7.4 texts per run against 3.7-4.0), and
one run of 8 glosses costs 0.62-0.96x two runs of 4 (all-MiniLM-L6-v2, 2 threads; `python -m benchmarks.serve
--batch-cost 30`), but the model then idles for the clients' round trip every run, where the alternating
groups overlap one group's HTTP work with the other's run. On idle 2 cores `--linger 0.25` gave 1.25x the
requests/s at 8 clients but 0.89x at 32 with a worse p99 (one run of benchmarks/serve.py, docs/benchmarks.md);
loaded, 0.65-1.68x over 8 interleaved rounds at 8 clients. So it stays off unless measured to pay where the
server runs (benchmarks/serve.py measures both).

The queue is bounded: a request beyond `max_queue` waiting or running is refused at once (`QueueFull`, a 429)
instead of waiting without end. A group whose run fails is run again one request at a time, so a bad request
(a text without [MASK]) fails alone instead of failing its neighbours.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bertforge.serving.metrics import ServerMetrics
from bertforge.serving.served import ServedModel, Work

CHARACTERS_PER_TOKEN = 4  # a group's size before tokenizing: English WordPiece averages about 4 characters a token
TOKENS_PER_TEXT = 2  # [CLS] and [SEP]


class QueueFull(Exception):
    """The model's queue holds `max_queue` requests: the client should retry after `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Job:
    work: Work
    inputs: list[Any]
    tokens: int  # estimated
    future: asyncio.Future[list[Any]]
    queued: float  # time.perf_counter() when it was submitted


def estimated_tokens(inputs: list[Any]) -> int:
    characters = sum(len(item) if isinstance(item, str) else sum(map(len, item)) for item in inputs)
    return characters // CHARACTERS_PER_TOKEN + TOKENS_PER_TEXT * len(inputs)


class Batcher:
    def __init__(self, model: ServedModel, *, max_batch_tokens: int, max_wait: float, max_queue: int,
                 metrics: ServerMetrics, linger: float = 0.0) -> None:
        self.model = model
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait
        self.linger = linger  # the share of the merged run's time a group waits for the last run's clients
        self.max_queue = max_queue
        self.metrics = metrics
        self.pending = 0  # requests queued or running
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.held: deque[Job] = deque()  # taken while gathering another work's group: first in the next one
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"bertforge-model-{model.name}")
        self.last_run_seconds = 0.0
        self.last_run_requests = 0  # the requests the last run held
        self.run_requests = 0  # the most requests queued or running during the last model run (see the docstring)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._serve(), name=f"batcher-{self.model.name}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        self.executor.shutdown(wait=True)

    async def submit(self, work: Work, inputs: list[Any]) -> list[Any]:
        """One result per input, once a group holding them has run; `QueueFull` when the queue is full."""
        if self.pending >= self.max_queue:
            raise QueueFull(max(1, round(self.last_run_seconds * 2)))
        self.pending += 1
        self.run_requests = max(self.run_requests, self.pending)
        self._show_depth()
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self.queue.put_nowait(Job(work, inputs, estimated_tokens(inputs), future, time.perf_counter()))
        try:
            return await future
        finally:
            self.pending -= 1
            self._show_depth()

    def _show_depth(self) -> None:
        self.metrics.queue_depth.labels(self.model.name).set(self.pending)

    async def _serve(self) -> None:
        while True:
            group = [job for job in await self._gather() if not job.future.done()]  # a cancelled client's job: dropped
            if group:
                starting = time.perf_counter()
                for job in group:
                    self.metrics.queue_seconds.labels(self.model.name).observe(starting - job.queued)
                self.run_requests = self.pending  # from here to the run's end: the requests queued or running
                self.last_run_requests = len(group)
                await self._run(group)

    async def _gather(self) -> list[Job]:
        first = self.held.popleft() if self.held else await self.queue.get()
        group, tokens = [first], first.tokens
        for job in list(self.held):  # held jobs of the same work join first, in arrival order
            if tokens >= self.max_batch_tokens:
                break
            if job.work == first.work:
                self.held.remove(job)
                group.append(job)
                tokens += job.tokens
        gathering = time.monotonic()
        deadline = gathering + self.max_wait
        # the merged run's time, guessed from the last run's time per request (a guess on the long side: a run's
        # time grows slower than its texts); from the last run alone, a run of 4 would let the next group wait
        # only for a quarter of a run of 4, shorter than the answered clients' round trip on a loaded machine,
        # and the alternating groups would stay apart
        merged_run = self.last_run_seconds * max(1.0, self.run_requests / max(1, self.last_run_requests))
        linger_deadline = gathering + max(self.max_wait, self.linger * merged_run)
        while tokens < self.max_batch_tokens:
            expected = len(group) < self.run_requests  # the last run's clients may not all be back yet
            try:
                remaining = (linger_deadline if expected else deadline) - time.monotonic()
                job = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self.queue.get(), remaining)
            except (asyncio.QueueEmpty, TimeoutError):
                break
            if job.work != first.work:
                self.held.append(job)
                continue
            group.append(job)
            tokens += job.tokens
        return group

    async def _run(self, group: list[Job]) -> None:
        inputs = [item for job in group for item in job.inputs]
        try:
            results = await self._on_worker(lambda: self.model.run(group[0].work, inputs), len(inputs))
        except Exception as error:  # noqa: BLE001  (handed to the requests, or narrowed down to the bad one)
            if len(group) == 1:
                _settle(group[0].future, error=error)
                return
            for job in group:
                await self._run([job])
            return
        start = 0
        for job in group:
            _settle(job.future, results=results[start:start + len(job.inputs)])
            start += len(job.inputs)

    async def _on_worker(self, call: Callable[[], list[Any]], texts: int) -> list[Any]:
        started = time.perf_counter()
        results = await asyncio.get_running_loop().run_in_executor(self.executor, call)
        self.last_run_seconds = time.perf_counter() - started
        self.metrics.batch_texts.labels(self.model.name).observe(texts)
        self.metrics.batch_seconds.labels(self.model.name).observe(self.last_run_seconds)
        return results


def _settle(future: asyncio.Future[list[Any]], *, results: list[Any] | None = None,
            error: BaseException | None = None) -> None:
    if future.done():  # the client went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(results or [])
