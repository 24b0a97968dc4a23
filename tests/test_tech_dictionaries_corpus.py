"""The tech-dictionaries corpus (benchmarks.common.corpora): a dictd database read through its index, entries
reflowed into prose, and the check that a corpus shares no line with a task's text."""

from __future__ import annotations

import gzip
from pathlib import Path

from benchmarks.common.corpora import (
    DICTD_DIGITS,
    dictd_entries,
    dictd_number,
    dictionary_document,
    shared_lines,
)

FOLDOC_ENTRY = """56k line

   <communications> A digital connection (possibly a {leased
   line}, possibly switched) capable of carrying {56 kbps}.

   Compare {DS0}.

   (2000-07-16)

"""


def encode(value: int) -> str:
    digits = ""
    while True:
        digits = DICTD_DIGITS[value % 64] + digits
        value //= 64
        if not value:
            return digits


def test_a_dictd_database_is_read_through_its_index(tmp_path: Path) -> None:
    header = "00-database-url\n     http://example.org\n"
    data = header + FOLDOC_ENTRY
    (tmp_path / "tiny.dict.dz").write_bytes(gzip.compress(data.encode()))  # dictzip is gzip with an index
    (tmp_path / "tiny.index").write_text(f"00-database-url\t{encode(0)}\t{encode(len(header))}\n"
                                         f"56k line\t{encode(len(header))}\t{encode(len(FOLDOC_ENTRY))}\n")
    assert dictd_number("BA") == 64 and dictd_number(encode(123_456)) == 123_456
    entries = dictd_entries("tiny", tmp_path)
    assert entries == [FOLDOC_ENTRY]
    assert dictionary_document(entries[0]) == ("56k line\n<communications> A digital connection (possibly a leased "
                                               "line, possibly switched) capable of carrying 56 kbps.\nCompare DS0.")


def test_shared_lines_finds_a_task_line_whatever_its_case_and_spacing() -> None:
    documents = ["crash\nTo crash a program is to stop it.", "modem\nA device that modulates signals."]
    texts = ["a device  that MODULATES signals.", "fall or come down violently"]
    assert shared_lines(documents, texts) == ["A device that modulates signals."]
    assert shared_lines(documents, ["something else"]) == []
