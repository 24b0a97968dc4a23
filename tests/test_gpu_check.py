"""The GPU check's dry run (`make gpu-check DRY_RUN=1`): every stage of `benchmarks/gpu_check.py` on this
CPU with tiny shapes, so a broken command line, import or recipe fails here, not in the few minutes a GPU
is lent. Without `gpu-wheels/` (a fresh clone: building it needs the network) the install stage is skipped
with the reason; with it, the wheels are installed into a fresh target for CPython 3.12 manylinux."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["environment", "install", "cuda-tests", "doctor", "throughput", "pretrain-resume", "finetune"]


@pytest.mark.slow
def test_the_gpu_check_dry_run_runs_every_stage_on_a_cpu_and_reports_them(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--out", str(out), "--work",
                           str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    report = json.loads((out / "gpu_check.json").read_text())
    stages = report["stages"]
    statuses = {name: stage["status"] for name, stage in stages.items()}
    assert done.returncode == 0, (statuses, done.stdout[-4000:], done.stderr[-2000:])
    assert list(stages) == STAGES and report["dry_run"]
    wheels = ROOT / "gpu-wheels"
    assert statuses == {name: "ok" for name in STAGES} | {"install": "ok" if wheels.is_dir() else "skipped"}
    if not wheels.is_dir():
        assert "gpu-wheels/ is absent" in stages["install"]["reason"]
    assert stages["cuda-tests"]["result"]["skipped"] > 0  # on a CPU every cuda test is collected and skipped
    assert stages["doctor"]["result"]["ok"]
    for run in stages["throughput"]["result"]["runs"]:
        feeds = run["feeds"]
        assert feeds["bertforge"]["median_tokens_per_s"] > 0 and feeds["HF SDPA, dynamic padding"]["median_tokens_per_s"] > 0
    resume = stages["pretrain-resume"]["result"]
    assert resume["killed_after_step"] < resume["steps"] and resume["verdict"] == "bitwise equal"
    assert 0 <= stages["finetune"]["result"]["test_metrics"]["accuracy"] <= 1
    log = (out / "gpu_check.log").read_text()
    assert all(f"=== {name}: ok" in log or f"=== {name}: skipped" in log for name in STAGES)
