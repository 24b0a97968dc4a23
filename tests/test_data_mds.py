"""Our MDS reader/writer agree with the real mosaicml-streaming package (fixtures written by it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bertforge.data.mds import MDSReader, MDSWriter
from bertforge.errors import DataError

FIXTURES = Path(__file__).parent / "fixtures" / "mds"
COLUMNS = {"text": "str", "blob": "bytes", "number": "int", "tokens": "ndarray:uint16", "pair": "ndarray:int32:2",
           "anything": "ndarray", "meta": "json"}  # the columns of scripts/make_mds_fixtures.py


def as_json(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, np.ndarray):
            out[key] = {"dtype": value.dtype.name, "shape": list(value.shape), "values": value.ravel().tolist()}
        elif isinstance(value, bytes):
            out[key] = {"hex": value.hex()}
        else:
            out[key] = value
    return out


def from_json(row: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, dict) and "dtype" in value:
            out[key] = np.array(value["values"], dtype=value["dtype"]).reshape(value["shape"])
        elif isinstance(value, dict) and "hex" in value:
            out[key] = bytes.fromhex(value["hex"])
        else:
            out[key] = value
    return out


@pytest.fixture(scope="module")
def expected() -> list[dict[str, Any]]:
    return json.loads((FIXTURES / "expected.json").read_text())


@pytest.mark.parametrize("name", ["plain", "zstd"])
def test_mds_written_by_mosaicml_streaming_reads_back_exactly(name: str, expected: list[dict[str, Any]]) -> None:
    reader = MDSReader(str(FIXTURES / name))
    assert len(reader) == len(expected)
    assert [as_json(row) for row in reader.iter_rows()] == expected


@pytest.mark.parametrize("name,compression", [("plain", None), ("zstd", "zstd")])
def test_mds_we_write_has_the_index_and_shard_bytes_of_mosaicml_streaming(
        tmp_path: Path, expected: list[dict[str, Any]], name: str, compression: str | None) -> None:
    with MDSWriter(str(tmp_path / name), COLUMNS, compression=compression, hashes=["sha1"], size_limit=1 << 10) as w:
        for row in expected:
            w.write(from_json(row))
    ours = json.loads((tmp_path / name / "index.json").read_text())
    theirs = json.loads((FIXTURES / name / "index.json").read_text())
    assert ours.keys() == theirs.keys() and ours["version"] == theirs["version"] == 2
    assert len(ours["shards"]) == len(theirs["shards"])
    for mine, reference in zip(ours["shards"], theirs["shards"], strict=True):
        assert mine.keys() == reference.keys()
        # the uncompressed shard is byte-identical (same sha1); zstd output may differ between zstd libraries
        assert mine["raw_data"] == reference["raw_data"]
        assert {k: v for k, v in mine.items() if k not in ("raw_data", "zip_data")} == \
            {k: v for k, v in reference.items() if k not in ("raw_data", "zip_data")}
        assert (mine["zip_data"] is None) == (reference["zip_data"] is None)
    assert [as_json(row) for row in MDSReader(str(tmp_path / name)).iter_rows()] == expected


def test_a_truncated_mds_shard_is_reported_by_name(tmp_path: Path) -> None:
    with MDSWriter(str(tmp_path / "d"), {"text": "str"}, size_limit=200) as writer:
        for i in range(20):
            writer.write({"text": f"document number {i} " * 3})
    shard = tmp_path / "d" / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-5])
    with pytest.raises(DataError, match=r"shard shard\.00001\.mds has \d+ bytes, the index says"):
        list(MDSReader(str(tmp_path / "d")).iter_rows())


def test_unsupported_encodings_and_compressions_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="encoding 'pkl' is not supported"):
        MDSWriter(str(tmp_path / "x"), {"obj": "pkl"})
    with pytest.raises(DataError, match="compression 'br' is not supported"):
        MDSWriter(str(tmp_path / "y"), {"text": "str"}, compression="br")
