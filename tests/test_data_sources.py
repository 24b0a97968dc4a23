"""Documents come out of every supported input format the same way, with clear errors for bad input."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertforge.data.bundled import corpus_path
from bertforge.data.mds import MDSWriter
from bertforge.data.sources import iter_documents, resolve_inputs
from bertforge.errors import DataError

DOCS = ["First sentence. Second one.\nA new line.", "Another document here.", "Third: with ünïcode."]


def texts(inputs: list[str], **kwargs: object) -> list[str]:
    return [d.text for d in iter_documents(resolve_inputs(inputs), **kwargs)]  # type: ignore[arg-type]


def write_txt(path: Path, docs: list[str]) -> Path:
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def test_txt_documents_are_separated_by_blank_lines_with_gzip_and_zstd(tmp_path: Path) -> None:
    raw = ("\n\n \n".join(DOCS) + "\n").encode()
    (tmp_path / "a.txt").write_bytes(raw)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    for name in ("a.txt", "b.txt.gz", "c.txt.zst"):
        assert texts([str(tmp_path / name)]) == DOCS


def test_bundled_corpus_has_the_document_count_of_its_manifest() -> None:
    documents = list(iter_documents(resolve_inputs(["bundled:corpus"])))
    assert len(documents) == 4153
    assert documents[0].origin == f"{corpus_path()}:1"
    assert documents[0].text.startswith("In the beginning God created")


def test_jsonl_json_csv_tsv_parquet_give_the_same_documents(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    (tmp_path / "d.json").write_text(json.dumps([{"body": d} for d in DOCS]))
    import csv

    for name, delimiter in (("d.csv", ","), ("d.tsv", "\t")):
        with open(tmp_path / name, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f, delimiter=delimiter)
            writer.writerow(["id", "text"])
            writer.writerows([i, d] for i, d in enumerate(DOCS))
    pq.write_table(pa.table({"text": DOCS}), tmp_path / "d.parquet", row_group_size=2)
    assert texts([str(tmp_path / "d.jsonl")]) == DOCS
    assert texts([str(tmp_path / "d.json")], text_field="body") == DOCS
    assert texts([str(tmp_path / "d.csv")]) == DOCS
    assert texts([str(tmp_path / "d.tsv")]) == DOCS
    assert texts([str(tmp_path / "d.parquet")]) == DOCS


def test_a_missing_text_field_names_the_file_line_and_the_fields(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "ok"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: no field 'text' \(fields: body\).*--text-field"):
        texts([str(tmp_path / "d.jsonl")])


def test_directories_and_globs_expand_in_sorted_order(tmp_path: Path) -> None:
    write_txt(tmp_path / "b.txt", DOCS[1:])
    write_txt(tmp_path / "a.txt", DOCS[:1])
    (tmp_path / "notes.bin").write_bytes(b"ignored")
    assert texts([str(tmp_path)]) == DOCS
    assert texts([str(tmp_path / "*.txt")]) == DOCS
    with pytest.raises(DataError, match="matched no files"):
        resolve_inputs([str(tmp_path / "*.nothing")])


def test_hf_save_to_disk_directories_and_load_dataset_on_a_local_copy(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(tmp_path / "saved"))
    assert texts([str(tmp_path / "saved")]) == DOCS
    hub_copy = tmp_path / "hub_copy"
    hub_copy.mkdir()
    (hub_copy / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    assert texts([f"hf:{hub_copy}@train"]) == DOCS
    with pytest.raises(DataError, match="load_dataset failed"):
        texts([f"hf:{hub_copy}@nosuchsplit"])


def test_mds_directories_are_read_by_their_text_column(tmp_path: Path) -> None:
    with MDSWriter(str(tmp_path / "mds"), {"text": "str", "n": "int"}, compression="zstd") as writer:
        for i, doc in enumerate(DOCS):
            writer.write({"text": doc, "n": i})
    assert texts([str(tmp_path / "mds")]) == DOCS


def test_fsspec_urls_work_for_input(tmp_path: Path) -> None:
    fs = fsspec.filesystem("memory")
    fs.pipe("/bertforge-test/in/corpus.txt", ("\n\n".join(DOCS) + "\n").encode())
    assert texts(["memory://bertforge-test/in/*.txt"]) == DOCS
    write_txt(tmp_path / "c.txt", DOCS)
    assert texts([f"file://{tmp_path}/c.txt"]) == DOCS


def test_invalid_utf8_is_replaced_with_one_warning_naming_the_line(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "bad.txt").write_bytes(b"Good text.\n\nBad \xff\xfe bytes here.\n\nMore good.\n")
    logger = logging.getLogger("bertforge")
    logger.addHandler(caplog.handler)
    try:
        got = texts([str(tmp_path / "bad.txt")])
    finally:
        logger.removeHandler(caplog.handler)
    assert got == ["Good text.", "Bad \ufffd\ufffd bytes here.", "More good."]
    assert "bad.txt:3: invalid UTF-8 bytes replaced" in caplog.text


def test_empty_documents_are_skipped_and_an_input_without_text_is_reported(tmp_path: Path) -> None:
    (tmp_path / "gaps.txt").write_text("\n\n\n   \n\nOnly one.\n\n\n\n")
    assert texts([str(tmp_path / "gaps.txt")]) == ["Only one."]
    (tmp_path / "rows.jsonl").write_text('{"text": ""}\n{"text": null}\n{"text": "x"}\n')
    assert texts([str(tmp_path / "rows.jsonl")]) == ["x"]


def test_unknown_extensions_and_missing_paths_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "data.xlsx").write_bytes(b"")
    with pytest.raises(DataError, match="unknown extension"):
        resolve_inputs([str(tmp_path / "data.xlsx")])
    with pytest.raises(DataError, match="does not exist"):
        resolve_inputs([str(tmp_path / "missing.txt")])
