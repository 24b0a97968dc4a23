"""The Arabic workflow measured (issue 36 item 4): a WordPiece tokenizer trained on Arabic text from Debian, a tiny
BERT pre-trained on it, fine-tuned on `arabic-messages` (an interface message -> which of six applications), test
accuracy over seeds against the majority class and against the same model fine-tuned without pre-training.

Each stage is the command a user runs (configs/pretrain/arabic-tiny.yaml's and configs/finetune/arabic-messages-tiny.yaml's
headers list them), called in this process through `bertforge.cli.main`:

    python scripts/build_parity_tasks.py --tasks arabic-messages
    python benchmarks/arabic_messages.py --out runs/arabic-bench --seeds 1 2 3 4 5 \\
        --json benchmarks/results/arabic_messages_seeds_1-5.json

`--arms pretrained` or `--arms scratch` runs one side only (scratch skips pre-training). `--normalize none` trains
the tokenizer with bertforge's default instead (uncased, BERT's accent stripping: harakat removed, hamza folded,
tatweel kept), to compare the two normalisations on one task.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

if not __package__:  # run as `python benchmarks/arabic_messages.py`: import from the repository root, as `-m` does
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.common.stats import mean_std
from bertforge.cli import main as bertforge
from bertforge.run_directory import RunDirectory

REPO = Path(__file__).resolve().parents[1]
PRETRAIN_RECIPE = REPO / "configs" / "pretrain" / "arabic-tiny.yaml"
FINETUNE_RECIPE = REPO / "configs" / "finetune" / "arabic-messages-tiny.yaml"
DEFAULT_TASK = Path("~/.cache/bertforge/tasks/arabic-messages").expanduser()
QUIET = ["log.tensorboard=false", "log.plots=false", "log.progress=false"]


def run(*args: str) -> None:
    if bertforge(["-q", *args]) != 0:
        raise SystemExit(f"bertforge {' '.join(args)} failed")


def labels_of(path: Path) -> list[str]:
    return [json.loads(line)["label"] for line in path.read_text(encoding="utf-8").splitlines() if line]


def majority_accuracy(task: Path) -> tuple[str, float]:
    """The most frequent train label and its share of the test split (what always answering it scores)."""
    majority, _ = Counter(labels_of(task / "train.jsonl")).most_common(1)[0]
    test = labels_of(task / "test.jsonl")
    return majority, sum(label == majority for label in test) / len(test)


def test_accuracy(run_dir: Path) -> float:
    results = json.loads(RunDirectory(run_dir).results_file("test").read_text(encoding="utf-8"))
    return float(results["metrics"]["accuracy"])


def finetune(task: Path, out: Path, name: str, seed: int, model: list[str], epochs: int | None) -> float:
    files = [f"finetune.{split}_file={task / f'{split}.jsonl'}" for split in ("train", "validation", "test")]
    length = [f"train.max_epochs={epochs}"] if epochs else []
    run("finetune", str(FINETUNE_RECIPE), *files, *model, *QUIET, *length, f"run.output_dir={out}",
        f"run.name={name}-seed-{seed}", f"run.seed={seed}")
    return test_accuracy(out / f"{name}-seed-{seed}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", type=Path, default=DEFAULT_TASK, help="the arabic-messages task directory")
    parser.add_argument("--out", type=Path, required=True, help="working directory (tokenizer, data, runs)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5], help="fine-tuning seeds")
    parser.add_argument("--normalize", choices=("arabic", "none"), default="arabic",
                        help="the tokenizer's --normalize (none: bertforge's uncased default)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--pretrain-steps", type=int, default=None, help="default: the pre-training recipe's")
    parser.add_argument("--finetune-epochs", type=int, default=None, help="default: the fine-tuning recipe's")
    parser.add_argument("--arms", nargs="+", choices=("pretrained", "scratch"), default=["pretrained", "scratch"],
                        help="fine-tune the pre-trained model, the same shape from random weights, or both")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    train_texts = str(args.task / "train.jsonl")
    out: Path = args.out
    timings: dict[str, float | list[float]] = {}

    started = time.perf_counter()
    tokenizer = out / "tokenizer"
    normalize = ["--normalize", args.normalize] if args.normalize != "none" else []
    run("tokenizer", "train", "--input", train_texts, *normalize, "--vocab-size", str(args.vocab_size),
        "--out", str(tokenizer), "--overwrite")
    data = out / "data-64"
    run("prepare", "pretrain", "--input", train_texts, "--tokenizer", str(tokenizer), "--out", str(data),
        "--seq-len", "64", "--overwrite")
    timings["tokenizer_and_data_s"] = time.perf_counter() - started

    evaluated = []
    if "pretrained" in args.arms:
        started = time.perf_counter()
        steps = [f"train.max_steps={args.pretrain_steps}"] if args.pretrain_steps else []
        run("pretrain", str(PRETRAIN_RECIPE), f"data.path={data}", f"run.output_dir={out}", "run.name=pretrain",
            "run.seed=1", *steps, *QUIET)
        metrics = [json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
        evaluated = [m for m in metrics if m.get("split") == "validation" and "mlm_accuracy" in m]
        timings["pretrain_s"] = time.perf_counter() - started

    majority, majority_acc = majority_accuracy(args.task)
    every_arm = {"pretrained": [f"model.init_from={out / 'pretrain'}"],
                 "scratch": ["model.init_from=null", f"model.tokenizer={tokenizer}"]}
    arms = {arm: every_arm[arm] for arm in args.arms}
    accuracies: dict[str, list[float]] = {arm: [] for arm in arms}
    for seed in args.seeds:
        for arm, model in arms.items():
            started = time.perf_counter()
            accuracies[arm].append(finetune(args.task, out, arm, seed, model, args.finetune_epochs))
            timings.setdefault(f"finetune_{arm}_s", []).append(time.perf_counter() - started)  # type: ignore[union-attr]
            print(f"seed {seed} {arm}: test accuracy {accuracies[arm][-1]:.4f}", flush=True)

    print(f"majority class ({majority}): {majority_acc:.4f}")
    for arm, values in accuracies.items():
        print(f"{arm}: {mean_std(values)} over seeds {args.seeds} (min {min(values):.4f}, max {max(values):.4f})")
    if evaluated:
        last = evaluated[-1]
        print(f"pre-training: validation MLM accuracy {last['mlm_accuracy']:.4f} "
              f"(unigram baseline {last.get('mlm_unigram_accuracy', float('nan')):.4f}) at step {last.get('step')}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "task": str(args.task), "task_json": json.loads((args.task / "task.json").read_text(encoding="utf-8")),
            "normalize": args.normalize, "vocab_size": args.vocab_size, "seeds": args.seeds,
            "pretrain_steps": args.pretrain_steps, "finetune_epochs": args.finetune_epochs,
            "majority": {"label": majority, "test_accuracy": majority_acc},
            "test_accuracy": accuracies,
            "mean": {arm: statistics.fmean(v) for arm, v in accuracies.items()},
            "stdev": {arm: statistics.stdev(v) if len(v) > 1 else None for arm, v in accuracies.items()},
            "pretrain_last_eval": evaluated[-1] if evaluated else None,
            "timings": timings,
        }, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
