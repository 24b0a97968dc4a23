"""The `bertforge` commands the documentation shows: the shell blocks of README.md and docs/*.md and the
`--help` examples of every (sub)command, and the `bertforge NAME ...` spans of the docs' prose.

A command is a shell line (continuations joined, a `$ ` prompt, comments and what follows `&&`, `|` or
`>` dropped) that starts with `bertforge`, or with a launcher that runs it (`torchrun ... -m bertforge.cli`,
`srun torchrun ...`, `python -m bertforge`), after any `NAME=value` environment assignments. Lines that
merely mention bertforge (a directory tree, a table in a command's printed output) are not commands.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bertforge.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCED_BLOCK = re.compile(r"```(?P<language>[^\n]*)\n(?P<text>.*?)```", re.S)
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                     r"(?P<launcher>(?:srun\s+)?torchrun\s.*?-m bertforge\.cli\s+|python3?\s+-m\s+bertforge(?:\.cli)?\s+)?"
                     r"(?:bertforge\s+)?(?P<arguments>.*)$")
STARTS_A_COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:bertforge\s|(?:srun\s+)?torchrun\s.*-m bertforge\.cli\s"
                              r"|python3?\s+-m\s+bertforge(?:\.cli)?\s)")


@dataclass(frozen=True)
class DocumentedCommand:
    where: str      # the document, or `<command> --help`
    arguments: str  # what follows `bertforge`, as written
    launcher: str   # `torchrun ...` when the docs launch it so, else ""


def command_lines(text: str, where: str) -> list[DocumentedCommand]:
    found = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip().removeprefix("$ ")
        if not STARTS_A_COMMAND.match(line):
            continue
        match = COMMAND.match(line)
        assert match is not None  # COMMAND accepts whatever STARTS_A_COMMAND does
        arguments = re.split(r" #|\s&&\s|\s\|\s|\s>\s", match["arguments"])[0].strip()
        found.append(DocumentedCommand(where, arguments, (match["launcher"] or "").strip()))
    return found


def documented_commands() -> list[DocumentedCommand]:
    """Every command in the shell blocks of README.md and docs/*.md, in document order."""
    commands = []
    for doc in DOCS:
        for block in FENCED_BLOCK.finditer(doc.read_text(encoding="utf-8")):
            if block["language"].strip() in SHELL_LANGUAGES:
                commands += command_lines(block["text"], doc.relative_to(REPO).as_posix())
    return commands


def subcommand_parsers(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += subcommand_parsers(child, f"{path} {name}".strip())
    return found


def help_examples() -> list[DocumentedCommand]:
    """Every command in the `example:` epilogs of `bertforge <command> --help`."""
    examples = []
    for path, parser in subcommand_parsers(build_parser()):
        epilog = parser.epilog or ""
        if epilog.startswith("example:"):
            examples += command_lines(epilog, f"{path} --help")
    return examples


def inline_commands() -> list[tuple[str, str]]:
    """`bertforge NAME ...` in the docs' prose and tables (often a synopsis with placeholders)."""
    spans = []
    for doc in DOCS:
        prose = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
        spans += [(doc.relative_to(REPO).as_posix(), span) for span in re.findall(r"`bertforge ([^`]+)`", prose)]
    return spans


# what the docs' shell variables stand for when a command's words are split as a shell splits them
SHELL_VARIABLES = {"SLURM_ARRAY_TASK_ID": "0"}


def shell_words(arguments: str) -> list[str]:
    """The words bash passes to bertforge for `arguments`: `$(...)` and `$VARIABLE` expanded by bash itself
    (with SHELL_VARIABLES), anything else split as shlex splits it."""
    if "$" not in arguments:
        return shlex.split(arguments)
    done = subprocess.run(["bash", "-c", f"printf '%s\\0' {arguments}"], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", **SHELL_VARIABLES})
    return done.stdout.split("\0")[:-1]
