"""W&B and MLflow receive the same metrics as metrics.jsonl, through their own libraries (offline)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.config import load_config
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
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    summary = json.loads((runs[0] / "files" / "wandb-summary.json").read_text())
    assert summary["train/loss"] == 4.5 and summary["validation/mlm_accuracy"] == 0.25
    assert list(runs[0].glob("*.wandb"))  # the run's event log, for `wandb sync`
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_mlflow_run_receives_the_metrics_and_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
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
