"""`make test` hands its workers the files that hold slow tests first (tests/helpers/suite_order.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester"]


def test_files_with_slow_tests_go_first_then_the_most_tests_and_each_file_keeps_its_order(
        pytester: pytest.Pytester) -> None:
    pytester.syspathinsert(ROOT / "tests")
    pytester.makeconftest("""
from helpers.suite_order import files_with_slow_tests_first

def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long")

def pytest_collection_modifyitems(config, items):
    items[:] = files_with_slow_tests_first(items)
""")
    pytester.makepyfile(
        test_a_many="def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n",
        test_b_one_slow="import pytest\n@pytest.mark.slow\ndef test_long(): pass\n",
        test_c_two_slow=("import pytest\ndef test_quick(): pass\n@pytest.mark.slow\ndef test_long_1(): pass\n"
                         "@pytest.mark.slow\ndef test_long_2(): pass\n"),
        test_d_few="def test_1(): pass\ndef test_2(): pass\n",
    )
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist")
    collected = [line for line in result.outlines if "::" in line]
    assert collected == ["test_c_two_slow.py::test_quick", "test_c_two_slow.py::test_long_1",
                         "test_c_two_slow.py::test_long_2", "test_b_one_slow.py::test_long",
                         "test_a_many.py::test_1", "test_a_many.py::test_2", "test_a_many.py::test_3",
                         "test_d_few.py::test_1", "test_d_few.py::test_2"]


def test_make_test_keeps_that_order() -> None:
    """xdist re-sorts the files by their number of tests unless told not to, which undoes the order above."""
    recipe = re.search(r"^test: .*?\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe and "--dist loadfile --no-loadscope-reorder" in recipe.group(1)
