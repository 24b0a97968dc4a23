"""Pre-training, side by side: bertforge vs Hugging Face `Trainer` + `BertForMaskedLM`, end to end.

The same corpus (the bundled KJV + WordNet text), the same WordPiece tokenizer (8192, trained here),
the same model size, global batch, sequence length (128), optimizer (AdamW, linear schedule with
6% warmup, clipping 1.0), dropout and masking (15%, 80/10/10), trained six ways:

- `HF (a) padded`: `BertForMaskedLM` (SDPA) + `DataCollatorForLanguageModeling` fed as the
  Union/Flyte and Mosaic examples feed it: every corpus line (a verse or a gloss) is one sample,
  tokenized with `padding="max_length", truncation=True, max_length=128`;
- `HF (b) group_texts`: the same model fed as `run_mlm.py` feeds it: every training document
  tokenized, the token stream concatenated and cut into 128-token blocks (`group_texts`, verbatim);
- `HF (c) line by line`: (a)'s samples as `run_mlm.py --line_by_line` feeds them without
  `--pad_to_max_length`: each batch padded to its longest line. The same training distribution as
  (a) (padding is masked out of attention and never chosen for MLM) in a fraction of its time;
- `bertforge`: `bertforge pretrain` on the prepared dataset (sentences of one document packed up
  to 128 tokens), the unpadded encoder and the MLM head on masked positions only;
- `bertforge, (a)'s tokens per step`: the same with the global batch cut to hold as many real
  tokens as (a)'s batch of padded lines (about a quarter). At equal tokens, (a) takes ~4x more
  optimizer steps than the packed arms; this arm takes as many as (a), so its accuracy compares
  the feeds at equal tokens *and* equal updates. Its speed is reported, not the goal's ratio.
- `bertforge, line by line`: (a)'s samples without (a)'s padding — the dataset prepared with
  `--line-by-line` (every line one sample, as `run_mlm.py --line_by_line` and (a) build them), the
  same global batch of 32 lines, so the same real tokens and optimizer steps as (a); the loader
  packs the short lines into full rows and the model attends within each line.

Each arm runs in its own process (a clean peak RSS; `torch.cuda.max_memory_allocated` on a GPU)
until it has seen the same number of real (non-padding) tokens (`--tokens`). Throughput is the
steady state of that run: the wall time between the starts of consecutive optimizer steps (data
loading, forward, backward, optimizer and logging included, the same clock for every arm) after
`--warmup-steps`. Then all final models — bertforge's through its Hugging Face export — are
evaluated by the same code with stock `transformers.BertForMaskedLM` on the same held-out data with
fixed masks: the prepared validation split (packed samples) and its documents' single lines.

    .venv/bin/python benchmarks/pretrain_vs_hf.py            # CPU: bert-mini, 350k tokens per arm
    .venv/bin/python benchmarks/pretrain_vs_hf.py --quick    # a smoke run: bert-tiny, batch 8, 8k tokens
    .venv/bin/python benchmarks/pretrain_vs_hf.py --device cuda   # bf16 autocast, bert-base
    .venv/bin/python benchmarks/pretrain_vs_hf.py --seeds 1,2,3,4 --arms hf-lines,bertforge-lines
                                                                  # a seed study of two arms
    .venv/bin/python benchmarks/pretrain_vs_hf.py --model bert-tiny --batch-size 64 --lr 2e-3 --tokens 3000000 \
        --arms bertforge,hf-group-texts --seeds 1,2,3 --downstream-seeds 3
                      # pre-training's downstream effect: every model fine-tuned by the same code, 3 seeds each

The table goes to stdout and to `benchmarks/results/pretrain_vs_hf.md` (+ `.json`), a seed study's
to `pretrain_vs_hf_seeds.md`; `--quick` writes into the work directory instead, so a smoke run
never replaces a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/pretrain_vs_hf.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.corpora import bundled_documents, document_lines
from benchmarks.common.hf_arms import hf_training_dataset
from benchmarks.common.mlm import (
    DEVICE_DEFAULTS,
    EVALUATION_SEED,
    MASK_PROBABILITY,
    SEQ_LEN,
    VOCAB_SIZE,
    WARMUP_FRACTION,
    line_validation_batches,
    mlm_accuracy,
    packed_validation_batches,
)
from benchmarks.common.reports import machine_description, quiet_progress_bars, run_in_child, write_atomically
from benchmarks.common.tasks import DOWNSTREAM_ROWS, DOWNSTREAM_SEEDS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ARMS = ("hf-padded", "hf-group-texts", "hf-lines", "bertforge", "bertforge-matched", "bertforge-lines")
HF_ARMS = ("hf-padded", "hf-group-texts", "hf-lines")
ARM_TITLES = {"hf-padded": "HF (a) padded", "hf-group-texts": "HF (b) group_texts",
              "hf-lines": "HF (c) line by line", "bertforge": "bertforge",
              "bertforge-matched": "bertforge, (a)'s tokens per step", "bertforge-lines": "bertforge, line by line"}
ARM_FEEDS = {"hf-padded": "each line padded to 128", "hf-group-texts": "128-token blocks of the stream",
             "hf-lines": "each line padded to the longest in its batch",
             "bertforge": "sentence-packed samples, unpadded",
             "bertforge-matched": "the same, fewer samples per step",
             "bertforge-lines": "each line one sample, unpadded"}
TIMING_DEFAULTS = {"warmup_steps": 5, "steps": 20}
QUICK = {"model": "bert-tiny", "batch_size": 8, "tokens": 8_000, "warmup_steps": 2, "steps": 5}


@dataclass
class ArmSpec:
    """Everything an arm's process needs; only `arm`, `out_dir`, `data_dir` and `max_steps` differ between arms."""

    arm: str
    out_dir: str
    device: str
    model: str
    batch_size: int
    tokens: int
    lr: float
    seed: int
    threads: int
    tokenizer_dir: str
    data_dir: str  # the arm's training data: bertforge's prepared dataset, or HF's `save_to_disk` directory
    max_steps: int  # tokens / (mean real tokens per row x batch); every arm also stops once it has seen `tokens`


@dataclass
class ArmResult:
    arm: str
    model_dir: str
    step_begins: list[float]  # perf_counter at the start of every optimizer step
    step_tokens: list[int]  # real tokens of every optimizer step
    computed_positions_per_step: float  # positions the encoder runs on (padded rows count in full)
    peak_memory_bytes: int  # peak RSS of the training process (CPU) or max_memory_allocated (GPU)
    train_seconds: float  # Trainer.fit / Trainer.train (bertforge's includes its set-up, final evaluation, export)
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# shared inputs: the tokenizer, the prepared dataset, the training documents


def prepare_inputs(work: Path) -> tuple[Path, Path, dict[str, Any], Path, dict[str, Any]]:
    """Train the tokenizer and prepare the datasets (packed, line by line) once; reused while the inputs are unchanged."""
    from bertforge.data.bundled import corpus_path
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    tokenizer_dir, data_dir = work / "tokenizer", work / "data-128"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer_from_inputs([str(corpus_path())], tokenizer_dir, vocab_size=VOCAB_SIZE)
    started = time.perf_counter()
    manifest = prepare_pretraining_data([str(corpus_path())], tokenizer_dir, data_dir,
                                        PrepareSettings(seq_len=SEQ_LEN, split=(980.0, 20.0)), workers=2,
                                        progress=False)
    manifest = dict(manifest, prepare_seconds=time.perf_counter() - started)
    lines_dir = work / "data-128-lines"
    lines_manifest = prepare_pretraining_data([str(corpus_path())], tokenizer_dir, lines_dir,
                                              PrepareSettings(seq_len=SEQ_LEN, split=(980.0, 20.0), line_by_line=True),
                                              workers=2, progress=False)
    return tokenizer_dir, data_dir, manifest, lines_dir, lines_manifest


# ---------------------------------------------------------------------------------------------
# one arm, in its own process


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def peak_memory(device: str) -> int:
    """Peak GPU memory allocated, or this process image's peak RSS (VmHWM).

    Not `getrusage().ru_maxrss`: Linux carries the parent's peak over fork + exec into it, so every
    arm would report at least the driver's RSS at the moment it was started.
    """
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated())
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def planned_steps(tokens: int, tokens_per_step: float) -> int:
    return max(1, math.ceil(tokens / tokens_per_step))


def run_bertforge(spec: ArmSpec) -> ArmResult:
    from bertforge.config import load_config
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    class ClockedPretrainTask(PretrainTask):
        """The pre-training task, plus a clock and a token count at the start of every step."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.step_begins: list[float] = []
            self.step_tokens: list[int] = []
            self.peak_bytes = 0

        def forward_step(self, batch: dict[str, Any], model: Any) -> Any:
            synchronize(spec.device)
            self.peak_bytes = peak_memory(spec.device)
            self.step_begins.append(time.perf_counter())
            self.step_tokens.append(self.tokens_in_batch(batch))
            return super().forward_step(batch, model)

    overrides = [
        "run.name=bertforge", f"run.output_dir={spec.out_dir}", f"run.seed={spec.seed}", f"run.device={spec.device}",
        "run.resume=never", f"data.path={spec.data_dir}", f"data.seq_len={SEQ_LEN}",
        f"data.mask_prob={MASK_PROBABILITY}", f"model.preset={spec.model}", "model.hidden_dropout=0.1",
        "model.attention_dropout=0.1", "optim.name=adamw", f"optim.lr={spec.lr}", "optim.weight_decay=0.01",
        "optim.betas=[0.9,0.98]", "optim.eps=1e-6", "optim.clip_grad_norm=1.0", "schedule.name=linear",
        f"schedule.warmup={WARMUP_FRACTION}", f"train.micro_batch_size={spec.batch_size}",
        f"train.global_batch_size={spec.batch_size}", f"train.max_tokens={spec.tokens}",
        f"train.max_steps={spec.max_steps}",
        f"train.precision={'bf16' if spec.device == 'cuda' else 'fp32'}",
        "train.eval_every=1000000000", "train.log_every=10", "log.progress=false", "log.tensorboard=false",
    ]
    config = load_config(None, overrides)
    task = ClockedPretrainTask(config)
    started = time.perf_counter()
    result = Trainer(config, task).fit()
    train_seconds = time.perf_counter() - started
    tokens = task.step_tokens
    own_validation = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
                      if '"validation"' in line]
    return ArmResult(spec.arm, str(result.run_dir / "final"), task.step_begins, tokens, statistics.fmean(tokens),
                     task.peak_bytes, train_seconds, extra={"own_validation": own_validation[-1] if own_validation
                                                            else None})


def save_hf_datasets(work: Path, tokenizer_dir: Path, documents: list[str]) -> dict[str, dict[str, Any]]:
    """Build the HF training sets here and save them (`save_to_disk`) for the arms to memory-map.

    Built in this process, not the arm's, so the tokenization's transient memory stays out of the
    arm's peak RSS, as a dataset cached ahead of training (the Union/Flyte artifact) would.
    """
    import datasets
    from transformers import AutoTokenizer

    datasets.logging.set_verbosity_error()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.model_max_length = 1 << 30  # run_mlm tokenizes whole documents; silence the length warning
    built: dict[str, dict[str, Any]] = {}
    for arm in HF_ARMS:
        started = time.perf_counter()
        dataset = hf_training_dataset(arm, documents, tokenizer)
        target = work / "hf-datasets" / arm
        staging = target.with_name(f".{arm}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        dataset.save_to_disk(str(staging))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        real_tokens = sum(sum(map(sum, batch["attention_mask"])) for batch in dataset.iter(batch_size=8192))
        built[arm] = {"path": target, "rows": len(dataset), "real_tokens_per_row": real_tokens / len(dataset),
                      "build_seconds": time.perf_counter() - started}
    return built


def run_hf(spec: ArmSpec) -> ArmResult:
    import torch
    from datasets import load_from_disk
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from bertforge.models import get_preset

    tokenizer = AutoTokenizer.from_pretrained(spec.tokenizer_dir)
    train = load_from_disk(spec.data_dir)

    class CountingCollator:
        """HF's MLM collator, counting the real tokens and positions of each batch it builds (in step order)."""

        def __init__(self) -> None:
            self.collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=MASK_PROBABILITY)
            self.real_tokens: list[int] = []
            self.positions: list[int] = []

        def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
            batch = self.collator(features)
            self.real_tokens.append(int(batch["attention_mask"].sum()))
            self.positions.append(batch["attention_mask"].numel())
            return batch

    class StepClock(TrainerCallback):
        """Timestamps each optimizer step's start; stops once the token budget is spent."""

        def __init__(self) -> None:
            self.step_begins: list[float] = []
            self.peak_bytes = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            synchronize(spec.device)
            self.peak_bytes = peak_memory(spec.device)
            self.step_begins.append(time.perf_counter())

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if sum(collator.real_tokens[:state.global_step]) >= spec.tokens:
                control.should_training_stop = True

    geometry = get_preset(spec.model)
    torch.manual_seed(spec.seed)
    model = BertForMaskedLM(BertConfig(
        vocab_size=len(tokenizer), hidden_size=geometry.hidden_size, num_hidden_layers=geometry.num_layers,
        num_attention_heads=geometry.num_heads, intermediate_size=geometry.intermediate_size,
        max_position_embeddings=geometry.max_position_embeddings, hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1, pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa"))
    collator, clock = CountingCollator(), StepClock()
    arguments = TrainingArguments(
        output_dir=str(Path(spec.out_dir) / "trainer"), per_device_train_batch_size=spec.batch_size,
        max_steps=spec.max_steps, learning_rate=spec.lr,
        weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-6, max_grad_norm=1.0,
        lr_scheduler_type="linear", warmup_steps=WARMUP_FRACTION, logging_steps=10, save_strategy="no",
        report_to="none", seed=spec.seed, bf16=spec.device == "cuda", use_cpu=spec.device == "cpu",
        disable_tqdm=True)
    trainer = Trainer(model=model, args=arguments, train_dataset=train, data_collator=collator,
                      processing_class=tokenizer, callbacks=[clock])
    started = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - started
    final = Path(spec.out_dir) / "final"
    trainer.save_model(str(final))
    steps = len(clock.step_begins)
    return ArmResult(spec.arm, str(final), clock.step_begins, collator.real_tokens[:steps],
                     statistics.fmean(collator.positions[:steps]), clock.peak_bytes, train_seconds)


def run_arm(spec_path: Path) -> None:
    """The child process: train one arm, write its `ArmResult` next to the spec."""
    import torch

    spec = ArmSpec(**json.loads(spec_path.read_text(encoding="utf-8")))
    quiet_progress_bars()
    if spec.device == "cpu":
        torch.set_num_threads(spec.threads)
    shutil.rmtree(spec.out_dir, ignore_errors=True)  # a fresh run, never a resumed one
    Path(spec.out_dir).mkdir(parents=True)
    result = run_bertforge(spec) if spec.arm.startswith("bertforge") else run_hf(spec)
    write_atomically(spec_path.with_name(f"{spec_path.stem}.result.json"), json.dumps(asdict(result)))


# ---------------------------------------------------------------------------------------------
# evaluation: the same code and the same fixed masks for all the models


# ---------------------------------------------------------------------------------------------
# the report


def steady_state(result: dict[str, Any], warmup_steps: int) -> dict[str, float]:
    """Real tokens/s and step time over the steps after warm-up (the last step has no end mark)."""
    begins, tokens = result["step_begins"], result["step_tokens"]
    intervals = [b - a for a, b in zip(begins[warmup_steps:-1], begins[warmup_steps + 1:], strict=True)]
    timed_tokens = tokens[warmup_steps:len(begins) - 1]
    if not intervals:
        raise SystemExit(f"{result['arm']} ran only {len(begins)} steps: nothing left to time after "
                         f"{warmup_steps} warm-up steps; raise --tokens")
    return {"timed_steps": len(intervals), "tokens_per_s": sum(timed_tokens) / sum(intervals),
            "step_s": statistics.median(intervals), "real_tokens_per_step": statistics.fmean(timed_tokens),
            "steps": len(begins), "tokens_seen": sum(tokens)}


def report_header(report: dict[str, Any], title: str) -> list[str]:
    settings, machine = report["settings"], report["machine"]
    precision = "bf16 autocast" if settings["device"] == "cuda" else "fp32"
    where = machine["gpu"] or f"{machine['cpu']}, {machine['torch_threads']} threads"
    return [
        f"## {title} — {settings['model']}, seq {SEQ_LEN}, global batch {settings['batch_size']}, {precision}",
        "",
        f"- Command: `{report['command']}`",
        f"- Machine: {where}; torch {machine['torch']}, transformers {machine['transformers']}, Python "
        f"{machine['python']}; load average {machine['load_average_start']:.2f} at the start, "
        f"{machine['load_average_end']:.2f} at the end",
        f"- Data: the bundled corpus, {settings['train_documents']:,} training documents "
        f"({report['data']['train_tokens']:,} tokens by bertforge's count), WordPiece {VOCAB_SIZE}; "
        f"{settings['tokens']:,} real tokens per arm; throughput over the steps after "
        f"{settings['warmup_steps']} warm-up steps",
        "",
    ]


def validation_note(report: dict[str, Any]) -> str:
    evaluation, settings = report["evaluation"], report["settings"]
    return (f"Validation: the last {settings['validation_documents']} documents (Megatron split 980,20): "
            f"{evaluation['packed_masked_tokens']:,} masked tokens in {evaluation['packed_samples']:,} packed samples "
            f"and {evaluation['lines_masked_tokens']:,} in {evaluation['lines']:,} single lines; fixed masks; every "
            "model evaluated by the same code with `transformers.BertForMaskedLM` (bertforge's through its HF export).")


def render(report: dict[str, Any]) -> str:
    settings, arms = report["settings"], report["arms"]
    base, matched, lines_arm = arms["bertforge"], arms["bertforge-matched"], arms["bertforge-lines"]
    speed = {name: arm["tokens_per_s"] for name, arm in arms.items()}
    memory_kind = "peak GPU memory (MB)" if settings["device"] == "cuda" else "peak RSS (MB)"
    lines = report_header(report, "Pre-training vs Hugging Face") + [
        f"| arm | feed | steps timed | real tokens/step | positions computed/step | step time (s) "
        f"| real tokens/s | bertforge speed-up | {memory_kind} |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ARMS:
        arm = arms[name]
        # each HF feed against the bertforge arm that sees the same samples
        ours = "bertforge-lines" if name == "hf-lines" else "bertforge"
        lines.append(
            f"| {ARM_TITLES[name]} | {ARM_FEEDS[name]} | {arm['timed_steps']} | {arm['real_tokens_per_step']:,.0f} "
            f"| {arm['computed_positions_per_step']:,.0f} | {arm['step_s']:.3f} | {arm['tokens_per_s']:,.0f} "
            f"| {'—' if name.startswith('bertforge') else f'{speed[ours] / speed[name]:.2f}×'} | "
            f"{arm['peak_memory_bytes'] / 2**20:,.0f} |")
    lines += [
        "",
        f"Real tokens/s, bertforge ÷ (a) = **{speed['bertforge'] / speed['hf-padded']:.2f}×** (goal ≥ 2.5×); "
        f"bertforge ÷ (b) = **{speed['bertforge'] / speed['hf-group-texts']:.2f}×** (goal ≥ 1.3×). With (a)'s "
        f"real tokens per step (global batch {settings['matched_batch_size']}), bertforge runs at "
        f"{speed['bertforge-matched'] / speed['hf-padded']:.2f}× (a); with (a)'s samples (line by line, batch "
        f"{settings['batch_size']}) at {speed['bertforge-lines'] / speed['hf-padded']:.2f}× (a) and "
        f"{speed['bertforge-lines'] / speed['hf-lines']:.2f}× (c), which has the same samples padded per batch.",
        "",
        "| arm | real tokens seen | optimizer steps | training time (s) | MLM accuracy, packed validation "
        "| MLM loss, packed | MLM accuracy, single lines | MLM loss, lines |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ARMS:
        arm = arms[name]
        packed, single = arm["eval_packed"], arm["eval_lines"]
        lines.append(
            f"| {ARM_TITLES[name]} | {arm['tokens_seen']:,} | {arm['steps']} | {arm['train_seconds']:.0f} "
            f"| {packed['accuracy']:.4f} | {packed['loss']:.3f} | {single['accuracy']:.4f} | {single['loss']:.3f} |")
    accuracy = {name: arms[name]["eval_packed"]["accuracy"] for name in ARMS}
    lines += [
        "",
        f"MLM accuracy (packed validation) at equal tokens, the same global batch of {settings['batch_size']} "
        f"sequences: bertforge {accuracy['bertforge']:.4f}, (a) {accuracy['hf-padded']:.4f}, (b) "
        f"{accuracy['hf-group-texts']:.4f}. At equal tokens and equal optimizer steps (bertforge's batch sized to "
        f"(a)'s real tokens per step, {matched['steps']} vs {arms['hf-padded']['steps']} steps): bertforge "
        f"{accuracy['bertforge-matched']:.4f} vs (a) {accuracy['hf-padded']:.4f}. With (a)'s samples (line by line, "
        f"{lines_arm['steps']} steps): bertforge {accuracy['bertforge-lines']:.4f} vs (a) "
        f"{accuracy['hf-padded']:.4f} and (c) {accuracy['hf-lines']:.4f}. One seed each: see the seed study "
        "(`--seeds`) before reading a difference here.",
        "",
        validation_note(report),
    ]
    own = base["extra"].get("own_validation")
    if own:
        lines.append(f"bertforge's own end-of-run evaluation (its unpadded model, the same masks): MLM accuracy "
                     f"{own['mlm_accuracy']:.4f}, loss {own['mlm_loss']:.3f} — a check on the export.")
    return "\n".join(lines) + "\n"


def render_seed_study(report: dict[str, Any], arm_names: list[str]) -> str:
    """Accuracy and loss at equal tokens per arm over the seeds; Welch's t-test when two arms are compared."""
    from scipy import stats

    runs, seeds = report["runs"], report["settings"]["seeds"]
    lines = report_header(report, "Pre-training vs Hugging Face, seed study") + [
        "| arm | " + " | ".join(f"seed {seed}: accuracy / loss" for seed in seeds)
        + " | mean accuracy | mean loss | real tokens/s (mean) |",
        "|---|" + "---:|" * (len(seeds) + 3),
    ]
    per_arm: dict[str, dict[str, list[float]]] = {}
    for name in arm_names:
        arm_runs = [run for run in runs if run["arm"] == name]
        values = per_arm[name] = {"accuracy": [run["eval_packed"]["accuracy"] for run in arm_runs],
                                  "loss": [run["eval_packed"]["loss"] for run in arm_runs],
                                  "speed": [run["tokens_per_s"] for run in arm_runs]}
        spread = {key: f" ± {statistics.stdev(v):.4f}" if len(v) > 1 else "" for key, v in values.items()}
        lines.append(f"| {ARM_TITLES[name]} | "
                     + " | ".join(f"{a:.4f} / {loss:.3f}" for a, loss in zip(values["accuracy"], values["loss"],
                                                                             strict=True))
                     + f" | {statistics.fmean(values['accuracy']):.4f}{spread['accuracy']} "
                     f"| {statistics.fmean(values['loss']):.3f}{spread['loss']} "
                     f"| {statistics.fmean(values['speed']):,.0f} |")
    lines.append("")
    if len(arm_names) == 2 and len(seeds) > 1:
        first, second = (per_arm[name] for name in arm_names)
        for metric in ("accuracy", "loss"):
            test = stats.ttest_ind(first[metric], second[metric], equal_var=False)
            lines.append(f"- {metric}: {ARM_TITLES[arm_names[0]]} − {ARM_TITLES[arm_names[1]]} = "
                         f"{statistics.fmean(first[metric]) - statistics.fmean(second[metric]):+.4f} "
                         f"(Welch t = {test.statistic:.2f}, p = {test.pvalue:.2f})")
        lines.append("")
    lines.append("MLM accuracy and loss on the packed validation split. " + validation_note(report))
    return "\n".join(lines) + "\n"


def fine_tune_accuracy(model_dir: str, name: str, seed: int, work: Path, threads: int) -> float:
    """Test accuracy of `model_dir` fine-tuned on WordNet supersense: the quickstart's fine-tuning recipe, one code
    path for every arm (a fresh pooler and classifier on each: neither MLM model has a pooler)."""
    import torch

    from bertforge.config import finetune_defaults, load_config
    from bertforge.data.bundled import supersense_labels, supersense_lines
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer

    torch.set_num_threads(threads)
    files = {}
    for split, rows in DOWNSTREAM_ROWS.items():
        files[split] = work / "downstream" / f"supersense-{split}-{rows}.jsonl"
        if not files[split].is_file():
            write_atomically(files[split], "".join(supersense_lines(split, rows)))
    recipe = REPO / "src" / "bertforge" / "recipes" / "quickstart-finetune-tiny.yaml"
    run_name = f"{name}-ft{seed}"
    config = load_config(recipe, [
        f"run.output_dir={work / 'downstream'}", f"run.name={run_name}", f"run.seed={seed}", "run.device=cpu",
        "run.resume=never", f"model.init_from={model_dir}", f"finetune.train_file={files['train']}",
        f"finetune.test_file={files['test']}", f"finetune.labels=[{','.join(supersense_labels())}]",
        "train.best_metric=null", "log.progress=false", "log.tensorboard=false"], base=finetune_defaults())
    shutil.rmtree(work / "downstream" / run_name, ignore_errors=True)  # a re-run of the study starts afresh
    result = Trainer(config, ClassificationTask(config)).fit()
    return json.loads((result.run_dir / "test_results.json").read_text())["metrics"]["accuracy"]


def render_downstream(report: dict[str, Any], arm_names: list[str]) -> str:
    """Fine-tuned test accuracy of every arm's model, mean ± std over pre-training and fine-tuning seeds."""
    from scipy import stats

    lines = report_header(report, "Pre-training vs Hugging Face: the downstream effect") + [
        f"Each pre-trained model fine-tuned by the same bertforge code (the quickstart's recipe: "
        f"`recipes/quickstart-finetune-tiny.yaml`, {DOWNSTREAM_ROWS['train']:,} train / {DOWNSTREAM_ROWS['test']:,} "
        f"test supersense glosses, 3 epochs) with {report['settings']['downstream_seeds']} fine-tuning seed(s).", "",
        "| arm | pre-training seed | MLM accuracy (packed validation) | fine-tuned test accuracy per seed | mean ± std |",
        "|---|---:|---:|---|---:|"]
    per_arm: dict[str, list[float]] = {name: [] for name in arm_names}
    for run in report["runs"]:
        accuracies = run["downstream"]
        per_arm[run["arm"]] += accuracies
        spread = f" ± {100 * statistics.stdev(accuracies):.2f}" if len(accuracies) > 1 else ""
        lines.append(f"| {ARM_TITLES[run['arm']]} | {run['seed']} | {run['eval_packed']['accuracy']:.4f} | "
                     + ", ".join(f"{100 * a:.2f}" for a in accuracies)
                     + f" | {100 * statistics.fmean(accuracies):.2f}{spread} |")
    lines.append("")
    for name, values in per_arm.items():
        spread = f" ± {100 * statistics.stdev(values):.2f}" if len(values) > 1 else ""
        lines.append(f"- {ARM_TITLES[name]}: {100 * statistics.fmean(values):.2f}{spread} over {len(values)} runs")
    if len(arm_names) == 2 and all(len(v) > 1 for v in per_arm.values()):
        first, second = (per_arm[name] for name in arm_names)
        test = stats.ttest_ind(first, second, equal_var=False)
        lines.append(f"- {ARM_TITLES[arm_names[0]]} − {ARM_TITLES[arm_names[1]]} = "
                     f"{100 * (statistics.fmean(first) - statistics.fmean(second)):+.2f} points "
                     f"(Welch t = {test.statistic:.2f}, p = {test.pvalue:.2f})")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the driver


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="bert-tiny, batch 8, 8k tokens per arm: a smoke run")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--model", default=None,
                        help="a classic BERT preset: bert-tiny | bert-mini | bert-small | bert-base | bert-large "
                             "(default: bert-mini on CPU, bert-base on a GPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="global batch in sequences (CPU 32, GPU 256)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="real tokens each arm trains on (CPU 350,000, GPU 10,000,000)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (CPU 1e-3, GPU 2e-4)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="steps left out of the throughput (5)")
    parser.add_argument("--steps", type=int, default=None,
                        help="the least number of steady-state steps every arm must time, checked up front (20)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads per arm")
    parser.add_argument("--seeds", default="42",
                        help="training seeds, comma-separated (default 42); with several, or with --arms, the "
                             "report is the seed study: MLM accuracy and loss per arm and seed, mean ± std")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"the arms to train (default all: {','.join(ARMS)})")
    parser.add_argument("--work-dir", default=str(REPO / "runs" / "benchmarks" / "pretrain_vs_hf"),
                        help="tokenizer, prepared data and the runs (reused: the data is prepared once)")
    parser.add_argument("--downstream-seeds", type=int, default=0,
                        help="also fine-tune every trained model on WordNet supersense with the same bertforge code, "
                             "this many seeds each, and report test accuracy per arm (pre-training's downstream "
                             "effect); the report then goes to pretrain_vs_hf_downstream.md")
    parser.add_argument("--run-arm", default=None, help=argparse.SUPPRESS)  # internal: the child process
    arguments = parser.parse_args()
    if arguments.run_arm is None:
        arguments.seeds = [int(seed) for seed in arguments.seeds.split(",")]
        arguments.arms = [arm.strip() for arm in arguments.arms.split(",")]
        unknown = sorted(set(arguments.arms) - set(ARMS))
        if unknown:
            parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
        import torch

        if arguments.device == "auto":
            arguments.device = "cuda" if torch.cuda.is_available() else "cpu"
        defaults = DEVICE_DEFAULTS[arguments.device] | TIMING_DEFAULTS | (QUICK if arguments.quick else {})
        for key, value in defaults.items():
            if getattr(arguments, key) is None:
                setattr(arguments, key, value)
    return arguments


def check_budget(arguments: argparse.Namespace) -> None:
    """Every arm must run warm-up + `--steps` + 1 steps; (b), with rows of 128 real tokens, runs the fewest."""
    fewest = planned_steps(arguments.tokens, SEQ_LEN * arguments.batch_size)
    needed = arguments.warmup_steps + arguments.steps + 1
    if fewest < needed:
        raise SystemExit(f"--tokens {arguments.tokens:,} gives the group_texts arm only {fewest} steps of "
                         f"{arguments.batch_size}x{SEQ_LEN} tokens; every arm needs {needed} "
                         "(--warmup-steps + --steps + 1): raise --tokens or lower --steps")


def train_arm(arm: str, seed: int, spec_values: dict[str, Any], work: Path) -> dict[str, Any]:
    """Train one arm in a child process (its own peak RSS) and return its `ArmResult` as a dict."""
    from bertforge.console import console

    spec = ArmSpec(arm=arm, seed=seed, out_dir=str(work / "runs" / f"seed-{seed}" / arm), **spec_values)
    spec_path = work / "specs" / f"seed-{seed}-{arm}.json"
    write_atomically(spec_path, json.dumps(asdict(spec), indent=1))
    console.print(f"[bold]{ARM_TITLES[arm]}[/bold] (seed {seed}): training {spec.model} on {spec.tokens:,} tokens")
    result_path = spec_path.with_name(f"{spec_path.stem}.result.json")
    result_path.unlink(missing_ok=True)
    run_in_child(Path(__file__), spec_path, f"the {ARM_TITLES[arm]} arm")
    return json.loads(result_path.read_text(encoding="utf-8"))


def main() -> None:
    arguments = parse_arguments()
    if arguments.run_arm is not None:
        run_arm(Path(arguments.run_arm))
        return
    from bertforge.console import console

    check_budget(arguments)
    work = Path(arguments.work_dir).resolve()
    command = shlex.join(["python", *sys.argv])
    machine = machine_description(arguments.device)
    tokenizer_dir, data_dir, manifest, lines_dir, lines_manifest = prepare_inputs(work)
    documents = bundled_documents()
    train_documents = manifest["splits"]["train"]["documents"]
    validation_documents = manifest["splits"]["validation"]["documents"]
    validation_lines = document_lines(documents[train_documents:train_documents + validation_documents])
    quiet_progress_bars()
    console.print("building the Hugging Face training sets (datasets.map, then save_to_disk)")
    hf_data = save_hf_datasets(work, tokenizer_dir, documents[:train_documents])
    train_split = manifest["splits"]["train"]
    training_data = {arm: (hf_data[arm]["path"], hf_data[arm]["real_tokens_per_row"]) for arm in hf_data} | {
        "bertforge": (data_dir, train_split["tokens"] / train_split["samples"])}

    training_data["bertforge-matched"] = training_data["bertforge"]
    lines_split = lines_manifest["splits"]["train"]
    training_data["bertforge-lines"] = (lines_dir, lines_split["tokens"] / lines_split["samples"])
    # (a)'s 32 padded lines hold ~4x fewer real tokens than 32 packed samples, so at equal tokens it
    # takes ~4x more optimizer steps. This arm gives bertforge (a)'s real tokens per step (and so
    # its number of steps), to compare accuracy at equal tokens *and* equal updates.
    batch_sizes = {arm: arguments.batch_size for arm in ARMS} | {"bertforge-matched": max(1, round(
        arguments.batch_size * training_data["hf-padded"][1] / training_data["bertforge"][1]))}
    results: dict[tuple[int, str], dict[str, Any]] = {}
    for seed in arguments.seeds:
        for arm in arguments.arms:
            arm_data, real_tokens_per_row = training_data[arm]
            results[seed, arm] = train_arm(arm, seed, {
                "device": arguments.device, "model": arguments.model, "batch_size": batch_sizes[arm],
                "tokens": arguments.tokens, "lr": arguments.lr, "threads": arguments.threads,
                "tokenizer_dir": str(tokenizer_dir), "data_dir": str(arm_data),
                "max_steps": planned_steps(arguments.tokens, real_tokens_per_row * batch_sizes[arm])}, work)
    machine["load_average_end"] = os.getloadavg()[0]

    import torch

    if arguments.device == "cpu":
        torch.set_num_threads(arguments.threads)
    packed = packed_validation_batches(data_dir, EVALUATION_SEED)
    single = line_validation_batches(tokenizer_dir, validation_lines, EVALUATION_SEED)
    runs = {}
    for (seed, arm), result in results.items():
        runs[seed, arm] = steady_state(result, arguments.warmup_steps) | {
            key: result[key] for key in ("computed_positions_per_step", "peak_memory_bytes", "train_seconds",
                                         "extra")} | {
            "eval_packed": mlm_accuracy(result["model_dir"], packed, arguments.device),
            "eval_lines": mlm_accuracy(result["model_dir"], single, arguments.device)}
    for (seed, arm), result in results.items():
        runs[seed, arm]["downstream"] = [fine_tune_accuracy(result["model_dir"], f"{arm}-seed{seed}", fine_tune_seed,
                                                            work, arguments.threads)
                                         for fine_tune_seed in DOWNSTREAM_SEEDS[:arguments.downstream_seeds]]
    first_run = next(iter(runs.values()))
    report = {
        "command": command, "machine": machine,
        "settings": {"device": arguments.device, "model": arguments.model, "batch_size": arguments.batch_size,
                     "matched_batch_size": batch_sizes["bertforge-matched"],
                     "tokens": arguments.tokens, "lr": arguments.lr, "seeds": arguments.seeds,
                     "downstream_seeds": arguments.downstream_seeds,
                     "warmup_steps": arguments.warmup_steps, "threads": arguments.threads,
                     "train_documents": train_documents, "validation_documents": validation_documents},
        "data": {"train_tokens": train_split["tokens"], "train_samples": train_split["samples"],
                 "bertforge_prepare_seconds": manifest["prepare_seconds"],
                 "hf_datasets": {arm: {k: v for k, v in info.items() if k != "path"} for arm, info in hf_data.items()}},
        "evaluation": {"packed_samples": sum(int(b["num_samples"]) for b in packed),
                       "packed_masked_tokens": first_run["eval_packed"]["masked_tokens"],
                       "lines": len(validation_lines),
                       "lines_masked_tokens": first_run["eval_lines"]["masked_tokens"]},
    }
    if arguments.downstream_seeds:
        report["runs"] = [{"seed": seed, "arm": arm} | run for (seed, arm), run in runs.items()]
        table, name = render_downstream(report, arguments.arms), "pretrain_vs_hf_downstream"
    elif len(arguments.seeds) == 1 and arguments.arms == list(ARMS):
        report["arms"] = {arm: run for (_, arm), run in runs.items()}
        table, name = render(report), "pretrain_vs_hf"
    else:
        report["runs"] = [{"seed": seed, "arm": arm} | run for (seed, arm), run in runs.items()]
        table, name = render_seed_study(report, arguments.arms), "pretrain_vs_hf_seeds"
    print(table)
    target = work / "quick-results" if arguments.quick else RESULTS
    write_atomically(target / f"{name}.md", table)
    write_atomically(target / f"{name}.json", json.dumps(report, indent=1))
    console.print(f"written to {target / name}.md and .json", soft_wrap=True)


if __name__ == "__main__":
    main()
