"""The reports' plumbing: atomic writes, the machine a result was measured on, one run in a child process."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text, encoding="utf-8")
    temporary.replace(path)


def machine_description(device: str) -> dict[str, Any]:
    import torch
    import transformers

    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "load_average_start": os.getloadavg()[0]}


def fp32_matmul_gflops(size: int = 1024, rounds: int = 7) -> float:
    """The CPU's fp32 matmul rate now, on torch's current threads: the median of `rounds` timed `size`³ products after
    one untimed. A wall-clock budget buys as many steps as the machine is fast that day (the same 2-core VM has run a
    10-minute arm 39% faster from one session to the next), so a study split over sessions records it per run."""
    import time

    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - start)
    return 2 * size**3 / sorted(seconds)[rounds // 2] / 1e9


def quiet_progress_bars() -> None:
    """`datasets.map` and weight loading draw progress bars; the arms' own logs are enough."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def run_in_child(script: Path, spec_path: Path, what: str) -> None:
    """`script --run-arm spec_path` in a fresh process (its own peak RSS and threads); exit if it fails.

    The child's stdout (HF's log lines) goes to our stderr: stdout carries only the table."""
    child = subprocess.run([sys.executable, str(script.resolve()), "--run-arm", str(spec_path)], stdout=sys.stderr)
    if child.returncode != 0:
        raise SystemExit(f"{what} failed with exit code {child.returncode} (its output is above); its spec is "
                         f"{spec_path}")
