"""Downstream quality: each final model fine-tuned with the quickstart's recipe at the setting (learning rate,
dropout) a dev split chooses for it and the task; a fine-tune already finished under the same config, model and code
is read back (its scores: the fine-tuned weights are not kept)."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common.reports import write_atomically
from benchmarks.common.tasks import DOWNSTREAM_SEEDS
from benchmarks.ttq.settings import CODE_FILE, DEV_EVERY, REPO


def fine_tune_accuracy(model_dir: str, task: Any, name: str, seed: int, work: Path, threads: int,
                       overrides: tuple[str, ...] = ()) -> float:
    """`pretrain_vs_hf.fine_tune_accuracy` for any classification task of `benchmarks.common.tasks.load_task`: the quickstart's
    fine-tuning recipe with a fresh pooler and classifier (plus `overrides`), test accuracy at the end. A run that
    finished with the same config and code after the model was written is read back instead (fine-tuning is
    deterministic on CPU), so an interrupted scoring resumes and a wider grid re-runs only its new settings."""
    import torch

    from bertforge.config import finetune_defaults, load_config
    from bertforge.tasks.classify import ClassificationTask
    from bertforge.train.trainer import Trainer

    torch.set_num_threads(threads)
    files = {}
    for split, rows in (("train", task.train), ("test", task.test)):
        files[split] = work / "downstream" / f"{task.name}-{split}-{len(rows)}.jsonl"
        if not files[split].is_file():
            write_atomically(files[split], "".join(json.dumps({"text": row["text"], "label": str(row["label"])}) + "\n"
                                                   for row in rows))
    recipe = REPO / "src" / "bertforge" / "recipes" / "quickstart-finetune-tiny.yaml"
    run_name = f"{name}-{task.name}-ft{seed}"
    labels = ",".join(json.dumps(label) for label in task.labels)  # quoted: manpages' labels are digits
    config = load_config(recipe, [
        f"run.output_dir={work / 'downstream'}", f"run.name={run_name}", f"run.seed={seed}", "run.device=cpu",
        "run.resume=never", f"model.init_from={model_dir}", f"finetune.train_file={files['train']}",
        f"finetune.test_file={files['test']}", f"finetune.labels=[{labels}]", "train.best_metric=null",
        "log.progress=false", "log.tensorboard=false", *overrides], base=finetune_defaults())
    run_dir = work / "downstream" / run_name
    if not finished_fine_tune(run_dir, config, Path(model_dir)):
        shutil.rmtree(run_dir, ignore_errors=True)  # a re-scored run starts afresh
        run_dir = Trainer(config, ClassificationTask(config)).fit().run_dir
        drop_weights(run_dir)
        (run_dir / CODE_FILE).write_text(code_fingerprint(), encoding="utf-8")  # last: an interrupted run re-runs
    return json.loads((run_dir / "test_results.json").read_text())["metrics"]["accuracy"]


def drop_weights(run_dir: Path) -> None:
    """Delete a finished fine-tune's checkpoints and exported model. The study reads back only its scores and what
    `finished_fine_tune` checks, and the weights are what fill a disk: a bert-mini fine-tune keeps ~85 MB, and the 18
    fine-tunes of each pre-training run (the dev grid and the test seeds of two tasks) came to 27 GB over one
    corpus' 18 runs."""
    for name in ("checkpoints", "final"):
        shutil.rmtree(run_dir / name, ignore_errors=True)


@functools.cache  # once per process: the code that runs is the code imported at the start, not a later edit
def code_fingerprint() -> str:
    """sha256 of torch's version and bertforge's source: a fine-tune is reused only under the code that ran it, since
    a change of float rounding alone (such as folding clipping into AdamW) moves its accuracy as another seed does."""
    import torch

    digest = hashlib.sha256(torch.__version__.encode())
    for path in sorted((REPO / "src" / "bertforge").rglob("*.py")):
        digest.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def finished_fine_tune(run_dir: Path, config: Any, model_dir: Path) -> bool:
    """Whether `run_dir` holds the test results of `config`, run by this code after every file of the model it starts
    from was written."""
    from bertforge.config import config_to_yaml

    results, saved, code = run_dir / "test_results.json", run_dir / "config.yaml", run_dir / CODE_FILE
    if not (results.is_file() and saved.is_file() and code.is_file()):
        return False
    if saved.read_text(encoding="utf-8") != config_to_yaml(config) or code.read_text(encoding="utf-8") != code_fingerprint():
        return False
    return results.stat().st_mtime > max(path.stat().st_mtime for path in model_dir.iterdir())


@dataclass(frozen=True)
class FineTuning:
    """One fine-tuning setting of the grid a dev split chooses from: a learning rate and the dropout rate (hidden,
    attention and classifier together; None keeps the model's own)."""
    lr: float
    dropout: float | None = None

    @property
    def overrides(self) -> tuple[str, ...]:
        rate = () if self.dropout is None else (f"model.hidden_dropout={self.dropout}",
                                                f"model.attention_dropout={self.dropout}",
                                                f"model.classifier_dropout={self.dropout}")
        return (f"optim.lr={self.lr}", *rate)

    @property
    def slug(self) -> str:  # the model's own dropout keeps the run names of the earlier, lr-only grid
        return f"lr{self.lr:g}" + ("" if self.dropout is None else f"-dropout{self.dropout:g}")

    def __str__(self) -> str:
        return f"lr {self.lr:g}, dropout {dropout_text(self.dropout)}"


def dropout_text(rate: float | None) -> str:
    return "the model's" if rate is None else f"{rate:g}"


def fine_tuning_grid(lrs: list[float], dropouts: list[float | None]) -> list[FineTuning]:
    return [FineTuning(lr, dropout) for lr in lrs for dropout in dropouts]


def fine_tune_with(model_dir: str, task: Any, name: str, setting: FineTuning, seed: int, work: Path,
                   threads: int) -> float:
    """`fine_tune_accuracy` with `setting`, its run named after it."""
    return fine_tune_accuracy(model_dir, task, f"{name}-{setting.slug}", seed, work, threads, setting.overrides)


def dev_split(task: Any) -> Any:
    """The task with every DEV_EVERY-th training row moved to its test split: the dev set the settings are chosen
    on (the rows are spread over the labels, so the dev set keeps their mix); the real test rows are not seen."""
    train = [row for index, row in enumerate(task.train) if index % DEV_EVERY != DEV_EVERY - 1]
    dev = [row for index, row in enumerate(task.train) if index % DEV_EVERY == DEV_EVERY - 1]
    return replace(task, name=f"{task.name}-dev", train=train, test=dev)


def choose_setting(model_dir: str, task: Any, name: str, grid: list[FineTuning], work: Path,
                   threads: int) -> dict[str, Any]:
    """Fine-tune on the dev split's training rows with each setting (the first fine-tuning seed); `best_setting`
    picks."""
    seed, dev = DOWNSTREAM_SEEDS[0], dev_split(task)
    scores = {setting: fine_tune_with(model_dir, dev, name, setting, seed, work, threads) for setting in grid}
    chosen = best_setting(scores)
    return {"chosen": asdict(chosen), "chosen_text": str(chosen),
            "dev_accuracy": {str(setting): accuracy for setting, accuracy in scores.items()},
            "dev_rows": [len(dev.train), len(dev.test)]}


def best_setting(dev_accuracy: dict[FineTuning, float]) -> FineTuning:
    """The setting with the best dev accuracy; of equals the gentler: the lower lr, then the model's own dropout
    (then the higher rate)."""
    def gentleness(setting: FineTuning) -> tuple[float, float]:
        return setting.lr, -(float("inf") if setting.dropout is None else setting.dropout)

    return max(sorted(dev_accuracy, key=gentleness), key=lambda setting: dev_accuracy[setting])  # first of equals
