"""One rule for every output (`bertforge.output_guard`): a command replaces only what it wrote itself, an
earlier output of its own only with --overwrite, never an input; what a killed run staged is removed by the next.

Every case goes through the CLI as a user types it, on tiny inputs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
from helpers.finetuning import supersense_slice

from bertforge.cli import main


def run(capsys: pytest.CaptureFixture[str], *arguments: str) -> tuple[int, str]:
    """`bertforge ARGS` in this process: the exit code and what it printed on stderr, as one line."""
    capsys.readouterr()
    code = main(list(arguments))
    return code, " ".join(capsys.readouterr().err.split())


def refused(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    """The one-line error of a command that must be refused with exit code 2."""
    capsys.readouterr()
    code = main(list(arguments))
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2, lines
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines[0]


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file's bytes, but the lock's (it names the last holder)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def dead_pid() -> int:
    """The PID of a process that has finished."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def prepare(corpus: Path, tokenizer: Path, out: str, *extra: str) -> list[str]:
    return ["prepare", "pretrain", "--input", str(corpus), "--tokenizer", str(tokenizer), "--out", out,
            "--workers", "0", *extra]


# --- prepare -----------------------------------------------------------------------------------


def test_prepare_never_deletes_a_users_shards_directory_beside_an_earlier_dataset(
        corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data"
    assert run(capsys, *prepare(corpus_slice, tokenizer_dir, str(out)))[0] == 0
    (out / "shards-mine").mkdir()
    (out / "shards-mine" / "notes.txt").write_text("my own shards", encoding="utf-8")
    before = snapshot(out)
    error = refused(capsys, *prepare(corpus_slice, tokenizer_dir, str(out), "--seq-len", "64", "--overwrite"))
    assert f"--out {out}" in error and "shards-mine/" in error and "choose a new or empty directory" in error
    assert snapshot(out) == before
    # an empty directory of the user's is fine; a directory of their files is not
    mine = tmp_path / "mine"
    (mine / "shards-mine").mkdir(parents=True)
    (mine / "shards-mine" / "notes.txt").write_text("my own shards", encoding="utf-8")
    error = refused(capsys, *prepare(corpus_slice, tokenizer_dir, str(mine)))
    assert "is not empty and is not an earlier dataset (it holds shards-mine/)" in error
    assert (mine / "shards-mine" / "notes.txt").read_text(encoding="utf-8") == "my own shards"


def test_prepare_replaces_an_earlier_dataset_of_other_settings_only_with_overwrite(
        corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "data"
    assert run(capsys, *prepare(corpus_slice, tokenizer_dir, str(out)))[0] == 0
    first = snapshot(out)
    assert run(capsys, *prepare(corpus_slice, tokenizer_dir, str(out)))[0] == 0  # the same one: nothing to do
    assert snapshot(out) == first
    error = refused(capsys, *prepare(corpus_slice, tokenizer_dir, str(out), "--seq-len", "64"))
    assert f"--out {out} holds an earlier dataset" in error and "pass --overwrite" in error
    assert snapshot(out) == first
    assert run(capsys, *prepare(corpus_slice, tokenizer_dir, str(out), "--seq-len", "64", "--overwrite"))[0] == 0
    manifest = json.loads((out / "index.json").read_text(encoding="utf-8"))
    assert manifest["settings"]["seq_len"] == 64
    builds = sorted(path.name for path in out.iterdir() if path.name.startswith(("shards-", ".staging-")))
    assert builds == [manifest["tokenizer"]["path"].split("/")[0]]  # the earlier build is gone


def test_prepare_into_a_bucket_never_deletes_a_users_objects_under_the_prefix(
        s3_prefix: str, corpus_slice: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fs, root = fsspec.core.url_to_fs(s3_prefix)
    for name in ("shards-000000.tar", "shards-000001.tar"):
        fs.pipe_file(f"{root}/{name}", b"a user's webdataset shard")
    error = refused(capsys, *prepare(corpus_slice, tokenizer_dir, s3_prefix))
    assert f"--out {s3_prefix} is not empty" in error and "shards-000000.tar" in error
    assert "choose a new or empty prefix" in error
    fs.invalidate_cache()
    assert sorted(path.rsplit("/", 1)[-1] for path in fs.find(root)) == ["shards-000000.tar", "shards-000001.tar"]
    assert fs.cat_file(f"{root}/shards-000000.tar") == b"a user's webdataset shard"


# --- tokenizer train ---------------------------------------------------------------------------


def test_tokenizer_train_refuses_a_model_directory_and_replaces_its_own_only_with_overwrite(
        corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "model"
    shutil.copytree(tokenizer_dir, model)
    (model / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    before = snapshot(model)
    train = ["tokenizer", "train", "--input", str(corpus_slice), "--vocab-size", "512"]
    error = refused(capsys, *train, "--out", str(model), "--overwrite")
    assert f"--out {model} is not empty and is not an earlier tokenizer" in error and "config.json" in error
    assert snapshot(model) == before

    out = tmp_path / "tokenizer"
    assert run(capsys, *train, "--out", str(out))[0] == 0
    first = snapshot(out)
    error = refused(capsys, *train, "--out", str(out), "--cased")
    assert f"--out {out} holds an earlier tokenizer" in error and "--overwrite" in error
    assert snapshot(out) == first
    assert run(capsys, *train, "--out", str(out), "--cased", "--overwrite")[0] == 0
    assert json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))["do_lower_case"] is False


# --- predict, evaluate, plot -------------------------------------------------------------------


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    (tmp_path / "inputs").mkdir()
    return supersense_slice(tmp_path / "inputs", "test", 4)


def test_predict_refuses_to_write_over_its_input(tiny_classifier: Path, texts: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = texts.read_bytes()
    for extra in ((), ("--overwrite",)):
        error = refused(capsys, "predict", str(tiny_classifier), "--input", str(texts), "--out", str(texts), *extra)
        assert f"--out {texts} is the --input file" in error
    assert texts.read_bytes() == before


def test_predict_replaces_an_existing_file_only_when_it_wrote_it_and_only_with_overwrite(
        tiny_classifier: Path, texts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    predict = ["predict", str(tiny_classifier), "--input", str(texts)]
    users = tmp_path / "gold.jsonl"
    users.write_text('{"id": 7, "text": "a gold row", "label": "noun.act"}\n', encoding="utf-8")
    error = refused(capsys, *predict, "--out", str(users))
    assert f"--out {users} exists and is not an earlier predictions file" in error
    assert refused(capsys, *predict, "--out", str(users), "--overwrite")  # a stranger's file, even with it
    assert users.read_text(encoding="utf-8") == '{"id": 7, "text": "a gold row", "label": "noun.act"}\n'

    out = tmp_path / "predictions.jsonl"
    assert run(capsys, *predict, "--out", str(out))[0] == 0
    out.write_text("marked\n", encoding="utf-8")  # to see whether the next run replaced it
    error = refused(capsys, *predict, "--out", str(out))
    assert f"--out {out} exists; add --overwrite" in error
    assert out.read_text(encoding="utf-8") == "marked\n"
    assert run(capsys, *predict, "--out", str(out), "--overwrite")[0] == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 4


def test_evaluate_and_plot_replace_their_own_files_only_with_overwrite(
        tiny_classifier: Path, texts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "notes.md").write_text("mine", encoding="utf-8")  # a shared directory: other files stay
    evaluate = ["evaluate", str(tiny_classifier), "--data", str(texts), "--out-dir", str(reports)]
    assert run(capsys, *evaluate)[0] == 0
    assert (reports / "evaluation_results.json").is_file()
    error = refused(capsys, *evaluate)
    assert "evaluation_results.json exists; add --overwrite" in error
    assert run(capsys, *evaluate, "--overwrite")[0] == 0
    assert (reports / "notes.md").read_text(encoding="utf-8") == "mine"

    plots = tmp_path / "plots"
    assert run(capsys, "plot", str(tiny_classifier), "--out", str(plots))[0] == 0
    assert (plots / "loss.png").is_file()
    assert "loss.png exists; add --overwrite" in refused(capsys, "plot", str(tiny_classifier), "--out", str(plots))
    assert run(capsys, "plot", str(tiny_classifier), "--out", str(plots), "--overwrite")[0] == 0


def test_plot_redraws_a_runs_own_plots_without_overwrite(tiny_classifier: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trainer draws RUN/plots at the end of every run; `bertforge plot RUN` redraws them as asked."""
    assert run(capsys, "plot", str(tiny_classifier))[0] == 0
    assert run(capsys, "plot", str(tiny_classifier))[0] == 0
    assert (tiny_classifier / "plots" / "loss.png").is_file()


# --- export: staging a killed run left ---------------------------------------------------------


def test_export_removes_the_staging_a_killed_export_left_and_keeps_a_live_ones(
        tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "exported"
    killed = tmp_path / f".exported.tmp-{dead_pid()}"  # what kill -9 during `export --overwrite` leaves
    (killed / "half").mkdir(parents=True)
    (killed / "half" / "model.safetensors").write_bytes(b"\0" * 32)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live_process:
        try:
            live = tmp_path / f".exported.tmp-{live_process.pid}"  # an export still running: not touched
            live.mkdir()
            assert run(capsys, "export", str(tiny_classifier), "--out", str(out))[0] == 0
            assert not killed.exists() and live.is_dir()
        finally:
            live_process.kill()
    assert (out / "config.json").is_file()
    # the export's own ledger makes it an earlier export, which --overwrite replaces; by then the other
    # export's process is gone too, and so is its staging
    assert "holds an earlier export" in refused(capsys, "export", str(tiny_classifier), "--out", str(out))
    assert live.is_dir()  # a refused command changes nothing
    assert run(capsys, "export", str(tiny_classifier), "--out", str(out), "--overwrite")[0] == 0
    assert not live.exists()


# --- run directories and glue ------------------------------------------------------------------


def test_training_and_glue_refuse_a_directory_of_a_users_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "config.yaml").write_text("my: own config\n", encoding="utf-8")
    (project / "thesis.tex").write_text("three years of work", encoding="utf-8")
    before = snapshot(project)
    root = Path(__file__).resolve().parents[1]
    error = refused(capsys, "finetune", str(root / "configs" / "finetune" / "supersense-tiny.yaml"),
                    f"run.output_dir={tmp_path}", "run.name=project")
    assert f"run.output_dir/run.name {project} is not empty and is not a run directory" in error
    error = refused(capsys, "glue", str(root / "configs" / "glue" / "minilm-cpu.yaml"), "--data-dir",
                    str(tmp_path / "glue"), "--out", str(project))
    assert f"--out {project} is not empty and is not an earlier GLUE output" in error
    assert snapshot(project) == before
