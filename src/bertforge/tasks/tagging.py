"""Token classification fine-tuning (`finetune.task_type: token_classification`): NER, supersense tagging.

A sibling of the other kinds on `FinetuneTask` (tokenizer and model reference resolution,
checkpoints as model directories, the final evaluation and export). Sentences come as words with one tag each (`data.tagged`: CoNLL files, jsonl, parquet, HF
datasets), each word is labeled on its first sub-word (`data.aligned`), and only those rows reach
the head. The loss is summed over labeled words and divided by the labeled words of the global
batch, so accumulation and data parallelism give the step one big batch would. Validation and
the final test report use `seqeval`'s entity-level precision/recall/F1 (`tasks.entity_metrics`);
`final/` is a `BertForTokenClassification` that `transformers.pipeline("token-classification")` runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batch import model_inputs
from bertforge.console import console, log
from bertforge.data.aligned import TaggedDataset, collate_tagged
from bertforge.data.tagged import TaggedData, TaggedSplit, load_tagged_data
from bertforge.data.validation_subset import final_splits_with_validation, rarest_entity_types
from bertforge.device import batch_on_device, model_device
from bertforge.locate import resolve_model
from bertforge.tasks.entity_metrics import ENTITY_METRICS, entity_metrics, per_type_report, tag_sequences
from bertforge.tasks.evaluation import EvaluationReport
from bertforge.tasks.finetune_base import FinetuneTask
from bertforge.train.map_style import iterate_once
from bertforge.train.task import Batch, TaskData

if TYPE_CHECKING:
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions

LOSS_UNIT = "labeled_words"
TASK_TYPE = "token_classification"


class TokenClassificationTask(FinetuneTask):
    """Fine-tune a token classifier on `finetune.*` tagged files, from `model.init_from` or from scratch."""

    examples = "sentences"

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config)
        self.tagged: TaggedData | None = None

    # --- data -----------------------------------------------------------------------------------

    def build_datasets(self) -> TaskData:
        section = self.config.finetune
        if self.tagged is None:
            self.tagged = load_tagged_data(self._with_resolved_files(), tokens_column=section.tagging.tokens_column,
                                           tags_column=section.tagging.tags_column)
        self._check_best_metric()
        tokenizer = self.tokenizer_dir()
        train = TaggedDataset(self.tagged.train, tokenizer, section.max_length)
        validation = self.tagged.validation
        if validation is not None:
            strata = rarest_entity_types(validation.tags, validation.tag_names) if validation.tags is not None else None
            validation = self.validation_rows = self.draw_validation(validation, strata, "entity type")
        validation_set = TaggedDataset(validation, tokenizer, section.max_length) if validation is not None else None
        for dataset in (train, validation_set):
            if dataset is not None and dataset.words_cut:
                log.warning(f"{dataset.source}: {dataset.words_cut:,} words lie beyond finetune.max_length="
                            f"{section.max_length} tokens and are neither trained on nor scored; raise "
                            "finetune.max_length to keep them")
        entity_types = sorted({name.split("-", 1)[1] for name in self.tagged.tag_names if name != "O"})
        log.info(f"token classification data: {len(train):,} training sentences ({len(train.word_starts):,} "
                 f"labeled words, {train.num_tokens / max(len(train), 1):.1f} tokens on average, no padding), "
                 f"{len(validation_set) if validation_set else 0:,} validation, {len(self.tagged.tag_names)} tags "
                 f"of {len(entity_types)} entity types")
        return TaskData(train=train, collate=collate_tagged, validation=validation_set,
                        tokens_per_sample=train.num_tokens / max(len(train), 1))

    @property
    def tag_names(self) -> list[str]:
        assert self.tagged is not None, "build_datasets() comes first"
        return self.tagged.tag_names

    # --- model ----------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        section = self.config.model
        if section.init_from:
            from bertforge.models.loading import load_for_task, runtime_overrides

            model = load_for_task(resolve_model(section.init_from).path, TASK_TYPE, label_names=self.tag_names,
                                  config_overrides=runtime_overrides(section))
        else:
            from bertforge.models import BertforgeForTokenClassification, encoder_config_from_section

            encoder = encoder_config_from_section(section, self.tokenizer_tokens())
            model = BertforgeForTokenClassification(encoder, len(self.tag_names), self.tag_names)
        self._check_model_fits_input(model)
        return model

    # --- training -------------------------------------------------------------------------------

    def loss_units(self, batch: Batch) -> dict[str, float]:
        return {LOSS_UNIT: float(batch["rows"].numel())}

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        output = model(**model_inputs(batch, extra=("rows",)), labels=batch["labels"])
        loss = output.loss_sum / batch["global_loss_units"][LOSS_UNIT]
        return loss, {"accuracy": float(output.correct) / max(batch["rows"].numel(), 1)}

    def metric_names(self) -> set[str]:
        return set(ENTITY_METRICS) | {"loss"}

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        gold, predicted, loss = predict_tags(model, batches, self.tag_names)
        return entity_metrics(gold, predicted) | {"loss": loss}

    # --- the end --------------------------------------------------------------------------------

    def final_splits(self) -> dict[str, TaggedSplit]:  # type: ignore[override]
        assert self.tagged is not None
        return final_splits_with_validation(self.tagged.test, self.tagged.validation, self.validation_rows)

    def evaluate_split(self, model: nn.Module, name: str, split: TaggedSplit) -> EvaluationReport:
        dataset = TaggedDataset(split, self.tokenizer_dir(), self.config.finetune.max_length)
        return evaluate_tagged(model, dataset, name, self.config.train.micro_batch_size)

    def show_report(self, report: EvaluationReport) -> None:
        if len(report.per_class) <= 12:
            from bertforge.tasks.metrics import per_class_table

            console.print(per_class_table(report.per_class, title=f"{report.split}: per entity type"))


@torch.no_grad()
def predict_tags(model: nn.Module, batches: Iterable[Batch], tag_names: list[str]
                 ) -> tuple[list[list[str]], list[list[str]], float]:
    """Gold and predicted tags per sentence (words within max_length), and the mean loss per labeled word."""
    device = model_device(model)
    predicted_ids: list[np.ndarray] = []
    gold_ids: list[np.ndarray] = []
    words: list[int] = []
    loss_sum, count = 0.0, 0
    for batch in batches:
        inputs = batch_on_device(model_inputs(batch, extra=("rows",)), device)
        labels = batch["labels"].to(device)
        output = model(**inputs, labels=labels)
        predicted_ids.append(output.logits.argmax(dim=-1).cpu().numpy())
        gold_ids.append(batch["labels"].numpy())
        words += batch["words_per_sample"]
        loss_sum, count = loss_sum + float(output.loss_sum), count + int(labels.numel())
    gold = tag_sequences(np.concatenate(gold_ids), words, tag_names)
    predicted = tag_sequences(np.concatenate(predicted_ids), words, tag_names)
    return gold, predicted, loss_sum / max(count, 1)


def evaluate_tagged(model: nn.Module, dataset: TaggedDataset, split: str, batch_size: int) -> EvaluationReport:
    """Entity metrics, loss and the per-type report of `model` on a tagged dataset."""
    gold, predicted, loss = predict_tags(model, iterate_once(dataset, collate_tagged, batch_size), dataset.tag_names)
    return tagged_report(gold, predicted, loss, dataset, split)


def tagged_report(gold: list[list[str]], predicted: list[list[str]], loss: float, dataset: TaggedDataset,
                  split: str) -> EvaluationReport:
    metrics = entity_metrics(gold, predicted) | {"loss": loss, "examples": float(len(dataset))}
    entity_types = sorted({name.split("-", 1)[1] for name in dataset.tag_names if name != "O"})
    return EvaluationReport(split, dataset.source, TASK_TYPE, entity_types, metrics, per_type_report(gold, predicted),
                            None)


# ---------------------------------------------------------------------------------------------
# a trained tagger on new text: `bertforge predict` and `bertforge evaluate`, through the kind's record


def entity_rows(loaded: LoadedModel, texts: Sequence[str], settings: EngineSettings | None = None) -> Predictions:
    """One dict per text with its entities, each {entity_group, score, word, start, end} as
    `transformers.pipeline("token-classification", aggregation_strategy="first")` gives them.

    Words are the tokenizer's own (whitespace and punctuation split), each tagged by its first
    sub-word, as the model was trained; an entity's score is the mean of its words' probabilities.
    """
    from seqeval.metrics.sequence_labeling import get_entities

    from bertforge import engine
    from bertforge.backends import backend_for
    from bertforge.inference import Predictions

    model = loaded.model
    names = model.label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
    encode_texts = engine.text_encoder(loaded.tokenizer(), loaded.max_length)

    def encode(chunk: list[str]) -> list[dict[str, Any]]:
        from bertforge.data.aligned import first_pieces

        return [example | {"word_starts": first_pieces(example["encoding"].word_ids)} for example in encode_texts(chunk)]

    def split(probabilities: torch.Tensor, examples: list[dict[str, Any]]) -> list[tuple[Any, list[float], list[int]]]:
        """Each text's encoding (its words and offsets), and its words' best tags with their probabilities."""
        scores, tag_ids = probabilities.max(dim=-1)
        counts = [len(example["word_starts"]) for example in examples]
        return list(zip((example["encoding"] for example in examples), (part.tolist() for part in scores.split(counts)),
                        (part.tolist() for part in tag_ids.split(counts)), strict=True))

    workload = engine.Workload(encode=encode, tokens=engine.tokens_of, collate=collate_tagged, split=split,
                               size=len, truncated=engine.was_truncated)
    settings = settings or engine.EngineSettings()
    backend = backend_for(settings.backend, model, loaded.tokenizer(), loaded.max_length,
                          lambda output: torch.softmax(output.logits.float(), dim=-1), extra=("rows",))
    done = engine.run(texts, workload, backend, settings)
    rows: list[dict[str, Any]] = []
    for text, (encoding, word_scores, ids) in zip(texts, done.results, strict=True):
        tags = [names[i] for i in ids]
        spans = _word_spans(encoding.word_ids, encoding.offsets)
        entities = []
        for kind, first_word, last_word in get_entities(tags):
            start, end = spans[first_word][0], spans[last_word][1]
            entities.append({"entity_group": kind, "score": float(np.mean(word_scores[first_word:last_word + 1])),
                             "word": text[start:end], "start": start, "end": end})
        rows.append({"text": text, "entities": entities})
    return Predictions(rows, done.truncated)


def _word_spans(word_ids: Sequence[int | None], offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each word's (first character, end character) in the text, in word order."""
    spans: dict[int, tuple[int, int]] = {}
    for word, (start, end) in zip(word_ids, offsets, strict=True):
        if word is not None:
            spans[word] = (spans[word][0], end) if word in spans else (start, end)
    return [spans[word] for word in sorted(spans)]


def evaluate_tagged_file(loaded: LoadedModel, data: str | Path, *, split: str = "evaluation",
                         tokens_column: str = "tokens", tags_column: str = "tags",
                         settings: EngineSettings | None = None) -> EvaluationReport:
    """A token classifier on a tagged file read against the model's own tags (an unknown tag names its line),
    through the inference engine (the file's sentences are tokenized as training tokenized them, up front)."""
    from bertforge import engine
    from bertforge.backends import backend_for
    from bertforge.data.tagged import read_tagged_split
    from bertforge.locate import resolve_data_file
    from bertforge.models.token_classification import IGNORED_LABEL

    model = loaded.model
    names = model.label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
    tagged = read_tagged_split(resolve_data_file(str(data)) or str(data), names, tokens_column=tokens_column,
                               tags_column=tags_column, origin=f"the model's tags ({loaded.name})",
                               cli_flags=True)
    dataset = TaggedDataset(tagged, loaded.tokenizer(), loaded.max_length)

    def rows_per_sentence(logits: torch.Tensor, examples: list[dict[str, Any]]) -> list[torch.Tensor]:
        return list(logits.float().split([len(example["word_starts"]) for example in examples]))

    workload = engine.Workload(encode=lambda indices: [dataset[i] for i in indices], tokens=engine.tokens_of,
                               collate=collate_tagged, split=rows_per_sentence,
                               size=lambda index: int(dataset.offsets[index + 1] - dataset.offsets[index]))
    settings = settings or engine.EngineSettings(label="evaluating")
    backend = backend_for(settings.backend, model, loaded.tokenizer(), loaded.max_length,
                          lambda output: output.logits, extra=("rows",))
    done = engine.run(list(range(len(dataset))), workload, backend, settings)
    logits = torch.cat(done.results) if done.results else torch.zeros(0, len(names))
    gold_ids = torch.from_numpy(dataset.tags if dataset.tags is not None else np.zeros(0, dtype=np.int64))
    words = [dataset.words_of(index) for index in range(len(dataset))]
    loss = float(F.cross_entropy(logits, gold_ids, ignore_index=IGNORED_LABEL, reduction="sum")) / max(len(gold_ids), 1)
    gold = tag_sequences(gold_ids.numpy(), words, names)
    predicted = tag_sequences(logits.argmax(dim=-1).numpy(), words, names)
    return tagged_report(gold, predicted, loss, dataset, split)
