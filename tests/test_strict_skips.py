"""`make test` turns a skip for a package it installs into a failure (tests/conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

SKIPPING_TESTS = '''
import sys
import pytest

def test_needs_onnxruntime(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    pytest.importorskip("onnxruntime")

def test_needs_something_optional():
    pytest.importorskip("a_package_make_test_does_not_install")
'''

CUDA_TEST = '''
import pytest
import torch

@pytest.mark.cuda
def test_on_a_gpu():
    assert torch.cuda.is_available()
'''


def run_pytest(directory: Path, strict: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "BERTFORGE_STRICT_TESTS"}
    if strict:
        env["BERTFORGE_STRICT_TESTS"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(directory)],
                          cwd=directory, env=env, capture_output=True, text=True, timeout=120)


def copy_conftest(directory: Path) -> None:
    """The suite's conftest, with the helpers it imports (tests/helpers/suite_order.py)."""
    shutil.copyfile(HERE / "conftest.py", directory / "conftest.py")
    shutil.copytree(HERE / "helpers", directory / "helpers", ignore=shutil.ignore_patterns("__pycache__"))


def test_a_skip_for_a_package_make_test_installs_fails_under_make_test_only(tmp_path: Path) -> None:
    copy_conftest(tmp_path)
    (tmp_path / "test_skipping.py").write_text(SKIPPING_TESTS, encoding="utf-8")
    strict = run_pytest(tmp_path, strict=True)
    assert "1 failed, 1 skipped" in strict.stdout, strict.stdout
    assert "although `make test` installs onnxruntime" in strict.stdout
    relaxed = run_pytest(tmp_path, strict=False)
    assert "2 skipped" in relaxed.stdout and relaxed.returncode == 0, relaxed.stdout


def test_a_cuda_test_without_a_gpu_is_a_skip_with_its_reason_even_under_make_test(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: cuda tests run here instead of skipping")
    copy_conftest(tmp_path)
    (tmp_path / "test_gpu.py").write_text(CUDA_TEST, encoding="utf-8")
    strict = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                            cwd=tmp_path, env=os.environ | {"BERTFORGE_STRICT_TESTS": "1"}, capture_output=True,
                            text=True, timeout=120)
    assert strict.returncode == 0 and "1 skipped" in strict.stdout, strict.stdout
    assert "needs a CUDA GPU" in strict.stdout and "make test-gpu" in strict.stdout
