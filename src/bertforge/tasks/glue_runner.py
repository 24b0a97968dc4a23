"""`bertforge glue`: fine-tune the 8 GLUE tasks in parallel processes and write the results table.

Each (task, seed) is one fine-tuning run — a `ClassificationTask` fed by the GLUE parsers of
`glue_tasks.py` — in its own process and run directory (`OUT/<task>/seed-<seed>/`), so a crash or
an out-of-memory error stays in one job, its log has a file of its own (`job.log`), and a finished
job is skipped when the command runs again (its `<split>_results.json` files exist; an interrupted
one resumes from its checkpoint). Jobs run task-parallel: one per GPU, or on a CPU as many as
`--jobs` with the cores divided between them (intra-op threads scale poorly on small models, so
several single-task processes finish a benchmark sooner than one process using every core).

Hyperparameters, in increasing precedence: the config file (model, schedule, betas, ...), the
task's row of the GLUE table (lr, epochs, batch size, weight decay, max length — Mosaic's values),
`glue.overrides.all`, then `glue.overrides.<task>`. Mosaic's weight decay is
Composer's decoupled one, which is not multiplied by the learning rate; torch's AdamW multiplies
it, so the table's value is divided by the task's learning rate to apply the same decay.

With `glue.from_mnli`, RTE, MRPC and STS-B start from the fine-tuned MNLI model (its
encoder and pooler; a fresh classifier), Mosaic's recipe for the small inference-like tasks, so
they wait for the MNLI job. Small tasks run several seeds; the table reports the median.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertforge.config import Config, config_to_yaml, load_config, load_run_config
from bertforge.console import log
from bertforge.errors import BertforgeError, ConfigError, user_message
from bertforge.output_guard import claim_run_directory
from bertforge.processes import kill_with_parent_preexec
from bertforge.run_directory import RunDirectory
from bertforge.tasks.glue_tasks import (
    GLUE_TASKS,
    STAND_IN_FILE,
    GlueTask,
    get_glue_task,
    glue_file,
    stand_in_tasks,
    summarize_glue,
    write_glue_results,
)

JOB_SPEC = "job.json"
JOB_LOG = "job.log"
THREADS_PER_CPU_JOB = 2
MNLI_STARTED = ("rte", "mrpc", "stsb")
# the longest jobs first: MNLI also unblocks the tasks that start from it
LAUNCH_ORDER = ("mnli", "qqp", "qnli", "sst2", "cola", "stsb", "mrpc", "rte")


@dataclass(frozen=True)
class GlueJob:
    task: GlueTask
    seed: int
    run_dir: Path
    after_mnli: bool  # starts from the MNLI model, so waits for the MNLI job

    @property
    def name(self) -> str:
        return f"{self.task.title} seed {self.seed}"

    def finished(self) -> bool:
        return all(RunDirectory(self.run_dir).results_file(split).is_file() for split in self.task.eval_splits)

    def metrics(self) -> dict[str, dict[str, float]]:
        """{eval split: metrics} as `summarize_glue` takes them."""
        run = RunDirectory(self.run_dir)
        return {split: json.loads(run.results_file(split).read_text(encoding="utf-8"))["metrics"]
                for split in self.task.eval_splits}


# ---------------------------------------------------------------------------------------------
# planning


def selected_tasks(config: Config) -> list[GlueTask]:
    names = config.glue.tasks or list(GLUE_TASKS)
    try:
        tasks = [get_glue_task(name) for name in names]
    except ConfigError as error:
        raise ConfigError(f"glue.tasks: {error}") from None
    unknown = sorted(set(config.glue.overrides) - set(GLUE_TASKS) - {"all"})
    if unknown:
        raise ConfigError(f"glue.overrides names {', '.join(unknown)}; use the task names "
                          f"{', '.join(GLUE_TASKS)} or `all`")
    return sorted({task.name: task for task in tasks}.values(), key=lambda t: LAUNCH_ORDER.index(t.name))


def seeds_of(task: GlueTask, config: Config) -> tuple[int, ...]:
    cap = config.glue.seeds
    return task.seeds if cap is None or not task.small else task.seeds[:cap]


def mnli_model(out_dir: Path) -> Path:
    return RunDirectory(out_dir / "mnli" / f"seed-{GLUE_TASKS['mnli'].seeds[0]}").final


def task_overrides(base: Config, task: GlueTask) -> list[str]:
    """The table's hyperparameters as dotted overrides, then the user's `all` and per-task ones."""
    hp = task.hyperparameters
    micro = base.train.micro_batch_size if hp.batch_size % base.train.micro_batch_size == 0 else hp.batch_size
    table = [f"optim.lr={hp.lr}", f"optim.weight_decay={hp.weight_decay / hp.lr}", f"train.max_epochs={hp.epochs}",
             f"train.global_batch_size={hp.batch_size}", f"train.micro_batch_size={micro}",
             f"finetune.max_length={hp.max_length}", f"finetune.task_type={task.task_type}"]
    overrides = base.glue.overrides
    return [*table, *overrides.get("all", []), *overrides.get(task.name, [])]


def job_config(base: Config, job: GlueJob, out_dir: Path) -> Config:
    fixed = [f"run.output_dir={job.run_dir.parent}", f"run.name={job.run_dir.name}", f"run.seed={job.seed}"]
    if job.after_mnli:
        fixed.append(f"model.init_from={mnli_model(out_dir)}")
    return load_config(None, [*task_overrides(base, job.task), *fixed], base=base)


def plan_jobs(config: Config, out_dir: Path) -> list[GlueJob]:
    tasks = selected_tasks(config)
    names = {task.name for task in tasks}
    from_mnli = config.glue.from_mnli
    if from_mnli and "mnli" not in names and not mnli_model(out_dir).is_dir() and names & set(MNLI_STARTED):
        raise ConfigError(f"glue.from_mnli needs the MNLI model: add mnli to glue.tasks (or run it first into "
                          f"{out_dir})")
    return [GlueJob(task, seed, out_dir / task.name / f"seed-{seed}", from_mnli and task.name in MNLI_STARTED)
            for task in tasks for seed in seeds_of(task, config)]


# ---------------------------------------------------------------------------------------------
# the worker: one job in its own process


def run_job(spec_path: Path) -> int:
    """Fine-tune one (task, seed): called in the job's process with the spec the runner wrote."""
    import torch

    from bertforge.data.labels import LabeledData
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.tasks.glue_tasks import read_glue_split
    from bertforge.train.trainer import Trainer

    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    torch.set_num_threads(int(spec["threads"]))
    config = load_run_config(spec_path.parent / "job_config.yaml")
    task = get_glue_task(spec["task"])
    train = read_glue_split(task, spec["data_dir"], "train")
    evaluations = {split: read_glue_split(task, spec["data_dir"], split) for split in task.eval_splits}
    data = LabeledData(train, evaluations[task.eval_splits[0]], None, None)
    return Trainer(config, ClassificationTask(config, data, final_splits=evaluations)).fit().exit_code


def worker_main(argv: Sequence[str]) -> int:
    from bertforge.console import NORMAL, quiet_transformers, setup_logging

    setup_logging(NORMAL)
    quiet_transformers()
    try:
        return run_job(Path(argv[0]))  # 143/130 when a signal stopped the job: the runner must not record it done
    except BertforgeError as error:
        print(f"error: {user_message(error)}", file=sys.stderr)
        return error.exit_code


# ---------------------------------------------------------------------------------------------
# the runner


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def device_slots(config: Config, jobs: int | None) -> list[dict[str, str]]:
    """One environment per parallel job: a GPU each, or an equal share of the CPU cores."""
    import torch

    gpus = torch.cuda.device_count() if config.run.device != "cpu" else 0
    return plan_slots(gpus, cpu_count(), jobs)


def plan_slots(gpus: int, cores: int, jobs: int | None) -> list[dict[str, str]]:
    """`device_slots` as a pure function of what the machine has, so the GPU plan is tested on a CPU."""
    if gpus:
        count = min(jobs or gpus, gpus)
        threads = str(max(1, cores // count))
        return [{"CUDA_VISIBLE_DEVICES": str(i), "OMP_NUM_THREADS": threads, "BERTFORGE_JOB_THREADS": threads}
                for i in range(count)]
    count = jobs or max(1, cores // THREADS_PER_CPU_JOB)
    threads = str(max(1, cores // count))
    return [{"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "BERTFORGE_JOB_THREADS": threads}
            for _ in range(count)]


@dataclass
class _Running:
    job: GlueJob
    process: subprocess.Popen[bytes]
    slot: int
    started: float


def _launch(job: GlueJob, config: Config, out_dir: Path, data_dir: Path, environment: dict[str, str],
            slot: int) -> _Running:
    job.run_dir.mkdir(parents=True, exist_ok=True)
    # the job's directory is a fine-tuning run's: claimed as one before the job's own files go in, so the
    # trainer in the job's process (which claims it again) finds a run directory, not a stranger's files
    claim_run_directory(job.run_dir, "finetune")
    (job.run_dir / "job_config.yaml").write_text(config_to_yaml(job_config(config, job, out_dir)), encoding="utf-8")
    spec = {"task": job.task.name, "seed": job.seed, "data_dir": str(data_dir.resolve()),
            "threads": environment["BERTFORGE_JOB_THREADS"]}
    (job.run_dir / JOB_SPEC).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    env = os.environ | environment | {"PYTHONUNBUFFERED": "1"}
    with open(job.run_dir / JOB_LOG, "ab") as log_file:
        # the job dies with this runner (kill -9 included): a re-run never finds an orphan still training
        process = subprocess.Popen([sys.executable, "-m", "bertforge.tasks.glue_runner", str(job.run_dir / JOB_SPEC)],
                                   stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                   preexec_fn=kill_with_parent_preexec())
    log.info(f"started {job.name} (log: {job.run_dir / JOB_LOG})")
    return _Running(job, process, slot, time.perf_counter())


def _last_error_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "internal error:")) or "Error" in line]
    return (errors or lines or ["(empty log)"])[-1]


def run_glue(config: Config, data_dir: str | Path, out_dir: str | Path | None = None,
             jobs: int | None = None) -> dict[str, Any]:
    """Run every planned job (skipping finished ones), then write glue_results.{md,json} into `out_dir`."""
    data_dir = Path(data_dir)
    out = Path(out_dir) if out_dir is not None else Path(config.run.output_dir) / config.run.name
    planned = plan_jobs(config, out)
    tasks = list({job.task.name: job.task for job in planned}.values())
    for task in tasks:  # a missing file fails now, not in a job
        for split in ("train", *task.eval_splits):
            glue_file(task, data_dir, split)
    stand_ins = stand_in_tasks(tasks, data_dir)
    if stand_ins:
        log.warning(f"{', '.join(GLUE_TASKS[name].title for name in stand_ins)} in {data_dir}: stand-ins in GLUE's "
                    f"layout ({STAND_IN_FILE}), not GLUE's data; the results table marks them and sets none "
                    "against BERT-base's numbers")
    for job in planned:  # a typo in an override fails now too
        job_config(config, job, out)
    slots = device_slots(config, jobs)
    pending = [job for job in planned if not job.finished()]
    if len(pending) < len(planned):
        log.info(f"{len(planned) - len(pending)} of {len(planned)} GLUE jobs already finished in {out}; skipping them")
    log.info(f"GLUE: {len(pending)} jobs on {len(slots)} parallel slot(s) "
             f"({'GPU' if 'CUDA_VISIBLE_DEVICES' in slots[0] else 'CPU threads ' + slots[0]['OMP_NUM_THREADS']} each)")
    running: list[_Running] = []
    free = list(range(len(slots)))
    mnli_jobs = [job for job in planned if job.task.name == "mnli"]
    try:
        while pending or running:
            mnli_done = all(job.finished() for job in mnli_jobs)
            for job in [j for j in pending if not j.after_mnli or mnli_done]:
                if not free:
                    break
                slot = free.pop(0)
                running.append(_launch(job, config, out, data_dir, slots[slot], slot))
                pending.remove(job)
            time.sleep(0.2)
            for entry in [r for r in running if r.process.poll() is not None]:
                running.remove(entry)
                free.append(entry.slot)
                code = entry.process.returncode
                if code != 0 or not entry.job.finished():
                    raise BertforgeError(f"GLUE job {entry.job.name} failed (exit code {code}): "
                                         f"{_last_error_line(entry.job.run_dir / JOB_LOG)} — full log: "
                                         f"{entry.job.run_dir / JOB_LOG}")
                metrics = entry.job.metrics()
                shown = ", ".join(f"{split}/{metric} {100 * metrics[split][metric]:.2f}"
                                  for split, metric in entry.job.task.official)
                log.info(f"finished {entry.job.name} in {time.perf_counter() - entry.started:.0f} s: {shown}")
    finally:
        for entry in running:  # an error or Ctrl-C: stop the jobs this runner started
            entry.process.terminate()
        for entry in running:
            entry.process.wait()
    results: dict[str, list[dict[str, dict[str, float]]]] = {}
    for job in planned:
        results.setdefault(job.task.name, []).append(job.metrics())
    summary = summarize_glue(results, stand_ins)
    markdown, data = write_glue_results(summary, out)
    log.info(f"GLUE results: {markdown} and {data}")
    return summary


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
