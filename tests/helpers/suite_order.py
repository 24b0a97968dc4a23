"""The order in which `make test`'s two workers take the test files."""

from __future__ import annotations

import pytest


def files_with_slow_tests_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The collection, file by file, in the order `make test`'s workers should take the files.

    `--dist loadfile` hands a worker the next whole file when it is free. xdist's own order (most tests
    first) put tests/test_quickstart.py, 4 tests and 8 minutes, near the end, so one worker ran it alone
    while the other had nothing left. Files holding `slow` tests now go first, those with the most
    first, then the others with the most tests first (xdist's rule; the Makefile passes
    --no-loadscope-reorder so this order is the one used). Tests keep their order within a file."""
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(tests: list[pytest.Item]) -> tuple[int, int]:
        return (-sum(1 for test in tests if test.get_closest_marker("slow")), -len(tests))

    return [item for tests in sorted(by_file.values(), key=weight) for item in tests]
