"""Where `bertforge export --out` may write: never over a user's files.

An export replaces its destination atomically, which deletes whatever was there. So the
destination must be missing, an empty directory, or an earlier export (`--overwrite` needed),
recognised by its files: nothing but what an export writes. It is never the model being
exported, nor a directory that contains it (exporting a run into its own parent would delete the
run). Everything else is refused with what is there and what to do.

An object-store destination (`s3://bucket/models/x`) follows the same rules over the objects under
that prefix. A bucket has no atomic rename, so `export_model` uploads the anchor files
(config.json, bertforge_model.json, model.onnx) after everything else: a prefix holding only
export files but no anchor is an export that was interrupted, which `--overwrite` may replace too.
"""

from __future__ import annotations

import re
from pathlib import Path

from bertforge.errors import BertforgeError, directory_listing
from bertforge.models.serialization import CONFIG_NAME, TOKENIZER_FILES
from bertforge.storage import filesystem, storage_errors

# what `export --format hf|onnx` writes, in transformers' layout or bertforge's own
EXPORT_FILES = frozenset({"config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                          CONFIG_NAME, "model.onnx", "model.onnx.data", "onnx_inputs.json", *TOKENIZER_FILES})
EXPORT_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")  # save_pretrained's shards of a large model
EXPORT_ANCHORS = ("config.json", CONFIG_NAME, "model.onnx")  # at least one of them is in every export


def is_earlier_export(directory: Path) -> bool:
    names = [entry.name for entry in directory.iterdir()]
    return (any(name in EXPORT_ANCHORS for name in names)
            and all((directory / name).is_file() and (name in EXPORT_FILES or EXPORT_SHARD.fullmatch(name))
                    for name in names))


def check_export_destination(out: str | Path, sources: list[Path], overwrite: bool) -> Path:
    """Raise a one-line `BertforgeError` unless exporting to `out` can destroy nothing but an earlier export.

    `sources` are the paths the model is read from (the reference the user gave and the directory
    it resolved to); `out` may be neither of them nor contain either.
    """
    destination = Path(out).expanduser().resolve()
    for source in sources:
        source = source.expanduser().resolve()
        if destination == source or destination in source.parents:
            what = "is the model being exported" if destination == source else f"contains the model being exported ({source})"
            raise BertforgeError(f"--out {out} {what}; exporting there would delete it. Choose a new directory, "
                                 "e.g. --out exported/NAME")
    if not destination.exists():
        return destination
    if not destination.is_dir():
        raise BertforgeError(f"--out {out} is a file, not a directory; choose a directory path for the export")
    if not any(destination.iterdir()):
        return destination
    if is_earlier_export(destination):
        if overwrite:
            return destination
        raise BertforgeError(f"--out {out} holds an earlier export ({directory_listing(destination)}); pass --overwrite to "
                             "replace it, or choose a new directory")
    raise BertforgeError(f"--out {out} is not empty and is not an earlier export (it holds {directory_listing(destination)}); "
                         "export replaces its destination, so choose a new or empty directory")


def is_export_file(name: str) -> bool:
    return name in EXPORT_FILES or EXPORT_SHARD.fullmatch(name) is not None


def check_remote_export_destination(out: str, overwrite: bool) -> list[str]:
    """The same rules as `check_export_destination` for a URL prefix; returns the names of the objects
    there (an earlier export's, which the new export replaces)."""
    fs, path = filesystem(out)
    root = path.rstrip("/")
    with storage_errors(out, "list"):
        try:
            names = sorted(found[len(root) + 1:] for found in fs.find(root))
        except FileNotFoundError:  # s3fs: no such prefix; a missing bucket is refused by storage_errors
            names = []
    if not names:
        return names
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    if all("/" not in name and is_export_file(name) for name in names):
        if overwrite:
            return names
        raise BertforgeError(f"--out {out} holds an earlier export ({shown}); pass --overwrite to replace it, or "
                             "choose a new prefix")
    raise BertforgeError(f"--out {out} is not empty and is not an earlier export (it holds {shown}); export "
                         "replaces its destination, so choose a new or empty prefix")
