"""Data in object storage, against a real S3 server (SeaweedFS on 127.0.0.1, `s3_server` in conftest.py).

Every test reaches the server the way a user reaches AWS, MinIO or Ceph: the standard AWS variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and `s3://` URLs; nothing of bertforge
or s3fs is replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import numpy as np
import pytest
from helpers.s3_server import BUCKET

from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.shards import PretokenizedDataset

if TYPE_CHECKING:
    from helpers.s3_server import SeaweedServer

ROOT = Path(__file__).resolve().parents[1]
SMALL_CHUNKS = PrepareSettings(nsp=True, split=(9, 1), chunk_bytes=16 << 10)  # a dozen shards from the slice


def cli(*arguments: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """`bertforge ARGS` in a fresh process that inherits the test's AWS variables."""
    return subprocess.run([sys.executable, "-m", "bertforge.cli", *arguments], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "COLUMNS": "1000", **(env or {})})


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed, checked to be one line with exit code 2."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def objects(url: str) -> list[str]:
    fs, path = fsspec.core.url_to_fs(url)
    return sorted(p[len(path) + 1:] for p in fs.find(path))


@pytest.fixture(scope="module")
def prepared_in_bucket(s3_server: SeaweedServer, corpus_slice: Path, tokenizer_dir: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> str:
    """`corpus_slice` prepared into the bucket (a dozen shards). Read-only: a test that changes objects
    prepares its own."""
    url = f"s3://{BUCKET}/module-{uuid.uuid4().hex[:8]}/data"
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_server.environment().items():
            patch.setenv(name, value)
        patch.setenv("BERTFORGE_CACHE", str(tmp_path_factory.mktemp("prepare-cache")))
        prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, url, SMALL_CHUNKS, workers=0, progress=False)
    return url


def test_prepare_into_a_bucket_reads_back_sample_for_sample(s3_prefix: str, corpus_slice: Path, tokenizer_dir: Path,
                                                            tmp_path: Path) -> None:
    url = f"{s3_prefix}/data"
    done = cli("prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--out", url,
               "--nsp", "--split", "9,1", "--chunk-mb", str(16 / 1024), "--workers", "0")
    assert done.returncode == 0, done.stderr
    local = tmp_path / "local"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, local, SMALL_CHUNKS, workers=0, progress=False)
    stored = objects(url)
    assert "index.json" in stored and any(name.endswith(".tokens.npy") for name in stored)
    for split in ("train", "validation"):
        remote, expected = PretokenizedDataset(url, split), PretokenizedDataset(local, split)
        assert len(remote) == len(expected) > 0
        assert all(np.array_equal(remote[i], expected[i]) for i in range(len(expected)))
        assert [remote.next_sentence_label(i) for i in range(len(remote))] == \
               [expected.next_sentence_label(i) for i in range(len(expected))]
    again = cli("prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--out", url,
                "--nsp", "--split", "9,1", "--chunk-mb", str(16 / 1024), "--workers", "0")
    assert again.returncode == 0 and "up to date" in again.stderr, again.stderr


TINY_PRETRAIN = ["model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
                 "model.num_layers=1", "data.num_workers=1", "train.micro_batch_size=8", "train.global_batch_size=16",
                 "train.max_steps=3", "train.log_every=1", "log.progress=false", "log.tensorboard=false",
                 "data.validation_samples=16", "train.eval_every=3", "train.checkpoint_every=3"]


def pretrain(data: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`bertforge pretrain CONFIG data.path=DATA`: a tiny model, 3 steps, an evaluation and a checkpoint."""
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(f"run: {{name: {run_dir.name}, output_dir: {run_dir.parent}}}\n", encoding="utf-8")
    return cli("-q", "pretrain", str(config), f"data.path={data}", *TINY_PRETRAIN, *extra)


def test_pretrain_trains_from_a_bucket(prepared_in_bucket: str, s3_environment: dict[str, str], tmp_path: Path) -> None:
    done = pretrain(prepared_in_bucket, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]
    assert any(r["split"] == "validation" for r in rows)


def shard_files_in(cache: Path) -> list[Path]:
    return sorted(p for p in cache.rglob("*.npy"))


def test_opening_a_bucket_dataset_fetches_shards_only_when_read(prepared_in_bucket: str, s3_environment: dict[str, str],
                                                               tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    dataset = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=cache)
    assert len(dataset.shards) > 4
    assert shard_files_in(cache) == []  # the manifest and the tokenizer only
    assert (dataset.tokenizer_path / "tokenizer.json").is_file()
    last = len(dataset) - 1
    dataset[last]
    assert [p.name.split(".")[0] for p in shard_files_in(cache)] == [dataset.shards[-1].name] * 3  # tokens, offsets, pairs
    from bertforge.data.pretraining_loader import FetchingSampler, MicroBatch

    micro_batches = [MicroBatch(0, np.array([0, 1])), MicroBatch(0, np.array([len(dataset) // 2]))]
    fetching = iter(FetchingSampler(micro_batches, dataset, lookahead=1))
    first = next(fetching)
    assert dataset.cache is not None and dataset.cache.is_local(dataset.shards_of(first.indices)[0])
    list(fetching)
    dataset.close()
    wanted = {dataset.shards[i].name for i in [0, *dataset.shards_of([len(dataset) // 2]), len(dataset.shards) - 1]}
    assert {p.name.split(".")[0] for p in shard_files_in(cache)} == wanted


FETCH_ALL = """
import sys, time
from pathlib import Path
from bertforge.data.shards import PretokenizedDataset
dataset = PretokenizedDataset(sys.argv[1], "train", cache_dir=sys.argv[2])
Path(sys.argv[3]).touch()
while len(list(Path(sys.argv[3]).parent.glob("ready-*"))) < 2:  # start fetching together
    time.sleep(0.01)
print(dataset.fetch(range(len(dataset.shards))))
"""


def test_two_processes_racing_for_one_cache_download_each_file_once(prepared_in_bucket: str,
                                                                    s3_environment: dict[str, str], tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    (tmp_path / "start").mkdir()
    racers = [subprocess.Popen([sys.executable, "-c", FETCH_ALL, prepared_in_bucket, str(cache),
                                str(tmp_path / "start" / f"ready-{i}")], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [racer.communicate(timeout=120) for racer in racers]
    assert all(racer.returncode == 0 for racer in racers), results
    downloads = [int(out.strip()) for out, _ in results]
    dataset = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=cache)
    files = sum(len(shard.files) for shard in dataset.shards)
    assert sum(downloads) == files  # each file downloaded by exactly one of them
    assert not list(cache.rglob("*.tmp-*"))
    assert dataset.fetch(range(len(dataset.shards))) == 0
    for shard in dataset.shards:  # every file whole and verified
        for entry in shard.files.values():
            import hashlib

            assert hashlib.sha256((cache / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
