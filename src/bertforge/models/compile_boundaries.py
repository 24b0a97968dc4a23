"""Python bookkeeping kept out of `torch.compile`, without importing `torch._dynamo` at import time.

`torch.compiler.disable` imports `torch._dynamo` the moment it decorates a function: 1.5-3 s on
these 2 cores, the largest single part of `bertforge predict`'s and `embed`'s start-up, paid by
every command although only training with `dist.compile=true` compiles. So the functions are only
marked here (`eager_under_compile`), and `apply_compile_boundaries()`, called where bertforge compiles
(`train.distributed.parallelize`; call it before compiling a bertforge model yourself), wraps them
in `torch.compiler.disable` in place: their callers look them up by name at call time.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import TypeVar

import torch

Function = TypeVar("Function", bound=Callable[..., object])

_marked: list[Callable[..., object]] = []
_applied = False


def eager_under_compile(function: Function) -> Function:
    """Mark a module-level function or a method (below `@classmethod`/`@staticmethod`, if any) to run eagerly
    under `torch.compile` once `apply_compile_boundaries()` has run (at once, when it already has)."""
    if _applied:
        return torch.compiler.disable(function)  # type: ignore[return-value]
    _marked.append(function)
    return function


def apply_compile_boundaries() -> None:
    """Replace every marked function by its `torch.compiler.disable` wrapper where its module or class holds it."""
    global _applied
    if _applied:
        return
    for function in _marked:
        owner: object = importlib.import_module(function.__module__)
        *outer, name = function.__qualname__.split(".")
        for part in outer:
            owner = getattr(owner, part)
        held = inspect.getattr_static(owner, name)
        disabled = torch.compiler.disable(function)
        if isinstance(held, classmethod):
            setattr(owner, name, classmethod(disabled))
        elif isinstance(held, staticmethod):
            setattr(owner, name, staticmethod(disabled))
        else:
            setattr(owner, name, disabled)
    _applied = True
