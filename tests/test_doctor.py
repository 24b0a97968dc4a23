"""`bertforge doctor` on this CPU: the report parses as JSON, says why the GPU kernels cannot run here,
checks SDPA against the eager reference, times real training steps; a failed check exits 1."""

from __future__ import annotations

import json

import pytest
import torch

import bertforge.doctor
from bertforge.cli import main

SMALL = ["--preset", "bert-tiny", "--seq-len", "32", "--batch-size", "2", "--steps", "1", "--device", "cpu"]


def doctor_json(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    code = main(["-q", "doctor", "--json", *SMALL, *extra])
    return code, json.loads(capsys.readouterr().out)


def test_doctor_json_reports_machine_backends_checks_and_speed(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = doctor_json(capsys)
    assert code == 0 and report["ok"] is True
    machine = report["machine"]
    assert machine["torch"] and machine["device"] == "cpu" and machine["bf16"]["runs"] is True
    attention = report["attention"]
    assert attention["precision"] == "fp32"
    assert attention["available"] == {"varlen": False, "flash": False, "sdpa": True, "eager": True}
    assert "CUDA-only" in attention["unavailable_because"]["varlen"]
    # the preset's global layers, and MPNet's layers with their relative position bias
    assert [(choice["layers"], choice["backend"]) for choice in attention["auto"]] == [
        ("global", "sdpa"), ("MPNet's (relative position bias)", "sdpa")]
    assert {(check["backend"], check["case"]) for check in report["checks"]} == {
        ("sdpa", "global"), ("sdpa", "window"), ("sdpa", "alibi"), ("sdpa", "bias")}
    for check in report["checks"]:
        assert check["ok"] and 0 < check["max_error"] <= check["tolerance"] == 1e-4
    training = report["training"]
    assert training["preset"] == "bert-tiny" and training["steps"] == 1
    assert training["tokens_per_second"] > 0 and training["flops_per_token"] > 0
    assert training["peak_source"] == "measured fp32 matmul" and 0 < training["mfu"]


def test_peak_tflops_overrides_the_measured_peak(capsys: pytest.CaptureFixture[str]) -> None:
    _, report = doctor_json(capsys, "--peak-tflops", "2")
    training = report["training"]
    assert training["peak_tflops"] == 2 and training["peak_source"] == "--peak-tflops"
    assert training["mfu"] == pytest.approx(training["tokens_per_second"] * training["flops_per_token"] / 2e12)


def test_gpu_peaks_come_from_the_table_by_name_in_half_precision_only() -> None:
    """The GPU side of MFU, as pure functions of the device name (this machine has no GPU)."""
    from bertforge.doctor import gpu_peak_with_source
    from bertforge.train.precision import gpu_peak_flops

    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", "fp16") == 312e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-40GB", "fp32") is None
    assert gpu_peak_flops("NVIDIA GeForce GTX 1080", "bf16") is None
    assert gpu_peak_with_source("NVIDIA GeForce GTX 1080", "bf16") == (
        None, "NVIDIA GeForce GTX 1080 is not in the table: give --peak-tflops")
    assert gpu_peak_with_source("NVIDIA H100 80GB HBM3", "fp32")[1].endswith("give --peak-tflops")


def test_a_failed_backend_check_exits_1(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero tolerance: SDPA's real rounding differences from the eager reference fail the check."""
    monkeypatch.setitem(bertforge.doctor.TOLERANCES, "fp32", 0.0)
    code, report = doctor_json(capsys)
    assert code == 1 and report["ok"] is False
    assert not any(check["ok"] for check in report["checks"])


def test_doctor_prints_readable_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "doctor", *SMALL]) == 0
    output = capsys.readouterr().out
    assert "bertforge[flash]" in output  # not eaten as rich markup
    assert "auto, global layers" in output and "MFU" in output and "all checks passed" in output


@pytest.mark.parametrize(("arguments", "message"), [
    (["--seq-len", "0"], "--seq-len is 0; it must be positive"),
    (["--device", "cuda"], "no CUDA GPU is visible"),
    (["--preset", "bert-huge"], "--preset bert-huge is not a model preset; choose one of bert-tiny"),
])
def test_bad_doctor_arguments_are_one_line_with_exit_code_2(arguments: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", *arguments]) == 2
    assert message in capsys.readouterr().err


def test_the_command_line_starts_without_importing_torch() -> None:
    """Registering every command (what `bertforge --help` and each command's start pay) stays light:
    doctor's preset list once imported the models, torch and torch._dynamo, 7 s per start here."""
    import subprocess
    import sys

    code = "import sys; from bertforge.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("case", ["global", "window", "alibi", "bias"])
def test_a_half_precision_backend_check_compares_output_and_gradients(case: str) -> None:
    """The check GPUs run (bf16 against eager fp32), on this CPU: each run takes fresh leaves, so the bf16 run's
    gradients exist (a cast of a tensor that requires grad is no leaf) and are not added into the reference's."""
    from bertforge.train.precision import Precision

    check = bertforge.doctor.check_backend("sdpa", case, torch.device("cpu"), Precision("bf16"))
    assert check.ok and 0 < check.max_error <= check.tolerance == bertforge.doctor.TOLERANCES["bf16"]
