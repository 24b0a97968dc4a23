"""The suite sees the same machine everywhere: its own home, caches and config, never the developer's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bertforge.storage import cache_root


def test_the_suite_runs_in_a_home_of_its_own() -> None:
    home = Path(os.environ["BERTFORGE_TEST_HOME"])
    assert Path.home() == home and home.name.startswith("bertforge-test-home-")
    assert cache_root().is_relative_to(home)
    assert Path(os.environ["HF_HOME"]).is_relative_to(home)


def test_processes_a_test_starts_inherit_that_home() -> None:
    printed = subprocess.run([sys.executable, "-c", "from pathlib import Path; print(Path.home())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert printed == os.environ["BERTFORGE_TEST_HOME"]
