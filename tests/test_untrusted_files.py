"""Nothing read from a run directory or a model directory can run code.

A run directory travels (a shared file system, a bucket, a colleague's copy), so each test plants
a payload, a pickle that creates a sentinel file when unpickled, in a file a command reads or used
to read: a resume, a rollback after a non-finite loss, a crafted `latest` marker, an FSDP (DCP)
checkpoint, `model.init_from` / `export` of a model directory. Each asserts that the payload never
ran. Every one of them ran its payload on the bertforge before the state files (optimizer and RNG
state were `torch.load(weights_only=False)` pickles, DCP metadata a plain `pickle.load`).
"""

from __future__ import annotations

import builtins
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import trainer_tasks
from helpers.cli import error_line
from helpers.models import tiny_config

from bertforge.cli import main
from bertforge.config import config_to_yaml, load_config
from bertforge.models.for_pretraining import BertforgeForPreTraining
from bertforge.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TASK = f"{ROOT / 'tests' / 'helpers' / 'trainer_tasks.py'}:SmallWithDropout"
BASE = ["optim.lr=3e-2", "optim.weight_decay=0.0", "train.micro_batch_size=32", "train.global_batch_size=64",
        "train.log_every=1", "train.checkpoint_every=2", "train.keep_last=4", "data.num_workers=0",
        "log.progress=false", "log.tensorboard=false", "log.plots=false"]


class Payload:
    """Unpickling this creates `sentinel` (what `torch.load(weights_only=False)` or `pickle.load` would do)."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = str(sentinel)

    def __reduce__(self):  # noqa: ANN204
        return (builtins.open, (self.sentinel, "w"))


def plant(path: Path, sentinel: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state": Payload(sentinel)}, path)


def config_for(run_dir: Path, *extra: str):
    return load_config(None, [*BASE, f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *extra])


def train(run_dir: Path, steps: int, task: type = trainer_tasks.SmallWithDropout, *extra: str) -> None:
    config = config_for(run_dir, f"train.max_steps={steps}", *extra)
    Trainer(config, task(config)).fit()


def checkpoint(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


@pytest.fixture
def sentinel(tmp_path: Path) -> Path:
    path = tmp_path / "PAYLOAD-RAN"
    yield path
    assert not path.exists(), "a planted pickle was unpickled: its payload ran"


def test_resume_reads_no_pickle_planted_in_the_checkpoint(tmp_path: Path, sentinel: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, 4)
    for name in ("optimizer.pt", "rng-rank0.pt", "scaler.pt", "ema.pt"):
        plant(checkpoint(run_dir, 4) / name, sentinel)
    train(run_dir, 6)
    assert json.loads((checkpoint(run_dir, 6) / "meta.json").read_text())["step"] == 6


def test_a_checkpoint_holding_pickled_state_is_refused_in_one_line(tmp_path: Path, sentinel: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """What an earlier bertforge wrote (or a crafted copy of it) is not read: one line says how to go on."""
    run_dir = tmp_path / "run"
    train(run_dir, 2)
    state = checkpoint(run_dir, 2)
    for name in ("optimizer", "rng-rank0"):
        (state / f"{name}.safetensors").unlink()
        plant(state / f"{name}.pt", sentinel)
    config = run_dir.parent / "run.yaml"
    config.write_text(config_to_yaml(config_for(run_dir, "train.max_steps=4")), encoding="utf-8")
    error = error_line(capsys, "train", "--task", TASK, str(config))  # exit 2, one line, no traceback
    assert "earlier bertforge" in error and "model.init_from=" in error


def test_a_latest_marker_naming_a_checkpoint_outside_the_run_is_ignored(tmp_path: Path, sentinel: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    train(ours, 2)
    train(theirs, 4)
    plant(checkpoint(theirs, 4) / "optimizer.pt", sentinel)
    (checkpoint(theirs, 4) / "optimizer.safetensors").unlink()
    (ours / "checkpoints" / "latest").write_text("../../theirs/checkpoints/step-00000004")
    train(ours, 3)
    steps = [json.loads(line)["step"] for line in (ours / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["split"] == "train"]
    assert steps == [1, 2, 3]  # resumed from its own step 2, not the other run's step 4


def test_a_rollback_after_a_non_finite_loss_reads_no_pickle(tmp_path: Path, sentinel: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, 2)
    plant(checkpoint(run_dir, 2) / "optimizer.pt", sentinel)
    plant(checkpoint(run_dir, 2) / "rng-rank0.pt", sentinel)
    monkeypatch.setenv("BERTFORGE_TEST_NAN_AT", "3")  # step 4 (2 micro-batches a step), after the resume
    monkeypatch.setattr(trainer_tasks.InjectsNaN, "calls", 0)
    train(run_dir, 4, trainer_tasks.InjectsNaN, "train.nan_policy=rollback")
    assert (run_dir / "final").is_dir()


def test_an_fsdp_checkpoint_with_planted_dcp_metadata_is_skipped_unread(tmp_path: Path, sentinel: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, 2)
    crafted = checkpoint(run_dir, 4)
    crafted.mkdir()
    shutil.copy(checkpoint(run_dir, 2) / "meta.json", crafted / "meta.json")
    (crafted / "dcp").mkdir()
    with open(crafted / "dcp" / ".metadata", "wb") as handle:
        import pickle

        pickle.dump(Payload(sentinel), handle)
    (run_dir / "checkpoints" / "latest").write_text(crafted.name)
    train(run_dir, 3)  # the crafted checkpoint is unreadable: resumed from step 2, with a warning
    assert json.loads((checkpoint(run_dir, 3) / "meta.json").read_text())["step"] == 3


def test_a_dcp_entry_holding_a_pickled_object_is_refused(tmp_path: Path, sentinel: Path) -> None:
    import pickle

    import torch.distributed.checkpoint as dcp

    from bertforge.train.safe_dcp import load_dcp

    dcp.save({"weights": torch.ones(3), "extra": Payload(sentinel)}, checkpoint_id=str(tmp_path / "dcp"))
    with pytest.raises(pickle.UnpicklingError):
        load_dcp({"weights": torch.zeros(3), "extra": None}, str(tmp_path / "dcp"))


def test_a_dcp_checkpoint_round_trips_through_the_safe_reader(tmp_path: Path) -> None:
    """The safe reader still reads what DCP writes: tensors and the plain values of an optimizer state."""
    import torch.distributed.checkpoint as dcp

    from bertforge.train.safe_dcp import load_dcp

    saved = {"weights": torch.arange(6.0), "optimizer": {"param_groups": [{"lr": 0.1, "betas": (0.9, 0.98)}]}}
    dcp.save(saved, checkpoint_id=str(tmp_path / "dcp"))
    target = {"weights": torch.zeros(6), "optimizer": {"param_groups": [{"lr": 0.0, "betas": (0.0, 0.0)}]}}
    load_dcp(target, str(tmp_path / "dcp"))
    assert torch.equal(target["weights"], saved["weights"])
    assert target["optimizer"] == saved["optimizer"]


@pytest.fixture
def model_with_planted_pickles(tmp_path: Path, sentinel: Path) -> Path:
    """A bertforge model directory (safetensors) beside pickles a careless copy could bring along."""
    directory = BertforgeForPreTraining(tiny_config(vocab_size=128)).save_pretrained(tmp_path / "model")
    for name in ("pytorch_model.bin", "training_args.bin", "optimizer.pt", "model.pt"):
        plant(directory / name, sentinel)
    return directory


def test_export_reads_no_pickle_beside_the_weights(model_with_planted_pickles: Path, tmp_path: Path) -> None:
    assert main(["export", str(model_with_planted_pickles), "--out", str(tmp_path / "exported")]) == 0


def test_init_from_reads_no_pickle_beside_the_weights(model_with_planted_pickles: Path, tmp_path: Path) -> None:
    from bertforge.models.loading import load_for_task

    assert load_for_task(str(model_with_planted_pickles), "pretraining") is not None


def test_init_from_a_pickled_hugging_face_checkpoint_never_unpickles_it(tmp_path: Path, sentinel: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A Hugging Face directory whose only weights are a pickle (pytorch_model.bin): refused or read with
    the restricted unpickler, never run."""
    from transformers import BertConfig

    directory = tmp_path / "hf"
    directory.mkdir()
    BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=48).save_pretrained(directory)
    plant(directory / "pytorch_model.bin", sentinel)
    error_line(capsys, "export", str(directory), "--out", str(tmp_path / "exported"))  # exit 2, one line, no traceback


def test_state_files_refuse_what_they_did_not_write(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from bertforge.train.state_files import StateFileError, load_state, save_state

    save_file({"t0": torch.ones(1)}, str(tmp_path / "foreign.safetensors"))
    with pytest.raises(StateFileError):
        load_state(tmp_path / "foreign.safetensors")
    save_file({}, str(tmp_path / "crafted.safetensors"),
              metadata={"bertforge_state": json.dumps({"$tensor": "t9"}), "version": "1"})
    with pytest.raises(StateFileError):
        load_state(tmp_path / "crafted.safetensors")
    state = {"step": torch.tensor(3.0), 1: (0.9, float("inf")), "rng": ("MT", torch.arange(3, dtype=torch.uint8))}
    save_state(state, tmp_path / "state.safetensors")
    loaded = load_state(tmp_path / "state.safetensors")
    assert loaded.keys() == state.keys() and loaded[1] == (0.9, float("inf"))
    assert torch.equal(loaded["rng"][1], state["rng"][1]) and loaded["rng"][0] == "MT"


@pytest.mark.parametrize("crafted", ["../../elsewhere/tokens.npy", "/etc/passwd", "a/../../b.npy"])
def test_a_dataset_manifest_naming_a_file_outside_the_dataset_is_refused(tmp_path: Path, crafted: str) -> None:
    from bertforge.data.shards import FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, read_manifest
    from bertforge.errors import DataError

    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "tokenizer": {"path": "tokenizer"},
                "splits": {"train": {"shards": [{"name": "s0", "samples": 1, "files": {"tokens": {"path": crafted}}}]}}}
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="not a path inside the dataset"):
        read_manifest(str(tmp_path))
