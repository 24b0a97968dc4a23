"""Learning-rate schedules and optimizers."""

from __future__ import annotations

import pytest
import torch

from bertforge.config import OptimSection, ScheduleSection
from bertforge.train.optim import Lamb, build_optimizer, default_parameter_groups, lr_factor
from bertforge.train.stable_adamw import StableAdamW


def factors(name: str, total: int = 100, **fields: float) -> list[float]:
    section = ScheduleSection(name=name, **fields)
    return [lr_factor(section, step=step, total_steps=total) for step in range(total)]


def test_warmup_is_linear_and_given_in_steps_or_as_a_fraction() -> None:
    in_steps = factors("constant", warmup=10)
    as_fraction = factors("constant", warmup=0.1)
    assert in_steps == pytest.approx(as_fraction)
    assert in_steps[0] == pytest.approx(1 / 11) and in_steps[9] == pytest.approx(10 / 11)
    assert in_steps[10:] == pytest.approx([1.0] * 90)


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_decaying_schedules_peak_after_warmup_and_end_near_the_floor(name: str) -> None:
    values = factors(name, warmup=0.1, min_lr_ratio=0.1)
    assert max(values) == pytest.approx(values[10])
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))
    assert values[-1] == pytest.approx(0.1, abs=0.02)


def test_inverse_sqrt_decays_as_one_over_root_step() -> None:
    values = factors("inverse_sqrt", total=400, warmup=4)
    assert values[16] == pytest.approx((4 / 16) ** 0.5)
    assert values[100] == pytest.approx((4 / 100) ** 0.5)


def test_warmup_stable_decay_holds_then_decays_in_the_last_fraction() -> None:
    values = factors("wsd", warmup=0.1, decay_fraction=0.2)
    assert values[20:80] == pytest.approx([1.0] * 60)
    assert values[90] == pytest.approx(0.5)
    assert values[-1] == pytest.approx(0.05)


def test_step_schedule_multiplies_by_gamma_every_step_size() -> None:
    values = factors("step", warmup=0, step_size=30, gamma=0.5)
    assert values[29] == 1.0 and values[30] == 0.5 and values[60] == 0.25


def test_wall_clock_progress_drives_the_schedule() -> None:
    section = ScheduleSection(name="linear", warmup=0.0)
    assert lr_factor(section, step=3, total_steps=1, progress=0.25) == pytest.approx(0.75)


def test_one_cycle_rises_linearly_to_the_peak_and_falls_linearly_to_the_floor() -> None:
    values = factors("one_cycle", peak_at=0.5, min_lr_ratio=0.1)
    assert values[0] == pytest.approx(1 / 51) and values[49] == pytest.approx(50 / 51)  # no step at lr 0
    assert values[50] == pytest.approx(1.0) and max(values) == values[50]
    assert values[75] == pytest.approx(0.55) and values[99] == pytest.approx(0.1 + 0.9 * 0.02)
    assert factors("one_cycle", peak_at=0.5, min_lr_ratio=0.1, warmup=30) == values  # warmup does not apply: the rise is peak_at


def test_one_cycle_follows_elapsed_time_under_a_wall_clock_budget() -> None:
    section = ScheduleSection(name="one_cycle", peak_at=0.25, min_lr_ratio=0.0)
    by_time = [lr_factor(section, step=1, total_steps=1, progress=p) for p in (0.0, 0.125, 0.25, 0.625, 1.0)]
    assert by_time == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0])


def test_no_weight_decay_on_biases_and_norms() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    decay, no_decay = default_parameter_groups(model, 0.1)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 4])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["adamw", "lamb", "adadelta", "sgd", "stable_adamw"])
def test_every_optimizer_reduces_a_least_squares_loss(name: str) -> None:
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(8, 1))
    inputs, targets = torch.randn(64, 8), torch.randn(64, 1)
    lr = {"adamw": 0.05, "lamb": 0.05, "adadelta": 20.0, "sgd": 0.05, "stable_adamw": 0.05}[name]
    optimizer = build_optimizer(OptimSection(name=name, lr=lr, momentum=0.9), [{"params": [weights],
                                                                                "weight_decay": 0.0}],
                                torch.device("cpu"))
    first = None
    for _ in range(50):
        loss = ((inputs @ weights - targets) ** 2).mean()
        first = first if first is not None else float(loss.detach())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float(loss.detach()) < 0.7 * first


def test_lamb_scales_each_update_by_the_trust_ratio() -> None:
    weights = torch.nn.Parameter(torch.full((4,), 2.0))
    optimizer = Lamb([weights], lr=0.1, betas=(0.9, 0.999), eps=1e-6)
    weights.grad = torch.tensor([1.0, -1.0, 1.0, -1.0])
    optimizer.step()
    # first Adam update is sign(grad); trust ratio ||w|| / ||update|| = 4 / 2 = 2
    assert weights.detach() == pytest.approx(torch.tensor([1.8, 2.2, 1.8, 2.2]), abs=1e-5)


def test_stable_adamw_without_a_gradient_spike_steps_as_adamw() -> None:
    """A steady gradient keeps RMS = sqrt(mean(g^2 / u)) at 1: no clipping, and the debiased moments are Adam's."""
    torch.manual_seed(0)
    start, gradient = torch.randn(6, 3), torch.randn(6, 3)
    stable, reference = (torch.nn.Parameter(start.clone()) for _ in range(2))
    options = {"lr": 0.01, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.1}
    optimizers = [StableAdamW([stable], **options), torch.optim.AdamW([reference], foreach=False, **options)]
    for _ in range(5):
        for parameter, optimizer in zip((stable, reference), optimizers, strict=True):
            parameter.grad = gradient.clone()
            optimizer.step()
    torch.testing.assert_close(stable.detach(), reference.detach(), rtol=1e-5, atol=1e-7)


def test_stable_adamw_divides_a_spiking_tensors_step_by_its_update_rms() -> None:
    """Step 2's gradient is 10x step 1's: computed by hand (in float64) from the paper's algorithm."""
    lr, beta1, beta2, eps, decay = 0.1, 0.9, 0.99, 1e-6, 0.01
    gradients = [torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), torch.tensor([10.0, -20.0, 5.0], dtype=torch.float64)]
    weights = torch.nn.Parameter(torch.tensor([0.3, -0.1, 0.7], dtype=torch.float64))
    expected = weights.detach().clone()
    optimizer = StableAdamW([weights], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay)
    m = v = torch.zeros(3, dtype=torch.float64)
    scales = []
    for t, g in enumerate(gradients, start=1):
        b1 = beta1 * (1 - beta1 ** (t - 1)) / (1 - beta1 ** t)
        b2 = beta2 * (1 - beta2 ** (t - 1)) / (1 - beta2 ** t)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        rms = float((g * g / v).mean().sqrt())
        scales.append(1 / max(1.0, rms))
        expected = expected * (1 - lr * decay) - lr * scales[-1] * m / (v.sqrt() + eps)
        weights.grad = g
        optimizer.step()
    assert scales[0] == pytest.approx(1.0) and scales[1] == pytest.approx((50.75 / 100) ** 0.5, rel=1e-3)
    torch.testing.assert_close(weights.detach(), expected, rtol=1e-12, atol=1e-12)
