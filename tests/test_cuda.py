"""GPU tests: they run wherever torch sees a CUDA GPU (`make test-gpu` runs only these) and are skipped,
with the reason, everywhere else -- including this project's CI, which has no GPU. They first ran on an
H200 on 2026-11-28 (`make gpu-check`, docs/scaling.md): 15 passed, 8 skipped (flash-attn not installed;
varlen_attn has no ALiBi); the bf16 kernels' largest error there was 0.007 against the 3e-2 tolerance, so
the tolerances below, estimated before any GPU run, hold with room.

What they cover is the code that only runs on a GPU: PyTorch's varlen_attn and flash-attn kernels
against the eager reference, bf16 autocast with those kernels in a training run, exact resume on a
GPU, and NCCL with DDP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT
from helpers.tiny_pretraining import ROOT, final_weights, relative_distance, train, train_losses

from bertforge.cli import main
from bertforge.doctor import CHECK_HEAD_DIM, check_backend
from bertforge.models.attention_backends import LayerNeeds, available_kernels, choose_backend
from bertforge.train.precision import Precision

pytestmark = pytest.mark.cuda

CUDA = ["run.device=cuda"]


def needs_flash_capability() -> None:
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 0):
        pytest.skip(f"FlashAttention kernels need compute capability 8.0+; this GPU has {major}.{minor}")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("backend", ["varlen", "flash", "sdpa"])
@pytest.mark.parametrize("case", ["global", "window", "alibi"])
def test_gpu_attention_backends_match_the_eager_reference(backend: str, case: str, precision: str) -> None:
    """Forward and backward on packed sequences of unequal lengths, against eager attention in fp32."""
    if backend in ("varlen", "flash"):
        needs_flash_capability()
    if backend == "flash":
        pytest.importorskip("flash_attn", reason="flash-attn is optional (pip install 'bertforge[flash]')")
    if backend == "varlen" and case == "alibi":
        pytest.skip("varlen_attn has no ALiBi; `auto` never sends it an ALiBi layer")
    check = check_backend(backend, case, torch.device("cuda"), Precision(precision))
    assert check.ok, f"{backend} {case} {precision}: error {check.max_error:.2e} > {check.tolerance:.0e}"


def test_auto_picks_varlen_on_a_gpu_for_a_layer_without_dropout_or_alibi() -> None:
    needs_flash_capability()
    needs = LayerNeeds("cuda", torch.bfloat16, 0.0, False, None, CHECK_HEAD_DIM)
    assert choose_backend("auto", needs, available_kernels(torch.device("cuda"))).backend == "varlen"


def test_masked_sdpa_on_a_gpu_takes_the_memory_efficient_kernel() -> None:
    """SDPA over rows with a block-diagonal mask and dropout (BERT's layers without flash-attn): left to choose,
    torch 2.11's SDPA on an H200 cost 209 ms a call on a fine-tune's changing batch shapes against 0.64 ms for
    the memory-efficient kernel (benchmarks/attention_dropout_paths.py), so PackedAttention names that kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bertforge.models.attention import PackedAttention

    class AtenOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.names.add(func.__name__)
            return func(*args, **(kwargs or {}))

    lengths = [37, 128, 5, 90]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    query, key, value = (torch.randn(sum(lengths), 4, CHECK_HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                                     requires_grad=True) for _ in range(3))
    with AtenOps() as ops:
        PackedAttention(cu_seqlens, max(lengths), "sdpa").attend(query, key, value, dropout_p=0.1).sum().backward()
    attention_ops = {name for name in ops.names if "scaled_dot_product" in name}
    assert any("efficient_attention" in name for name in attention_ops), attention_ops
    assert not any("cudnn" in name for name in attention_ops), attention_ops


def test_doctor_passes_every_check_on_this_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["-q", "doctor", "--json", "--preset", "bert-mini", "--steps", "3"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"], report
    assert report["machine"]["gpus"] and report["training"]["tokens_per_second"] > 0


def test_bf16_training_on_the_gpu_ends_near_fp32(prepared_corpus: Path, tmp_path: Path) -> None:
    """6 steps of the tiny pre-training model: bf16 autocast (varlen_attn) against fp32 (SDPA) on the GPU.
    Tolerances: estimated at 5x the CPU's measured bf16 differences (tests/test_precision.py)."""
    fp32 = train(prepared_corpus, tmp_path / "fp32", *CUDA, "train.max_steps=6", "train.precision=fp32")
    bf16 = train(prepared_corpus, tmp_path / "bf16", *CUDA, "train.max_steps=6", "train.precision=bf16")
    assert train_losses(bf16) == pytest.approx(train_losses(fp32), rel=1e-2)
    assert relative_distance(final_weights(bf16, 6), final_weights(fp32, 6)) < 5e-2


def test_resume_on_the_gpu_ends_equal_to_the_uninterrupted_run(prepared_corpus: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16, dropout on. With deterministic algorithms bitwise; where a kernel has no deterministic
    version (torch warns, the run goes on) within a stated tolerance instead: 1e-5 relative on the
    losses, 1e-4 on the weights, the size of run-to-run differences of atomic-add reductions."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for determinism
    settings = [*CUDA, "train.precision=bf16", "model.hidden_dropout=0.1", "train.checkpoint_every=3"]
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            uninterrupted = train(prepared_corpus, tmp_path / "uninterrupted", "train.max_steps=6", *settings)
            resumed = tmp_path / "resumed"
            train(prepared_corpus, resumed, "train.max_steps=3", *settings)
            train(prepared_corpus, resumed, "train.max_steps=6", *settings)
    finally:
        torch.use_deterministic_algorithms(previous)
    nondeterministic = [str(w.message) for w in caught if "deterministic" in str(w.message)]
    a, b = final_weights(uninterrupted, 6), final_weights(resumed, 6)
    if not nondeterministic:
        assert train_losses(resumed) == train_losses(uninterrupted)
        for name in a:
            assert torch.equal(a[name], b[name]), name
    else:
        assert train_losses(resumed) == pytest.approx(train_losses(uninterrupted), rel=1e-5), nondeterministic[0]
        assert relative_distance(b, a) < 1e-4, nondeterministic[0]


def test_one_gpu_nccl_ddp_run() -> None:
    worker = ROOT / "tests" / "helpers" / "nccl_ddp_worker.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                           str(worker)], cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert result["backend"] == "nccl" and result["world_size"] == 1 and result["all_reduce"] == 1.0
    # one rank averages with nobody: equal but for the GPU kernels' own run-to-run differences (atomic
    # adds in attention backward), hence a tolerance rather than bitwise
    assert result["ddp"] == pytest.approx(result["plain"], rel=1e-4)
