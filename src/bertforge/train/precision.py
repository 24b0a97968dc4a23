"""Numeric precision: fp32, bf16 or fp16 autocast, the fp16 GradScaler, TF32, and peak FLOP/s for MFU.

`auto` picks bf16 on GPUs that support it and fp32 elsewhere: on CPUs without bf16 instructions
(the 2-core EPYC of our CI) bf16 matmuls run 16-190x slower than fp32.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from bertforge.console import log

# dense bf16/fp16 tensor-core peaks (FLOP/s) by GPU name fragment, for model-FLOPs utilisation
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "V100": 125e12}


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16

    @property
    def dtype(self) -> torch.dtype:
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.name]

    @property
    def fsdp_param_dtype(self) -> torch.dtype | None:
        return None if self.name == "fp32" else self.dtype

    def autocast(self, device: torch.device) -> AbstractContextManager[Any]:
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.dtype)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        # fp16 has too few exponent bits for small gradients: scale the loss, unscale before the step
        return torch.amp.GradScaler(device.type) if self.name == "fp16" else None

    def peak_flops(self, device: torch.device) -> float | None:
        if device.type == "cuda":
            return gpu_peak_flops(torch.cuda.get_device_name(device), self.name)
        return measured_cpu_fp32_peak() if self.name == "fp32" else None


def gpu_peak_flops(gpu_name: str, precision: str) -> float | None:
    """The dense bf16/fp16 peak of a GPU named in the table; None in fp32 (TF32 peaks are another
    table) or for a GPU not in it. A pure function of the name, so it is tested without a GPU."""
    if precision == "fp32":
        return None
    return next((peak for key, peak in GPU_PEAK_FLOPS.items() if key in gpu_name), None)


def resolve_precision(request: str, device: torch.device, tf32: bool) -> Precision:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    if request == "auto":
        use_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return Precision("bf16" if use_bf16 else "fp32")
    if device.type == "cpu" and request in ("bf16", "fp16"):
        log.warning(f"train.precision={request} on a CPU: most CPUs (this one included, unless it has AVX-512 "
                    "bf16/AMX) run half-precision matmuls many times slower than fp32; fp32 is the CPU default")
    return Precision(request)


def measured_cpu_fp32_peak() -> float:
    """fp32 matmul FLOP/s of this CPU with torch's threads (best of 3 at 1024^3, ~0.1 s)."""
    return measured_cpu_peak(torch.float32)


@lru_cache(maxsize=4)
def measured_cpu_peak(dtype: torch.dtype) -> float:
    """Matmul FLOP/s of this CPU in `dtype` with torch's threads, best of 3: 1024^3 in fp32, 512^3 in
    half precision (which runs up to 190x slower on CPUs without bf16 instructions)."""
    size = 1024 if dtype == torch.float32 else 512
    generator = torch.Generator().manual_seed(0)  # never touch the global RNG: resume must stay exact
    a, b = (torch.randn(size, size, generator=generator).to(dtype) for _ in range(2))
    torch.mm(a, b)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best
