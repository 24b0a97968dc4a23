"""Write the MDS fixtures under tests/fixtures/mds/ with the real `mosaicml-streaming` package.

bertforge reads and writes MDS itself (see `bertforge.data.mds` for why); these fixtures pin its
compatibility with the reference implementation. Run once, in a throwaway environment, never in
the project's venv (streaming pins transformers<5 and numpy<2.2 and imports torchvision):

    python3 -m venv /tmp/mdsenv
    /tmp/mdsenv/bin/pip install --no-deps mosaicml-streaming==0.13.0 xxhash zstd python-snappy cramjam Brotli tqdm catalogue
    # torch/numpy from the project's venv; a stand-in torchvision (streaming imports it unconditionally)
    echo /path/to/bertforge/.venv/lib/python3.11/site-packages > /tmp/mdsenv/lib/python3.11/site-packages/zz.pth
    /tmp/mdsenv/bin/python scripts/make_mds_fixtures.py --stand-in-torchvision

`--check DIR` instead reads an MDS directory written by bertforge with `streaming.StreamingDataset`
and prints its samples as JSON: the proof that the library accepts what we write.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mds"
COLUMNS = {
    "text": "str",
    "blob": "bytes",
    "number": "int",
    "tokens": "ndarray:uint16",
    "pair": "ndarray:int32:2",
    "anything": "ndarray",
    "meta": "json",
}


def stand_in_torchvision() -> None:
    """streaming imports torchvision for its vision datasets only; text needs none of it."""
    site = Path(sysconfig.get_paths()["purelib"]) / "torchvision"
    (site / "datasets").mkdir(parents=True, exist_ok=True)
    (site / "transforms").mkdir(parents=True, exist_ok=True)
    (site / "__init__.py").write_text('"""Stand-in: streaming imports torchvision unconditionally."""\n')
    (site / "datasets" / "__init__.py").write_text("class VisionDataset:\n    pass\n\n\nclass CIFAR10:\n    pass\n")
    (site / "transforms" / "__init__.py").write_text("")
    (site / "transforms" / "functional.py").write_text("def to_tensor(x):\n    raise NotImplementedError\n")


def samples() -> list[dict]:
    import numpy as np

    rows = []
    for i in range(23):
        rows.append({
            "text": f"sample {i}: héllo wörld " + "x" * (i * 7),
            "blob": bytes(range(i % 11)) + b"\xff\x00",
            "number": i * 1_000_003 - 7,
            "tokens": np.arange(i + 1, dtype=np.uint16) * 3,
            "pair": np.array([i, -i], dtype=np.int32),
            "anything": np.full((2, i % 3 + 1), i / 2, dtype=np.float32),
            "meta": {"index": i, "tags": ["a", "b"][: i % 3]},
        })
    return rows


def as_json(row: dict) -> dict:
    import numpy as np

    out = {}
    for key, value in row.items():
        if isinstance(value, np.ndarray):
            out[key] = {"dtype": value.dtype.name, "shape": list(value.shape), "values": value.ravel().tolist()}
        elif isinstance(value, bytes):
            out[key] = {"hex": value.hex()}
        else:
            out[key] = value
    return out


def write_fixtures() -> None:
    from streaming import MDSWriter

    rows = samples()
    for name, compression in (("plain", None), ("zstd", "zstd")):
        out = FIXTURES / name
        shutil.rmtree(out, ignore_errors=True)
        with MDSWriter(out=str(out), columns=COLUMNS, compression=compression, hashes=["sha1"],
                       size_limit=1 << 10) as writer:
            for row in rows:
                writer.write(row)
    (FIXTURES / "expected.json").write_text(json.dumps([as_json(r) for r in rows], indent=1) + "\n")
    print(f"wrote {FIXTURES}")


def check(directory: str) -> None:
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=directory, shuffle=False, batch_size=1)
    json.dump([as_json(dataset[i]) for i in range(len(dataset))], sys.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stand-in-torchvision", action="store_true",
                        help="install the stand-in torchvision module into this environment first")
    parser.add_argument("--check", metavar="DIR", help="read DIR with streaming.StreamingDataset instead")
    args = parser.parse_args()
    if args.stand_in_torchvision:
        stand_in_torchvision()
    if args.check:
        check(args.check)
    else:
        write_fixtures()


if __name__ == "__main__":
    main()
