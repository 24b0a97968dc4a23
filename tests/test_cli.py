"""The command line: help for every command, version, exit codes, --print-config round trip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.cli import build_parser, main
from bertforge.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def commands() -> list[list[str]]:
    """Every command and sub-command path, e.g. ['tokenizer', 'train']."""
    import argparse

    found: list[list[str]] = []

    def walk(parser: argparse.ArgumentParser, prefix: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append([*prefix, name])
                    walk(sub, [*prefix, name])

    walk(build_parser(), [])
    return found


def test_the_pipeline_commands_are_registered() -> None:
    top = {path[0] for path in commands()}
    assert {"quickstart", "data", "tokenizer", "prepare", "pretrain", "train", "plot"} <= top


@pytest.mark.parametrize("path", commands(), ids=lambda p: " ".join(p))
def test_every_command_has_help_with_an_example(path: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*path, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "usage: bertforge" in text and "example:" in text and f"bertforge {path[0]}" in text.split("example:")[1]


def test_version_and_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("bertforge ")
    assert main([]) == 0


def run_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bertforge.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_print_config_output_loads_back_to_an_equal_config(tmp_path: Path) -> None:
    recipe = ROOT / "configs" / "pretrain" / "mosaic-bert-base.yaml"
    done = run_cli("pretrain", str(recipe), "optim.lr=1e-4", "train.max_steps=5", "--print-config")
    assert done.returncode == 0, done.stderr
    printed = tmp_path / "printed.yaml"
    printed.write_text(done.stdout)
    assert load_config(printed) == load_config(recipe, ["optim.lr=1e-4", "train.max_steps=5"])


def test_a_config_typo_is_one_line_on_stderr_with_exit_code_2() -> None:
    done = run_cli("pretrain", str(ROOT / "configs" / "pretrain" / "bert-base.yaml"), "optim.lrr=1e-4")
    assert done.returncode == 2
    assert "did you mean `optim.lr`" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_debug_shows_the_traceback() -> None:
    done = run_cli("--debug", "pretrain", str(ROOT / "configs" / "pretrain" / "bert-base.yaml"), "optim.lrr=1")
    assert done.returncode == 2 and "Traceback" in done.stderr


def test_every_recipe_loads() -> None:
    recipes = sorted((ROOT / "configs").rglob("*.yaml")) + sorted((ROOT / "src" / "bertforge" / "recipes").glob("*.yaml"))
    assert len(recipes) >= 7
    for recipe in recipes:
        load_config(recipe)


def test_data_samples_lists_the_bundled_files() -> None:
    done = run_cli("data", "samples")
    assert done.returncode == 0, done.stderr
    assert "corpus" in done.stdout and "supersense" in done.stdout


def test_error_text_with_brackets_is_printed_verbatim() -> None:
    done = run_cli("train", "--task", "missing[MASK].py:Task", str(ROOT / "configs" / "pretrain" / "bert-base.yaml"))
    assert done.returncode == 2
    assert "missing[MASK].py does not exist" in done.stderr
