"""Training state (optimizer, RNG, loss scaler) in files that cannot run code when read.

A run directory travels: a shared file system, a bucket, a colleague's copy. `torch.load` of a
pickle runs whatever the file says, so nothing a resume reads is a pickle. A state is a tree of
dicts, lists, tuples, numbers, strings, tensors and numpy arrays (what an optimizer's
`state_dict()`, `random.getstate()` and `np.random.get_state()` return); it is written as one
safetensors file whose tensors are the tree's tensors and whose header metadata holds the rest of
the tree as JSON, with each tensor replaced by its name. Reading parses JSON and safetensors only,
so a crafted file can fail to load but never execute. The round trip is exact: tensors keep dtype
and bits, floats go through `repr` (JSON's float text round-trips), tuples stay tuples, integer
keys (an optimizer's parameter ids) stay integers.

Why not `torch.load(weights_only=True)`: its unpickler is an allow-list that must track every
type a state may hold (numpy's RNG state needs several numpy globals), and it has had escapes;
JSON has no code path at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

STATE_METADATA_KEY = "bertforge_state"
STATE_FORMAT_VERSION = "1"
STATE_SUFFIX = ".safetensors"

# a JSON object with one of these keys stands for a value JSON has no type for
_TENSOR, _TUPLE, _DICT, _ARRAY = "$tensor", "$tuple", "$dict", "$ndarray"
_MARKS = (_TENSOR, _TUPLE, _DICT, _ARRAY)


class StateFileError(ValueError):
    """A state file that is not one bertforge wrote (damaged, or crafted)."""


class _Encoder:
    """Turns a state into its JSON skeleton, collecting the tensors it holds."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.storages: set[int] = set()

    def __call__(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            name = f"t{len(self.tensors)}"
            tensor = value.detach().cpu().contiguous()
            # safetensors refuses two entries on one storage: a copy only for a tensor that shares one
            if tensor.untyped_storage().data_ptr() in self.storages:
                tensor = tensor.clone()
            self.storages.add(tensor.untyped_storage().data_ptr())
            self.tensors[name] = tensor
            return {_TENSOR: name}
        if isinstance(value, np.ndarray):
            return {_ARRAY: {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.ravel().tolist()}}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, tuple):
            return {_TUPLE: [self(item) for item in value]}
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, dict):
            if all(isinstance(key, str) and key not in _MARKS for key in value):
                return {key: self(item) for key, item in value.items()}
            return {_DICT: [[self(key), self(item)] for key, item in value.items()]}
        if value is None or isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"cannot save a {type(value).__name__} in a training state file")


def _decode(value: Any, tensors: dict[str, torch.Tensor], where: Path) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors, where) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and next(iter(value)) in _MARKS:
        mark, content = next(iter(value.items()))
        if mark == _TENSOR:
            if not isinstance(content, str) or content not in tensors:
                raise StateFileError(f"{where}: names a tensor {content!r} it does not hold")
            return tensors[content]
        if mark == _TUPLE and isinstance(content, list):
            return tuple(_decode(item, tensors, where) for item in content)
        if mark == _DICT and isinstance(content, list) and all(isinstance(p, list) and len(p) == 2 for p in content):
            return {_hashable(_decode(key, tensors, where), where): _decode(item, tensors, where)
                    for key, item in content}
        if mark == _ARRAY and isinstance(content, dict):
            try:
                return np.asarray(content["data"], dtype=np.dtype(content["dtype"])).reshape(content["shape"])
            except (KeyError, TypeError, ValueError) as error:
                raise StateFileError(f"{where}: a malformed array ({error})") from None
        raise StateFileError(f"{where}: a malformed {mark} entry")
    return {key: _decode(item, tensors, where) for key, item in value.items()}


def _hashable(key: Any, where: Path) -> Any:
    if isinstance(key, list | dict) or (isinstance(key, tuple) and not all(isinstance(k, str | int) for k in key)):
        raise StateFileError(f"{where}: a dictionary key of type {type(key).__name__}")
    return key


def state_path(directory: Path, name: str) -> Path:
    """`optimizer` -> `directory/optimizer.safetensors`."""
    return directory / f"{name}{STATE_SUFFIX}"


def save_state(state: Any, path: Path) -> None:
    """Write `state` (see the module docstring for what it may hold) to `path`."""
    encode = _Encoder()
    skeleton = encode(state)
    metadata = {STATE_METADATA_KEY: json.dumps(skeleton), "version": STATE_FORMAT_VERSION}
    save_file(encode.tensors, str(path), metadata=metadata)


def load_state(path: Path) -> Any:
    """The state `save_state` wrote; `StateFileError` (or safetensors' error) for anything else."""
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        metadata = handle.metadata() or {}
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118 (safe_open has no iter)
    if metadata.get("version") != STATE_FORMAT_VERSION or STATE_METADATA_KEY not in metadata:
        raise StateFileError(f"{path} is not a bertforge training state file (version {metadata.get('version')!r})")
    try:
        skeleton = json.loads(metadata[STATE_METADATA_KEY])
    except json.JSONDecodeError as error:
        raise StateFileError(f"{path}: its state description is not JSON ({error})") from None
    return _decode(skeleton, tensors, path)
