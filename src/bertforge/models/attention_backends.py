"""Which attention kernel runs a layer, and the exact arguments each GPU kernel is called with.

Both are pure functions of plain values, so every branch is tested on a CPU-only machine; the
GPU-only code left is the two kernel calls in `models/attention.py`.

The order of preference on a CUDA GPU:

1. `varlen`: PyTorch's own `torch.nn.attention.varlen.varlen_attn` (FlashAttention 2 inside
   PyTorch, no extra package): packed `[tokens, heads, head_dim]` input and int32 `cu_seqlens`,
   exactly our layout — no rows, no masks. It has sliding windows but no dropout and no ALiBi.
2. `flash`: the optional flash-attn package's `flash_attn_varlen_func`, the same kernel family
   with attention dropout and ALiBi slopes: used when a layer needs one of those.
3. `sdpa`: PyTorch SDPA over rows with block-diagonal masks; the CPU path and the GPU fallback.

Both FlashAttention kernels need fp16/bf16 tensors, an Ampere-or-newer GPU (compute capability
8.0+) and a head size that is a multiple of 8 up to 256.
"""

from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from bertforge.errors import BertforgeError

HALF_DTYPES = (torch.float16, torch.bfloat16)
FLASH_MIN_CAPABILITY = (8, 0)
FLASH_MAX_HEAD_DIM = 256

# flash-attn 2.6+'s documented signature (flash_attn/flash_attn_interface.py), written down so the
# call's arguments are checked by binding to it on machines without the package.
FLASH_ATTN_VARLEN_SIGNATURE = inspect.Signature([
    inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
    for name, default in (
        ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
        ("cu_seqlens_q", inspect.Parameter.empty), ("cu_seqlens_k", inspect.Parameter.empty),
        ("max_seqlen_q", inspect.Parameter.empty), ("max_seqlen_k", inspect.Parameter.empty),
        ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
        ("block_table", None),
    )
])


@dataclass(frozen=True)
class AvailableKernels:
    """What this machine offers: found once per device by `available_kernels`."""

    torch_varlen: bool  # torch has torch.nn.attention.varlen (2.10+)
    flash_attn: bool  # the flash-attn package is importable
    gpu_capability: tuple[int, int] | None  # CUDA compute capability of the device; None on a CPU


@dataclass(frozen=True)
class LayerNeeds:
    """What one attention call asks of a kernel."""

    device_type: str  # "cuda" | "cpu" | ...
    dtype: torch.dtype  # of the query (autocast's dtype under mixed precision)
    dropout_p: float  # attention dropout of this call (0 in eval mode)
    alibi: bool  # ALiBi distance bias
    window: int | None  # keys at most this many positions away on each side; None = whole sequence
    head_dim: int
    bias: bool = False  # a learned additive bias on the scores (MPNet's relative positions)


@dataclass(frozen=True)
class BackendChoice:
    backend: str  # varlen | flash | sdpa | eager
    reason: str  # one line: why this backend, and for a fallback what would enable the preferred one
    fallback: bool = False  # `auto` on a GPU could not use PyTorch's varlen kernel: logged once


def available_kernels(device: torch.device) -> AvailableKernels:
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    return AvailableKernels(torch_varlen=importlib.util.find_spec("torch.nn.attention.varlen") is not None,
                            flash_attn=importlib.util.find_spec("flash_attn") is not None,
                            gpu_capability=capability)


def _flash_kernel_problem(needs: LayerNeeds, kernels: AvailableKernels) -> str | None:
    """Why neither FlashAttention kernel can run this call here, or None if they can."""
    if needs.device_type != "cuda":
        return f"FlashAttention kernels are CUDA-only (this is a {needs.device_type} device)"
    if kernels.gpu_capability is not None and kernels.gpu_capability < FLASH_MIN_CAPABILITY:
        major, minor = kernels.gpu_capability
        return f"FlashAttention needs compute capability 8.0+ (Ampere or newer); this GPU has {major}.{minor}"
    if needs.dtype not in HALF_DTYPES:
        return (f"FlashAttention runs in bf16/fp16 only, the attention inputs are {str(needs.dtype)[6:]} "
                "(set train.precision=bf16)")
    if needs.head_dim % 8 or needs.head_dim > FLASH_MAX_HEAD_DIM:
        return f"FlashAttention needs a head size that is a multiple of 8 up to 256; it is {needs.head_dim}"
    return None


def _varlen_problem(needs: LayerNeeds, kernels: AvailableKernels) -> str | None:
    if not kernels.torch_varlen:
        return f"this torch ({torch.__version__}) has no torch.nn.attention.varlen (2.10+ has it)"
    if needs.alibi:
        return "varlen_attn has no ALiBi bias"
    if needs.bias:
        return "varlen_attn takes no additive attention bias (MPNet's relative position bias)"
    if needs.dropout_p > 0:
        return ("varlen_attn has no attention dropout (model.attention_dropout > 0 while training; "
                "set model.attention_dropout=0 to use it)")
    return _flash_kernel_problem(needs, kernels)


def _flash_attn_problem(needs: LayerNeeds, kernels: AvailableKernels) -> str | None:
    if not kernels.flash_attn:
        return "the flash-attn package is not installed (pip install 'bertforge[flash]')"
    if needs.bias:
        return "flash-attn takes ALiBi slopes but no learned additive bias"
    return _flash_kernel_problem(needs, kernels)


def backend_problem(backend: str, needs: LayerNeeds, kernels: AvailableKernels) -> str | None:
    """Why `backend` cannot run this call here, or None if it can (`bertforge doctor` lists them all)."""
    if backend == "varlen":
        return _varlen_problem(needs, kernels)
    if backend == "flash":
        return _flash_attn_problem(needs, kernels)
    return None  # sdpa and eager run anywhere


def choose_backend(requested: str, needs: LayerNeeds, kernels: AvailableKernels) -> BackendChoice:
    """The backend that runs this call and why; a requested backend that cannot run raises one line."""
    if requested in ("varlen", "flash", "sdpa", "eager"):
        problem = backend_problem(requested, needs, kernels)
        if problem:
            raise BertforgeError(f"model.attention_backend={requested} cannot run here: {problem}; "
                                 "set model.attention_backend=auto")
        return BackendChoice(requested, f"requested (model.attention_backend={requested})")
    if requested != "auto":
        raise BertforgeError(f"model.attention_backend is {requested!r}; expected auto, varlen, flash, sdpa or eager")

    if needs.device_type != "cuda":
        return BackendChoice("sdpa", f"{needs.device_type}: SDPA over rows with block-diagonal masks "
                                     "(the FlashAttention kernels are CUDA-only)")
    varlen_problem = _varlen_problem(needs, kernels)
    if varlen_problem is None:
        return BackendChoice("varlen", "PyTorch's varlen_attn on the packed tokens")
    flash_problem = _flash_attn_problem(needs, kernels)
    if flash_problem is None:
        return BackendChoice("flash", f"flash-attn, because {varlen_problem}", fallback=True)
    problems = varlen_problem if flash_problem == varlen_problem else f"{varlen_problem}, and {flash_problem}"
    return BackendChoice("sdpa", f"SDPA with masks, because {problems}", fallback=True)


def window_size(window: int | None) -> tuple[int, int]:
    """Our symmetric window (keys each side) in FlashAttention's (left, right) form; (-1, -1) = none."""
    return (window, window) if window is not None else (-1, -1)


def varlen_attn_arguments(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                          max_seqlen: int, window: int | None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`varlen_attn(*args, **kwargs)` for packed [tokens, heads, head_dim] self-attention."""
    cu = cu_seqlens.to(torch.int32)
    return ((query, key, value, cu, cu, int(max_seqlen), int(max_seqlen)),
            {"scale": query.shape[-1] ** -0.5, "window_size": window_size(window)})


def flash_attn_arguments(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor,
                         max_seqlen: int, window: int | None, alibi_slopes: torch.Tensor | None,
                         dropout_p: float) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`flash_attn_varlen_func(*args, **kwargs)`; ALiBi slopes go in as fp32 [heads], as flash-attn requires."""
    cu = cu_seqlens.to(torch.int32)
    return ((query, key, value, cu, cu, int(max_seqlen), int(max_seqlen)),
            {"dropout_p": dropout_p, "softmax_scale": query.shape[-1] ** -0.5, "causal": False,
             "window_size": window_size(window),
             "alibi_slopes": alibi_slopes.float() if alibi_slopes is not None else None})
