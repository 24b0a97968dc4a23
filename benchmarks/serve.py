"""Serving embeddings over HTTP: `bertforge serve` against a FastAPI wrapper around `SentenceTransformer.encode`.

bertforge serve runs twice, as by default and with `--linger 0.25` (batches wait for the clients the last
run answered: bertforge.serving.batcher), to show whether merging the alternating groups pays here. The servers
hold all-MiniLM-L6-v2 and answer OpenAI's `POST /v1/embeddings`; each runs as its own process on
127.0.0.1, with torch's default threads. The wrapper is written the way FastAPI's and sentence-transformers' docs
suggest: one model loaded at start-up, a plain `def` endpoint (FastAPI runs it on its thread pool) that calls
`model.encode(texts)` for each request; no batching across requests. For each of `--concurrency` (1, 8, 32
clients) the three servers are measured back to back (the ratio is taken within one run, minutes apart at most):
every client sends one real gloss per request (bundled supersense glosses, ~18 tokens) back to back for
`--seconds`, after a warm-up, over keep-alive connections (httpx, asyncio, in this process). Reported:
requests/s (= texts/s), p50 and p99 latency, the largest difference between bertforge's and the wrapper's vectors, and,
from bertforge's /metrics, what its batcher did at each level: texts per model run, mean queue wait, mean run.
The load generator shares the machine's cores with the server it measures, equally for both. Last, for what
batching across requests can approach, the batch engine in this process (`embed_run`, the engine
`bertforge embed` runs) on the same glosses, with the servers idle. The wrapper's figures are those of its level in the same run.

    .venv/bin/python -m benchmarks.serve
    .venv/bin/python -m benchmarks.serve --concurrency 1 8 32 --seconds 20 --out benchmarks/results/serve.json

`--batch-cost REPEATS` measures instead what batching can gain: the served model's time for one run of
1, 2, 4, 8 and 16 glosses (in process, 2 threads, the sizes interleaved, REPEATS rounds; median and tenth
percentile), i.e. whether one run of 8 costs less than two runs of 4 (the batcher's linger rule rests on it).

    .venv/bin/python -m benchmarks.serve --batch-cost 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
from pydantic import BaseModel

from bertforge.serving.server import KEEP_ALIVE_SECONDS

MODEL = "all-MiniLM-L6-v2"
WRAPPER = "FastAPI + SentenceTransformer.encode"
LINGER = 0.25  # bertforge serve is measured as it is by default and with --linger at this share
BATCH_SIZES = (1, 2, 4, 8, 16)
STARTUP_SECONDS = 300


@dataclass
class Level:
    server: str
    clients: int
    requests: int
    seconds: float
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    failed: int
    # bertforge serve's batcher over the level (from /metrics; None for the wrapper): texts per model run,
    # mean seconds a request waited for its run, mean seconds of a run
    texts_per_run: float | None = None
    queue_wait_ms: float | None = None
    run_ms: float | None = None


class EmbeddingsRequest(BaseModel):
    input: str | list[str]
    model: str


def wrapper_app():  # type: ignore[no-untyped-def]
    """The comparison server: FastAPI around SentenceTransformer.encode, as the libraries' docs show."""
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    from bertforge.locate import resolve_model

    model = SentenceTransformer(str(resolve_model(MODEL).path), device="cpu")
    app = FastAPI()

    @app.post("/v1/embeddings")
    def embeddings(request: EmbeddingsRequest) -> dict:
        texts = [request.input] if isinstance(request.input, str) else request.input
        vectors = model.encode(texts)
        return {"object": "list", "model": request.model,
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}

    return app


def serve_wrapper() -> None:
    """`python -m benchmarks.serve --wrapper`: run the comparison server, printing its address as bertforge does."""
    import socket

    import uvicorn

    app = wrapper_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"serving 1 model on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    # bertforge serve's keep-alive, so that the two differ in what they run, not in how long connections live
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=KEEP_ALIVE_SECONDS)
    uvicorn.Server(config).run(sockets=[sock])


def start(command: list[str]) -> tuple[subprocess.Popen[str], str]:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        if found := re.search(r"on (http://\S+)", process.stdout.readline()):
            return process, found[1]
    process.kill()
    raise SystemExit(f"{' '.join(command)} did not start")


async def measure(name: str, url: str, texts: list[str], clients: int, seconds: float, warmup: float) -> Level:
    latencies: list[float] = []
    failed = 0

    async def client(http: httpx.AsyncClient, number: int, until: float, record: bool) -> None:
        nonlocal failed
        sent = 0
        while time.monotonic() < until:
            text = texts[(number * 7919 + sent) % len(texts)]
            started = time.perf_counter()
            try:
                response = await http.post("/v1/embeddings", json={"model": MODEL, "input": [text]})
                ok = response.status_code == 200
            except httpx.TransportError as error:  # counted, and shown, as a failed request
                print(f"  {name}: {type(error).__name__}: {error}", flush=True)
                ok = False
            if record:
                latencies.append(time.perf_counter() - started)
                failed += not ok
            sent += 1

    # one client, a keep-alive connection per concurrent caller (a client each would load its TLS certificates,
    # ~50 ms of this process's CPU apiece, while the others' clocks run)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        await asyncio.gather(*(client(http, n, time.monotonic() + warmup, False) for n in range(clients)))
        started = time.monotonic()
        await asyncio.gather(*(client(http, n, started + seconds, True) for n in range(clients)))
    elapsed = time.monotonic() - started  # the last requests end after `seconds`
    ordered = sorted(latencies)
    return Level(name, clients, len(ordered), elapsed, len(ordered) / elapsed, statistics.median(ordered) * 1000,
                 ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000, failed)


BATCHER_METRICS = ("bertforge_batch_texts_count", "bertforge_batch_texts_sum", "bertforge_batch_seconds_sum",
                   "bertforge_queue_seconds_count", "bertforge_queue_seconds_sum")


def batcher_totals(url: str) -> dict[str, float]:
    """bertforge serve's batcher counters so far (Prometheus text format, one model)."""
    text = httpx.get(url + "/metrics", timeout=60).text
    return {name: float(found[1]) if (found := re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)) else 0.0
            for name in BATCHER_METRICS}


def with_batcher(level: Level, before: dict[str, float], after: dict[str, float]) -> Level:
    runs, texts, seconds, queued, waited = (after[name] - before[name] for name in BATCHER_METRICS)
    level.texts_per_run = texts / runs if runs else None
    level.run_ms = seconds / runs * 1000 if runs else None
    level.queue_wait_ms = waited / queued * 1000 if queued else None
    return level


def batch_cost(texts: list[str], repeats: int) -> list[dict[str, float]]:
    """Seconds of one served-model run of n glosses, n in BATCH_SIZES, interleaved (alternate rounds reversed)."""
    import torch

    from bertforge.console import hide_progress
    from bertforge.engine import EngineSettings
    from bertforge.serving.served import load_served

    hide_progress()
    torch.set_num_threads(2)
    served = load_served(MODEL, EngineSettings(label="serving"))
    times: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    cpu: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}  # the process's CPU seconds: less sensitive
    # than wall-clock time to the other processes on a shared machine
    for size in BATCH_SIZES:  # warm-up
        served.run(("vectors",), texts[:size])
    offset = 0
    for round_number in range(repeats):
        for size in BATCH_SIZES if round_number % 2 == 0 else BATCH_SIZES[::-1]:
            batch = texts[offset:offset + size]
            offset = (offset + size) % (len(texts) - max(BATCH_SIZES))
            started, cpu_started = time.perf_counter(), time.process_time()
            served.run(("vectors",), batch)
            times[size].append(time.perf_counter() - started)
            cpu[size].append(time.process_time() - cpu_started)
    rows = []
    for size, seconds in times.items():
        median, tenth = statistics.median(seconds), sorted(seconds)[len(seconds) // 10]
        cpu_median = statistics.median(cpu[size])
        rows.append({"texts": size, "median_ms": median * 1000, "p10_ms": tenth * 1000,
                     "texts_per_second": size / median, "cpu_median_ms": cpu_median * 1000})
        print(f"{size:3d} texts per run: median {median * 1000:7.1f} ms, p10 {tenth * 1000:7.1f} ms, "
              f"{size / median:6.1f} texts/s; CPU median {cpu_median * 1000:7.1f} ms", flush=True)
    by_size = {row["texts"]: row for row in rows}
    for key in ("median_ms", "p10_ms", "cpu_median_ms"):
        print(f"one run of 8 / two runs of 4 ({key.removesuffix('_ms')}): {by_size[8][key] / (2 * by_size[4][key]):.2f}")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return rows


def vectors_of(url: str, texts: list[str]) -> np.ndarray:
    answer = httpx.post(url + "/v1/embeddings", json={"model": MODEL, "input": texts}, timeout=300).json()
    return np.array([item["embedding"] for item in answer["data"]])


def engine_texts_per_second(texts: list[str]) -> float:
    from bertforge.console import hide_progress
    from bertforge.embed import embed_run, load_embedder

    hide_progress()
    embedder = load_embedder(MODEL)
    embed_run(embedder, texts[:64])  # warm-up
    started = time.perf_counter()
    embed_run(embedder, texts)
    return len(texts) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--batch-cost", type=int, default=None, metavar="REPEATS",
                        help="measure the model's time per run of 1-16 glosses instead (no servers)")
    parser.add_argument("--wrapper", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.wrapper:
        serve_wrapper()
        return
    from bertforge.inference import read_inputs

    texts = read_inputs("bundled:supersense/train").texts[:2000]
    if args.batch_cost is not None:
        rows = batch_cost(texts, args.batch_cost)
        if args.out is not None:
            args.out.write_text(json.dumps({"model": MODEL, "threads": 2, "repeats": args.batch_cost,
                                            "runs": rows}, indent=1) + "\n")
        return
    serve = [sys.executable, "-m", "bertforge.cli", "serve", MODEL, "--port", "0"]
    servers = {"bertforge serve": start(serve),
               f"bertforge serve --linger {LINGER}": start([*serve, "--linger", str(LINGER)]),
               WRAPPER: start([sys.executable, "-m", "benchmarks.serve", "--wrapper"])}
    try:
        ours, theirs = servers["bertforge serve"][1], servers[WRAPPER][1]
        difference = float(np.abs(vectors_of(ours, texts[:64]) - vectors_of(theirs, texts[:64])).max())
        print(f"{MODEL}, one gloss per request; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
              f"max |vector difference| between the servers {difference:.1e}")
        levels: list[Level] = []
        for clients in args.concurrency:
            measured = {}
            for name, (_, url) in servers.items():
                before = batcher_totals(url) if name != WRAPPER else {}
                level = asyncio.run(measure(name, url, texts, clients, args.seconds, args.warmup))
                if name != WRAPPER:  # the warm-up's runs counted too: the batcher behaves the same in both
                    level = with_batcher(level, before, batcher_totals(url))
                measured[name] = level
                batching = (f"  {level.texts_per_run:.1f} texts/run, queue wait {level.queue_wait_ms:.0f} ms, "
                            f"run {level.run_ms:.0f} ms" if level.texts_per_run is not None else "")
                print(f"{clients:3d} clients  {name:38s} {level.requests_per_second:7.1f} requests/s  "
                      f"p50 {level.p50_ms:7.1f} ms  p99 {level.p99_ms:7.1f} ms  failed {level.failed}{batching}",
                      flush=True)
            wrapper = measured[WRAPPER]
            for name, level in measured.items():
                if name != WRAPPER:
                    print(f"{clients:3d} clients  {name}: throughput ratio "
                          f"{level.requests_per_second / wrapper.requests_per_second:.2f}x, p99 ratio "
                          f"{level.p99_ms / wrapper.p99_ms:.2f}  (load average {os.getloadavg()[0]:.1f})", flush=True)
            levels += measured.values()
        engine_rate = engine_texts_per_second(texts[:1000])
        print(f"batch engine in process (bertforge embed's): {engine_rate:.1f} texts/s on 1,000 glosses "
              f"(load average {os.getloadavg()[0]:.1f})")
        if args.out is not None:
            args.out.write_text(json.dumps({"model": MODEL, "max_vector_difference": difference,
                                            "engine_texts_per_second": engine_rate,
                                            "levels": [asdict(level) for level in levels]}, indent=1) + "\n")
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)


if __name__ == "__main__":
    main()
