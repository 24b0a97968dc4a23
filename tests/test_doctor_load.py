"""`bertforge doctor` states the machine load its timing ran under: tokens/s on a shared machine moved 5x between
two runs, and a number without its load reads like a regression."""

from __future__ import annotations

import json
import os

import pytest

from bertforge.cli import main
from bertforge.commands.doctor import load_sentence

SMALL = ["--preset", "bert-tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--device", "cpu"]


def test_the_report_holds_the_load_average_and_the_cores(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "doctor", "--json", *SMALL]) == 0
    training = json.loads(capsys.readouterr().out)["training"]
    assert training["cpu_cores"] == os.cpu_count() and training["load_average"] >= 0.0
    assert main(["-q", "doctor", *SMALL]) == 0
    assert "machine load" in capsys.readouterr().out


def test_the_load_sentence_says_whether_the_cores_were_shared() -> None:
    assert load_sentence(9.5, 2) == ("load average 9.50 (1 min) on 2 cores: busy: other processes shared the cores, "
                                     "so tokens/s is lower than on a quiet machine")
    assert load_sentence(0.2, 8).endswith("quiet enough for tokens/s to be representative")
    assert load_sentence(None, 8).startswith("unknown")
