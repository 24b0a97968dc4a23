"""Hugging Face Hub names as model references (issue 34 item 7), offline against a pre-populated HF cache.

The cache is built in the layout `huggingface_hub` itself writes (`models--ORG--NAME/blobs/<hash>`,
`snapshots/<commit>/<file>` as relative symlinks to the blobs, `refs/main` holding the commit) from the
all-MiniLM-L6-v2 package, so what bertforge and stock `transformers` read is what a download leaves.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from bertforge.cli import main
from bertforge.errors import BertforgeError
from bertforge.locate import resolve_model, resolve_model_path
from tests.helpers.finetuning import minilm_dir, run_cli, supersense_files

HUB_NAME = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


def fill_hub_cache(cache: Path, name: str, source: Path) -> Path:
    """`source`'s files as the HF cache holds a snapshot of Hub model `name`; returns the snapshot directory."""
    repo = cache / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT, encoding="utf-8")
    return snapshot


@pytest.fixture
def hub_cache(tmp_path: Path) -> Path:
    cache = tmp_path / "hf-home" / "hub"
    fill_hub_cache(cache, HUB_NAME, minilm_dir())
    return cache


@pytest.fixture
def offline_cache(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """In this process: huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE when imported, so set what it read."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


def offline_environment(hub_cache: Path) -> dict[str, str]:
    return {"HF_HOME": str(hub_cache.parent), "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}


def test_a_hub_name_resolves_to_its_cached_snapshot_offline(offline_cache: Path) -> None:
    location = resolve_model(HUB_NAME)
    assert location.path == offline_cache / f"models--{HUB_NAME.replace('/', '--')}" / "snapshots" / COMMIT
    assert location.format == "hf" and location.run_dir is None
    assert (location.path / "model.safetensors").is_file()


def test_a_local_path_wins_over_a_hub_name(offline_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    local = tmp_path / "work" / "sentence-transformers" / "all-MiniLM-L6-v2"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve_model_path(HUB_NAME) == Path(HUB_NAME)


def test_a_name_neither_local_nor_cached_offline_is_one_line_naming_it(offline_cache: Path) -> None:
    with pytest.raises(BertforgeError) as raised:
        resolve_model("bert-base-uncased")
    message = str(raised.value)
    assert "'bert-base-uncased'" in message and "HF_HUB_OFFLINE=1" in message and "\n" not in message


def test_transformers_loads_the_hub_name_offline_from_the_same_cache(hub_cache: Path) -> None:
    code = (f"from transformers import AutoModel; m = AutoModel.from_pretrained({HUB_NAME!r}); "
            "print(type(m).__name__, m.config.hidden_size)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=os.environ | offline_environment(hub_cache))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["BertModel", "384"]


def test_finetune_starts_from_a_hub_name_offline(offline_cache: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # in this process, with the cache huggingface_hub read set as `offline_cache` sets it; a process that reads
    # HF_HUB_CACHE / HF_HUB_OFFLINE from its environment is the transformers test's and the unreachable hub's
    run_dir = tmp_path / "runs" / "from-hub"
    config = tmp_path / "from-hub.yaml"
    config.write_text(f"model: {{init_from: {HUB_NAME}}}\n", encoding="utf-8")
    code = main(["finetune", str(config), *supersense_files(tmp_path / "data", train=32, validation=16, test=16),
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                 "train.max_steps=2", "train.micro_batch_size=16", "train.global_batch_size=16",
                 "finetune.max_length=24", "data.num_workers=0", "log.tensorboard=false", "log.plots=false",
                 "log.progress=false"])
    assert code == 0, capsys.readouterr().err[-3000:]
    assert (run_dir / "final" / "config.json").is_file()


def test_an_unreachable_hub_and_an_empty_cache_exit_2_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty-hf" / "hub"
    empty.mkdir(parents=True)
    # the Hub "online" but at a closed local port: what a user without network sees, without the network
    done = run_cli("fill-mask", "some-org/no-such-model", "the [MASK] sat", env={
        "HF_HOME": str(empty.parent), "HF_HUB_CACHE": str(empty), "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert "'some-org/no-such-model'" in error and "could not be reached" in error
