"""Fixed start-up costs of training processes: a `finetune` run that does not compile never imports `torch._dynamo`
(about 1.4 s of CPU in every such process), the optimizers that avoid it step and save exactly as torch's do, and
fine-tuning from a pre-trained MLM directory does not import a `transformers` modeling module.

Checked by what a fresh interpreter has imported (`sys.modules`), not by time.
"""

from __future__ import annotations

import copy
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from helpers.finetuning import QUIET_RUN, TINY_MODEL, minilm_dir, supersense_files
from helpers.models import tiny_config
from safetensors.torch import load_file

from bertforge.config import OptimSection
from bertforge.models import BertforgeForPreTraining
from bertforge.models.hf import export_hf
from bertforge.models.loading import load_for_task
from bertforge.train.optim import build_optimizer, default_parameter_groups, optimizer_class_and_options

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS = ["adamw", "sgd", "adadelta", "lamb", "stable_adamw"]
CPU = torch.device("cpu")


def train_three_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    torch.manual_seed(1)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(5, 8)).square().mean().backward()
        optimizer.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_eager_optimizer_steps_saves_and_resumes_exactly_as_torchs_class(name: str) -> None:
    section = OptimSection(name=name, lr=1e-2, momentum=0.9)
    torch.manual_seed(0)
    reference_model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.LayerNorm(6), torch.nn.Linear(6, 3))
    eager_model = copy.deepcopy(reference_model)
    reference = build_optimizer(section, default_parameter_groups(reference_model, 0.01), CPU, compiled=True)
    eager = build_optimizer(section, default_parameter_groups(eager_model, 0.01), CPU)
    torch_class, _ = optimizer_class_and_options(section, CPU)
    assert type(reference) is torch_class  # a compiling run keeps torch's own class
    assert isinstance(eager, torch_class) and type(eager).__name__ == torch_class.__name__
    # GradScaler reads step's parameters (its `grad_scaler` keyword) through the wrappers
    assert inspect.signature(eager.step) == inspect.signature(reference.step)
    train_three_steps(reference_model, reference)
    train_three_steps(eager_model, eager)
    for expected, got in zip(reference_model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(expected, got)
        assert got.grad_fn is None  # stepped without recording a graph
    saved = eager.state_dict()
    assert str(saved) == str(reference.state_dict())

    resumed = build_optimizer(section, default_parameter_groups(eager_model, 0.01), CPU)
    resumed.load_state_dict(saved)
    train_three_steps(reference_model, reference)
    train_three_steps(eager_model, resumed)
    for expected, got in zip(reference_model.parameters(), eager_model.parameters(), strict=True):
        assert torch.equal(expected, got)


def test_step_hooks_still_run_on_the_eager_optimizer() -> None:
    model = torch.nn.Linear(8, 3)
    optimizer = build_optimizer(OptimSection(name="adamw", lr=1e-2), [{"params": list(model.parameters())}], CPU)
    calls: list[str] = []
    optimizer.register_step_pre_hook(lambda *_: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *_: calls.append("post"))
    train_three_steps(model, optimizer)
    assert calls == ["pre", "post"] * 3


def test_training_that_does_not_compile_never_imports_torch_dynamo(tmp_path: Path) -> None:
    """Every optimizer's bookkeeping (step, zero_grad, state_dict, load_state_dict), then `bertforge finetune`
    (checkpoints, best-model reload, test report, export), in one fresh interpreter. Fails when torch moves its dynamo
    guards where the trainer's optimizers no longer avoid them, or when anything else in a training process starts
    importing torch._dynamo. (A resume in the same interpreter would add about 2 s of CPU and no new import path:
    loading the optimizer's state is checked by the loop.)"""
    run = [str(ROOT / "configs/finetune/supersense-tiny.yaml"), "model.init_from=null", f"model.tokenizer={minilm_dir()}",
           f"run.output_dir={tmp_path}", "run.name=tiny", *TINY_MODEL, *QUIET_RUN,
           *supersense_files(tmp_path / "data", train=64, validation=32, test=32), "finetune.max_length=32",
           "train.micro_batch_size=16", "train.global_batch_size=16", "train.eval_every=1", "train.checkpoint_every=1"]
    probe = (
        "import json, sys, torch\n"
        "from bertforge.cli import main\n"
        "from bertforge.config import OptimSection\n"
        "from bertforge.train.optim import build_optimizer\n"
        f"for name in {OPTIMIZERS!r}:\n"
        "    model = torch.nn.Linear(4, 2)\n"
        "    optimizer = build_optimizer(OptimSection(name=name, lr=1e-2), [{'params': list(model.parameters())}],\n"
        "                                torch.device('cpu'))\n"
        "    optimizer.zero_grad(); model(torch.ones(1, 4)).sum().backward(); optimizer.step()\n"
        "    optimizer.load_state_dict(optimizer.state_dict())\n"
        f"code = main(['finetune', *{run!r}, 'train.max_steps=2', '-q'])\n"
        "print(json.dumps([code, sorted(name for name in sys.modules if name.startswith('torch._dynamo'))]))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    code, dynamo_modules = json.loads(result.stdout.strip().splitlines()[-1])
    assert code == 0, result.stderr[-3000:]
    assert (tmp_path / "tiny/final/config.json").is_file() and (tmp_path / "tiny/test_results.json").is_file()
    assert dynamo_modules == []


def test_a_pretrained_mlm_export_loads_for_fine_tuning_without_transformers_from_pretrained(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pre-training run's final/ holds BERT's MLM bias once (`cls.predictions.bias`, as `save_pretrained` writes
    it); fine-tuning from it reads the file directly instead of falling back to `from_pretrained`, whose modeling
    module (and torch._dynamo) cost about 2.4 s of CPU in every such fine-tuning process."""
    torch.manual_seed(0)
    pretrained = BertforgeForPreTraining(tiny_config())
    directory = export_hf(pretrained, None, tmp_path / "mlm").directory
    assert "cls.predictions.bias" in load_file(str(directory / "model.safetensors"))
    assert "cls.predictions.decoder.bias" not in load_file(str(directory / "model.safetensors"))
    hf_class = json.loads((directory / "config.json").read_text())["architectures"][0]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"{hf_class}.from_pretrained was called")

    monkeypatch.setattr(getattr(transformers, hf_class), "from_pretrained", refuse)
    expected = pretrained.state_dict()
    reloaded = load_for_task(directory, "pretraining").state_dict()
    assert all(torch.equal(reloaded[key], expected[key]) for key in expected)  # the MLM bias included
    classifier = load_for_task(directory, "classification", num_labels=3).state_dict()
    assert all(torch.equal(classifier[key], expected[key]) for key in expected if key.startswith("encoder."))
