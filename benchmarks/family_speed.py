"""Fine-tuning speed per model family: bertforge vs Hugging Face `Trainer` with dynamic padding.

For each family (BERT, DistilBERT, RoBERTa, XLM-RoBERTa, ELECTRA, DeBERTa-v3, MPNet, ModernBERT)
one randomly initialised sequence classifier of one small shape (4 layers x 256 hidden, 4 heads,
FFN 1024; ELECTRA embeddings 128 wide as electra-small's; ModernBERT's GLU 384 wide, as its base
model's 1.5x) is built by `transformers` itself and saved once, with the family's kind of tokenizer
(WordPiece for BERT, DistilBERT and ELECTRA; byte-level BPE for RoBERTa, ModernBERT and MPNet, whose
stock WordPiece has `<pad>` at id 1 as bertforge's has not; Unigram for XLM-RoBERTa and DeBERTa-v3),
each trained by `bertforge tokenizer train`'s code on the same supersense text, one vocabulary size for all so the ratio shows the architecture, not the
embedding's size. Both sides fine-tune that directory on the same bundled WordNet supersense rows
(45 classes) with `parity.py`'s settings (AdamW lr 2e-4, weight decay 0.01, linear decay after 6%
warm-up, clipping 1.0, batch 32, max length 128, the family's own dropout, fp32):

- bertforge: its real `finetune` task (`ClassificationTask` + `Trainer`, unpadded batches);
- HF: `Trainer` + `DataCollatorWithPadding` (each batch padded to its longest, a random order without
  length grouping, as users run it), `AutoModelForSequenceClassification` with SDPA attention where the family has it.

Timed: the optimizer-step loop of one epoch (bertforge's `TrainingState.elapsed_seconds`, HF's
`train_runtime`), both sides in this one process at the same thread count, the arms interleaved
(bertforge, HF, then HF, bertforge for the next family, ...) and the whole round repeated; the table
gives each arm's median over the rounds and HF ÷ bertforge of the medians. DeBERTa's disentangled
attention cannot use a varlen kernel: bertforge computes its scores explicitly on SDPA's packed rows
(`models/disentangled_attention.py`; `bertforge doctor` says so), which the table states.

    .venv/bin/python benchmarks/family_speed.py --json benchmarks/results/family_speed.json   # 2 threads, 256 rows, 3 rounds
    .venv/bin/python benchmarks/family_speed.py --quick        # smoke test: tiny shape, 64 rows, 1 round
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/family_speed.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
import transformers
import yaml

from benchmarks.common.reports import machine_description, quiet_progress_bars, write_atomically
from benchmarks.common.tasks import TaskData, load_task
from benchmarks.parity import BATCH, BertforgeOptions, finetune_config, hf_dataset, hf_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 17  # one seed: every run of a family draws the same batches, so rounds differ by the machine only
TOKENIZER_ROWS = 20_000  # supersense training glosses the tokenizers learn from


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    electra_embedding: int  # ELECTRA projects narrower embeddings up to the hidden width
    modernbert_glu: int  # ModernBERT's `intermediate_size` is one half of its GLU input projection


SHAPES = {"small": Shape(256, 4, 4, 1024, 128, 384), "tiny": Shape(32, 2, 4, 48, 16, 48)}


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    cls: int
    sep: int


def bert_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    return transformers.BertConfig(vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                                   num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
                                   max_position_embeddings=512, pad_token_id=ids.pad)


def distilbert_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    return transformers.DistilBertConfig(vocab_size=vocab, dim=shape.hidden, n_layers=shape.layers,
                                         n_heads=shape.heads, hidden_dim=shape.intermediate,
                                         max_position_embeddings=512, pad_token_id=ids.pad)


def roberta_like_config(config_class: type) -> Callable[[int, SpecialIds, Shape], transformers.PretrainedConfig]:
    def build(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
        # positions start after padding_idx: 512 tokens need 514 rows, as the stock checkpoints have
        return config_class(vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                            num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
                            max_position_embeddings=514, type_vocab_size=1, pad_token_id=ids.pad,
                            bos_token_id=ids.cls, eos_token_id=ids.sep)
    return build


def electra_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    return transformers.ElectraConfig(vocab_size=vocab, embedding_size=shape.electra_embedding,
                                      hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                                      num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
                                      max_position_embeddings=512, pad_token_id=ids.pad)


def deberta_v3_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    # deberta-v3's attention: 256 log buckets, shared keys, normed relative table, no absolute positions
    return transformers.DebertaV2Config(
        vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        intermediate_size=shape.intermediate, max_position_embeddings=512, type_vocab_size=0,
        relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"], position_buckets=256,
        share_att_key=True, norm_rel_ebd="layer_norm", max_relative_positions=-1, layer_norm_eps=1e-7,
        pooler_hidden_size=shape.hidden, pad_token_id=ids.pad, legacy=False)


def mpnet_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    return transformers.MPNetConfig(vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                                    num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
                                    max_position_embeddings=514, pad_token_id=ids.pad, bos_token_id=ids.cls,
                                    eos_token_id=ids.sep)


def modernbert_config(vocab: int, ids: SpecialIds, shape: Shape) -> transformers.PretrainedConfig:
    # ModernBERT-base's pattern: a global layer every 3rd from layer 0, 128-token windows between
    return transformers.ModernBertConfig(
        vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        intermediate_size=shape.modernbert_glu, max_position_embeddings=512, global_attn_every_n_layers=3,
        local_attention=128, pad_token_id=ids.pad, bos_token_id=ids.cls, eos_token_id=ids.sep,
        cls_token_id=ids.cls, sep_token_id=ids.sep)


@dataclass(frozen=True)
class FamilySetup:
    tokenizer: str  # the `bertforge tokenizer train --model` the family's checkpoints use the like of
    config: Callable[[int, SpecialIds, Shape], transformers.PretrainedConfig]
    bertforge_attention: str  # the path bertforge's encoder takes for this family on the CPU


PACKED_SDPA = "packed rows, SDPA with a block-diagonal mask (the CPU's varlen path)"
FAMILIES: dict[str, FamilySetup] = {
    "bert": FamilySetup("wordpiece", bert_config, PACKED_SDPA),
    "distilbert": FamilySetup("wordpiece", distilbert_config, PACKED_SDPA),
    "roberta": FamilySetup("bpe", roberta_like_config(transformers.RobertaConfig), PACKED_SDPA),
    "xlm-roberta": FamilySetup("unigram", roberta_like_config(transformers.XLMRobertaConfig), PACKED_SDPA),
    "electra": FamilySetup("wordpiece", electra_config, PACKED_SDPA),
    "deberta-v3": FamilySetup("unigram", deberta_v3_config,
                              "disentangled: c2p/p2c scores, softmax and values computed explicitly on SDPA's packed "
                              "rows (no kernel takes the per-pair bias)"),
    # MPNet's stock tokenizer is WordPiece with <pad> at 1, the id transformers hard-codes for its positions;
    # bertforge's WordPiece puts [PAD] at 0, so MPNet takes the BPE tokenizer, whose ids are RoBERTa's
    "mpnet": FamilySetup("bpe", mpnet_config, PACKED_SDPA + ", with MPNet's relative position bias"),
    "modernbert": FamilySetup("bpe", modernbert_config, PACKED_SDPA + ", local layers with a sliding-window mask"),
}


# ---------------------------------------------------------------------------------------------
# setup: tokenizers and the saved initial models


def train_tokenizers(workdir: Path, texts: list[str], kinds: set[str], vocab_size: int) -> dict[str, Path]:
    """One tokenizer of each kind, trained by bertforge on the same texts."""
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    corpus = workdir / "tokenizer-corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    directories = {}
    for kind in sorted(kinds):
        directories[kind] = workdir / f"tokenizer-{kind}"
        train_tokenizer_from_inputs([str(corpus)], directories[kind], model=kind, vocab_size=vocab_size)
    return directories


def save_initial_model(family: str, tokenizer_dir: Path, shape: Shape, task: TaskData, out: Path) -> Path:
    """The family's stock sequence classifier, randomly initialised (seeded) and saved with its tokenizer:
    both arms start from these weights."""
    from bertforge.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    ids = SpecialIds(tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id)
    config = FAMILIES[family].config(tokenizer.padded_vocab_size, ids, shape)
    config.num_labels = len(task.labels)
    config.id2label = dict(enumerate(task.labels))
    config.label2id = {name: i for i, name in enumerate(task.labels)}
    config.problem_type = "single_label_classification"
    transformers.set_seed(SEED)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(str(out))
    transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out))
    return out


# ---------------------------------------------------------------------------------------------
# the two arms: seconds of the optimizer-step loop for `epochs` epochs (or `max_steps` steps)


@dataclass
class ArmRun:
    seconds: float  # the step loop: bertforge's elapsed_seconds, HF's train_runtime
    steps: int
    positions: int  # token positions the model computed (bertforge: real tokens; HF: real + padding)


def run_bertforge(workdir: Path, task: TaskData, init: Path, epochs: int, max_steps: int | None = None) -> ArmRun:
    from bertforge.config import load_config
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer

    settings = finetune_config(workdir, task, SEED, epochs, init, True, BertforgeOptions())
    settings["train"]["log_every"] = 10  # parity.py logs each step for its matched mode; a speed run need not
    if max_steps is not None:
        settings["train"]["max_steps"] = max_steps
    config_file = workdir / "finetune.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    config = load_config(config_file)
    result = Trainer(config, ClassificationTask(config)).fit()
    if result.stopped_by == "signal":
        raise SystemExit(f"stopped by a signal during {result.run_dir.name}")
    return ArmRun(result.state.elapsed_seconds, result.state.step, result.state.consumed_tokens)


def run_hf(workdir: Path, task: TaskData, init: Path, epochs: int, max_steps: int | None = None) -> ArmRun:
    from benchmarks.parity import LR, WARMUP, WEIGHT_DECAY

    transformers.set_seed(SEED)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(init))
    model = hf_model(init, task, dropout=True)
    train = hf_dataset(task, task.train, tokenizer)
    arguments = transformers.TrainingArguments(
        output_dir=str(workdir / f"hf-{time.monotonic_ns()}"), seed=SEED, per_device_train_batch_size=BATCH,
        num_train_epochs=epochs, max_steps=max_steps if max_steps is not None else -1, learning_rate=LR,
        weight_decay=WEIGHT_DECAY, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        lr_scheduler_type="linear", warmup_steps=WARMUP, train_sampling_strategy="random", eval_strategy="no",
        save_strategy="no", logging_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=True)
    collator = transformers.DataCollatorWithPadding(tokenizer)
    positions = []

    def counting_collator(features: list[dict[str, Any]]) -> Any:
        batch = collator(features)
        positions.append(batch["input_ids"].numel())
        return batch

    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=train, data_collator=counting_collator)
    trainer.remove_callback(transformers.PrinterCallback)
    output = trainer.train()
    return ArmRun(output.metrics["train_runtime"], output.global_step, sum(positions))


ARMS: dict[str, Callable[..., ArmRun]] = {"bertforge": run_bertforge, "hf": run_hf}


# ---------------------------------------------------------------------------------------------
# the measurement and its report


def load_average() -> dict[str, Any]:
    """`uptime`'s line and the three load averages, as the machine stood at this moment."""
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    return {"uptime": uptime, "load_average": list(os.getloadavg()), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                          time.gmtime())}


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from bertforge.data.bundled import supersense_lines

    shape = SHAPES[args.shape]
    task = load_task("supersense", args.train_rows, 1)
    texts = [json.loads(line)["text"] for line in supersense_lines("train", TOKENIZER_ROWS)]
    tokenizers = train_tokenizers(workdir, texts, {FAMILIES[f].tokenizer for f in args.families}, args.vocab_size)
    initial = {family: save_initial_model(family, tokenizers[FAMILIES[family].tokenizer], shape, task,
                                          workdir / f"init-{family}") for family in args.families}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {f: {arm: [] for arm in ARMS} for f in args.families}
    for round_index in range(args.rounds):
        for family_index, family in enumerate(args.families):
            arms = list(ARMS) if (round_index + family_index) % 2 == 0 else list(reversed(ARMS))
            for arm in arms:
                run = ARMS[arm](workdir, task, initial[family], args.epochs)
                runs[family][arm].append(asdict(run) | {"first": arms[0]})
                print(f"round {round_index + 1} {family} {arm}: {run.seconds / args.epochs:.2f} s/epoch, "
                      f"{run.steps} steps, load {os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    rows = {}
    for family in args.families:
        medians = {arm: statistics.median(r["seconds"] for r in runs[family][arm]) / args.epochs for arm in ARMS}
        rows[family] = {"bertforge_seconds_per_epoch": medians["bertforge"], "hf_seconds_per_epoch": medians["hf"],
                        "ratio": medians["hf"] / medians["bertforge"],
                        "ratios_per_round": [h["seconds"] / b["seconds"] for b, h in
                                             zip(runs[family]["bertforge"], runs[family]["hf"], strict=True)],
                        "bertforge_attention": FAMILIES[family].bertforge_attention,
                        "tokenizer": FAMILIES[family].tokenizer, "runs": runs[family]}
    return {"rows": rows, "train_rows": len(task.train), "steps_per_epoch": runs[args.families[0]]["bertforge"][0]["steps"]
            // args.epochs, "vocab_sizes": {kind: transformers.AutoTokenizer.from_pretrained(str(d)).vocab_size
                                           for kind, d in tokenizers.items()}}


def table(rows: dict[str, dict[str, Any]]) -> str:
    lines = ["| family | tokenizer | bertforge s/epoch | HF `Trainer` s/epoch | HF ÷ bertforge | per round | "
             "bertforge's attention path |", "|---|---|---:|---:|---:|---|---|"]
    for family, row in rows.items():
        rounds = ", ".join(f"{r:.2f}" for r in row["ratios_per_round"])
        lines.append(f"| {family} | {row['tokenizer']} | {row['bertforge_seconds_per_epoch']:.2f} | "
                     f"{row['hf_seconds_per_epoch']:.2f} | **{row['ratio']:.2f}×** | {rounds} | "
                     f"{row['bertforge_attention']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", type=lambda s: s.split(","), default=list(FAMILIES),
                        help=f"comma-separated: {', '.join(FAMILIES)}")
    parser.add_argument("--shape", choices=SHAPES, default="small")
    parser.add_argument("--train-rows", type=int, default=256, help="supersense rows of one epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of every family's pair of runs")
    parser.add_argument("--vocab-size", type=int, default=8192, help="every tokenizer's (padded to x64)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke test: tiny shape, 64 rows, 1 round")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args()
    unknown = [f for f in args.families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown family {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    if args.quick:
        args.shape, args.train_rows, args.rounds, args.vocab_size = "tiny", 64, 1, 1024
    torch.set_num_threads(args.threads)
    from bertforge.console import quiet_transformers, setup_logging

    setup_logging(0)
    quiet_transformers()
    quiet_progress_bars()
    transformers.utils.logging.set_verbosity_error()
    before = load_average()
    machine = machine_description("cpu")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="family-speed-") as scratch:
        result = measure(args, Path(scratch))
    after = load_average()
    shape = SHAPES[args.shape]
    header = (f"supersense, {result['train_rows']} rows = {result['steps_per_epoch']} steps of batch {BATCH} per "
              f"epoch, {args.epochs} epoch(s) a run, median of {args.rounds} interleaved round(s); {shape.layers} "
              f"layers x {shape.hidden} hidden, {shape.heads} heads, FFN {shape.intermediate}; vocabularies "
              f"{result['vocab_sizes']}; {args.threads} threads, torch {torch.__version__}, transformers "
              f"{transformers.__version__}; load average {before['load_average']} before, {after['load_average']} "
              f"after; {(time.perf_counter() - began) / 60:.1f} min in all")
    print(header + "\n\n" + table(result["rows"]))
    if args.json:
        write_atomically(args.json, json.dumps({
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "args": {k: v if isinstance(v, (int, float, list)) else str(v) for k, v in vars(args).items()},
            "shape": asdict(shape), "machine": machine, "uptime_before": before, "uptime_after": after,
            "total_seconds": time.perf_counter() - began} | result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
