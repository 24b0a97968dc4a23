"""The repository's scripts are files, not packages: tests import them by path (the benchmarks are a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]


def load_repo_script(relative_path: str, module_name: str) -> ModuleType:
    """`relative_path` (e.g. "scripts/build_parity_tasks.py") imported as `module_name`."""
    spec = importlib.util.spec_from_file_location(module_name, REPO_ROOT / relative_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses in the script look their module up there
    spec.loader.exec_module(module)
    return module
