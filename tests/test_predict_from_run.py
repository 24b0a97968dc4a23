"""`bertforge predict` and `evaluate` on a run's model read the run's own columns and label map from its
config.yaml (options on the command line still win), take a .txt file or `--text` on the command line, and
carry an input's id column through to the output lines; mistakes are one line and exit code 2."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.cli import error_line
from helpers.finetuning import TINY_MODEL, finetune, minilm_dir

from bertforge.cli import main
from bertforge.data.bundled import supersense_labels, supersense_lines

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_RUN = [*TINY_MODEL, "finetune.max_length=32", "train.max_steps=4", "train.checkpoint_every=2",
            "train.micro_batch_size=16", "train.global_batch_size=16"]


def gloss_rows(split: str, rows: int) -> list[dict[str, str]]:
    """Supersense rows under the columns a user's own file might have: gloss, sense and synset."""
    return [{"synset": row["id"], "gloss": row["text"], "sense": row["label"]}
            for row in map(json.loads, supersense_lines(split, rows))]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def gloss_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny classifier trained on `gloss` -> `sense`, whose label map turns the raw label `beast` into
    noun.animal; its test file (`../data/test.jsonl`) has the same columns."""
    root = tmp_path_factory.mktemp("gloss")
    data = root / "data"
    data.mkdir()
    files = {split: write_jsonl(data / f"{split}.jsonl", gloss_rows(split, rows))
             for split, rows in (("train", 64), ("validation", 16), ("test", 16))}
    run_dir = root / "runs" / "gloss"
    finetune(run_dir, *TINY_RUN, f"model.tokenizer={minilm_dir()}", f"finetune.train_file={files['train']}",
             f"finetune.validation_file={files['validation']}", f"finetune.test_file={files['test']}",
             f"finetune.labels=[{','.join(supersense_labels())}]", "finetune.text_column=gloss",
             "finetune.label_column=sense", "finetune.classification.label_map={beast: noun.animal}")
    return run_dir


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny pair classifier trained on `first` / `second`: do two glosses share a part of speech?"""
    root = tmp_path_factory.mktemp("pairs")
    rows = [json.loads(line) for line in supersense_lines("train", 64)]
    pairs = [{"first": a["text"], "second": b["text"],
              "label": "same" if a["label"].split(".")[0] == b["label"].split(".")[0] else "different"}
             for a, b in zip(rows, rows[1:] + rows[:1], strict=True)]
    train = write_jsonl(root / "pairs.jsonl", pairs)
    run_dir = root / "runs" / "pairs"
    finetune(run_dir, *TINY_RUN, f"model.tokenizer={minilm_dir()}", f"finetune.train_file={train}",
             "finetune.text_column=first", "finetune.text_pair_column=second")
    return run_dir


def predictions(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]



def test_predict_reads_the_runs_text_column_and_carries_the_id_column(gloss_run: Path, tmp_path: Path) -> None:
    rows = gloss_rows("test", 16)
    source = write_jsonl(tmp_path / "new.jsonl", [{"id": f"row-{i}", "gloss": row["gloss"]}
                                                  for i, row in enumerate(rows)])
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(gloss_run), "--input", str(source), "--out", str(out)]) == 0
    written = predictions(out)
    assert [row["id"] for row in written] == [f"row-{i}" for i in range(16)]
    assert [row["text"] for row in written] == [row["gloss"] for row in rows]
    assert list(written[0])[:2] == ["id", "text"] and written[0]["label"] in supersense_labels()


def test_predict_id_column_names_any_column_and_a_missing_one_is_refused(
        gloss_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    test_file = gloss_run.parent.parent / "data" / "test.jsonl"
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(gloss_run / "final"), "--input", str(test_file), "--id-column", "synset",
                 "--out", str(out)]) == 0
    assert [row["id"] for row in predictions(out)] == [row["synset"] for row in gloss_rows("test", 16)]
    error = error_line(capsys, "predict", str(gloss_run), "--input", str(test_file), "--id-column", "key")
    assert "no column 'key'" in error and "--id-column" in error


def test_evaluate_a_checkpoint_reads_the_runs_columns_and_label_map(gloss_run: Path, tmp_path: Path) -> None:
    during_training = json.loads((gloss_run / "test_results.json").read_text())
    checkpoint = gloss_run / "checkpoints" / f"step-{during_training['checkpoint']['step']:08d}"
    test_file = gloss_run.parent.parent / "data" / "test.jsonl"
    assert main(["evaluate", str(checkpoint), "--data", str(test_file), "--out-dir", str(tmp_path)]) == 0
    ours = json.loads((tmp_path / "evaluation_results.json").read_text())["metrics"]
    during_training = during_training["metrics"]
    assert ours["accuracy"] == pytest.approx(during_training["accuracy"]) and ours["examples"] == 16
    # `beast` means noun.animal only through the run's finetune.label_map
    beasts = write_jsonl(tmp_path / "beasts.jsonl", [{"gloss": "a small domesticated carnivore", "sense": "beast"}])
    assert main(["evaluate", str(gloss_run), "--data", str(beasts), "--split-name", "beasts",
                 "--out-dir", str(tmp_path)]) == 0
    per_class = json.loads((tmp_path / "beasts_results.json").read_text())["per_class"]
    assert [entry["support"] for entry in per_class if entry["name"] == "noun.animal"] == [1]


def test_options_on_the_command_line_win_over_the_runs_columns(gloss_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "texts.csv"
    source.write_text("id,sentence,sense\n7,a small domesticated carnivore,noun.animal\n9,to move fast on foot,"
                      "verb.motion\n")
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(gloss_run), "--input", str(source), "--text-column", "sentence",
                 "--out", str(out)]) == 0
    assert [(row["id"], row["text"]) for row in predictions(out)] == [("7", "a small domesticated carnivore"),
                                                                      ("9", "to move fast on foot")]
    # the text column from the command line, the label column (sense) from the run
    assert main(["evaluate", str(gloss_run), "--data", str(source), "--text-column", "sentence",
                 "--split-name", "csv", "--out-dir", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "csv_results.json").read_text())["metrics"]["examples"] == 2


def test_predict_takes_a_txt_file_one_text_per_line(gloss_run: Path, tmp_path: Path) -> None:
    rows = gloss_rows("test", 16)
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(row["gloss"] + "\n" for row in rows), encoding="utf-8")
    from_txt, from_jsonl = tmp_path / "txt.jsonl", tmp_path / "jsonl.jsonl"
    assert main(["predict", str(gloss_run), "--input", str(texts), "--out", str(from_txt)]) == 0
    assert main(["predict", str(gloss_run), "--input", str(gloss_run.parent.parent / "data" / "test.jsonl"),
                 "--out", str(from_jsonl)]) == 0
    assert [row["id"] for row in predictions(from_txt)] == list(range(16))  # no id column: the row number
    assert [{key: value for key, value in row.items() if key != "id"} for row in predictions(from_txt)] == \
        [{key: value for key, value in row.items() if key != "id"} for row in predictions(from_jsonl)]


def test_predict_text_on_the_command_line_prints_json_lines(gloss_run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["a small domesticated carnivore", "to move fast on foot"]
    capsys.readouterr()
    assert main(["predict", str(gloss_run), "--text", texts[0], "--text", texts[1]]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in printed] == texts and all(row["label"] in supersense_labels() for row in printed)
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(gloss_run), "--text", texts[0], "--text", texts[1], "--out", str(out)]) == 0
    assert predictions(out) == printed
    assert capsys.readouterr().out == ""
    refused = error_line(capsys, "predict", str(gloss_run), "--text", texts[0], "--out", str(out))
    assert "--overwrite" in refused and predictions(out) == printed


def test_a_pair_run_reads_its_pair_column_and_takes_text_pairs(pair_run: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    source = write_jsonl(tmp_path / "pairs.jsonl", [{"first": "a small dog", "second": "a large cat"},
                                                    {"first": "to run", "second": "a tall tree"}])
    out = tmp_path / "preds.jsonl"
    assert main(["predict", str(pair_run), "--input", str(source), "--out", str(out)]) == 0
    from_file = predictions(out)
    assert [row["text_pair"] for row in from_file] == ["a large cat", "a tall tree"]
    capsys.readouterr()
    assert main(["predict", str(pair_run), "--text", "a small dog", "--text-pair", "a large cat",
                 "--text", "to run", "--text-pair", "a tall tree"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["label"] for row in printed] == [row["label"] for row in from_file]
    for row, theirs in zip(printed, from_file, strict=True):
        assert row["score"] == pytest.approx(theirs["score"], abs=1e-6)
    assert "give a --text-pair after each --text" in error_line(capsys, "predict", str(pair_run), "--text", "a dog")
    assert "2 --text but 1 --text-pair" in error_line(capsys, "predict", str(pair_run), "--text", "a", "--text", "b",
                                                      "--text-pair", "c")


def test_input_mistakes_are_one_line(gloss_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("a small domesticated carnivore\n\nto move fast\n", encoding="utf-8")
    assert f"{texts}:2: empty line" in error_line(capsys, "predict", str(gloss_run), "--input", str(texts))
    error = error_line(capsys, "evaluate", str(gloss_run), "--data", str(texts))
    assert "without labels" in error and "bertforge predict" in error
    error = error_line(capsys, "predict", str(gloss_run), "--input", str(texts), "--id-column", "key")
    assert ".txt file is one text per line" in error
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"text": "a small domesticated carnivore"}])
    error = error_line(capsys, "predict", str(gloss_run), "--input", str(wrong))
    assert "no column 'gloss'" in error and "--text-column" in error
    no_id = write_jsonl(tmp_path / "no-id.jsonl", [{"id": "a", "gloss": "a dog"}, {"id": None, "gloss": "a cat"}])
    assert f"{no_id}:2: the id in column 'id' is missing" in error_line(capsys, "predict", str(gloss_run),
                                                                          "--input", str(no_id))
    assert "empty" in error_line(capsys, "predict", str(gloss_run), "--text", " ")
