"""`bertforge glue`: the job plan (hyperparameters, seeds, the MNLI start), all 8 tasks run end to end in
two parallel processes on a GLUE-layout directory of real text, and the final table."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers.finetuning import minilm_dir

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.errors import BertforgeError, ConfigError, DataError
from bertforge.tasks.glue_runner import job_config, mnli_model, plan_jobs, plan_slots, run_glue
from bertforge.tasks.glue_tasks import GLUE_TASKS


def glue_config(tmp_path: Path, *overrides: str):  # type: ignore[no-untyped-def]
    """A 1-layer, 32-wide BERT with the MiniLM vocabulary, 2 steps per job."""
    return load_config(None, [
        f"run.output_dir={tmp_path}", "run.name=glue", "model.preset=bert-tiny", f"model.tokenizer={minilm_dir()}",
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false",
        "glue.overrides={all: [train.max_steps=2, finetune.max_length=64, train.micro_batch_size=16, "
        "train.global_batch_size=16]}", *overrides])


# ---------------------------------------------------------------------------------------------
# the plan


def test_every_task_gets_the_table_hyperparameters_then_the_all_and_per_task_overrides(tmp_path: Path) -> None:
    config = load_config(None, ["glue.overrides={all: [finetune.max_length=128], rte: [optim.lr=2e-5]}"])
    jobs = {job.task.name: job for job in reversed(plan_jobs(config, tmp_path))}  # each task's first seed
    rte = job_config(config, jobs["rte"], tmp_path)
    assert rte.optim.lr == 2e-5 and rte.finetune.max_length == 128
    assert rte.train.max_epochs == 3 and rte.train.global_batch_size == 16 and rte.train.micro_batch_size == 16
    mnli = job_config(config, jobs["mnli"], tmp_path)
    assert mnli.optim.lr == 5e-5 and mnli.train.global_batch_size == 48 and mnli.finetune.max_length == 128
    # Mosaic's decoupled weight decay 5e-6 at lr 5e-5 is torch AdamW's 0.1
    assert mnli.optim.weight_decay == pytest.approx(0.1)
    stsb = job_config(config, jobs["stsb"], tmp_path)
    assert stsb.finetune.task_type == "regression" and stsb.run.output_dir == str(tmp_path / "stsb")
    assert stsb.run.name == "seed-19" and stsb.run.seed == 19 and stsb.model.init_from is None


def test_jobs_get_one_gpu_each_or_a_share_of_the_cpu_cores() -> None:
    """The GPU plan (never run on a GPU here) as a pure function of the GPU and core counts."""
    eight_gpus = plan_slots(8, 64, None)
    assert [slot["CUDA_VISIBLE_DEVICES"] for slot in eight_gpus] == [str(i) for i in range(8)]
    assert {slot["OMP_NUM_THREADS"] for slot in eight_gpus} == {"8"}
    assert [slot["CUDA_VISIBLE_DEVICES"] for slot in plan_slots(8, 64, 3)] == ["0", "1", "2"]
    assert len(plan_slots(2, 16, 5)) == 2  # never more jobs than GPUs
    cpu = plan_slots(0, 8, None)
    assert len(cpu) == 4 and all("CUDA_VISIBLE_DEVICES" not in slot and slot["OMP_NUM_THREADS"] == "2" for slot in cpu)


def test_small_tasks_run_several_seeds_and_may_start_from_the_mnli_model(tmp_path: Path) -> None:
    config = load_config(None, ["glue.seeds=2", "glue.from_mnli=true"])
    jobs = plan_jobs(config, tmp_path)
    seeds = {name: [job.seed for job in jobs if job.task.name == name] for name in GLUE_TASKS}
    assert seeds["rte"] == [19, 8364] and seeds["cola"] == [19, 8364] and seeds["mnli"] == [19]
    assert jobs[0].task.name == "mnli"  # the longest job, and the one three others wait for
    rte = next(job for job in jobs if job.task.name == "rte")
    assert rte.after_mnli and job_config(config, rte, tmp_path).model.init_from == str(mnli_model(tmp_path))
    assert not next(job for job in jobs if job.task.name == "cola").after_mnli
    everything = plan_jobs(load_config(None), tmp_path)
    assert len(everything) == 4 + 1 + 5 + 5 + 1 + 1 + 1 + 5  # CoLA 4 seeds, MRPC/STS-B/RTE 5 (Mosaic's)


def test_config_mistakes_are_caught_before_any_job_starts(tmp_path: Path, glue_dir: Path) -> None:
    with pytest.raises(ConfigError, match="glue.tasks: WNLI is left out"):
        plan_jobs(load_config(None, ["glue.tasks=[rte,wnli]"]), tmp_path)
    with pytest.raises(ConfigError, match="glue.overrides names rtee"):
        plan_jobs(load_config(None, ["glue.overrides={rtee: [optim.lr=1e-5]}"]), tmp_path)
    with pytest.raises(ConfigError, match="glue.from_mnli needs the MNLI model"):
        plan_jobs(load_config(None, ["glue.tasks=[rte]", "glue.from_mnli=true"]), tmp_path)
    with pytest.raises(ConfigError, match="holds 'optim.lr'"):
        load_config(None, ["glue.overrides={rte: [optim.lr]}"])
    with pytest.raises(ConfigError, match="did you mean `optim.lr`"):
        run_glue(glue_config(tmp_path, "glue.tasks=[rte]", "glue.overrides={rte: [optim.lrr=1e-5]}"), glue_dir)
    partial = tmp_path / "partial"
    (partial / "RTE").mkdir(parents=True)
    shutil.copy(glue_dir / "RTE" / "train.tsv", partial / "RTE" / "train.tsv")
    with pytest.raises(DataError, match="RTE/dev.tsv: GLUE file not found"):
        run_glue(glue_config(tmp_path, "glue.tasks=[rte]"), partial)
    assert not (tmp_path / "glue").exists()


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs" / "glue").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_the_shipped_glue_configs_load_and_plan(path: Path, tmp_path: Path) -> None:
    config = load_config(path)
    jobs = plan_jobs(config, tmp_path)
    assert jobs and all(job_config(config, job, tmp_path).model.init_from for job in jobs)


# ---------------------------------------------------------------------------------------------
# end to end


@pytest.fixture(scope="module")
def glue_run(tmp_path_factory: pytest.TempPathFactory, glue_dir: Path) -> tuple[Path, str]:
    """All 8 tasks, 2 parallel processes, RTE/MRPC/STS-B from the MNLI model, through the CLI's entry point."""
    root = tmp_path_factory.mktemp("runs")
    config = root / "glue.yaml"
    config.write_text(f"""
run: {{name: glue, output_dir: {root}}}
model: {{preset: bert-tiny, tokenizer: {minilm_dir()}, hidden_size: 32, num_layers: 1, num_heads: 2,
        intermediate_size: 64}}
glue:
  from_mnli: true
  seeds: 1
  overrides:
    all: [train.max_steps=2, finetune.max_length=64, train.micro_batch_size=16, train.global_batch_size=16]
data: {{num_workers: 0}}
log: {{tensorboard: false, progress: false, plots: false}}
""")
    # `bertforge glue` in this process (its 8 jobs are still processes of their own): a second interpreter for the
    # runner only added start-up CPU; what it prints is read from redirected streams
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["glue", str(config), "--data-dir", str(glue_dir), "--jobs", "2"])
    assert code == 0, stderr.getvalue()[-3000:]
    return root / "glue", stdout.getvalue()


def test_all_eight_tasks_run_and_the_table_lists_each_official_metric_and_the_average(
        glue_run: tuple[Path, str]) -> None:
    out, stdout = glue_run
    summary = json.loads((out / "glue_results.json").read_text())
    assert list(summary["tasks"]) == list(GLUE_TASKS) and summary["tasks_run"] == 8
    assert set(summary["tasks"]["mnli"]["values"]) == {"dev_matched/accuracy", "dev_mismatched/accuracy"}
    assert set(summary["tasks"]["stsb"]["values"]) == {"dev/pearson", "dev/spearman"}
    assert set(summary["tasks"]["cola"]["values"]) == {"dev/matthews"}
    scores = [entry["score"] for entry in summary["tasks"].values()]
    assert summary["glue_average"] == pytest.approx(sum(scores) / 8)
    markdown = (out / "glue_results.md").read_text()
    assert markdown in stdout and "**GLUE average**" in markdown and "BERT-base" in markdown
    # the WordNet stand-ins of tests/glue_layout.py say so, with no delta against BERT-base's real-GLUE numbers
    assert summary["stand_in_tasks"] == list(GLUE_TASKS) and "| CoLA (stand-in) |" in markdown
    assert "Stand-ins, not GLUE" in markdown
    assert next(line for line in markdown.splitlines() if line.startswith("| **GLUE average**")).endswith("| n/a | |")
    for task in GLUE_TASKS.values():
        run_dir = out / task.name / "seed-19"
        for split in task.eval_splits:
            assert json.loads((run_dir / f"{split}_results.json").read_text())["metrics"]["examples"] == 100
        assert (run_dir / "final" / "config.json").is_file() and (run_dir / "job.log").is_file()


def test_rte_mrpc_and_sts_b_started_from_the_fine_tuned_mnli_model(glue_run: tuple[Path, str]) -> None:
    out, _ = glue_run
    for name in ("rte", "mrpc", "stsb"):
        assert load_config(out / name / "seed-19" / "config.yaml").model.init_from == str(out / "mnli" / "seed-19" / "final")
    assert load_config(out / "cola" / "seed-19" / "config.yaml").model.init_from is None
    assert json.loads((out / "mnli" / "seed-19" / "final" / "config.json").read_text())["id2label"] == {
        "0": "entailment", "1": "neutral", "2": "contradiction"}


def test_running_again_skips_finished_jobs_and_more_seeds_report_the_median(glue_run: tuple[Path, str],
                                                                           glue_dir: Path) -> None:
    out, _ = glue_run
    config = glue_config(out.parent, "glue.tasks=[rte]", "glue.seeds=2", "glue.from_mnli=true")
    before = (out / "rte" / "seed-19" / "dev_results.json").stat().st_mtime_ns
    summary = run_glue(config, glue_dir, jobs=1)
    assert (out / "rte" / "seed-19" / "dev_results.json").stat().st_mtime_ns == before
    rte = summary["tasks"]["rte"]
    assert rte["seeds"] == 2
    per_seed = [run["dev/accuracy"] for run in rte["per_seed"]]
    assert rte["values"]["dev/accuracy"] == pytest.approx(sum(per_seed) / 2)  # the median of two


def test_a_failing_job_stops_the_run_with_its_error_and_log(tmp_path: Path, glue_dir: Path) -> None:
    config = glue_config(tmp_path, "glue.tasks=[rte]", "glue.overrides={rte: [finetune.max_length=600]}")
    with pytest.raises(BertforgeError, match=r"GLUE job RTE seed 19 failed \(exit code 2\): .*max_length is 600"
                                             r".*job\.log"):
        run_glue(config, glue_dir, jobs=1)


def test_killing_the_runner_kills_its_job_so_a_rerun_never_meets_an_orphan(glue_dir: Path, tmp_path: Path) -> None:
    """kill -9 of `bertforge glue`: its job processes die with it (they were left training before)."""
    import os
    import signal
    import subprocess
    import time

    from bertforge.config import config_to_yaml

    config = tmp_path / "glue.yaml"
    config.write_text(config_to_yaml(glue_config(
        tmp_path, "glue.tasks=[rte]", "glue.seeds=1",
        "glue.overrides={all: [train.max_steps=1000000, finetune.max_length=64, "
        "train.micro_batch_size=16, train.global_batch_size=16]}")), encoding="utf-8")
    runner = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "glue", str(config), "--data-dir",
                               str(glue_dir), "--jobs", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    lock = tmp_path / "glue" / "rte" / "seed-19" / ".lock"
    try:
        deadline = time.monotonic() + 180
        while not (lock.is_file() and lock.stat().st_size > 0):  # the job holds its run directory
            assert time.monotonic() < deadline and runner.poll() is None, "the GLUE job never started"
            time.sleep(0.1)
        job_pid = json.loads(lock.read_text())["pid"]
        os.kill(runner.pid, signal.SIGKILL)  # the runner only
        runner.wait()
        deadline = time.monotonic() + 15
        while Path(f"/proc/{job_pid}").exists() and "Z" not in Path(f"/proc/{job_pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, f"the job (PID {job_pid}) outlived its runner"
            time.sleep(0.1)
    finally:  # whatever happened, nothing of this test keeps running
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)
