"""W&B and MLflow receive the same metrics as metrics.jsonl, through their own libraries (offline)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from bertforge.config import load_config
from bertforge.errors import ConfigError
from bertforge.train.logging import MetricsLogger


def test_weights_and_biases_offline_run_receives_the_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network: the run is written to disk
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = load_config(None, ["run.name=tracked", "log.tensorboard=false", "log.wandb_project=bertforge-tests"])
    logger = MetricsLogger(tmp_path, config, enabled=True)
    logger.write(1, "train", {"loss": 4.5, "lr": 1e-3})
    logger.write(2, "validation", {"mlm_accuracy": 0.25})
    logger.close()
    (log_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")  # what `wandb sync` uploads
    history = wandb_history(log_file)
    assert {"train/loss": 4.5, "train/lr": 1e-3, "_step": 1}.items() <= history[0].items()
    assert {"validation/mlm_accuracy": 0.25, "_step": 2}.items() <= history[1].items()
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def wandb_history(path: Path, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The history rows of an offline W&B run file, once its writer has finished it (its exit record).

    `run.finish()` of wandb 0.31 can return before its service process has flushed the file (seen:
    7 bytes at return, the whole run half a second later), so the file is read until it holds the
    run's exit record, within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        rows, finished = _wandb_records(path)
        if finished or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _wandb_records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The history rows of an offline W&B run file (`wandb` ships no Python reader for it any more),
    and whether its exit record was reached.

    The file is a 7-byte header (":W&B", magic, version), then LevelDB-log records — 32 KiB blocks,
    each record fragment a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) —
    each record a `wandb_internal_pb2.Record`.
    """
    from wandb.proto import wandb_internal_pb2

    data, block, offset, pending, rows, finished = path.read_bytes(), 32 * 1024, 7, b"", [], False
    assert data.startswith(b":W&B")
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # too little room for a header: the rest of the block is padding
            offset += block - offset % block
            continue
        _, length, kind = struct.unpack("<IHB", data[offset:offset + 7])
        if offset + 7 + length > len(data):  # a record still being written
            break
        pending += data[offset + 7:offset + 7 + length]
        offset += 7 + length
        if kind in (1, 4):  # a whole record, or the last fragment of one
            record = wandb_internal_pb2.Record.FromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
            finished = finished or record.WhichOneof("record_type") == "exit"
    return rows, finished


def test_mlflow_run_receives_the_metrics_and_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow-skinny has no SQL store
    config = load_config(None, ["run.name=tracked", "log.tensorboard=false", "log.mlflow_experiment=bertforge-tests"])
    (tmp_path / "run").mkdir()
    logger = MetricsLogger(tmp_path / "run", config, enabled=True)
    logger.write(1, "train", {"loss": 4.5})
    logger.write(2, "train", {"loss": 3.5})
    logger.close()
    client = mlflow.tracking.MlflowClient()
    experiment = client.get_experiment_by_name("bertforge-tests")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")] == [(1, 4.5), (2, 3.5)]
    artifact = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="config.yaml",
                                                        dst_path=str(tmp_path / "downloaded")))
    assert "tracked" in artifact.read_text()


def test_a_tracker_that_cannot_start_is_a_one_line_config_error(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://tracking")
    config = load_config(None, ["log.tensorboard=false", "log.mlflow_experiment=bertforge-tests"])
    with pytest.raises(ConfigError, match=r"^log.mlflow_experiment: MLflow did not start \(.*\); check") as caught:
        MetricsLogger(tmp_path, config, enabled=True)
    assert "\n" not in str(caught.value)


def test_a_rewound_tensorboard_log_is_read_after_an_interrupted_attempts_file_of_the_same_second(
        tmp_path: Path) -> None:
    """TensorBoard reads a run's event files in name order (whole seconds, host, pid): a killed attempt's file
    named in the same second as the rewound writer's, with a pid that sorts later, was read after the purge, and
    its steps came back (a test that re-ran in the same process right after a kill -9 saw steps 1-9 for 1-4)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    run = tmp_path / "run"
    killed = SummaryWriter(log_dir=str(run / "tensorboard"))
    for step in range(1, 7):
        killed.add_scalar("train/loss", 5.0, step)
    killed.close()
    (written,) = (run / "tensorboard").glob("events.out.tfevents.*")
    # the attempt's name as if it were written this second (or the next) by a process whose pid sorts last
    written.rename(written.with_name(f"events.out.tfevents.{int(time.time()) + 1:010d}.host.99999999.0"))
    logger = MetricsLogger(run, load_config(None, ["log.tensorboard=true"]), enabled=True)
    logger.rewind(0)
    for step in range(1, 5):
        logger.write(step, "train", {"loss": 1.0})
    logger.close()
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2, 3, 4]
