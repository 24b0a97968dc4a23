"""The real data bundled in ``bertforge/samples`` is what its manifest says, leak-free and reproducible."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import HANG_TIMEOUT

from bertforge.data.bundled import (
    SUPERSENSE_SPLITS,
    corpus_path,
    describe_samples,
    read_manifest,
    samples_dir,
    supersense_labels,
    supersense_path,
)
from bertforge.errors import BertforgeError

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_samples.py"

LEXICOGRAPHER_FILES = {
    "adj.all", "adj.pert", "adj.ppl", "adv.all",
    "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute", "noun.body",
    "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant",
    "noun.possession", "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition",
    "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather",
}  # fmt: skip


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return read_manifest()


@pytest.fixture(scope="module")
def corpus_text() -> str:
    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        return f.read()


@pytest.fixture(scope="module")
def corpus_documents(corpus_text: str) -> list[list[str]]:
    return [doc.split("\n") for doc in corpus_text.rstrip("\n").split("\n\n")]


@pytest.fixture(scope="module")
def supersense() -> dict[str, list[dict[str, str]]]:
    rows: dict[str, list[dict[str, str]]] = {}
    for split in SUPERSENSE_SPLITS:
        with gzip.open(supersense_path(split), "rt", encoding="utf-8") as f:
            rows[split] = [json.loads(line) for line in f]
    return rows


def test_every_bundled_file_has_the_size_and_sha256_recorded_in_the_manifest(
    manifest: dict[str, Any],
) -> None:
    on_disk = {
        p.relative_to(samples_dir()).as_posix()
        for p in samples_dir().rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    for name, entry in manifest["files"].items():
        data = (samples_dir() / name).read_bytes()
        assert len(data) == entry["bytes"], name
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name


def test_the_whole_samples_directory_fits_in_8_mb() -> None:
    total = sum(p.stat().st_size for p in samples_dir().rglob("*") if p.is_file())
    assert total <= 8_000_000


def test_corpus_document_and_line_counts_match_the_manifest(
    manifest: dict[str, Any], corpus_documents: list[list[str]]
) -> None:
    entry = manifest["files"]["corpus.txt.gz"]
    assert len(corpus_documents) == entry["documents"] == entry["kjv_chapters"] + entry["wordnet_documents"]
    assert sum(len(doc) for doc in corpus_documents) == entry["lines"]
    assert entry["kjv_chapters"] == 1189 and entry["kjv_verses"] == 31102


def test_corpus_is_documents_separated_by_single_blank_lines(corpus_text: str) -> None:
    assert corpus_text.endswith("\n") and not corpus_text.endswith("\n\n")
    assert not corpus_text.startswith("\n")
    assert "\n\n\n" not in corpus_text
    lines = corpus_text.rstrip("\n").split("\n")
    assert all(line == line.strip() for line in lines), "no line has surrounding whitespace"


def test_corpus_starts_with_genesis_without_verse_numbers(corpus_documents: list[list[str]]) -> None:
    assert corpus_documents[0][0] == "In the beginning God created the heaven and the earth."
    assert len(corpus_documents[0]) == 31  # Genesis 1 has 31 verses


def test_supersense_row_counts_match_the_manifest(
    manifest: dict[str, Any], supersense: dict[str, list[dict[str, str]]]
) -> None:
    for split in SUPERSENSE_SPLITS:
        assert len(supersense[split]) == manifest["files"][f"supersense/{split}.jsonl.gz"]["rows"]
        assert len(supersense[split]) == manifest["supersense"]["splits"][split]
        counts: dict[str, int] = {}
        for row in supersense[split]:
            counts[row["label"]] = counts.get(row["label"], 0) + 1
        assert counts == manifest["supersense"]["label_counts"][split]


def test_supersense_rows_are_text_label_id_with_non_empty_text(
    supersense: dict[str, list[dict[str, str]]],
) -> None:
    for rows in supersense.values():
        for row in rows:
            assert list(row) == ["text", "label", "id"]
            assert row["text"] and row["text"] == row["text"].strip()
            pos, _, offset = row["id"].partition(".")
            assert pos in {"n", "v", "a", "s", "r"} and len(offset) == 8 and offset.isdigit()


def test_supersense_splits_are_disjoint_by_id_and_by_text(
    supersense: dict[str, list[dict[str, str]]],
) -> None:
    ids = {split: {row["id"] for row in rows} for split, rows in supersense.items()}
    texts = {split: {row["text"] for row in rows} for split, rows in supersense.items()}
    for split, rows in supersense.items():
        assert len(ids[split]) == len(rows), f"duplicate ids in {split}"
    for a, b in [("train", "validation"), ("train", "test"), ("validation", "test")]:
        assert not ids[a] & ids[b], f"{a} and {b} share ids"
        assert not texts[a] & texts[b], f"{a} and {b} share gloss texts"


def test_supersense_split_is_roughly_80_10_10(supersense: dict[str, list[dict[str, str]]]) -> None:
    total = sum(len(rows) for rows in supersense.values())
    assert total > 100_000
    for split, share in [("train", 0.8), ("validation", 0.1), ("test", 0.1)]:
        assert abs(len(supersense[split]) / total - share) < 0.01, split


def test_labels_are_the_45_lexicographer_files_and_all_occur_in_train(
    manifest: dict[str, Any], supersense: dict[str, list[dict[str, str]]]
) -> None:
    assert set(manifest["supersense"]["labels"]) == LEXICOGRAPHER_FILES
    assert supersense_labels() == sorted(LEXICOGRAPHER_FILES)
    train_labels = {row["label"] for row in supersense["train"]}
    assert train_labels == LEXICOGRAPHER_FILES
    for split in ("validation", "test"):
        assert {row["label"] for row in supersense[split]} <= train_labels


def test_corpus_contains_train_glosses_but_no_validation_or_test_gloss(
    corpus_text: str, supersense: dict[str, list[dict[str, str]]]
) -> None:
    lines = set(corpus_text.split("\n"))
    held_out = {row["text"] for split in ("validation", "test") for row in supersense[split]}
    assert not lines & held_out
    assert {row["text"] for row in supersense["train"]} <= lines


def test_unknown_supersense_split_is_a_user_error_naming_the_valid_splits() -> None:
    with pytest.raises(BertforgeError, match="train, validation, test"):
        supersense_path("dev")


def test_describe_samples_lists_the_corpus_and_the_three_splits_with_counts(manifest: dict[str, Any]) -> None:
    entries = describe_samples()
    assert [e["name"] for e in entries] == [
        "corpus.txt.gz",
        "supersense/train.jsonl.gz",
        "supersense/validation.jsonl.gz",
        "supersense/test.jsonl.gz",
    ]
    for entry in entries:
        assert Path(entry["path"]).is_file()
        assert entry["bytes"] == manifest["files"][entry["name"]]["bytes"]
        assert isinstance(entry["rows"], int) and entry["rows"] > 0
    assert entries[0]["unit"] == "documents" and entries[1]["unit"] == "rows"


def _debian_version(package: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    res = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    if res.returncode != 0:
        return None
    return res.stdout.strip() or None


def test_build_script_reproduces_the_bundled_files_byte_for_byte(manifest: dict[str, Any]) -> None:
    if not Path("/usr/share/wordnet/data.noun").exists():
        pytest.skip("WordNet data not installed (apt-get install wordnet-base)")
    if shutil.which("bible") is None:
        pytest.skip("the `bible` program is not installed (apt-get install bible-kjv)")
    for package, version in manifest["sources"].items():
        installed = _debian_version(package)
        if installed != version:
            pytest.skip(f"{package} {installed} installed, but the samples were built from {version}")
    res = subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), "--check", "--out", str(samples_dir())],
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
    )
    assert res.returncode == 0, res.stdout + res.stderr
