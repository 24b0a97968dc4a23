"""`bertforge doctor`'s checks: what this machine offers, whether each attention backend agrees with the
eager reference here, and how fast a preset trains.

Made for the machines this project cannot test on (GPUs, clusters): a user runs one command and
learns which attention kernel `auto` takes and why, whether the kernels give the reference's numbers
in the precision they will train in, and the tokens/s and MFU of a few real training steps.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertforge import __version__
from bertforge.errors import ConfigError
from bertforge.models import BertforgeForPreTraining, EncoderConfig, get_preset
from bertforge.models.attention import PackedAttention, eager_attention
from bertforge.models.attention_backends import (
    AvailableKernels,
    LayerNeeds,
    available_kernels,
    backend_problem,
    choose_backend,
)
from bertforge.tasks.pretrain import pretraining_flops_per_token
from bertforge.train.precision import Precision, gpu_peak_flops, measured_cpu_peak, resolve_precision

BACKENDS = ("varlen", "flash", "sdpa", "eager")
# max |backend - eager fp32| / max |eager fp32|, outputs and input gradients: the inputs' rounding to
# the precision's mantissa (bf16: 8 bits, fp16: 11) times a few for the softmax and the sums
TOLERANCES = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 5e-3}
# packed sequences of unequal lengths (one longer than the window), 4 heads of 64: sizes every kernel takes
CHECK_LENGTHS = (37, 128, 5, 90)
CHECK_HEADS, CHECK_HEAD_DIM, CHECK_WINDOW = 4, 64, 16
MASK_PROB = 0.15


@dataclass
class BackendCheck:
    backend: str
    case: str  # global | window | alibi | bias (a learned bias on the scores, as MPNet's relative positions)
    max_error: float  # relative to the reference's largest value, worst of output and q/k/v gradients
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_error <= self.tolerance


@dataclass
class TrainingSpeed:
    preset: str
    seq_len: int
    batch_size: int
    steps: int
    tokens_per_second: float
    flops_per_token: float
    peak_tflops: float | None
    peak_source: str  # measured fp32/bf16 matmul | table: <GPU> | --peak-tflops | unknown
    mfu: float | None
    final_loss: float
    load_average: float | None = None  # 1-minute load average after the timed steps (None where the OS has none)
    cpu_cores: int | None = None  # logical cores: a load above them means the timing shared the machine

    @property
    def ok(self) -> bool:
        return self.final_loss == self.final_loss and abs(self.final_loss) != float("inf")


@dataclass
class DoctorReport:
    machine: dict[str, Any]
    attention: dict[str, Any]
    checks: list[BackendCheck] = field(default_factory=list)
    training: TrainingSpeed | None = None

    @property
    def ok(self) -> bool:
        return all(check.ok for check in self.checks) and (self.training is None or self.training.ok)

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine, "attention": self.attention,
                "checks": [asdict(check) | {"ok": check.ok} for check in self.checks],
                "training": None if self.training is None else asdict(self.training) | {"ok": self.training.ok},
                "ok": self.ok}


# --- the machine ----------------------------------------------------------------------------------

def nvidia_driver_version() -> str | None:
    """The driver's version as nvidia-smi reports it (torch exposes only the CUDA runtime's)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else None


def cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def bf16_support(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
        return {"runs": native, "native": native,
                "note": "tensor cores" if native else "this GPU has no bf16 (compute capability < 8.0): use fp16"}
    native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return {"runs": True, "native": native,
            "note": "AVX-512 bf16 / AMX instructions" if native else
            "emulated: bf16 matmuls run many times slower than fp32 here; train in fp32 on this CPU"}


def machine_facts(device: torch.device) -> dict[str, Any]:
    devices: list[dict[str, Any]] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            properties = torch.cuda.get_device_properties(index)
            devices.append({"index": index, "name": properties.name,
                            "memory_gib": round(properties.total_memory / 2**30, 1),
                            "capability": f"{properties.major}.{properties.minor}"})
    return {"bertforge": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "cuda_runtime": torch.version.cuda, "cuda_driver": nvidia_driver_version(),
            "cpu": platform.processor() or platform.machine(), "cpu_threads": torch.get_num_threads(),
            "gpus": devices, "device": str(device), "bf16": bf16_support(device)}


# --- attention backends ---------------------------------------------------------------------------

DISENTANGLED_PATH = ("DeBERTa's c2p/p2c terms are a per-pair bias no varlen/flash kernel takes: scores, softmax "
                     "and values computed explicitly on SDPA's packed rows (models/disentangled_attention.py; "
                     "docs/benchmarks.md, DeBERTa)")


def layer_needs(config: EncoderConfig, device: torch.device, precision: Precision) -> list[LayerNeeds]:
    """The distinct attention calls a training step of this model makes on this device."""
    needs = {LayerNeeds(device.type, precision.dtype, config.attention_dropout, config.position == "alibi",
                        config.layer_window(index), config.head_dim, config.relative_attention_buckets > 0)
             for index in range(config.num_layers)}
    return sorted(needs, key=lambda need: -1 if need.window is None else need.window)


def attention_report(config: EncoderConfig, device: torch.device, precision: Precision,
                     kernels: AvailableKernels) -> dict[str, Any]:
    """Which backends can run here, and what `auto` picks for each kind of layer of the model and why."""
    needs = layer_needs(config, device, precision)
    # whether each kernel runs on this device in this precision at all (a plain layer: no dropout,
    # no ALiBi); what the model's own layers need is `auto`'s business below
    plain = LayerNeeds(device.type, precision.dtype, 0.0, False, None, config.head_dim)
    backends = {name: backend_problem(name, plain, kernels) for name in BACKENDS}
    auto = []
    for need in needs:
        choice = choose_backend("auto", need, kernels)
        auto.append({"layers": "global" if need.window is None else f"window {need.window}",
                     "backend": choice.backend, "reason": choice.reason})
    # a family whose layers add a learned bias to the scores, whatever the preset timed here: what its layers get
    mpnet = choose_backend("auto", LayerNeeds(device.type, precision.dtype, 0.0, False, None, config.head_dim, True),
                           kernels)
    auto.append({"layers": "MPNet's (relative position bias)", "backend": mpnet.backend, "reason": mpnet.reason})
    if config.disentangled_attention is not None:  # DeBERTa's layers never reach a kernel: say what they run
        auto = [{"layers": "all", "backend": "disentangled", "reason": DISENTANGLED_PATH}]
    return {"available": {name: problem is None for name, problem in backends.items()},
            "unavailable_because": {name: problem for name, problem in backends.items() if problem},
            "auto": auto}


def check_backend(backend: str, case: str, device: torch.device, precision: Precision) -> BackendCheck:
    """Forward and backward of `backend` in this precision against eager attention in fp32."""
    generator = torch.Generator().manual_seed(0)
    tokens = sum(CHECK_LENGTHS)
    cu_seqlens = torch.tensor([0, *torch.tensor(CHECK_LENGTHS).cumsum(0).tolist()], dtype=torch.int32, device=device)
    inputs = [torch.randn(tokens, CHECK_HEADS, CHECK_HEAD_DIM, generator=generator).to(device) for _ in range(3)]
    grad_output = torch.randn(tokens, CHECK_HEADS, CHECK_HEAD_DIM, generator=generator).to(device)
    window = CHECK_WINDOW if case == "window" else None
    slopes = torch.tensor([0.5 ** (i + 1) for i in range(CHECK_HEADS)], device=device) if case == "alibi" else None
    # a learned bias over key-query offsets (MPNet's): [heads, L, L], the same value along each diagonal
    offsets = torch.arange(max(CHECK_LENGTHS))
    table = torch.randn(CHECK_HEADS, 2 * max(CHECK_LENGTHS) - 1, generator=generator)
    bias = table[:, offsets[None, :] - offsets[:, None] + max(CHECK_LENGTHS) - 1].to(device) if case == "bias" else None

    def run(name: str, dtype: torch.dtype) -> list[torch.Tensor]:
        # fresh leaves for each run: `x.to(dtype)` is `x` itself when nothing changes (fp32 on the CPU), so the
        # runs' gradients would add up in one tensor, and of an `x` that requires grad it is no leaf (no .grad)
        leaves = [x.to(dtype, copy=True).requires_grad_() for x in inputs]
        if name == "eager":
            output = eager_attention(*leaves, cu_seqlens, window=window, alibi_slopes=slopes, bias=bias)
        else:
            output = PackedAttention(cu_seqlens, max(CHECK_LENGTHS), name).attend(
                *leaves, window=window, alibi_slopes=slopes, bias=None if bias is None else bias.to(dtype))
        output.backward(grad_output.to(dtype))
        return [output.detach().float()] + [leaf.grad.float() for leaf in leaves]  # type: ignore[union-attr]

    reference = run("eager", torch.float32)
    candidate = run(backend, precision.dtype)
    error = max(((c - r).abs().max() / r.abs().max()).item() for c, r in zip(candidate, reference, strict=True))
    return BackendCheck(backend, case, error, TOLERANCES[precision.name])


def check_backends(available: dict[str, bool], device: torch.device, precision: Precision) -> list[BackendCheck]:
    checks = []
    for backend in BACKENDS:
        if not available[backend] or backend == "eager":  # eager is the reference itself
            continue
        for case in ("global", "window", "alibi", "bias"):
            if case == "alibi" and backend == "varlen":
                continue  # varlen_attn has no ALiBi: `auto` never sends it an ALiBi layer
            if case == "bias" and backend in ("varlen", "flash"):
                continue  # neither takes a learned bias: `auto` sends MPNet's layers to SDPA
            checks.append(check_backend(backend, case, device, precision))
    return checks


# --- training speed -------------------------------------------------------------------------------

def peak_flops(device: torch.device, precision: Precision, override_tflops: float | None) -> tuple[float | None, str]:
    if override_tflops is not None:
        return override_tflops * 1e12, "--peak-tflops"
    if device.type == "cpu":
        return measured_cpu_peak(precision.dtype), f"measured {precision.name} matmul"
    return gpu_peak_with_source(torch.cuda.get_device_name(device), precision.name)


def gpu_peak_with_source(gpu_name: str, precision: str) -> tuple[float | None, str]:
    """`precision.gpu_peak_flops` and where the number comes from, in words."""
    peak = gpu_peak_flops(gpu_name, precision)
    if peak is not None:
        return peak, f"table: {gpu_name}, dense bf16/fp16"
    if precision == "fp32":
        return None, f"unknown for fp32 on {gpu_name}: give --peak-tflops"
    return None, f"{gpu_name} is not in the table: give --peak-tflops"


def timed_training(preset: str, config: EncoderConfig, seq_len: int, batch_size: int, steps: int,
                   device: torch.device, precision: Precision, override_tflops: float | None) -> TrainingSpeed:
    """`steps` AdamW steps of MLM on random full-length sequences, after one untimed warm-up step."""
    generator = torch.Generator().manual_seed(0)
    model = BertforgeForPreTraining(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    scaler = precision.grad_scaler(device)
    tokens = batch_size * seq_len
    masked = max(1, int(tokens * MASK_PROB))
    batch = {"input_ids": torch.randint(0, config.vocab_size, (tokens,), generator=generator),
             "cu_seqlens": torch.arange(0, tokens + 1, seq_len, dtype=torch.int32), "max_seqlen": seq_len,
             "masked_positions": torch.randperm(tokens, generator=generator)[:masked].sort().values,
             "masked_labels": torch.randint(0, config.vocab_size, (masked,), generator=generator)}
    batch = {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}

    def step() -> float:
        with precision.autocast(device):
            loss = model(**batch).mlm_loss_sum / masked
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    model.train()
    step()  # warm-up: allocator, kernel selection, lazy initialisation
    synchronize(device)
    start = time.perf_counter()
    loss = float("nan")
    for _ in range(steps):
        loss = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens_per_second = tokens * steps / seconds
    flops_per_token = pretraining_flops_per_token(model, seq_len, MASK_PROB)
    peak, source = peak_flops(device, precision, override_tflops)
    mfu = tokens_per_second * flops_per_token / peak if peak else None
    return TrainingSpeed(preset, seq_len, batch_size, steps, tokens_per_second, flops_per_token,
                         None if peak is None else peak / 1e12, source, mfu, loss, load_average(), os.cpu_count())


def load_average() -> float | None:
    """The 1-minute load average: tokens/s measured on a busy machine can be several times lower than on a quiet
    one (5x between two runs on a shared 2-core machine), so the report says what the timing ran under."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no load average
        return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --- the whole check ------------------------------------------------------------------------------

def default_preset(device: torch.device) -> str:
    """Small on a CPU (the whole doctor stays under a minute on 2 cores), bert-base on a GPU."""
    return "bert-base" if device.type == "cuda" else "bert-tiny"


def resolve_device(request: str) -> torch.device:
    if request == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if request.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {request}: no CUDA GPU is visible to torch {torch.__version__} "
                          f"(CUDA runtime {torch.version.cuda or 'none: a CPU build'}); use --device cpu")
    return torch.device(request)


def run_doctor(device: torch.device, precision_request: str, preset: str, seq_len: int, batch_size: int,
               steps: int, peak_tflops: float | None) -> DoctorReport:
    precision = resolve_precision(precision_request, device, tf32=True)
    config = get_preset(preset)
    report = DoctorReport(machine_facts(device), attention_report(config, device, precision, available_kernels(device)))
    report.attention["precision"] = precision.name
    report.checks = check_backends(report.attention["available"], device, precision)
    report.training = timed_training(preset, config, seq_len, batch_size, steps, device, precision, peak_tflops)
    return report
