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

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from bertforge.batch import model_inputs
from bertforge.config import Config
from bertforge.console import console, log
from bertforge.data.labeled import LabeledDataset
from bertforge.data.labels import Columns, LabeledData, LabeledSplit, LabelSet, read_labeled_split
from bertforge.data.validation_subset import final_splits_with_validation
from bertforge.errors import BertforgeError
from bertforge.locate import resolve_model
from bertforge.tasks.evaluation import (
    EvaluationReport,
    classification_loss,
    evaluate_dataset,
    outputs_of,
    report_of_logits,
)
from bertforge.tasks.finetune_base import FinetuneTask
from bertforge.tasks.kinds.classification import KIND
from bertforge.tasks.metrics import compute_metrics
from bertforge.train.task import Batch, TaskData

if TYPE_CHECKING:
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions
    from bertforge.models.hf import BertforgeAny

LOSS_UNIT = "examples"
PRINTED_CONFUSION_CLASSES = 12  # larger confusion matrices go to the report file and the PNG only
# what model.pooling=mean bought over the pooler from a masked-LM-only checkpoint (hint_untrained_pooler), measured
MEAN_POOLING_GAIN = ("fine-tuned three bert-mini models pre-trained this way (HF Trainer's and bertforge's) to 62.4-62.8% "
                     "on supersense, against 42.6-52.9% with the pooler")


class ClassificationTask(FinetuneTask):
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

    # --- data -----------------------------------------------------------------------------------

    def _read_data(self) -> LabeledData:
        return KIND.read(self._with_resolved_files())

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
        return TaskData(train=train, collate=KIND.collate, validation=validation,
                        tokens_per_sample=train.num_tokens / len(train))

    # --- model ----------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        assert self.labeled is not None, "build_datasets() comes first"
        data, section = self.labeled, self.config.model
        label_names = data.label_names if data.task_type == "classification" else None
        if section.init_from:
            model = self._model_from(section.init_from, data.task_type, data.num_labels, label_names)
        else:
            from bertforge.models import BertforgeForSequenceClassification, encoder_config_from_section

            encoder = encoder_config_from_section(section, self.tokenizer_tokens())
            model = BertforgeForSequenceClassification(encoder, data.num_labels, data.task_type, label_names)
        self._check_model_fits_input(model)
        return model

    def _model_from(self, reference: str, task_type: str, num_labels: int, label_names: list[str] | None) -> nn.Module:
        """The encoder (and BERT's pooler) of any saved model, with a fresh head for our labels."""
        from bertforge.models.loading import adapt_for_task, load_model_directory, runtime_overrides

        location = resolve_model(reference)
        if self.config.model.pooling is None and location.format == "hf":
            hint_sentence_transformers_pooling(location.path)
        source = load_model_directory(location.path)
        model = adapt_for_task(source, location.path, "classification", num_labels=num_labels, problem_type=task_type,
                               label_names=label_names, config_overrides=runtime_overrides(self.config.model))
        if self.config.model.pooling is None:
            hint_untrained_pooler(source, model, location.path)
        return model

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
        return KIND.metric_names(self.config.finetune, self.labeled)

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        assert self.labeled is not None
        logits, labels = outputs_of(model, batches)
        assert labels is not None
        task_type = self.labeled.task_type
        predictions = logits.squeeze(-1).numpy() if task_type == "regression" else logits.numpy()
        metrics = compute_metrics(task_type, predictions, labels.numpy(), self.labeled.label_names)
        return metrics | {"loss": classification_loss(task_type, logits, labels)}

    # --- the end --------------------------------------------------------------------------------

    def final_splits(self) -> dict[str, LabeledSplit]:
        if self.explicit_final_splits is not None:
            if self.validation_subset is None or self.validation_subset.is_whole_split:
                return self.explicit_final_splits
            assert self.validation_rows is not None
            return self.explicit_final_splits | {"validation": self.validation_rows}
        assert self.labeled is not None
        return final_splits_with_validation(self.labeled.test, self.labeled.validation, self.validation_rows)

    def evaluate_split(self, model: nn.Module, name: str, split: LabeledSplit) -> EvaluationReport:
        dataset = LabeledDataset(split, self.tokenizer_dir(), self.config.finetune.max_length)
        return evaluate_dataset(model, dataset, name, self.config.train.micro_batch_size)

    def show_report(self, report: EvaluationReport) -> None:
        if report.per_group is not None:
            from bertforge.tasks.metrics import per_group_table

            console.print(per_group_table(report.per_group, report.group_column or "group",
                                          title=f"{report.split}: per {report.group_column}"))
        if report.confusion is not None and len(report.label_names) <= PRINTED_CONFUSION_CLASSES:
            from bertforge.tasks.metrics import confusion_table, per_class_table

            console.print(per_class_table(report.per_class, title=f"{report.split}: per-class metrics"))
            console.print(confusion_table(report.confusion, report.label_names,
                                          title=f"{report.split}: confusion matrix"))


def warn_suspicious_labels(train: LabeledSplit) -> None:
    """Name rare training labels and likely typos of another label before a run learns them as classes."""
    from collections import Counter

    from bertforge.data.label_warnings import suspicious_labels

    ids = Counter(train.labels)
    counts = {name: ids.get(index, 0) for index, name in enumerate(train.label_names) if ids.get(index, 0)}
    for sentence in suspicious_labels(counts):
        log.warning(f"{train.source}: {sentence}; fix the label, merge it with finetune.classification.label_map, or drop the row")


def hint_sentence_transformers_pooling(path: Path) -> None:
    """Say when the family's own classifier start (the default, as its `*ForSequenceClassification`; BERT's
    pooler for BERT) is not the pooling the checkpoint was trained with; the family names what that start is."""
    from bertforge.models.families import family_of_class
    from bertforge.models.hf import hf_architecture, sentence_transformers_pooling

    trained = sentence_transformers_pooling(path)
    if trained is None:
        return
    family = family_of_class(hf_architecture(path))
    stock = f"{family.hf_prefix}ForSequenceClassification"
    log.warning(f"{path} is a sentence-transformers model trained with {trained} pooling, but the classifier starts "
                f"from {family.classifier_start}, as transformers' {stock} does, not from that pooling. "
                f"model.pooling={trained} usually fine-tunes much better (see docs/guide.md); it exports to "
                f"bertforge's format instead of {stock}.")


def hint_untrained_pooler(source: BertforgeAny, model: BertforgeAny, path: Path) -> None:
    """Say when a classic BERT's classifier starts from a fresh pooler because the checkpoint has none: one
    pre-trained by masked-LM alone (bertforge's pre-training without NSP, `run_mlm.py`'s BertForMaskedLM), whose
    [CLS] state no pre-training loss ever read."""
    from bertforge.models.classification import BertforgeForSequenceClassification
    from bertforge.models.families import family_for_config

    if not isinstance(model, BertforgeForSequenceClassification) or model.config.pooling != "pooler":
        return
    family, _ = family_for_config(model.config)
    if family is None or family.name != "bert" or source.pooler_module() is not None:
        return  # RoBERTa's and the others' classifier start is their own head, not a pooler pre-training trains
    log.warning(f"{path} carries no trained pooler (it was pre-trained by masked-LM alone, without NSP), so the "
                "classifier starts from a fresh pooler on a [CLS] state no pre-training loss read. "
                f"model.pooling=mean {MEAN_POOLING_GAIN} (docs/guide.md, \"Which pooling\"); it exports to "
                "bertforge's format instead of BertForSequenceClassification.")


# ---------------------------------------------------------------------------------------------
# a trained classifier on new text: `bertforge predict` and `bertforge evaluate`, through the kind's record


def classifier_of(loaded: LoadedModel) -> nn.Module:
    """The sequence classifier `loaded` holds (the model with a `problem_type`), else an error saying to fine-tune."""
    if getattr(loaded.model, "problem_type", None) is None:
        raise BertforgeError(f"{loaded.name} is a {type(loaded.model).__name__} without a classification head; "
                             "fine-tune it first (`bertforge finetune`) and use the fine-tuned model")
    return loaded.model


def prediction_rows(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings | None = None) -> Predictions:
    """One dict per input text: the label and its probability, all probabilities (or the regression value)."""
    from bertforge.inference import Predictions

    classifier = classifier_of(loaded)
    logits, truncated = classifier_logits(loaded, split, settings)
    rows: list[dict[str, Any]] = []
    names = classifier.label_names or [f"LABEL_{i}" for i in range(classifier.num_labels)]
    probabilities = torch.softmax(logits, dim=-1) if classifier.problem_type == "classification" else None
    for index, text in enumerate(split.texts):
        row: dict[str, Any] = {"text": text}
        if split.text_pairs is not None:
            row["text_pair"] = split.text_pairs[index]
        if probabilities is None:
            row["score"] = float(logits[index, 0])
        else:
            best = int(probabilities[index].argmax())
            row["label"] = names[best]
            row["label_id"] = best
            row["score"] = float(probabilities[index, best])
            row["probabilities"] = {name: float(p) for name, p in zip(names, probabilities[index], strict=True)}
        rows.append(row)
    return Predictions(rows, truncated)


def classifier_logits(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings | None = None,
                      ) -> tuple[torch.Tensor, int]:
    """[texts, outputs] logits of the classifier `loaded` holds, in the split's order, through the inference
    engine; and how many inputs were truncated at the model's length."""
    from bertforge import engine
    from bertforge.backends import backend_for

    classifier = classifier_of(loaded)
    inputs = split.texts if split.text_pairs is None else list(zip(split.texts, split.text_pairs, strict=True))
    settings = settings or engine.EngineSettings()
    backend = backend_for(settings.backend, classifier, loaded.tokenizer(), loaded.max_length,
                          lambda output: output.logits)
    done = engine.run(inputs, engine.text_workload(loaded.tokenizer(), loaded.max_length, engine.rows_of), backend,
                      settings)
    return torch.stack(done.results) if done.results else torch.zeros(0, classifier.num_labels), done.truncated


def evaluate_file(loaded: LoadedModel, data: str | Path, *, split: str = "evaluation", text_column: str = "text",
                  text_pair_column: str | None = None, label_column: str = "label",
                  label_map: dict[str, str] | None = None, delimiter: str | None = None,
                  settings: EngineSettings | None = None) -> EvaluationReport:
    """Read a labeled file against the model's own labels (an unknown label is an error naming its line)."""
    from bertforge.locate import resolve_data_file

    classifier = classifier_of(loaded)
    task_type = classifier.problem_type
    labels = None
    if task_type == "classification":
        names = classifier.label_names or [str(i) for i in range(classifier.num_labels)]
        labels = LabelSet(names, origin=f"the model's labels ({loaded.name})")
    labeled = read_labeled_split(resolve_data_file(str(data)) or str(data), task_type=task_type, labels=labels,
                                 columns=Columns(text_column, text_pair_column, label_column), label_map=label_map,
                                 delimiter=delimiter, split=split, cli_flags=True)
    logits, _ = classifier_logits(loaded, labeled, settings)
    labels = torch.tensor(labeled.labels, dtype=torch.float32 if task_type == "regression" else torch.long)
    return report_of_logits(logits, labels, split, labeled.source, task_type, labeled.label_names, labeled.groups,
                            labeled.group_column)
