"""A refused command does not pay for importing torch, transformers or the trainer first (issue 35 item 9).

A config error (an unknown key, a value of the wrong type), a missing data file, dataset, MODEL or --input, and a
bad engine flag are each refused with their usual one line and exit code 2 while `torch` is still absent from
`sys.modules`. All refusals run in one fresh interpreter, one after the other: the first one that imports torch
taints the rest, and the test names it. Checked by what the interpreter imported, not by time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.commands import preflight
from bertforge.errors import BertforgeError

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "bertforge.train.trainer", "bertforge.engine", "bertforge.inference")
PROBE = """
import contextlib, io, json, sys
from bertforge.cli import main
for argv in json.loads(sys.argv[1]):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = main(argv)
    heavy = [name for name in json.loads(sys.argv[2]) if name in sys.modules]
    print(json.dumps({"argv": argv, "code": code, "heavy": heavy, "stderr": stderr.getvalue()}))
"""


@pytest.fixture(scope="module")
def a_model_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An existing MODEL: the refusals below are about the other inputs, so its files are never read."""
    directory = tmp_path_factory.mktemp("model")
    (directory / "config.json").write_text("{}", encoding="utf-8")
    return directory


def refusals(tmp: Path, model: Path) -> list[tuple[list[str], str]]:
    """(argv, a fragment of its one-line error) for each refusal that must come before torch."""
    unknown_key = tmp / "unknown-key.yaml"
    unknown_key.write_text("task_type: classification\n", encoding="utf-8")
    missing_train = tmp / "missing-train.yaml"
    missing_train.write_text(f"run:\n  output_dir: {tmp / 'runs'}\n  name: never\n"
                             f"finetune:\n  train_file: {tmp / 'absent.jsonl'}\n", encoding="utf-8")
    absent_model, absent_input = str(tmp / "no-model"), str(tmp / "absent-input.jsonl")
    return [
        (["finetune", str(unknown_key)], "unknown key `task_type`"),
        (["finetune", str(missing_train), "optim.lr=fast"], "optim.lr"),
        (["finetune", str(missing_train)], f"{tmp / 'absent.jsonl'}: no such file or directory"),
        (["pretrain", str(ROOT / "configs/pretrain/quickstart.yaml"), f"run.output_dir={tmp / 'runs'}",
          f"data.path={tmp / 'no-dataset'}"], f"{tmp / 'no-dataset'}/index.json not found"),
        (["predict", absent_model, "--text", "a text"], f"model {absent_model!r}: no such file or directory"),
        (["predict", str(model), "--input", absent_input], f"{absent_input}: no such file or directory"),
        (["predict", absent_model, "--text", "a text", "--batch-size", "0"], "--batch-size is 0"),
        (["evaluate", str(model), "--data", absent_input], f"{absent_input}: no such file or directory"),
        (["fill-mask", absent_model, "the [MASK] fox"], f"model {absent_model!r}: no such file or directory"),
        (["fill-mask", str(model), "--input", absent_input], f"{absent_input}: no such file or directory"),
        (["export", absent_model, "--out", str(tmp / "exported")], f"model {absent_model!r}: no such file"),
    ]


def test_refusals_come_before_torch_is_imported(tmp_path: Path, a_model_directory: Path) -> None:
    cases = refusals(tmp_path, a_model_directory)
    environment = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "1000"}
    result = subprocess.run([sys.executable, "-c", PROBE, json.dumps([argv for argv, _ in cases]), json.dumps(HEAVY)],
                            capture_output=True, text=True, cwd=ROOT, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(cases), result.stdout + result.stderr
    for (argv, fragment), report in zip(cases, reports, strict=True):
        assert report["heavy"] == [], f"{argv} imported {report['heavy']} before its refusal"
        assert report["code"] == 2, report
        assert fragment in report["stderr"], report
        assert "Traceback" not in report["stderr"]
    assert not (tmp_path / "runs" / "never").exists()  # the refused run left no directory


def test_a_missing_data_file_is_refused_with_the_readers_own_line(tmp_path: Path) -> None:
    from bertforge.data.records import read_records

    absent = str(tmp_path / "absent.csv")
    with pytest.raises(BertforgeError) as by_reader:
        read_records(absent)
    with pytest.raises(BertforgeError) as by_preflight:
        preflight.refuse_missing_data_file(absent)
    assert str(by_preflight.value) == str(by_reader.value)


def test_inputs_that_exist_or_are_not_local_paths_are_left_to_the_run(tmp_path: Path) -> None:
    present = tmp_path / "train.jsonl"
    present.write_text('{"text": "a", "label": "x"}\n', encoding="utf-8")
    # a missing .txt is left too: `predict` and `embed` read it as one text per line and word their own refusal
    for reference in (None, str(present), "hf:glue:sst2@train", "s3://bucket/train.csv", f"{tmp_path}@train",
                      str(tmp_path / "absent.txt")):
        preflight.refuse_missing_data_file(reference)  # nothing read, nothing downloaded, nothing raised
    for model in ("all-MiniLM-L6-v2", "some-org/some-model", str(tmp_path)):
        preflight.refuse_missing_model(model)
    preflight.refuse_missing_prepared_dataset("s3://bucket/corpus-128")
