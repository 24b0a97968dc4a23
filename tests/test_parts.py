"""A corpus split across machines (`--num-parts N --part I`), ids in the outputs, and `fill-mask --input FILE`:
parts read in order equal the one-machine run, a killed part leaves no file and its rerun completes, a finished
part is skipped, parts read and write s3://, bad parts are one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers.cli import error_line
from helpers.finetuning import minilm_dir
from helpers.models import MINILM_TINY_LENGTH, minilm_sized_config

from bertforge.cli import main
from bertforge.embed import vectors_of_table
from bertforge.engine import EngineSettings
from bertforge.inference import fill_masks, load_model, read_inputs
from bertforge.models import BertforgeForPreTraining, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.parts import RowPart

ROOT = Path(__file__).resolve().parents[1]
MAX_LENGTH = MINILM_TINY_LENGTH
LONG = " ".join(["the slow erosion of the soil of a region by wind and water over a long time"] * 4)
PARTS = 3



@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random models with the MiniLM vocabulary, saved as bertforge directories."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("parts-models")
    built = {"classification": BertforgeForSequenceClassification(minilm_sized_config(), 3, "classification",
                                                                  ["noun.act", "noun.animal", "verb.motion"]),
             "embedding": BertforgeForEmbedding(minilm_sized_config(pooling="mean")),
             "mlm": BertforgeForPreTraining(minilm_sized_config())}
    return {name: save_bertforge_model(model.eval(), root / name, minilm_dir()) for name, model in built.items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """31 real glosses (not a multiple of the parts) with ids, one over the models' length."""
    glosses = read_inputs("bundled:supersense/test").texts[:30]
    path = tmp_path_factory.mktemp("parts-corpus") / "glosses.jsonl"
    path.write_text("".join(json.dumps({"doc": f"g{i}", "text": text}) + "\n"
                            for i, text in enumerate([*glosses, LONG])), encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    """`bertforge ARGS` in this process: exit code and stderr on one line."""
    capsys.readouterr()
    code = main(list(arguments))
    return code, " ".join(capsys.readouterr().err.split())



def part_files(out: Path) -> list[Path]:
    return [Path(RowPart(i, PARTS).output_of(str(out))) for i in range(PARTS)]


def test_part_names_and_rows_cover_the_input_once_in_order() -> None:
    assert RowPart(3, 16).output_of("s3://bucket/out/preds.parquet") == \
        "s3://bucket/out/preds.part-00003-of-00016.parquet"
    assert RowPart(0, 2).output_of("vectors") == "vectors.part-00000-of-00002"
    covered = [row for index in range(7) for row in RowPart(index, 7).rows(31)]
    assert covered == list(range(31))
    assert [len(RowPart(index, 7).rows(31)) for index in range(7)] == [4, 4, 5, 4, 5, 4, 5]


def test_embed_parts_read_in_order_equal_the_one_machine_run_with_ids(models: dict[str, Path], corpus: Path,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    model = str(models["embedding"])
    assert run(capsys, "embed", model, "--input", str(corpus), "--out", str(tmp_path / "all.npy"))[0] == 0
    whole = np.load(tmp_path / "all.npy")
    for index in range(PARTS):
        code, err = run(capsys, "embed", model, "--input", str(corpus), "--id-column", "doc", "--out",
                        str(tmp_path / "vectors.parquet"), "--num-parts", str(PARTS), "--part", str(index))
        assert code == 0, err
    assert "truncated at 40 tokens)" in err  # the long text is in the last part: counted, not a crash
    tables = [pq.read_table(path) for path in part_files(tmp_path / "vectors.parquet")]
    assert [row_id for table in tables for row_id in table.column("id").to_pylist()] == [f"g{i}" for i in range(31)]
    assert np.abs(np.concatenate([vectors_of_table(table) for table in tables]) - whole).max() <= 1e-5
    # one run to .parquet and .jsonl: the row number is the id without an id column
    assert run(capsys, "embed", model, "--input", str(corpus), "--text-column", "text", "--out",
               str(tmp_path / "all.jsonl"))[0] == 0
    rows = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == list(range(31))
    assert np.abs(np.array([row["vector"] for row in rows]) - whole).max() <= 1e-6
    # a .npy part is finished when its header and size say it holds the part's rows; a torn copy is not trusted
    npy = ["embed", model, "--input", str(corpus), "--out", str(tmp_path / "v.npy"), "--num-parts", "3", "--part", "2"]
    assert run(capsys, *npy)[0] == 0
    part = Path(RowPart(2, 3).output_of(str(tmp_path / "v.npy")))
    assert np.abs(np.load(part) - whole[20:]).max() <= 1e-5
    assert "already holds its 11 rows; skipped" in run(capsys, *npy)[1]
    part.write_bytes(part.read_bytes()[:-100])
    assert "exists; add --overwrite" in error_line(capsys, *npy)
    assert run(capsys, *npy, "--overwrite")[0] == 0 and np.load(part).shape == (11, 32)
    assert "a .npy holds only the vectors" in error_line(capsys, "embed", model, "--input", str(corpus),
                                                         "--id-column", "doc", "--out", str(tmp_path / "x.npy"))


def test_predict_parts_equal_the_one_machine_run_and_a_finished_part_is_skipped(
        models: dict[str, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(models["classification"])
    assert run(capsys, "predict", model, "--input", str(corpus), "--out", str(tmp_path / "all.jsonl"))[0] == 0
    whole = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [row["id"] for row in whole] == list(range(31))  # no id column: the row number
    out = tmp_path / "preds.jsonl"
    for index in range(PARTS):
        assert run(capsys, "predict", model, "--input", str(corpus), "--out", str(out), "--num-parts", str(PARTS),
                   "--part", str(index))[0] == 0
    parts = [json.loads(line) for path in part_files(out) for line in path.read_text().splitlines()]
    assert [(row["id"], row["label"]) for row in parts] == [(row["id"], row["label"]) for row in whole]
    assert [row["score"] for row in parts] == pytest.approx([row["score"] for row in whole], abs=1e-5)
    finished = part_files(out)[1]
    before = finished.stat().st_mtime_ns
    code, err = run(capsys, "predict", model, "--input", str(corpus), "--out", str(out), "--num-parts", str(PARTS),
                    "--part", "1")
    assert code == 0 and "part 1 of 3:" in err and "already holds its 10 rows; skipped" in err, err
    assert finished.stat().st_mtime_ns == before
    # the same name holding other rows (another input) is never taken for finished, nor replaced without --overwrite
    other = tmp_path / "other.jsonl"
    other.write_text(corpus.read_text().replace('"doc"', '"id"'), encoding="utf-8")
    message = error_line(capsys, "predict", model, "--input", str(other), "--out", str(out), "--num-parts", "3",
                         "--part", "1")
    assert f"--out {finished} exists; add --overwrite" in message
    assert run(capsys, "predict", model, "--input", str(other), "--out", str(out), "--num-parts", "3", "--part", "1",
               "--overwrite")[0] == 0
    assert [json.loads(line)["id"] for line in finished.read_text().splitlines()] == [f"g{i}" for i in range(10, 20)]


KILLED_AFTER_FIRST_BATCH = """
import os, signal, sys
from bertforge import engine
from bertforge.cli import main

batches = engine._batches

def first_then_killed(*args, **kwargs):
    for number, batch in enumerate(batches(*args, **kwargs)):
        if number == 1:  # the first batch went through the model: die as a node's OOM killer or scancel does
            os.kill(os.getpid(), signal.SIGKILL)
        yield batch

engine._batches = first_then_killed
sys.exit(main(sys.argv[1:]))
"""


def test_a_part_killed_after_its_first_batch_leaves_no_file_and_its_rerun_completes(
        models: dict[str, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "vectors.parquet"
    arguments = ["embed", str(models["embedding"]), "--input", str(corpus), "--out", str(out), "--num-parts", "2",
                 "--part", "1", "--batch-size", "4"]
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_AFTER_FIRST_BATCH), *arguments], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    part = Path(RowPart(1, 2).output_of(str(out)))
    assert not part.exists() and list(tmp_path.iterdir()) == []
    code, err = run(capsys, *arguments)
    assert code == 0, err
    assert pq.read_table(part).column("id").to_pylist() == list(range(15, 31))


def test_a_part_that_fails_while_writing_leaves_no_file_in_place_and_its_rerun_completes(
        models: dict[str, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "vectors.parquet"
    arguments = ["embed", str(models["embedding"]), "--input", str(corpus), "--out", str(out), "--num-parts", "2",
                 "--part", "0"]
    real_write = pq.write_table

    def half_then_disk_full(table: object, where: object, **kwargs: object) -> None:
        Path(str(where)).write_bytes(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", half_then_disk_full)
    assert "No space left on device" in error_line(capsys, *arguments)
    assert list(tmp_path.iterdir()) == []  # neither the part nor its staging file
    monkeypatch.setattr(pq, "write_table", real_write)
    assert run(capsys, *arguments)[0] == 0
    assert pq.read_table(Path(RowPart(0, 2).output_of(str(out)))).column("id").to_pylist() == list(range(15))


def test_bad_parts_are_one_line_before_any_work(models: dict[str, Path], corpus: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    base = ["embed", str(models["embedding"]), "--input", str(corpus), "--out", str(tmp_path / "v.npy")]
    assert "--part 3 --num-parts 3: the part must be in 0..2" in error_line(capsys, *base, "--num-parts", "3",
                                                                             "--part", "3")
    assert "--part -1 --num-parts 3: the part must be in 0..2" in error_line(capsys, *base, "--num-parts", "3",
                                                                              "--part", "-1")
    assert "--num-parts 0: give at least 1 part" in error_line(capsys, *base, "--num-parts", "0", "--part", "0")
    assert "--part needs --num-parts" in error_line(capsys, *base, "--part", "0")
    predict = ["predict", str(models["classification"])]
    assert "give --input and --out" in error_line(capsys, *predict, "--text", "a dog", "--num-parts", "2", "--part",
                                                  "0")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_text_in_a_part_s_input_is_one_line_naming_the_file_and_line(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a dog\nthe cat\n\nto run\n", encoding="utf-8")
    message = error_line(capsys, "embed", str(models["embedding"]), "--input", str(texts), "--out",
                         str(tmp_path / "v.parquet"), "--num-parts", "2", "--part", "1")
    assert f"{texts}:3: empty line" in message
    assert sorted(path.name for path in tmp_path.iterdir()) == ["texts.txt"]


def test_fill_mask_on_a_file_equals_one_text_at_a_time_and_splits_into_parts(
        models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["the [MASK] of the law", "a small [MASK] carnivore", "to [MASK] fast on <mask>", "[MASK]",
             LONG.replace("wind", "[MASK]", 1)]
    source = tmp_path / "masked.txt"
    source.write_text("".join(text + "\n" for text in texts), encoding="utf-8")
    model = str(models["mlm"])
    assert run(capsys, "fill-mask", model, "--input", str(source), "--out", str(tmp_path / "filled.jsonl"),
               "--top-k", "3")[0] == 0
    rows = [json.loads(line) for line in (tmp_path / "filled.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == list(range(len(texts))) and [row["text"] for row in rows] == texts
    one_at_a_time = fill_masks(load_model(model), texts, 3, EngineSettings(batch_size=1))
    for row, alone in zip(rows, one_at_a_time, strict=True):
        assert [[c["token"] for c in mask] for mask in row["masks"]] == [[p.token for p in mask] for mask in alone]
        assert [c["score"] for mask in row["masks"] for c in mask] == pytest.approx(
            [p.score for mask in alone for p in mask], abs=1e-5)
    for index in range(2):
        assert run(capsys, "fill-mask", model, "--input", str(source), "--out", str(tmp_path / "filled.parquet"),
                   "--top-k", "3", "--num-parts", "2", "--part", str(index))[0] == 0
    parts = [row for index in range(2)
             for row in pq.read_table(RowPart(index, 2).output_of(str(tmp_path / "filled.parquet"))).to_pylist()]
    assert [[[c["token"] for c in mask] for mask in row["masks"]] for row in parts] == \
        [[[c["token"] for c in mask] for mask in row["masks"]] for row in rows]
    (tmp_path / "unmasked.txt").write_text("the [MASK] of the law\nno mask here\n", encoding="utf-8")
    message = error_line(capsys, "fill-mask", model, "--input", str(tmp_path / "unmasked.txt"))
    assert f"{tmp_path / 'unmasked.txt'}: the text of row 1 has no [MASK] or <mask>" in message
    assert "give the masked TEXT or --input FILE" in error_line(capsys, "fill-mask", model, "a [MASK]", "--input",
                                                                str(source))


def test_a_part_reads_and_writes_a_bucket_and_is_skipped_when_finished(
        s3_prefix: str, models: dict[str, Path], corpus: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    fs, prefix = fsspec.core.url_to_fs(s3_prefix)
    fs.put_file(str(corpus), f"{prefix}/glosses.jsonl")
    model = str(models["embedding"])
    arguments = ["embed", model, "--input", f"{s3_prefix}/glosses.jsonl", "--id-column", "doc", "--out",
                 f"{s3_prefix}/out/vectors.parquet", "--num-parts", "2", "--part", "1"]
    code, err = run(capsys, *arguments)
    assert code == 0, err
    part = f"{prefix}/out/vectors.part-00001-of-00002.parquet"
    with fs.open(part, "rb") as handle:
        stored = pq.read_table(handle)
    assert stored.column("id").to_pylist() == [f"g{i}" for i in range(15, 31)]
    local = tmp_path / "local.parquet"
    assert run(capsys, "embed", model, "--input", str(corpus), "--id-column", "doc", "--out", str(local),
               "--num-parts", "2", "--part", "1")[0] == 0
    expected = vectors_of_table(pq.read_table(RowPart(1, 2).output_of(str(local))))
    assert np.abs(vectors_of_table(stored) - expected).max() <= 1e-6
    code, err = run(capsys, *arguments)
    assert code == 0 and "already holds its 16 rows; skipped" in err, err
    whole = arguments[:-4]  # without --num-parts: a local file only, never a directory named s3:
    assert "add --num-parts 1 --part 0 (it writes" in error_line(capsys, *whole)
    assert not Path("s3:").exists()
    assert sorted(name.rsplit("/", 1)[-1] for name in fs.find(f"{prefix}/out")) == [
        ".bertforge-outputs.json", "vectors.part-00001-of-00002.parquet"]

