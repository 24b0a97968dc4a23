"""Gradient clipping folded into fused AdamW's step (`train/clipping.py`): the same training as
`clip_grad_norm_` followed by the step, on real `torch.optim.AdamW`, and where it is (not) used."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import trainer_tasks

from bertforge.config import load_config
from bertforge.train.clipping import GradientClipping, folds_into
from bertforge.train.optim import Lamb
from bertforge.train.stable_adamw import StableAdamW
from bertforge.train.trainer import Trainer


def train(fold: bool, gradient_scale: float, steps: int = 5, max_norm: float = 1.0) -> tuple[torch.nn.Module, list[float]]:
    """`steps` AdamW steps (fused, weight decay) of a small model on fixed random gradients times `gradient_scale`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
    clipping = GradientClipping(max_norm, fold=fold)
    generator = torch.Generator().manual_seed(1)
    norms = []
    for _ in range(steps):
        for parameter in model.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator) * gradient_scale
        norms.append(float(clipping.clip(model)))
        with clipping.step(optimizer):
            optimizer.step()
        assert not hasattr(optimizer, "grad_scale")  # handed back: a later AMP scaler or step never sees it
        optimizer.zero_grad(set_to_none=True)
    return model, norms


def test_folded_clipping_trains_as_clip_grad_norm_then_the_step() -> None:
    for scale, clipped in ((10.0, True), (0.01, False)):
        folded, folded_norms = train(True, scale)
        plain, plain_norms = train(False, scale)
        assert folded_norms == pytest.approx(plain_norms, rel=1e-6)
        assert all((norm > 1.0) == clipped for norm in plain_norms)
        for a, b in zip(folded.parameters(), plain.parameters(), strict=True):
            if clipped:  # g / (1/c) against g * c: float rounding apart
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            else:  # nothing clipped: the scale is exactly 1, the same bits
                assert torch.equal(a, b)
    # clipping changed the training (else the comparison above proves nothing): the unclipped run differs
    clipped_model, _ = train(True, 10.0)
    model, _ = train(True, 10.0, max_norm=1e9)
    assert not torch.allclose(next(model.parameters()), next(clipped_model.parameters()), rtol=1e-4, atol=1e-6)


def test_the_scale_is_taken_back_when_the_step_fails() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    clipping = GradientClipping(1.0, fold=True)
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, 5.0)
    clipping.clip(model)
    with pytest.raises(RuntimeError, match="boom"), clipping.step(optimizer):
        raise RuntimeError("boom")
    assert not hasattr(optimizer, "grad_scale")


def test_only_fused_adamw_without_an_amp_scaler_or_sharding_folds() -> None:
    parameters = list(torch.nn.Linear(4, 2).parameters())
    fused = torch.optim.AdamW(parameters, fused=True)
    assert folds_into(fused, amp_scaler=False, sharded=False)
    assert not folds_into(fused, amp_scaler=True, sharded=False)  # GradScaler owns grad_scale
    assert not folds_into(fused, amp_scaler=False, sharded=True)  # FSDP's norm is a DTensor
    for other in (torch.optim.AdamW(parameters, foreach=True), torch.optim.SGD(parameters, lr=0.1),
                  Lamb(parameters, lr=1e-3), StableAdamW(parameters, lr=1e-3)):
        assert not folds_into(other, amp_scaler=False, sharded=False)


def test_a_cpu_run_with_adamw_folds_its_clipping_and_logs_the_norm(tmp_path: Path) -> None:
    config = load_config(None, ["optim.name=adamw", "optim.clip_grad_norm=0.001", "train.max_steps=3",
                                "train.micro_batch_size=32", "train.global_batch_size=32", "train.log_every=1",
                                "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false",
                                f"run.output_dir={tmp_path}", "run.name=folded"])
    trainer = Trainer(config, trainer_tasks.NoDropout(config))
    result = trainer.fit()
    assert trainer.clipping is not None and trainer.clipping.fold
    assert result.state.step == 3
    assert "grad_norm" in (result.run_dir / "metrics.jsonl").read_text()
