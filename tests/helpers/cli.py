"""Commands run in the test's own process through `bertforge.cli.main`, as the documented-commands test runs them."""

from __future__ import annotations

import pytest

from bertforge.cli import main


def error_line(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    """The one error line of a command refused with exit code 2 (an info line may precede it), no traceback."""
    capsys.readouterr()
    code = main(list(arguments))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    return errors[0]
