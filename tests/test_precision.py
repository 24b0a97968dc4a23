"""Every precision runs in the CPU tests and is checked against fp32: bf16 autocast, fp16 + GradScaler,
and FSDP2's mixed-precision policy on 2 CPU ranks.

CPU autocast takes the same code path as on a GPU (`train/precision.py`), only slower, so a tiny
pre-training model (2 layers × 32 wide, dropout off) trained 6 steps under each precision must
end near the fp32 run. Measured on the 2-core EPYC: the largest per-step loss difference was
7.9e-6 relative (bf16) and 1.2e-6 (fp16); the final weights' distance relative to the fp32
weights' norm 1.5e-3 (bf16) and 3.9e-4 (fp16). The tolerances below leave room for other CPUs' kernels.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import HANG_TIMEOUT
from helpers.tiny_pretraining import (
    ROOT,
    final_weights,
    relative_distance,
    train,
    train_losses,
    train_on_two_ranks,
)

from bertforge.train.state_files import load_state

LOSS_RTOL = 2e-3  # per-step training loss, relative to the fp32 run's
# all final weights as one vector: ||half - fp32|| / ||fp32||. Not element-wise nor per tensor: Adam
# moves every weight by ~lr = 3e-3 a step whatever its gradient's size, so a weight with a near-zero
# gradient (a bias that started at 0) can flip direction under bf16 rounding and differ by a few lr
# while the model as a whole agrees closely.
WEIGHT_RTOL = 1e-2


@pytest.fixture(scope="module")
def fp32_run(prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(prepared_corpus, tmp_path_factory.mktemp("precision") / "fp32", "train.max_steps=6",
                 "train.precision=fp32")


FP16_CHECKPOINTED = ["train.precision=fp16", "train.checkpoint_every=3"]


@pytest.fixture(scope="module")
def fp16_run(prepared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """6 fp16 steps, checkpointed at step 3: the half-precision test's fp16 run and the resume test's uninterrupted
    reference (on this CPU fp16 matmuls are slow; one run serves both)."""
    return train(prepared_corpus, tmp_path_factory.mktemp("precision") / "fp16", "train.max_steps=6",
                 *FP16_CHECKPOINTED)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_training_on_cpu_ends_within_tolerance_of_fp32(precision: str, fp32_run: Path,
                                                                      prepared_corpus: Path, tmp_path: Path,
                                                                      request: pytest.FixtureRequest) -> None:
    run_dir = request.getfixturevalue("fp16_run") if precision == "fp16" else \
        train(prepared_corpus, tmp_path / precision, "train.max_steps=6", f"train.precision={precision}")
    reference, losses = train_losses(fp32_run), train_losses(run_dir)
    assert len(losses) == len(reference) == 6
    assert losses == pytest.approx(reference, rel=LOSS_RTOL)
    assert losses != reference  # autocast really ran in half precision
    assert relative_distance(final_weights(run_dir, 6), final_weights(fp32_run, 6)) < WEIGHT_RTOL


def test_fp16_resume_restores_the_grad_scaler_and_ends_bitwise_equal(fp16_run: Path, prepared_corpus: Path,
                                                                    tmp_path: Path) -> None:
    """The scaler's scale and growth tracker continue from the checkpoint, as the weights do."""
    uninterrupted = fp16_run
    resumed = tmp_path / "resumed"
    train(prepared_corpus, resumed, "train.max_steps=3", *FP16_CHECKPOINTED)
    train(prepared_corpus, resumed, "train.max_steps=6", *FP16_CHECKPOINTED)  # run.resume=auto: from step 3
    scaler_file = Path("checkpoints") / "step-00000006" / "scaler.safetensors"
    expected, restored = (load_state(run / scaler_file) for run in (uninterrupted, resumed))
    assert restored == expected and restored["_growth_tracker"] == 6  # a fresh scaler would count 3
    a, b = final_weights(uninterrupted, 6), final_weights(resumed, 6)
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.distributed
def test_fsdp2_bf16_mixed_precision_on_two_cpu_ranks_ends_within_tolerance_of_fp32(fp32_run: Path,
                                                                                   prepared_corpus: Path,
                                                                                   tmp_path: Path) -> None:
    """FSDP2's policy (bf16 parameters in compute, fp32 gradient reduction) with bf16 autocast, 2 ranks,
    the same global batch: the unpadded encoder's index_add_, masks and losses meet bf16 parameters.
    Measured: 3.7e-5 relative on the losses, 2.0e-3 on the weights."""
    run_dir = train_on_two_ranks(prepared_corpus, tmp_path / "fsdp-bf16", "train.max_steps=6",
                                 "train.precision=bf16", "dist.strategy=fsdp")
    reference, losses = train_losses(fp32_run), train_losses(run_dir)
    assert len(losses) == 6
    assert losses == pytest.approx(reference, rel=LOSS_RTOL)
    assert losses != reference
    weights = final_weights(run_dir, 6)
    assert {weight.dtype for weight in weights.values()} == {torch.float32}  # the sharded master weights stay fp32
    assert relative_distance(weights, final_weights(fp32_run, 6)) < WEIGHT_RTOL


@pytest.mark.distributed
def test_fsdp2_policy_computes_in_half_precision_and_an_overflow_on_one_shard_skips_the_step_on_every_rank() -> None:
    """`parallelize`'s FSDP2 policy under fp16; the GradScaler's inf check agreed across sharded gradients."""
    worker = ROOT / "tests" / "helpers" / "fsdp_precision_worker.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(worker)], cwd=ROOT, env=os.environ | {"OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=HANG_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    # two ranks print to one pipe: their reports may share a line, so take each flat JSON object wherever it is
    ranks = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", done.stdout)]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1]
    for rank in ranks:
        assert rank["compute_dtype"] == "torch.float16" and rank["param_dtype"] == "torch.float32"
        assert rank["moved"] is False  # rank 0's own shard was finite, yet it skipped the step too
        assert rank["scale"] == 2.0**15  # backed off once from 2**16, alike on both ranks
