"""Data in object storage, against a real S3 server (SeaweedFS on 127.0.0.1, `s3_server` in conftest.py).

Every test reaches the server the way a user reaches AWS, MinIO or Ceph: the standard AWS variables
(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) and `s3://` URLs; nothing of bertforge
or s3fs is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import numpy as np
import pytest
from helpers.flaky_proxy import FlakyProxy
from helpers.s3_server import BUCKET

from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.shards import PretokenizedDataset
from bertforge.errors import DataError

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


def run_main(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    """`bertforge ARGS` in this process (the heavy imports are paid once): exit code and stderr's text."""
    from bertforge.cli import main

    capsys.readouterr()
    code = main(list(arguments))
    return code, " ".join(capsys.readouterr().err.split())


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


@pytest.fixture(scope="module")
def prepared_locally(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`prepared_in_bucket`'s dataset prepared into a local directory in one go: what a dataset in the bucket,
    prepared at once or merged from parts, must equal sample for sample. Read-only."""
    local = tmp_path_factory.mktemp("prepared-locally") / "data"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, local, SMALL_CHUNKS, workers=0, progress=False)
    return local


def test_prepare_into_a_bucket_reads_back_sample_for_sample(s3_prefix: str, corpus_slice: Path, tokenizer_dir: Path,
                                                            prepared_locally: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    url = f"{s3_prefix}/data"
    arguments = ["prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--out", url,
                 "--nsp", "--split", "9,1", "--chunk-mb", str(16 / 1024), "--workers", "0"]
    code, err = run_main(capsys, *arguments)
    assert code == 0, err
    stored = objects(url)
    assert "index.json" in stored and any(name.endswith(".tokens.npy") for name in stored)
    for split in ("train", "validation"):
        remote, expected = PretokenizedDataset(url, split), PretokenizedDataset(prepared_locally, split)
        assert len(remote) == len(expected) > 0
        assert all(np.array_equal(remote[i], expected[i]) for i in range(len(expected)))
        assert [remote.next_sentence_label(i) for i in range(len(remote))] == \
               [expected.next_sentence_label(i) for i in range(len(expected))]
    code, err = run_main(capsys, *arguments)
    assert code == 0 and "up to date" in err, err


TINY_PRETRAIN = ["model.preset=bert-tiny", "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
                 "model.num_layers=1", "data.num_workers=1", "train.micro_batch_size=8", "train.global_batch_size=16",
                 "train.max_steps=3", "train.log_every=1", "log.progress=false", "log.tensorboard=false", "log.plots=false",
                 "data.validation_samples=16", "train.eval_every=3", "train.checkpoint_every=3"]


def write_run_config(run_dir: Path) -> Path:
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(f"run: {{name: {run_dir.name}, output_dir: {run_dir.parent}}}\n", encoding="utf-8")
    return config


def pretrain(data: str, run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`bertforge pretrain CONFIG data.path=DATA` in a new process: a tiny model, 3 steps, an evaluation and a
    checkpoint."""
    return cli("-q", "pretrain", str(write_run_config(run_dir)), f"data.path={data}", *TINY_PRETRAIN, *extra)


def test_pretrain_trains_from_a_bucket(prepared_in_bucket: str, s3_environment: dict[str, str], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    # in this process (a data-loader worker forked from it reads the bucket); a process's one line after a
    # bucket error is test_a_shard_changed_in_the_bucket_after_preparation_is_named's
    code, err = run_main(capsys, "-q", "pretrain", str(write_run_config(tmp_path / "run")),
                         f"data.path={prepared_in_bucket}", *TINY_PRETRAIN)
    assert code == 0, err
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
    assert list(FetchingSampler(micro_batches, dataset, lookahead=1)) == micro_batches
    dataset.close()  # waits for the background downloads the sampler queued
    wanted = {dataset.shards[i].name for i in [0, *dataset.shards_of([len(dataset) // 2]), len(dataset.shards) - 1]}
    assert {p.name.split(".")[0] for p in shard_files_in(cache)} == wanted


FETCH_ALL = """
import sys, time
from pathlib import Path
from bertforge.data.shards import PretokenizedDataset
from bertforge.errors import DataError
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


def upload(local: Path, url: str) -> str:
    fs, path = fsspec.core.url_to_fs(url)
    fs.put_file(str(local), path)
    return url


def test_finetune_and_predict_read_labeled_files_from_a_bucket(s3_prefix: str, data_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from helpers.finetuning import TINY_MODEL, minilm_dir, supersense_files

    overrides = supersense_files(data_dir, train=48, validation=16, test=16)
    remote = []
    for override in overrides[:3]:  # train, validation, test files -> s3:// URLs
        key, _, local = override.partition("=")
        remote.append(f"{key}={upload(Path(local), f'{s3_prefix}/{Path(local).name}')}")
    config = tmp_path / "finetune.yaml"
    config.write_text(f"run: {{name: run, output_dir: {tmp_path}}}\n", encoding="utf-8")
    code, err = run_main(capsys, "-q", "finetune", str(config), *TINY_MODEL, *remote, overrides[3],
                         f"model.tokenizer={minilm_dir()}", "finetune.max_length=32", "train.max_steps=2",
                         "train.micro_batch_size=16", "train.global_batch_size=16", "data.num_workers=0",
                         "log.tensorboard=false", "log.plots=false", "log.progress=false")
    assert code == 0, err
    assert (tmp_path / "run" / "test_results.json").is_file()
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"{s3_prefix}/supersense-train-48.jsonl" in saved  # the run records the URL, not the cache copy
    predictions = tmp_path / "predictions.jsonl"
    code, err = run_main(capsys, "predict", str(tmp_path / "run"), "--input", f"{s3_prefix}/supersense-test-16.jsonl",
                         "--out", str(predictions))
    assert code == 0, err
    assert len(predictions.read_text().splitlines()) == 16
    code, err = run_main(capsys, "predict", str(tmp_path / "run"), "--input", f"{s3_prefix}/no-such-file.jsonl",
                         "--out", str(tmp_path / "none.jsonl"))
    assert code == 2 and f"{s3_prefix}/no-such-file.jsonl: no such object" in err, err


def test_export_writes_a_model_directory_to_a_bucket_and_never_over_other_objects(
        s3_prefix: str, tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import transformers

    out = f"{s3_prefix}/exported"
    code, err = run_main(capsys, "export", str(tiny_classifier), "--out", out)
    assert code == 0, err
    names = objects(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    copy = tmp_path / "downloaded"
    fs, path = fsspec.core.url_to_fs(out)
    fs.get(f"{path}/", str(copy), recursive=True)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(copy)
    assert model.config.num_labels > 1
    # an earlier export is replaced only with --overwrite; anything else is never touched
    code, err = run_main(capsys, "export", str(tiny_classifier), "--out", out)
    assert code == 2 and "holds an earlier export" in err and "--overwrite" in err, err
    assert run_main(capsys, "export", str(tiny_classifier), "--out", out, "--overwrite")[0] == 0
    assert objects(out) == names
    fs.pipe_file(f"{fsspec.core.url_to_fs(s3_prefix)[1]}/mine/notes.txt", b"a user's file")
    code, err = run_main(capsys, "export", str(tiny_classifier), "--out", f"{s3_prefix}/mine", "--overwrite")
    assert code == 2 and "is not empty and is not an earlier export (it holds notes.txt)" in err, err
    assert fs.cat_file(f"{fsspec.core.url_to_fs(s3_prefix)[1]}/mine/notes.txt") == b"a user's file"


# ---------------------------------------------------------------------------------------------
# faults against the real server


def test_a_shard_changed_in_the_bucket_after_preparation_is_named(s3_prefix: str, corpus_slice: Path,
                                                                  tokenizer_dir: Path, tmp_path: Path) -> None:
    url = f"{s3_prefix}/data"
    manifest = prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, url, SMALL_CHUNKS, workers=0,
                                        progress=False)
    fs, root = fsspec.core.url_to_fs(url)
    changed = {}
    for shard in manifest["splits"]["train"]["shards"]:  # whichever the first micro-batch reads is changed
        path = shard["files"]["tokens"]["path"]
        data = bytearray(fs.cat_file(f"{root}/{path}"))
        data[-1] ^= 0xFF  # same size, different bytes: only the checksum can tell
        fs.pipe_file(f"{root}/{path}", bytes(data))
        changed[shard["name"]] = f"{url}/{path}"
    line = error_line(pretrain(url, tmp_path / "run"))
    named = [name for name in changed if f"shard {name}: {changed[name]} does not match its checksum" in line]
    assert len(named) == 1, line


def test_wrong_or_missing_credentials_a_missing_bucket_and_a_bad_scheme_are_one_line(
        s3_prefix: str, s3_environment: dict[str, str], prepared_in_bucket: str, corpus_slice: Path,
        tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import s3fs

    def attempt(*arguments: str) -> str:
        s3fs.S3FileSystem.clear_instance_cache()  # as a new process would, under the variables set now
        code, err = run_main(capsys, *arguments)
        assert code == 2 and err.startswith("error: ") and "Traceback" not in err, err
        return err

    prepare = ["prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--workers", "0"]
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    err = attempt(*prepare, "--out", f"{s3_prefix}/data")  # the output guard lists the prefix first
    assert f"{s3_prefix}/data" in err and "access denied" in err and "AWS_SECRET_ACCESS_KEY" in err
    err = attempt("-q", "pretrain", str(write_run_config(tmp_path / "run")),
                  f"data.path={prepared_in_bucket}", *TINY_PRETRAIN)
    assert f"{prepared_in_bucket}/index.json: access denied" in err
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws either
    err = attempt(*prepare, "--out", f"{s3_prefix}/data")
    assert f"{s3_prefix}/data" in err and "no credentials" in err and "AWS_ACCESS_KEY_ID" in err
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_environment["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_environment["AWS_SECRET_ACCESS_KEY"])
    err = attempt("-q", "pretrain", str(write_run_config(tmp_path / "run")), "data.path=s3://no-such-bucket-here/data",
                  *TINY_PRETRAIN)
    assert "s3://no-such-bucket-here/data/index.json: the bucket does not exist" in err
    err = attempt(*prepare, "--out", "nosuchscheme://bucket/data")
    assert "nosuchscheme://bucket/data" in err and "unknown URL scheme" in err


def test_training_continues_when_the_server_goes_down_while_shards_are_fetched_and_comes_back(
        s3_server: SeaweedServer, prepared_in_bucket: str, s3_environment: dict[str, str], tmp_path: Path) -> None:
    cache, log = tmp_path / "cache", tmp_path / "stderr.txt"
    config = write_run_config(tmp_path / "run")
    with open(log, "w") as stderr:
        # botocore's own retries off, so bertforge's backoff shows within seconds (s3fs still retries briefly)
        process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "-q", "pretrain", str(config),
                                    f"data.path={prepared_in_bucket}", f"data.cache_dir={cache}", *TINY_PRETRAIN],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr,
                                   env={**os.environ, "AWS_MAX_ATTEMPTS": "1", "COLUMNS": "1000"})
    try:
        try:
            deadline = time.monotonic() + 180
            while not list(cache.rglob("tokenizer.json")):  # the dataset is open: the tokenizer came with it
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.02)
            s3_server.stop()
            fetched_before_the_outage = len(shard_files_in(cache))
            while "retrying in" not in log.read_text():  # a download failed and waits to try again
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        finally:
            if s3_server.process is None:
                s3_server.start()
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, log.read_text()
    assert fetched_before_the_outage == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3]


def test_a_prepare_killed_while_uploading_never_leaves_a_manifest_pointing_at_missing_shards(
        s3_prefix: str, corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    url = f"{s3_prefix}/data"
    fs, root = fsspec.core.url_to_fs(url)
    arguments = ["prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--out", url,
                 "--chunk-mb", str(4 / 1024), "--workers", "0"]
    process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "-q", *arguments], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while process.poll() is None and time.monotonic() < deadline:
            fs.invalidate_cache()
            if not fs.exists(root):
                # still starting: prepare's first object, the output guard's marker, comes before any shard, so
                # the listing is polled every 0.02 s only from then on (each poll is a request to the server:
                # about 100 of them while the interpreter started, the poller's CPU and the server's)
                time.sleep(0.1)
                continue
            if any(name.endswith(".npy") for name in fs.find(root)):
                process.send_signal(signal.SIGKILL)  # in the middle of the upload
                break
            time.sleep(0.02)
    finally:
        if process.poll() is None and time.monotonic() >= deadline:
            process.kill()
        process.wait(timeout=60)
    fs.invalidate_cache()
    uploaded = {name: fs.size(name) for name in fs.find(root)} if fs.exists(root) else {}
    assert any(name.endswith(".npy") for name in uploaded)
    if f"{root}/index.json" in uploaded:  # the kill came after the last shard: every shard must be there
        manifest = json.loads(fs.cat_file(f"{root}/index.json"))
        for split in manifest["splits"].values():
            for shard in split["shards"]:
                for entry in shard["files"].values():
                    assert uploaded.get(f"{root}/{entry['path']}") == entry["bytes"]
        assert process.returncode == 0  # it finished before the kill
    else:
        assert process.returncode == -signal.SIGKILL
        with pytest.raises(DataError, match="index.json not found"):
            PretokenizedDataset(url)
    # the same command again completes the dataset
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, url,
                             PrepareSettings(chunk_bytes=int(4 / 1024 * (1 << 20))), workers=0, progress=False)
    assert len(PretokenizedDataset(url)) > 0


def test_parts_prepared_into_the_bucket_merge_into_a_dataset_equal_to_a_one_machine_one(
        s3_prefix: str, corpus_slice: Path, tokenizer_dir: Path, prepared_locally: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bertforge.data.prepare import Part
    from bertforge.data.prepare_parts import merge_parts

    parts = [f"{s3_prefix}/parts/{i}" for i in range(2)]
    for i, part in enumerate(parts):
        prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, part, SMALL_CHUNKS, workers=0, progress=False,
                                 part=Part(i, 2))
    assert "part.json" in objects(parts[1])
    code, err = run_main(capsys, "prepare", "merge", *parts, "--out", f"{s3_prefix}/merged", "--workers", "0")
    assert code == 0, err
    for split in ("train", "validation"):
        merged = PretokenizedDataset(f"{s3_prefix}/merged", split)
        expected = PretokenizedDataset(prepared_locally, split)
        assert merged.manifest["cache_key"] == expected.manifest["cache_key"]
        assert len(merged) == len(expected)
        assert all(np.array_equal(merged[i], expected[i]) for i in range(len(expected)))
    assert merge_parts(parts, f"{s3_prefix}/merged")["cache_key"] == expected.manifest["cache_key"]  # up to date


def _read_every_sample(dataset: PretokenizedDataset) -> None:
    for i in range(0, len(dataset), 7):
        dataset[i]


def test_a_loader_worker_forked_while_prefetches_are_queued_fetches_for_itself(
        prepared_in_bucket: str, s3_environment: dict[str, str], tmp_path: Path) -> None:
    import multiprocessing

    dataset = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=tmp_path / "cache")
    dataset.prefetch(range(len(dataset.shards)))  # 4 threads: most of them still queued at the fork
    worker = multiprocessing.get_context("fork").Process(target=_read_every_sample, args=(dataset,))
    worker.start()
    worker.join(timeout=120)  # the parent's queued futures never complete in the child: waiting on them hangs
    if worker.is_alive():
        worker.kill()
    dataset.close()
    assert worker.exitcode == 0


def test_an_unreachable_store_is_tried_again_with_backoff_then_one_line(
        s3_environment: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import socket

    import s3fs

    from bertforge.storage import with_retries

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries off: only ours and s3fs's remain
    s3fs.S3FileSystem.clear_instance_cache()
    url = f"s3://{BUCKET}/anything/index.json"
    fs, path = fsspec.core.url_to_fs(url)
    logger = logging.getLogger("bertforge")
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(DataError) as raised:
            with_retries(url, "read", lambda: fs.cat_file(path), attempts=2)
    finally:
        logger.removeHandler(caplog.handler)
    message = str(raised.value)
    assert message.startswith(f"{url}: could not read it after 2 attempts") and "AWS_ENDPOINT_URL" in message
    assert "\n" not in message
    assert any("retrying in 1 s (attempt 2 of 2)" in record.getMessage() for record in caplog.records)


@contextlib.contextmanager
def bertforge_log(caplog: pytest.LogCaptureFixture) -> Iterator[list[str]]:
    """The messages bertforge logs meanwhile (its logger does not propagate to the root one)."""
    import logging

    logger = logging.getLogger("bertforge")
    logger.addHandler(caplog.handler)
    messages: list[str] = []
    try:
        yield messages
    finally:
        logger.removeHandler(caplog.handler)
        messages.extend(record.getMessage() for record in caplog.records)


@contextlib.contextmanager
def through_proxy(proxy: FlakyProxy, monkeypatch: pytest.MonkeyPatch, checksum_validation: str) -> Iterator[None]:
    """s3:// URLs reach the server through `proxy`, with botocore's own retries off (they do not cover a body
    anyway) and its check of a body against the object's stored CRC as given. bertforge's backoff waits 0.05 s
    before its first retry instead of 1 s (then doubling): these tests check that a cut body is fetched again, not
    how long the wait is, and the 1-3 s of waiting were a third of each one's time."""
    import s3fs

    from bertforge import storage

    monkeypatch.setattr(storage, "RETRY_FIRST_WAIT_S", 0.05)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", checksum_validation)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield
    finally:
        s3fs.S3FileSystem.clear_instance_cache()  # no instance keeps pointing at the closed proxy


@pytest.mark.parametrize(("hide_length", "checksum_validation", "raised"), [
    (False, "when_supported", "ClientPayloadError"),  # fewer bytes than Content-Length: aiohttp sees the cut
    (True, "when_supported", "FlexibleChecksumError"),  # no length to check: botocore's CRC of the object sees it
    (True, "when_required", "TruncatedTransfer"),  # nothing in the client sees it: only the manifest's length
], ids=["content-length", "crc-only", "unnoticed-by-the-client"])
def test_a_shard_download_cut_in_the_middle_of_its_body_is_tried_again_and_arrives_whole(
        prepared_in_bucket: str, s3_server: SeaweedServer, s3_environment: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, hide_length: bool,
        checksum_validation: str, raised: str) -> None:
    """A real connection to the real server, closed by a proxy half-way through an object's body (as a
    server dying mid-download or a dropped connection would): bertforge's backoff fetches it again."""
    import hashlib

    import s3fs

    direct = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=tmp_path / "direct")
    expected = [direct[i] for i in range(direct.shards[0].samples)]
    # s3fs tries a body that aiohttp finds short `retries` times itself; one cut more reaches bertforge's retry
    cuts = s3fs.S3FileSystem.retries + 1 if not hide_length else 2
    with FlakyProxy(s3_server.endpoint, r"\.npy$", cuts, hide_length=hide_length) as proxy, \
            through_proxy(proxy, monkeypatch, checksum_validation), bertforge_log(caplog) as log:
        cached = tmp_path / "through-the-proxy"
        dataset = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=cached)
        read = [dataset[i] for i in range(dataset.shards[0].samples)]
    assert len(proxy.cut) == cuts, proxy.requests
    assert all(0 < relayed < size for _, relayed, size in proxy.cut)  # each one cut in the middle of the body
    assert all(np.array_equal(a, b) for a, b in zip(read, expected, strict=True))
    for entry in dataset.shards[0].files.values():
        assert hashlib.sha256((cached / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
    retries = [line for line in log if "retrying in" in line]
    assert retries and all(f"download failed ({raised}: " in line for line in retries), log


@pytest.mark.parametrize("change", ["same length", "one byte more"])
def test_a_shard_changed_in_the_bucket_is_named_at_once_not_tried_again(
        prepared_in_bucket: str, s3_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, change: str) -> None:
    fs, source = fsspec.core.url_to_fs(prepared_in_bucket)
    copy = f"{s3_prefix}/data"
    target = fsspec.core.url_to_fs(copy)[1]
    for name in fs.find(source):  # a copy of the module's dataset, changed below
        fs.pipe_file(f"{target}/{name[len(source) + 1:]}", fs.cat_file(name))
    dataset = PretokenizedDataset(copy, "train", cache_dir=tmp_path / "cache")
    tokens = dataset.shards[0].files["tokens"]
    data = bytearray(fs.cat_file(f"{target}/{tokens['path']}"))
    data[-1] ^= 0xFF
    fs.pipe_file(f"{target}/{tokens['path']}", bytes(data) + (b"\0" if change == "one byte more" else b""))
    with bertforge_log(caplog) as log, pytest.raises(DataError) as raised:
        dataset.fetch([0])
    assert f"{copy}/{tokens['path']} does not match its checksum in the manifest" in str(raised.value)
    assert not [line for line in log if "retrying in" in line], log


def test_a_labeled_file_cut_short_unnoticed_by_the_client_is_fetched_again_not_cached_short(
        s3_prefix: str, s3_server: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from bertforge.storage import local_copy

    rows = "".join(f"sentence number {i},{i % 2}\n" for i in range(400))
    local = tmp_path / "train.csv"
    local.write_text(f"text,label\n{rows}", encoding="utf-8")
    url = upload(local, f"{s3_prefix}/train.csv")
    with FlakyProxy(s3_server.endpoint, r"\.csv$", 1, hide_length=True) as proxy, \
            through_proxy(proxy, monkeypatch, "when_required"), bertforge_log(caplog) as log:
        copy = local_copy(url)
    assert len(proxy.cut) == 1
    assert copy.read_bytes() == local.read_bytes()  # a short copy would be reused as long as the object is unchanged
    assert any("download failed (TruncatedTransfer: " in line and "retrying in" in line for line in log), log


def test_the_dataset_tokenizer_cut_short_unnoticed_by_the_client_is_fetched_again_not_cached_short(
        prepared_in_bucket: str, s3_server: SeaweedServer, s3_environment: dict[str, str], tokenizer_dir: Path,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The tokenizer copy that travels with a dataset is cached for every later run: half of it must not be."""
    with FlakyProxy(s3_server.endpoint, r"tokenizer\.json$", 1, hide_length=True) as proxy, \
            through_proxy(proxy, monkeypatch, "when_required"), bertforge_log(caplog) as log:
        dataset = PretokenizedDataset(prepared_in_bucket, "train", cache_dir=tmp_path / "cache")
    assert len(proxy.cut) == 1, proxy.requests
    assert (dataset.tokenizer_path / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()
    assert any("download failed (TruncatedTransfer: " in line and "retrying in" in line for line in log), log


def test_an_error_in_a_labeled_file_from_a_bucket_names_the_url_and_its_line(
        s3_prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers.finetuning import TINY_MODEL, minilm_dir

    from bertforge.storage import cache_root

    local = tmp_path / "train.csv"
    local.write_text("text,label\na good row,yes\na row, with a comma,no\n", encoding="utf-8")
    url = upload(local, f"{s3_prefix}/train.csv")
    config = tmp_path / "finetune.yaml"
    config.write_text(f"run: {{name: run, output_dir: {tmp_path}}}\n", encoding="utf-8")
    code, err = run_main(capsys, "-q", "finetune", str(config), *TINY_MODEL, f"finetune.train_file={url}",
                         f"model.tokenizer={minilm_dir()}", "data.num_workers=0", "log.tensorboard=false", "log.plots=false",
                         "log.progress=false")
    assert code == 2 and f"error: {url}:3: 3 fields but the header has 2 (text, label)" in err, err
    assert str(cache_root()) not in err  # the copy it was read from is bertforge's business
