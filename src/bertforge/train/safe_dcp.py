"""Reading FSDP2 checkpoints (`torch.distributed.checkpoint`, DCP) without running code from them.

DCP's own reader unpickles the checkpoint's `.metadata` with plain `pickle.load`, and its load
planner reads every non-tensor entry (an optimizer's `param_groups`, a step count) with
`torch.load(weights_only=False)`: a crafted file in a run directory would run its payload on
resume. The reader here unpickles `.metadata` with an allow-list of the classes DCP writes there
(its metadata dataclasses, `torch.Size`, dtypes, layouts, a path), and the planner reads entries
with `torch.load(weights_only=True)`. The tensor files DCP itself already reads with
`weights_only=True`. What DCP writes is unchanged, so checkpoints stay DCP checkpoints.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

# (module, name) pairs the metadata of a DCP checkpoint refers to; anything else is refused
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata",
                 "BytesStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"a checkpoint's DCP metadata refers to {module}.{name}, which bertforge does "
                                     "not load (it could run code)")


class SafeFileSystemReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            metadata = _MetadataUnpickler(metadata_file).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


def load_dcp(state_dict: dict[str, Any], directory: str) -> None:
    """`dcp.load(state_dict, checkpoint_id=directory)` with the reader and planner above. A refused or
    damaged file raises `pickle.UnpicklingError` (DCP wraps what a rank raised in its own exception)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(state_dict, storage_reader=SafeFileSystemReader(directory), planner=SafeLoadPlanner())
    except CheckpointException as error:
        failures = [pair[0] for pair in error.failures.values()]  # (exception, traceback) per rank
        if any(isinstance(failure, pickle.UnpicklingError) for failure in failures):
            raise pickle.UnpicklingError(f"{directory} holds a pickled object that refers to code; bertforge does not "
                                         "read it") from None
        reason = failures[0] if failures else error
        raise pickle.UnpicklingError(f"{directory}: {type(reason).__name__}: {str(reason).strip().splitlines()[0]}") from None
