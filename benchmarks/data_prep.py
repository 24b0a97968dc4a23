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


def make_corpora(work: Path, big_mb: int) -> dict[str, Path]:
    from bertforge.data.bundled import corpus_path

    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        text = f.read()
    bundled = work / "bundled.txt"
    bundled.write_text(text, encoding="utf-8")
    documents = text.rstrip("\n").split("\n\n")
    big = work / f"big-{big_mb}mb.txt"
    rng = random.Random(0)
    written = 0
    with open(big, "w", encoding="utf-8") as f:
        while written < big_mb * 1_000_000:
            shuffled = documents[:]
            rng.shuffle(shuffled)
            for document in shuffled:
                f.write(document + "\n\n")
                written += len(document.encode("utf-8")) + 2
    return {"bundled": bundled, f"{big_mb} MB": big}


def prepare_with_bertforge(corpus: Path, tokenizer: Path, out: Path, workers: int) -> tuple[float, int]:
    code = ("import sys; from bertforge.data.prepare import prepare_pretraining_data, PrepareSettings; "
            "prepare_pretraining_data([sys.argv[1]], sys.argv[2], sys.argv[3], PrepareSettings(seq_len=int(sys.argv[4])),"
            " workers=int(sys.argv[5]), progress=False)")
    seconds, peak, _ = run_measured([sys.executable, "-c", code, str(corpus), str(tokenizer), str(out), str(SEQ_LEN),
                                     str(workers)])
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


def loader_samples_per_second(data: Path, workers: int, batches: int) -> float:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 MB instead of 200 MB, shorter loader runs")
    parser.add_argument("--big-mb", type=int, default=None, help="size of the large corpus (default 200, quick 20)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes for both pipelines (default 2)")
    parser.add_argument("--reference-python", default=None, help="interpreter where mosaicml-streaming imports")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()
    big_mb = args.big_mb or (20 if args.quick else 200)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bertforge-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    python, writer = reference_interpreter(args.reference_python)

    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    tokenizer = work / "tokenizer"
    if not (tokenizer / "tokenizer.json").exists():
        train_tokenizer_from_inputs(["bundled:corpus"], tokenizer, vocab_size=VOCAB)
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
    batches = 40 if args.quick else 200
    print("\n### Loader: samples/s (seq 128, dynamic masking, unpadded layout, micro-batch 256)\n")
    print("| workers | samples/s |")
    print("|---:|---:|")
    for workers in (0, 1, 2):
        print(f"| {workers} | {loader_samples_per_second(data, workers, batches):,.0f} |")
    print(json.dumps({"workdir": str(work), "reference_writer": writer}), file=sys.stderr)
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
