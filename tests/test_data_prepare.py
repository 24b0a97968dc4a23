"""`prepare`: manifest, checksums, O(1) access, caching, resume, corruption, URLs, hostile input."""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.data.bundled import corpus_path
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data, split_boundaries
from bertforge.data.shards import FORMAT_VERSION, PretokenizedDataset
from bertforge.data.tokenizer import load_tokenizer
from bertforge.errors import DataError

SMALL_CHUNKS = PrepareSettings(chunk_bytes=64 << 10)


@pytest.fixture(scope="module")
def prepared(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "data"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, out, SMALL_CHUNKS, workers=0, progress=False)
    return out


def file_hashes(root: Path) -> dict[str, str]:
    """Every data file's hash; `.lock` says who prepared the directory (pid, host, since: seconds), not data."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


def test_manifest_records_version_tokenizer_counts_and_a_checksum_per_file(prepared: Path, tokenizer_dir: Path) -> None:
    manifest = json.loads((prepared / "index.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert manifest["tokenizer"]["fingerprint"] == load_tokenizer(tokenizer_dir).fingerprint
    assert manifest["token_dtype"] == "uint16"
    assert set(manifest["splits"]) == {"train", "validation"}
    assert manifest["splits"]["train"]["documents"] + manifest["splits"]["validation"]["documents"] == 300
    assert len(manifest["splits"]["train"]["shards"]) > 1
    for split in manifest["splits"].values():
        assert split["samples"] == sum(s["samples"] for s in split["shards"])
        for shard in split["shards"]:
            for entry in shard["files"].values():
                data = (prepared / entry["path"]).read_bytes()
                assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
            assert np.load(prepared / shard["files"]["tokens"]["path"]).dtype == np.uint16
    assert load_tokenizer(prepared / manifest["tokenizer"]["path"]).fingerprint == manifest["tokenizer"]["fingerprint"]


def test_random_access_equals_a_sequential_read_of_the_shards(prepared: Path) -> None:
    dataset = PretokenizedDataset(prepared, "train")
    sequential = []
    for shard in dataset.manifest["splits"]["train"]["shards"]:
        tokens = np.load(prepared / shard["files"]["tokens"]["path"])
        offsets = np.load(prepared / shard["files"]["offsets"]["path"])
        sequential.extend(tokens[a:b].astype(np.int64) for a, b in zip(offsets[:-1], offsets[1:], strict=True))
    assert len(sequential) == len(dataset)
    for index in np.random.default_rng(0).permutation(len(dataset))[:300]:
        assert np.array_equal(dataset[int(index)], sequential[index])
    flat, lengths, _ = dataset.gather(np.array([5, 0, len(dataset) - 1]))
    assert np.array_equal(flat, np.concatenate([sequential[5], sequential[0], sequential[-1]]))
    assert all(len(s) <= 128 and s[0] == 2 and s[-1] == 3 for s in sequential)


def test_line_by_line_gives_one_sample_per_line_with_exactly_the_lines_tokens(corpus_slice: Path,
                                                                             tokenizer_dir: Path, tmp_path: Path) -> None:
    settings = PrepareSettings(line_by_line=True, split=(1,))
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, tmp_path / "lines", settings, workers=0,
                             progress=False)
    dataset = PretokenizedDataset(tmp_path / "lines", "train")
    tokenizer = load_tokenizer(tokenizer_dir)
    lines = [line for line in corpus_slice.read_text(encoding="utf-8").splitlines() if line.strip()]
    expected = []
    for encoding in tokenizer.tokenizer.encode_batch(lines, add_special_tokens=False):
        ids = encoding.ids
        expected.extend([tokenizer.cls_id, *ids[i:i + 126], tokenizer.sep_id] for i in range(0, len(ids), 126))
    assert len(dataset) == len(expected) > len(lines) // 2
    assert all(dataset[i].tolist() == expected[i] for i in range(len(dataset)))
    with pytest.raises(DataError, match="--nsp and --line-by-line"):
        PrepareSettings(line_by_line=True, nsp=True)


def test_split_is_by_contiguous_documents_with_megatron_rounding() -> None:
    assert split_boundaries([980, 20], 1000) == [0, 980, 1000, 1000]
    assert split_boundaries([969, 30, 1], 1000) == [0, 969, 999, 1000]
    assert split_boundaries([1, 1, 1], 10) == [0, 4, 7, 10]  # Megatron shifts the rounding error onto every boundary


def test_running_again_with_the_same_inputs_is_a_no_op(prepared: Path, corpus_slice: Path, tokenizer_dir: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    def data_files() -> dict[Path, int]:  # every file but the one-writer lock, which each run takes
        return {p: p.stat().st_mtime_ns for p in prepared.rglob("*") if p.is_file() and p.name != ".lock"}

    before = data_files()
    logger = logging.getLogger("bertforge")
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    try:
        prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, prepared, SMALL_CHUNKS, workers=0, progress=False)
    finally:
        logger.removeHandler(caplog.handler)
    assert "up to date" in caplog.text
    assert before == data_files()


def test_the_result_does_not_depend_on_the_number_of_workers(prepared: Path, corpus_slice: Path, tokenizer_dir: Path,
                                                             tmp_path: Path) -> None:
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, tmp_path / "two", SMALL_CHUNKS, workers=2,
                             progress=False)
    assert file_hashes(tmp_path / "two") == file_hashes(prepared)


def test_a_corrupt_or_truncated_shard_is_reported_by_name(prepared: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(prepared, copy)
    manifest = json.loads((copy / "index.json").read_text())
    shard = manifest["splits"]["train"]["shards"][1]
    tokens = copy / shard["files"]["tokens"]["path"]
    data = bytearray(tokens.read_bytes())
    data[-3] ^= 0xFF
    tokens.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"shard {shard['name']}: .*sha256"):
        PretokenizedDataset(copy, "train")
    tokens.write_bytes(bytes(data[:-100]))
    with pytest.raises(DataError, match=rf"shard {shard['name']}: .*truncated"):
        PretokenizedDataset(copy, "train", verify_checksums=False)
    # a manifest whose sample count disagrees with the offsets: found when the dataset opens, in this
    # process, not later inside a loader worker
    tokens.write_bytes(bytes(data))
    shard["samples"] += 1
    (copy / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=rf"shard {shard['name']}: its offsets do not match the manifest"):
        PretokenizedDataset(copy, "train", verify_checksums=False)


def test_fsspec_urls_work_for_output_and_remote_shards_are_cached_locally(prepared: Path, corpus_slice: Path,
                                                                         tokenizer_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "cache"))
    url = "memory://bertforge-tests/prepared"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, url, SMALL_CHUNKS, workers=0, progress=False)
    remote = PretokenizedDataset(url, "validation")
    local = PretokenizedDataset(prepared, "validation")
    assert len(remote) == len(local)
    assert all(np.array_equal(remote[i], local[i]) for i in range(len(local)))
    assert str(remote.root).startswith(str(tmp_path / "cache"))
    assert load_tokenizer(remote.tokenizer_path).fingerprint == remote.manifest["tokenizer"]["fingerprint"]


def test_hostile_input_is_handled_with_clear_messages(tokenizer_dir: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # a 10 MB line without a sentence end, invalid UTF-8, empty documents, literal special tokens
    corpus = tmp_path / "hostile.txt"
    with open(corpus, "wb") as f:
        f.write(b"A normal first sentence. And a second.\n\n\n\n   \n\n")
        f.write(b"the quick brown fox jumps " * (10 * 1024 * 1024 // 26) + b"\n\n")
        f.write(b"Bad \xff bytes [CLS] and [MASK] typed in.\n\nShort tail document.\n")
    logger = logging.getLogger("bertforge")
    logger.addHandler(caplog.handler)
    try:
        started = time.perf_counter()
        manifest = prepare_pretraining_data([str(corpus)], tokenizer_dir, tmp_path / "out",
                                            PrepareSettings(split=(1,)), workers=0, progress=False)
    finally:
        logger.removeHandler(caplog.handler)
    assert time.perf_counter() - started < 120  # a hang guard, not a speed assertion
    assert "hostile.txt:7: a line of 10.5 MB" in caplog.text
    assert "invalid UTF-8 bytes replaced" in caplog.text
    assert manifest["splits"]["train"]["documents"] == 4
    dataset = PretokenizedDataset(tmp_path / "out", "train")
    ids = load_tokenizer(tokenizer_dir).ids
    lengths = [len(dataset[i]) for i in range(len(dataset))]
    assert max(lengths) <= 128 and sum(lengths) > 2_000_000
    assert all(int((dataset[i] == ids["cls"]).sum()) == 1 and not (dataset[i] == ids["mask"]).any()
               for i in range(len(dataset) - 3, len(dataset)))


def test_an_input_without_text_is_a_clear_error(tokenizer_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(DataError, match="no text"):
        prepare_pretraining_data([str(tmp_path / "empty.txt")], tokenizer_dir, tmp_path / "out", workers=0,
                                 progress=False)
    # nothing half-written left behind: the directory the failed run created (for its lock) is gone again
    assert not (tmp_path / "out").exists()


def _run_cli(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bertforge.cli", "-q", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def test_an_interrupted_run_leaves_the_old_dataset_intact_and_resumes_to_the_same_result(
        tokenizer_dir: Path, tmp_path: Path) -> None:
    out, fresh = tmp_path / "data", tmp_path / "fresh"
    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        (tmp_path / "corpus.txt").write_text("\n\n".join(f.read().split("\n\n")[:700]), encoding="utf-8")

    def prepare(target: Path, seq_len: int, *extra: str) -> subprocess.Popen[bytes]:
        return _run_cli(["prepare", "pretrain", "--input", str(tmp_path / "corpus.txt"), "--tokenizer",
                         str(tokenizer_dir), "--out", str(target), "--workers", "1", "--chunk-mb", "0.1",
                         "--seq-len", str(seq_len), *extra])

    assert prepare(out, 64).wait(timeout=300) == 0
    old_manifest = json.loads((out / "index.json").read_text())
    process = prepare(out, 128, "--overwrite")  # other settings: the earlier dataset is replaced
    deadline = time.monotonic() + 120
    while not list(out.glob(".staging-*/chunk-*.npz"))[2:] and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert json.loads((out / "index.json").read_text()) == old_manifest  # still the complete old build
    assert len(PretokenizedDataset(out, "train")) == old_manifest["splits"]["train"]["samples"]
    assert prepare(out, 128, "--overwrite").wait(timeout=300) == 0
    resumed: dict[str, Any] = json.loads((out / "index.json").read_text())
    assert prepare(fresh, 128).wait(timeout=300) == 0
    assert resumed["splits"] == json.loads((fresh / "index.json").read_text())["splits"]
    assert not list(out.glob(".staging-*")) and len(list(out.glob("shards-*"))) == 1
