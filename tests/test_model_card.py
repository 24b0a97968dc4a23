"""Run directories that explain themselves (issue 34 item 6): a model card in final/ and in every export,
test_results.json naming the checkpoint it scored, plots at the end of every run, and
`train.keep_optimizer_state=false` leaving only what inference needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import bertforge.plotting
from bertforge.cli import main
from bertforge.export import is_earlier_export
from bertforge.run_directory import RunDirectory
from tests.helpers import tiny_pretraining
from tests.helpers.cli import error_line
from tests.helpers.finetuning import QUIET_RUN, TINY_MODEL, finetune, minilm_dir, supersense_files

RECIPE = ["finetune.max_length=32", "optim.lr=2e-3", "train.micro_batch_size=32", "train.global_batch_size=32",
          "train.max_steps=6", "train.eval_every=2", "train.checkpoint_every=2", "train.best_metric=accuracy"]


def front_matter_and_body(card: Path) -> tuple[dict, str]:
    _, front, body = card.read_text(encoding="utf-8").split("---\n", 2)
    return yaml.safe_load(front), body


@pytest.fixture(scope="module")
def lean_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bertforge finetune` of a tiny BERT with the best checkpoint kept and train.keep_optimizer_state=false, through
    the CLI's entry point in this process (what is checked is the run directory, not a process's exit)."""
    root = tmp_path_factory.mktemp("card")
    run_dir = root / "runs" / "lean"
    config = root / "lean.yaml"
    config.write_text("train: {keep_optimizer_state: false}\n", encoding="utf-8")
    assert main(["finetune", str(config), *TINY_MODEL, *supersense_files(root / "data", 128, 64, 64),
                 f"model.tokenizer={minilm_dir()}", f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}",
                 *QUIET_RUN, *RECIPE, "log.plots=true"]) == 0  # QUIET_RUN turns plots off; this run checks them
    return run_dir


def test_final_holds_a_hub_style_model_card_with_metrics_checkpoint_command_and_loading(lean_run: Path) -> None:
    front, body = front_matter_and_body(lean_run / "final" / "README.md")
    assert front["library_name"] == "transformers" and front["pipeline_tag"] == "text-classification"
    assert "bertforge" in front["tags"]
    results = {result["dataset"]["split"]: result for result in front["model-index"][0]["results"]}
    test = json.loads((lean_run / "test_results.json").read_text(encoding="utf-8"))
    accuracy = next(m for m in results["test"]["metrics"] if m["type"] == "accuracy")
    assert accuracy["value"] == pytest.approx(test["metrics"]["accuracy"], abs=1e-6)
    step = test["checkpoint"]["step"]
    assert f"the best checkpoint by validation accuracy, step {step}" in body
    assert "bertforge finetune" in body and "keep_optimizer_state" not in body.split("```bash")[0]
    assert 'pipeline("text-classification"' in body
    assert "supersense-train-128.jsonl" in body  # the data it was trained on


def test_test_results_name_the_checkpoint_they_scored(lean_run: Path) -> None:
    test = json.loads((lean_run / "test_results.json").read_text(encoding="utf-8"))
    best = (lean_run / "checkpoints" / "best").read_text(encoding="utf-8").strip()
    validation = [json.loads(line) for line in (lean_run / "metrics.jsonl").read_text().splitlines()
                  if json.loads(line)["split"] == "validation"]
    best_record = max(validation, key=lambda record: record["accuracy"])  # the first of equals wins, as the trainer
    assert test["checkpoint"] == {"step": int(best.removeprefix("step-")), "which": "best", "best_metric": "accuracy",
                                  "best_value": pytest.approx(best_record["accuracy"])}
    assert test["checkpoint"]["step"] == best_record["step"]
    assert f"best checkpoint, step {test['checkpoint']['step']}" in (lean_run / "test_report.md").read_text()


def test_plots_are_written_at_the_end_of_the_run(lean_run: Path) -> None:
    assert (lean_run / "plots" / "loss.png").read_bytes().startswith(b"\x89PNG")
    assert (lean_run / "plots" / "accuracy.png").is_file()


def test_without_optimizer_state_the_checkpoints_keep_only_their_models(lean_run: Path) -> None:
    checkpoints = RunDirectory(lean_run).complete_checkpoints()
    assert checkpoints
    for checkpoint in checkpoints:
        names = {path.name for path in checkpoint.iterdir()}
        assert names == {"model", "meta.json"}, names
        assert (checkpoint / "model" / "model.safetensors").is_file()


def test_resuming_a_run_that_kept_only_its_models_is_refused_in_one_line(lean_run: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # in this process: test_finetune.py's bad-input test shows the exit code and line of a refused run's process
    error = error_line(capsys, "finetune", str(lean_run / "config.yaml"), "train.max_steps=8")
    assert "train.keep_optimizer_state=false" in error and f"model.init_from={lean_run}" in error


def test_an_export_carries_its_own_model_card_and_a_second_export_may_replace_it(lean_run: Path,
                                                                                 tmp_path: Path) -> None:
    out = tmp_path / "exported"
    assert main(["export", str(lean_run), "--out", str(out)]) == 0
    front, body = front_matter_and_body(out / "README.md")
    assert front["pipeline_tag"] == "text-classification" and "model-index" in front
    assert f"bertforge export {lean_run} --out {out}" in body and f"Exported from `{lean_run}`" in body
    names = [path.name for path in out.iterdir() if not path.name.startswith(".")]
    assert "README.md" in names and is_earlier_export(names, set())
    assert main(["export", str(lean_run), "--out", str(out), "--overwrite"]) == 0


def test_a_plotting_failure_is_a_warning_and_the_run_still_finishes(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no display backend")

    monkeypatch.setattr(bertforge.plotting, "plot_run", broken)
    run_dir = tmp_path / "runs" / "no-plots"
    result = finetune(run_dir, *TINY_MODEL, *supersense_files(tmp_path / "data", 64, 32, 32),
                      f"model.tokenizer={minilm_dir()}", "finetune.max_length=32", "train.max_steps=2",
                      "train.micro_batch_size=32", "train.global_batch_size=32", "log.plots=true")
    assert result.stopped_by == "budget" and (run_dir / "final" / "config.json").is_file()
    assert not (run_dir / "plots").exists()
    # through the library no command line was typed: the card says so, and the last weights were scored
    _, body = front_matter_and_body(run_dir / "final" / "README.md")
    assert "Python API" in body and "the last weights, step 2" in body
    assert json.loads((run_dir / "test_results.json").read_text())["checkpoint"] == {"step": 2, "which": "last"}


def test_pretraining_final_has_a_fill_mask_card(prepared_corpus: Path, tmp_path: Path) -> None:
    run_dir = tiny_pretraining.train(prepared_corpus, tmp_path / "runs" / "mlm", "train.max_steps=4",
                                     "train.eval_every=4", "log.plots=false")
    front, body = front_matter_and_body(run_dir / "final" / "README.md")
    assert front["pipeline_tag"] == "fill-mask" and "base_model" not in front
    assert "trained from scratch" in body and "Last validation, at step 4" in body
    assert 'pipeline("fill-mask"' in body
    assert not (run_dir / "plots").exists()  # log.plots=false
