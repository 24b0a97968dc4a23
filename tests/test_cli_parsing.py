"""The command line as the docs show it: every `bertforge ...` command in README.md, docs/*.md and the
`--help` examples parses (dotted overrides anywhere after CONFIG, between and after options), a mistyped
command gets a did-you-mean, a missing CONFIG is named, and a few cheap documented commands run
(tests/test_documented_commands.py runs all of them)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
from helpers.documented_commands import (
    DocumentedCommand,
    documented_commands,
    help_examples,
    inline_commands,
    shell_words,
    subcommand_parsers,
)

from bertforge.cli import build_parser, main, parse_arguments

REPO = Path(__file__).resolve().parents[1]


def parse(arguments: str) -> argparse.Namespace:
    return parse_arguments(build_parser(), shlex.split(arguments))


def test_the_docs_and_help_show_many_commands() -> None:  # the extraction itself must keep finding them
    assert len(documented_commands()) >= 30 and len(help_examples()) >= 20 and len(inline_commands()) >= 30


@pytest.mark.parametrize("command", documented_commands() + help_examples(),
                         ids=lambda command: f"{command.where}: {command.arguments[:60]}")
def test_every_documented_command_parses(command: DocumentedCommand) -> None:
    words = shell_words(command.arguments)
    if "--help" in words:
        with pytest.raises(SystemExit) as exit_:
            parse_arguments(build_parser(), words)
        assert exit_.value.code == 0
        return
    args = parse_arguments(build_parser(), words)
    assert args.command is not None and callable(args.func)


@pytest.mark.parametrize(("where", "span"), inline_commands(), ids=lambda value: value[:50])
def test_every_command_the_docs_name_in_prose_exists(where: str, span: str) -> None:
    parsers = dict(subcommand_parsers(build_parser()))
    words = [word for word in span.split() if re.fullmatch(r"[a-z][a-z-]*", word)]
    assert words and words[0] in parsers, f"{where}: `bertforge {span}` names no command"
    if words[:2] and " ".join(words[:2]) not in parsers and any(p.startswith(words[0] + " ") for p in parsers):
        pytest.fail(f"{where}: `bertforge {span}` names no subcommand of {words[0]}")


def test_overrides_stand_anywhere_after_config_in_command_line_order() -> None:
    args = parse("glue configs/glue/minilm-cpu.yaml --data-dir /tmp/glue-demo --jobs 2 glue.tasks=[rte,mrpc] "
                 "--out /tmp/out glue.seeds=1")
    assert (args.config, args.data_dir, args.jobs, args.out) == ("configs/glue/minilm-cpu.yaml", "/tmp/glue-demo", 2,
                                                                 "/tmp/out")
    assert args.overrides == ["glue.tasks=[rte,mrpc]", "glue.seeds=1"]
    args = parse("pretrain configs/pretrain/quickstart.yaml optim.lr=1 --print-config train.max_steps=3 -q optim.lr=2")
    assert args.print_config and args.overrides == ["optim.lr=1", "train.max_steps=3", "optim.lr=2"]


def test_a_stray_argument_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse("pretrain configs/pretrain/quickstart.yaml --print-config stray")
    assert exit_.value.code == 2 and "unrecognized arguments: stray" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("fill-mask runs/x 'a [MASK]' optim.lr=1")  # no config tree: an override means nothing here


def test_a_mistyped_command_or_subcommand_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]) -> None:
    for mistyped, meant in (("pretrian configs/x.yaml", "pretrain"), ("finetnue", "finetune"),
                            ("tokenizer trian --input x --out y", "train")):
        with pytest.raises(SystemExit) as exit_:
            parse(mistyped)
        assert exit_.value.code == 2 and f"did you mean '{meant}'?" in capsys.readouterr().err


def test_finetune_without_arguments_says_config_is_missing_and_overrides_are_optional(
        capsys: pytest.CaptureFixture[str]) -> None:
    for arguments in ("finetune", "finetune optim.lr=1e-3"):
        with pytest.raises(SystemExit) as exit_:
            parse(arguments)
        error = capsys.readouterr().err
        assert exit_.value.code == 2 and "missing CONFIG" in error and "KEY=VALUE overrides are optional" in error
        assert "bertforge finetune configs/finetune/" in error  # the --help example


def test_cheap_documented_commands_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pretrain", str(REPO / "configs/pretrain/quickstart.yaml"), "--print-config", "optim.lr=1e-3"]) == 0
    assert "lr: 0.001" in capsys.readouterr().out
    assert main(shlex.split(f"glue {REPO}/configs/glue/minilm-cpu.yaml --data-dir /tmp/glue-demo --jobs 2 "
                            "glue.tasks=[rte,mrpc] --print-config")) == 0
    assert re.search(r"tasks:\n\s+- rte\n\s+- mrpc", capsys.readouterr().out)
    assert main(["data", "samples"]) == 0
    assert "supersense" in capsys.readouterr().out
