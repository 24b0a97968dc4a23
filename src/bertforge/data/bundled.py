"""The real English data shipped inside the package (``bertforge/samples``).

So the quickstart, tests and benchmarks run with no download, the package carries a small
pre-training corpus (KJV chapters + WordNet train glosses, ``corpus.txt.gz``) and the WordNet
"gloss -> supersense" classification set (``supersense/{train,validation,test}.jsonl.gz``).
They are built by ``scripts/build_samples.py``; ``manifest.json`` records their hashes and counts.

Paths come from ``__file__`` (package data next to this module), so they work from a source
checkout, an editable install and an installed wheel alike.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from bertforge.errors import BertforgeError, DataError

SUPERSENSE_SPLITS: tuple[str, ...] = ("train", "validation", "test")
CORPUS_NAME = "corpus.txt.gz"
MANIFEST_NAME = "manifest.json"

_DESCRIPTIONS = {
    CORPUS_NAME: "pre-training corpus: KJV chapters + WordNet train glosses",
    "supersense/train.jsonl.gz": "WordNet gloss -> supersense, train split",
    "supersense/validation.jsonl.gz": "WordNet gloss -> supersense, validation split",
    "supersense/test.jsonl.gz": "WordNet gloss -> supersense, test split",
}


def samples_dir() -> Path:
    """The directory holding the bundled sample files."""
    return Path(__file__).resolve().parent.parent / "samples"


def _existing(relative: str) -> Path:
    path = samples_dir() / relative
    if not path.is_file():
        raise DataError(
            f"bundled sample file {path} is missing: the package was installed without its data; "
            "reinstall bertforge, or rebuild with `python scripts/build_samples.py` in a source checkout"
        )
    return path


def corpus_path() -> Path:
    """The pre-training corpus (gzip, bertforge .txt format: one sentence a line, blank line between docs)."""
    return _existing(CORPUS_NAME)


def supersense_path(split: str) -> Path:
    """One split of the supersense set (gzip JSONL with ``text``, ``label``, ``id``)."""
    if split not in SUPERSENSE_SPLITS:
        raise BertforgeError(
            f"unknown supersense split {split!r}: choose one of {', '.join(SUPERSENSE_SPLITS)}"
        )
    return _existing(f"supersense/{split}.jsonl.gz")


def supersense_lines(split: str, count: int) -> list[str]:
    """`count` evenly spaced JSONL lines of a split, spread over all of it.

    The files list synsets grouped by part of speech (nouns, then verbs, adjectives, adverbs), so
    a subset must span the whole file: taking the first rows, or every k-th row and then cutting
    at `count`, leaves whole parts of speech (and their labels) out.
    """
    with gzip.open(supersense_path(split), "rt", encoding="utf-8") as handle:
        lines = handle.readlines()
    count = min(count, len(lines))
    return [lines[i * len(lines) // count] for i in range(count)]


def read_manifest() -> dict[str, Any]:
    """The build manifest: per-file sha256/bytes/counts, the label set, split counts, source versions."""
    return json.loads(_existing(MANIFEST_NAME).read_text(encoding="utf-8"))


def supersense_labels() -> list[str]:
    """The sorted supersense label set, so a classifier head can be sized without reading the data."""
    return list(read_manifest()["supersense"]["labels"])


def describe_samples() -> list[dict[str, Any]]:
    """One entry per data file for ``bertforge data samples``.

    Keys: ``name`` (relative to the samples dir), ``path``, ``bytes`` (size on disk), ``rows``
    (documents for the corpus, JSON rows for the supersense splits), ``unit`` ("documents" or
    "rows") and ``description``.
    """
    files = read_manifest()["files"]
    entries: list[dict[str, Any]] = []
    for name, description in _DESCRIPTIONS.items():
        path = _existing(name)
        info = files[name]
        is_corpus = name == CORPUS_NAME
        entries.append(
            {
                "name": name,
                "path": path,
                "bytes": path.stat().st_size,
                "rows": int(info["documents"] if is_corpus else info["rows"]),
                "unit": "documents" if is_corpus else "rows",
                "description": description,
            }
        )
    return entries
