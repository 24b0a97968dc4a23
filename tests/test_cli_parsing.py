"""The command line as the docs show it: every `bertforge ...` command in README.md, docs/guide.md and the
`--help` examples parses (dotted overrides anywhere after CONFIG, between and after options), a mistyped
command gets a did-you-mean, a missing CONFIG is named, and a few cheap documented commands run."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from bertforge.cli import build_parser, main, parse_arguments

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "docs" / "guide.md"]
COMMAND = re.compile(r"(?:^|\s)(?:bertforge|-m bertforge\.cli|-m bertforge) (?P<arguments>.*)")


def command_lines(text: str) -> list[str]:
    """The argument lists of `bertforge` commands in a text's shell lines (continuations joined, comments, prompts
    and redirections dropped); `torchrun ... -m bertforge.cli ARGS` counts."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip().removeprefix("$ ")
        match = COMMAND.search(line)
        if line.startswith("#") or match is None:
            continue
        arguments = re.split(r" #|\s&&\s|\s\|\s|\s>\s", match["arguments"])[0].strip()
        found.append(arguments)
    return found


def documented_commands() -> list[tuple[str, str]]:
    commands = []
    for doc in DOCS:
        for block in re.findall(r"```[^\n]*\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            commands += [(doc.name, arguments) for arguments in command_lines(block)]
    return commands


def subcommand_parsers(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += subcommand_parsers(child, f"{path} {name}".strip())
    return found


def help_examples() -> list[tuple[str, str]]:
    examples = []
    for path, parser in subcommand_parsers(build_parser()):
        epilog = parser.epilog or ""
        if epilog.startswith("example:"):
            examples += [(f"{path} --help", arguments) for arguments in command_lines(epilog)]
    return examples


def inline_commands() -> list[tuple[str, str]]:
    """`bertforge NAME ...` in the docs' prose and tables (often a synopsis with placeholders)."""
    spans = []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        spans += [(doc.name, span) for span in re.findall(r"`bertforge ([^`]+)`", prose)]
    return spans


def parse(arguments: str) -> argparse.Namespace:
    return parse_arguments(build_parser(), shlex.split(arguments))


def test_the_docs_and_help_show_many_commands() -> None:  # the extraction itself must keep finding them
    assert len(documented_commands()) >= 30 and len(help_examples()) >= 20 and len(inline_commands()) >= 30


@pytest.mark.parametrize(("where", "arguments"), documented_commands() + help_examples(),
                         ids=lambda value: value if len(value) < 60 else value[:57] + "...")
def test_every_documented_command_parses(where: str, arguments: str) -> None:
    if "--help" in shlex.split(arguments):
        with pytest.raises(SystemExit) as exit_:
            parse(arguments)
        assert exit_.value.code == 0
        return
    args = parse(arguments)
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
