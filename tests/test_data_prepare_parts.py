"""`prepare pretrain --num-parts N --part I` + `prepare merge`: a preparation split across machines equals one
made in one go, sample for sample."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bertforge.cli import main
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.shards import PretokenizedDataset

SETTINGS = PrepareSettings(nsp=True, split=(8, 1, 1), chunk_bytes=16 << 10)  # ~12 chunks; NSP draws within a chunk
CLI_SETTINGS = ["--nsp", "--split", "8,1,1", "--chunk-mb", str(16 / 1024), "--workers", "0"]


def prepare_part(corpus: Path, tokenizer: Path, out: Path, part: int, parts: int,
                 capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["prepare", "pretrain", "--input", str(corpus), "--tokenizer", str(tokenizer), "--out", str(out),
                 *CLI_SETTINGS, "--num-parts", str(parts), "--part", str(part)])
    return code, " ".join(capsys.readouterr().err.split())


def merge(parts: list[Path], out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["prepare", "merge", *map(str, parts), "--out", str(out), "--workers", "0"])
    return code, " ".join(capsys.readouterr().err.split())


@pytest.fixture(scope="module")
def one_go(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("one-go") / "data"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, out, SETTINGS, workers=0, progress=False)
    return out


def assert_same_dataset(merged: str | Path, expected: Path) -> None:
    for split in ("train", "validation", "test"):
        ours, theirs = PretokenizedDataset(merged, split), PretokenizedDataset(expected, split)
        assert len(ours) == len(theirs) > 0
        assert ours.manifest["cache_key"] == theirs.manifest["cache_key"]
        assert ours.manifest["splits"][split]["documents"] == theirs.manifest["splits"][split]["documents"]
        for i in range(len(theirs)):
            assert np.array_equal(ours[i], theirs[i])
            assert ours.segment_b_start(i) == theirs.segment_b_start(i)
            assert ours.next_sentence_label(i) == theirs.next_sentence_label(i)


def test_three_parts_merged_equal_a_one_machine_preparation_sample_for_sample(
        one_go: Path, corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    parts = [tmp_path / f"part-{i}" for i in range(3)]
    for i, part in enumerate(parts):
        code, err = prepare_part(corpus_slice, tokenizer_dir, part, i, 3, capsys)
        assert code == 0, err
        assert (part / "part.json").is_file()
    owned = [sorted(p.name for p in (part / "chunks").iterdir()) for part in parts]
    assert all(owned) and sum(map(len, owned)) == len(set().union(*owned))  # each chunk tokenized by one part
    code, err = merge(list(reversed(parts)), tmp_path / "merged", capsys)  # any order
    assert code == 0, err
    assert_same_dataset(tmp_path / "merged", one_go)
    code, err = prepare_part(corpus_slice, tokenizer_dir, parts[0], 0, 3, capsys)  # a finished part is not redone
    assert code == 0 and "nothing to do" in err, err


def test_merge_refuses_missing_repeated_foreign_and_unfinished_parts(corpus_slice: Path, tokenizer_dir: Path,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    parts = [tmp_path / f"part-{i}" for i in range(2)]
    for i, part in enumerate(parts):
        assert prepare_part(corpus_slice, tokenizer_dir, part, i, 2, capsys)[0] == 0
    code, err = merge(parts[:1], tmp_path / "merged", capsys)
    assert code == 2 and "part(s) 1 of 2 are missing" in err, err
    code, err = merge([parts[0], parts[0]], tmp_path / "merged", capsys)
    assert code == 2 and "are both part 0" in err, err
    foreign = tmp_path / "foreign"
    capsys.readouterr()
    assert main(["prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tokenizer_dir), "--out",
                 str(foreign), "--workers", "0", "--num-parts", "2", "--part", "1", "--seq-len", "64"]) == 0
    code, err = merge([parts[0], foreign], tmp_path / "merged", capsys)
    assert code == 2 and "belongs to another preparation" in err, err
    (parts[1] / "part.json").unlink()  # as if that part had been killed
    code, err = merge(parts, tmp_path / "merged", capsys)
    assert code == 2 and f"{parts[1]}/part.json not found" in err, err
    code, err = prepare_part(corpus_slice, tokenizer_dir, parts[0], 2, 2, capsys)
    assert code == 2 and "--part 2 --num-parts 2" in err, err
    assert not (tmp_path / "merged" / "index.json").exists()
