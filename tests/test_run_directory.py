"""The run directory's owner (`bertforge.run_directory`): the names users see on disk, and the rules for
reading a run's checkpoints and markers. Plain files in a temporary directory; no training."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bertforge.run_directory import (
    BEST_MARKER,
    LATEST_MARKER,
    RunDirectory,
    checkpoint_name,
    checkpoint_step,
    evaluation_file_names,
    is_run_listing,
    read_checkpoint_meta,
    write_checkpoint_meta,
)


def make_checkpoint(run: RunDirectory, step: int, *, complete: bool = True) -> Path:
    path = run.checkpoint(step)
    path.mkdir(parents=True)
    if complete:
        write_checkpoint_meta(path, {"step": step})
    return path


def test_the_layout_keeps_the_names_users_and_their_scripts_rely_on(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    assert run.config_file == tmp_path / "config.yaml"
    assert run.metrics_file == tmp_path / "metrics.jsonl"
    assert run.checkpoints == tmp_path / "checkpoints"
    assert run.final == tmp_path / "final"
    assert run.tensorboard == tmp_path / "tensorboard"
    assert run.plots == tmp_path / "plots"
    assert run.checkpoint(120) == tmp_path / "checkpoints" / "step-00000120"
    assert run.resume_config_file(2) == tmp_path / "config-resume-2.yaml"
    assert run.results_file("test") == tmp_path / "test_results.json"
    assert evaluation_file_names("validation") == (
        "validation_results.json", "validation_report.md", "validation_confusion_matrix.png")
    assert checkpoint_name(120) == "step-00000120" and checkpoint_step(run.checkpoint(120)) == 120
    assert not tmp_path.joinpath("checkpoints").exists()  # asking for a path creates nothing


def test_a_directory_is_a_run_once_its_config_is_written(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    assert not run.is_run()
    run.config_file.write_text("run: {}\n", encoding="utf-8")
    assert run.is_run()


def test_complete_checkpoints_are_the_step_directories_holding_their_meta_oldest_first(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    assert run.complete_checkpoints() == []  # no checkpoints/ yet
    for step in (10, 2):
        make_checkpoint(run, step)
    make_checkpoint(run, 12, complete=False)  # killed before its meta.json: not a checkpoint
    (run.checkpoints / ".tmp-step-00000014").mkdir()  # a save in progress
    (run.checkpoints / "step-14").mkdir()  # not a step-NNNNNNNN name
    write_checkpoint_meta(run.checkpoints / "step-14", {"step": 14})
    assert [path.name for path in run.complete_checkpoints()] == ["step-00000002", "step-00000010"]


def test_latest_is_the_marked_checkpoint_else_the_newest_complete_one(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    assert run.latest_checkpoint() is None
    older, newer = make_checkpoint(run, 2), make_checkpoint(run, 4)
    assert run.latest_checkpoint() == newer  # no marker: the newest complete one
    run.mark(LATEST_MARKER, older)  # a rollback re-marks an older step
    assert (run.checkpoints / "latest").read_text(encoding="utf-8") == "step-00000002"
    assert run.latest_checkpoint() == older
    run.mark(LATEST_MARKER, run.checkpoint(6))  # names a checkpoint that is not complete (or was pruned)
    assert run.latest_checkpoint() == newer
    assert not list(run.checkpoints.glob(".latest*"))  # the atomic write leaves no staging file


def test_best_is_only_what_the_best_marker_names(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    first = make_checkpoint(run, 2)
    make_checkpoint(run, 4)
    assert run.best_checkpoint() is None  # a run without train.best_metric has no best
    run.mark(BEST_MARKER, first)
    assert run.best_checkpoint() == first
    assert run.latest_checkpoint() != first


@pytest.mark.parametrize("written", ["../../theirs/checkpoints/step-00000004", "/abs/step-00000004",
                                     "step-00000004/../step-00000004", "step-4", ""])
def test_a_marker_naming_anything_but_a_bare_checkpoint_name_is_ignored(tmp_path: Path, written: str) -> None:
    run = RunDirectory(tmp_path / "ours")
    theirs = RunDirectory(tmp_path / "theirs")
    make_checkpoint(theirs, 4)
    ours = make_checkpoint(run, 2)
    (run.checkpoints / LATEST_MARKER).write_text(written, encoding="utf-8")
    (run.checkpoints / BEST_MARKER).write_text(written, encoding="utf-8")
    assert run.best_checkpoint() is None
    assert run.latest_checkpoint() == ours


def test_a_marked_checkpoint_that_is_a_link_out_of_the_run_is_ignored(tmp_path: Path) -> None:
    run, theirs = RunDirectory(tmp_path / "ours"), RunDirectory(tmp_path / "theirs")
    elsewhere = make_checkpoint(theirs, 4)
    make_checkpoint(run, 2)
    os.symlink(elsewhere, run.checkpoint(4))
    run.mark(BEST_MARKER, run.checkpoint(4))
    assert run.best_checkpoint() is None
    run.mark(LATEST_MARKER, run.checkpoint(4))
    assert run.checkpoint_named_by(LATEST_MARKER) is None


def test_a_model_directory_knows_the_run_it_belongs_to(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path / "run")
    run.final.mkdir(parents=True)
    model = make_checkpoint(run, 2) / "model"
    model.mkdir()
    assert RunDirectory.of_model(run.final) is None  # no config.yaml: not a run yet
    run.config_file.write_text("run: {}\n", encoding="utf-8")
    assert RunDirectory.of_model(run.final) == RunDirectory(run.root.resolve())
    assert RunDirectory.of_model(model) == RunDirectory(run.root.resolve())
    assert RunDirectory.of_model(tmp_path) is None


def test_config_segments_follow_the_order_of_the_resumes(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    for name in ("config.yaml", "config-resume-10.yaml", "config-resume-2.yaml", "config-resume-x.yaml"):
        (tmp_path / name).write_text("{}\n", encoding="utf-8")
    assert [path.name for path in run.config_segments()] == ["config.yaml", "config-resume-2.yaml",
                                                              "config-resume-10.yaml"]


def test_checkpoint_meta_round_trips(tmp_path: Path) -> None:
    meta = {"step": 3, "consumed_samples": 96, "metrics": {"loss": 1.5}, "world_size": 2}
    write_checkpoint_meta(tmp_path, meta)
    assert (tmp_path / "meta.json").is_file()
    assert read_checkpoint_meta(tmp_path) == meta


def test_results_files_are_each_splits_evaluation(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    for name in ("validation_results.json", "test_results.json", "test_report.md", "results.json"):
        (tmp_path / name).write_text("{}", encoding="utf-8")
    assert [path.name for path in run.results_files()] == ["test_results.json", "validation_results.json"]


def test_an_earlier_run_is_its_config_beside_what_the_trainer_writes(tmp_path: Path) -> None:
    assert is_run_listing(["config.yaml", "metrics.jsonl"])
    assert is_run_listing(["config.yaml", "checkpoints", "notes.txt"])
    assert is_run_listing(["config.yaml", ".lock"])
    assert not is_run_listing(["config.yaml", "train.csv"])  # a user's project with a config of its own
    assert not is_run_listing(["metrics.jsonl", "checkpoints"])
