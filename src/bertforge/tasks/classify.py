"""Sequence classification and regression fine-tuning: the second white-box `Task` (after pre-training).

One class covers one text or a text pair, binary or multi-class classification (optionally with
class weights) and STS-B-style regression. Examples are tokenized once and batched unpadded
(`collate_unpadded`): a batch of 18-token glosses costs 18 tokens each, not 128 or 512.

The loss is a sum over the micro-batch divided by the examples of the whole global batch (the
trainer's loss units; with class weights, the summed weights of the batch's labels, as
`cross_entropy(weight=...)` averages), so accumulation and data parallelism give the same step
as one big batch. At the end the trainer reloads the best checkpoint and calls `save_final`, which
evaluates the test split (metrics, per-class report, confusion matrix as markdown and PNG in the
run directory) and exports `final/` in Hugging Face format with the label names, so
`transformers.pipeline("text-classification", model=run/final)` works as is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertforge.batch import model_inputs
from bertforge.config import Config, FinetuneSection
from bertforge.console import console, log
from bertforge.data.labeled import LabeledDataset, collate_unpadded
from bertforge.data.labels import LabeledData, LabeledSplit, load_labeled_data
from bertforge.data.validation_subset import (
    ValidationSubset,
    final_splits_with_validation,
    sample_rows,
    subset_of_split,
)
from bertforge.errors import ConfigError
from bertforge.locate import resolve_data_file, resolve_model, resolve_model_path, tokenizer_dir_for
from bertforge.tasks.evaluation import (
    EvaluationReport,
    classification_loss,
    evaluate_dataset,
    metrics_line,
    outputs_of,
    write_evaluation,
)
from bertforge.tasks.metrics import best_mode, compute_metrics, metric_names
from bertforge.train.task import Batch, Task, TaskData

LOSS_UNIT = "examples"
PRINTED_CONFUSION_CLASSES = 12  # larger confusion matrices go to the report file and the PNG only


class ClassificationTask(Task):
    """Fine-tune a classifier / regressor on `finetune.*` data, from `model.init_from` or from scratch.

    `data` and `final_splits` let a caller (the GLUE runner) bring splits read its own way:
    `final_splits` are evaluated with the best checkpoint at the end (default: the test split, or
    the validation split when there is no test file).
    """

    def __init__(self, config: Config, data: LabeledData | None = None,
                 final_splits: Mapping[str, LabeledSplit] | None = None) -> None:
        super().__init__(config)
        self.labeled = data
        self.explicit_final_splits = dict(final_splits) if final_splits is not None else None
        self.class_weights: torch.Tensor | None = None
        self._tokenizer_dir: Path | None = None
        self.validation_subset: ValidationSubset | None = None
        self.validation_rows: Any = None  # the split (or subset) the evaluations during training score

    # --- data -----------------------------------------------------------------------------------

    @property
    def run_dir(self) -> Path:
        return Path(self.config.run.output_dir) / self.config.run.name

    def tokenizer_dir(self) -> Path:
        """`model.tokenizer`, else the tokenizer that comes with `model.init_from`; found once (every
        checkpoint's model directory copies it, and resolving `init_from` may read run configs)."""
        if self._tokenizer_dir is None:
            self._tokenizer_dir = self._find_tokenizer_dir()
        return self._tokenizer_dir

    def _find_tokenizer_dir(self) -> Path:
        section = self.config.model
        if section.tokenizer:
            return resolve_model_path(section.tokenizer)
        if section.init_from:
            found = tokenizer_dir_for(resolve_model(section.init_from))
            if found is not None:
                return found
            raise ConfigError(f"model.init_from {section.init_from} comes without a tokenizer; set model.tokenizer "
                              "to the tokenizer directory it was trained with")
        raise ConfigError("a model trained from scratch needs model.tokenizer (a tokenizer directory, e.g. from "
                          "`bertforge tokenizer train`), or set model.init_from to a pre-trained model")

    def _with_resolved_files(self) -> FinetuneSection:
        """`finetune.*` with its data files resolved (bundled sample names, `~`, fsspec URLs)."""
        section = self.config.finetune
        return dataclasses.replace(section, train_file=resolve_data_file(section.train_file),
                                   validation_file=resolve_data_file(section.validation_file),
                                   test_file=resolve_data_file(section.test_file))

    def _read_data(self) -> LabeledData:
        return load_labeled_data(self._with_resolved_files())

    def build_datasets(self) -> TaskData:
        if self.labeled is None:
            self.labeled = self._read_data()
        data = self.labeled
        self._check_best_metric()
        max_length = self.config.finetune.max_length
        tokenizer = self.tokenizer_dir()
        train = LabeledDataset(data.train, tokenizer, max_length)
        if data.validation is not None:
            strata = data.validation.labels if data.task_type == "classification" else None
            self.validation_rows = self.draw_validation(data.validation, strata, "label")
        validation = LabeledDataset(self.validation_rows, tokenizer, max_length) if self.validation_rows is not None else None
        if data.class_weights is not None:
            self.class_weights = torch.tensor(data.class_weights, dtype=torch.float32)
        if data.task_type == "classification" and data.train.labels is not None:
            warn_suspicious_labels(data.train)
        kind = "regression" if data.task_type == "regression" else f"{data.num_labels} classes"
        log.info(f"fine-tuning data: {len(train):,} training examples ({train.num_tokens / len(train):.1f} tokens "
                 f"on average, no padding), {len(validation) if validation else 0:,} validation, {kind}")
        return TaskData(train=train, collate=collate_unpadded, validation=validation,
                        tokens_per_sample=train.num_tokens / len(train))

    def draw_validation(self, split: Any, strata: Sequence[Hashable] | None, stratified_by: str) -> Any:
        """The rows of the validation split that evaluations score: `data.validation_samples` of them as a
        seeded sample, stratified by `strata` (one key per row) when given; all of them without a cap."""
        limit, seed = self.config.data.validation_samples, self.config.run.seed
        rows = sample_rows(len(split), limit, seed, strata)
        self.validation_subset = ValidationSubset(rows, len(split), seed,
                                                  stratified_by if strata is not None else None)
        if not self.validation_subset.is_whole_split:
            log.info(f"validation: {len(rows):,} of {len(split):,} rows (data.validation_samples), a seeded "
                     f"{'sample stratified by ' + stratified_by if strata is not None else 'sample'}")
        return subset_of_split(split, self.validation_subset)

    def report_of(self, report: EvaluationReport, split: Any) -> EvaluationReport:
        """A final evaluation's report, with the checkpoint it scored, saying so when it scored the rows that
        chose the checkpoint."""
        report = dataclasses.replace(report, checkpoint=self.final_checkpoint)
        if split is self.validation_rows and self.validation_subset is not None:
            return dataclasses.replace(report, subset=self.validation_subset.describe())
        return report

    def _check_best_metric(self) -> None:
        """Before the first step: a misspelt or wrong-way `train.best_metric` is a config error, not a
        run that keeps the wrong checkpoint. Needs the data read (`metric_names` depends on it)."""
        metric = self.config.train.best_metric
        if metric is None:
            return
        available = self.metric_names()
        if metric not in available:
            raise ConfigError(f"train.best_metric is {metric!r}, which {self.config.finetune.task_type} evaluation "
                              "does not report; "
                              f"choose one of {', '.join(sorted(available))}")
        if self.config.train.best_mode != best_mode(metric):  # it would keep the worst checkpoint
            raise ConfigError(f"train.best_mode is {self.config.train.best_mode} but a better {metric} is "
                              f"{'larger' if best_mode(metric) == 'max' else 'smaller'}; set "
                              f"train.best_mode={best_mode(metric)}")

    # --- model ----------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        assert self.labeled is not None, "build_datasets() comes first"
        data, section = self.labeled, self.config.model
        label_names = data.label_names if data.task_type == "classification" else None
        if section.init_from:
            model = self._model_from(section.init_from, data.task_type, data.num_labels, label_names)
        else:
            from bertforge.data.tokenizer import load_tokenizer
            from bertforge.models import BertforgeForSequenceClassification, encoder_config_from_section

            encoder = encoder_config_from_section(section, load_tokenizer(self.tokenizer_dir()).vocab_size)
            model = BertforgeForSequenceClassification(encoder, data.num_labels, data.task_type, label_names)
        self._check_positions(model)
        return model

    def _check_positions(self, model: nn.Module) -> None:
        positions = model.config.max_position_embeddings
        if model.config.position == "learned" and self.config.finetune.max_length > positions:
            raise ConfigError(f"finetune.max_length is {self.config.finetune.max_length} but the model has learned "
                              f"positions for {positions} tokens; set finetune.max_length <= {positions}")

    def _model_from(self, reference: str, task_type: str, num_labels: int, label_names: list[str] | None) -> nn.Module:
        """The encoder (and BERT's pooler) of any saved model, with a fresh head for our labels."""
        from bertforge.models.loading import load_for_task, runtime_overrides

        location = resolve_model(reference)
        if self.config.model.pooling is None and location.format == "hf":
            hint_sentence_transformers_pooling(location.path)
        return load_for_task(location.path, "classification", num_labels=num_labels, problem_type=task_type,
                             label_names=label_names, config_overrides=runtime_overrides(self.config.model))

    def save_model(self, model: nn.Module, directory: Path) -> None:
        """The model directory of a checkpoint: bertforge's format, with the tokenizer."""
        from bertforge.models import save_bertforge_model

        save_bertforge_model(model, directory, self.tokenizer_dir())

    # --- training -------------------------------------------------------------------------------

    def _weights_on(self, device: torch.device) -> torch.Tensor | None:
        if self.class_weights is not None and self.class_weights.device != device:
            self.class_weights = self.class_weights.to(device)
        return self.class_weights

    def loss_units(self, batch: Batch) -> dict[str, float]:
        if self.class_weights is not None:
            return {LOSS_UNIT: float(self.class_weights.cpu()[batch["labels"].cpu()].sum())}
        return {LOSS_UNIT: float(batch["num_samples"])}

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        labels = batch["labels"]
        output = model(**model_inputs(batch), labels=labels, class_weights=self._weights_on(labels.device))
        loss = output.loss_sum / batch["global_loss_units"][LOSS_UNIT]
        if output.correct is None:
            return loss, {}
        return loss, {"accuracy": float(output.correct) / batch["num_samples"]}

    def metric_names(self) -> set[str]:
        assert self.labeled is not None
        return metric_names(self.labeled.task_type, self.labeled.num_labels) | {"loss"}

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        assert self.labeled is not None
        logits, labels = outputs_of(model, batches)
        assert labels is not None
        task_type = self.labeled.task_type
        predictions = logits.squeeze(-1).numpy() if task_type == "regression" else logits.numpy()
        metrics = compute_metrics(task_type, predictions, labels.numpy(), self.labeled.label_names)
        return metrics | {"loss": classification_loss(task_type, logits, labels)}

    def flops_per_token(self, model: nn.Module) -> float | None:
        """6 x the parameters a token passes through (the word-embedding lookup is not a matmul)."""
        encoder = getattr(model, "encoder", None)
        if encoder is None:
            return None
        embedded = encoder.embeddings.word_embeddings.weight.numel()
        return 6.0 * (sum(p.numel() for p in model.parameters()) - embedded)

    # --- the end --------------------------------------------------------------------------------

    def final_splits(self) -> dict[str, LabeledSplit]:
        if self.explicit_final_splits is not None:
            if self.validation_subset is None or self.validation_subset.is_whole_split:
                return self.explicit_final_splits
            assert self.validation_rows is not None
            return self.explicit_final_splits | {"validation": self.validation_rows}
        assert self.labeled is not None
        return final_splits_with_validation(self.labeled.test, self.labeled.validation, self.validation_rows)

    def save_final(self, model: nn.Module, directory: Path) -> None:
        """Evaluate the final splits with the (best) model, then export `final/` in Hugging Face format."""
        from bertforge.models.hf import export_hf

        model.eval()
        tokenizer = self.tokenizer_dir()
        for name, split in self.final_splits().items():
            dataset = LabeledDataset(split, tokenizer, self.config.finetune.max_length)
            report = self.report_of(evaluate_dataset(model, dataset, name, self.config.train.micro_batch_size), split)
            written = write_evaluation(report, directory.parent)
            log.info(f"{name} ({len(dataset):,} examples): {metrics_line(report.metrics)}")
            log.info(f"{name} report: {', '.join(str(p) for p in written)}")
            if report.confusion is not None and len(report.label_names) <= PRINTED_CONFUSION_CLASSES:
                from bertforge.tasks.metrics import confusion_table, per_class_table

                console.print(per_class_table(report.per_class, title=f"{name}: per-class metrics"))
                console.print(confusion_table(report.confusion, report.label_names, title=f"{name}: confusion matrix"))
        export_hf(model, tokenizer, directory)


def warn_suspicious_labels(train: LabeledSplit) -> None:
    """Name rare training labels and likely typos of another label before a run learns them as classes."""
    from collections import Counter

    from bertforge.data.label_warnings import suspicious_labels

    ids = Counter(train.labels)
    counts = {name: ids.get(index, 0) for index, name in enumerate(train.label_names) if ids.get(index, 0)}
    for sentence in suspicious_labels(counts):
        log.warning(f"{train.source}: {sentence}; fix the label, merge it with finetune.label_map, or drop the row")


def hint_sentence_transformers_pooling(path: Path) -> None:
    """Say when BERT's pooler (the default, as `BertForSequenceClassification`) is the wrong start."""
    from bertforge.models.hf import sentence_transformers_pooling

    trained = sentence_transformers_pooling(path)
    if trained is None:
        return
    log.warning(f"{path} is a sentence-transformers model trained with {trained} pooling: the BERT pooler on [CLS] "
                f"that the classifier starts from (as transformers' BertForSequenceClassification does) was not "
                f"trained with it. model.pooling={trained} usually fine-tunes much better (see docs/guide.md); it "
                f"exports to bertforge's format instead of BertForSequenceClassification.")
