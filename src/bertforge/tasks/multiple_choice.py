"""Multiple choice (`finetune.task_type: multiple_choice`): a context and N candidate answers, one right.

Each candidate is scored as the pair (context, choice) in the tokenizer's pair layout (`[CLS] context [SEP]
choice [SEP]`; RoBERTa's `<s> context </s></s> choice </s>`) by the encoder and a one-output sequence head
(`SequenceHead`: the family's pooling, its dropouts, a linear layer), and the softmax runs over one question's
candidates: the model of the encoder's family's stock `*ForMultipleChoice` class, which `final/` exports to
and which imports back as this model. Which class that is, and its head's weight names, is the family's
record (`models/families/`, its `head_keys`; the families table of docs/guide.md lists them): BERT's is
`BertForMultipleChoice`. Where `transformers` pads every question to [questions, choices, longest pair], the
pairs of a batch here are one unpadded sequence each, and a question may have any number of candidates
(`choice_counts`).

The kind's parts in one place: the reader (`finetune.text_column` the context, `finetune.multiple_choice.
choice_columns` the candidates: one list column, or one column per choice; `finetune.label_column` the right
one's index from 0), the dataset and collate, the model, the `Task`, and what `evaluate` / `predict` print.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batch import model_inputs, unpadded_inputs
from bertforge.console import log
from bertforge.data.labeled import bert_tokenizer
from bertforge.data.labels import _check_columns, _text
from bertforge.data.records import Records, describe_value, read_records
from bertforge.data.validation_subset import final_splits_with_validation
from bertforge.device import batch_on_device, model_device
from bertforge.errors import ConfigError, DataError
from bertforge.locate import resolve_model
from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel, pack_inputs
from bertforge.models.heads import SequenceHead
from bertforge.models.init import init_head
from bertforge.models.serialization import SavableModel
from bertforge.tasks.evaluation import EvaluationReport
from bertforge.tasks.finetune_base import FinetuneTask
from bertforge.train.map_style import iterate_once
from bertforge.train.task import Batch, TaskData

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from bertforge.config import FinetuneSection
    from bertforge.engine import EngineRun, EngineSettings
    from bertforge.inference import Predictions

TASK_TYPE = "multiple_choice"
LOSS_UNIT = "examples"
METRICS = ("accuracy", "loss")

# ---------------------------------------------------------------------------------------------
# data


@dataclass
class ChoiceSplit:
    """One split: each question's context, its candidate answers and (when labeled) the right one's index."""

    source: str
    contexts: list[str]
    choices: list[list[str]]
    labels: list[int] | None  # None: read without labels (prediction input)

    def __len__(self) -> int:
        return len(self.contexts)


@dataclass
class ChoiceData:
    train: ChoiceSplit
    validation: ChoiceSplit | None
    test: ChoiceSplit | None


def _choices_of(row: dict[str, Any], columns: Sequence[str], where: str) -> list[str]:
    """A row's candidates: the list in the one choice column, or one text per choice column."""
    if len(columns) > 1:
        return [_text(row.get(column), column, where) for column in columns]
    column = columns[0]
    value = row.get(column)
    if not isinstance(value, list | tuple) or len(value) < 2:
        raise DataError(f"{where}: column {column!r} holds {describe_value(value)}; give a list of two or more "
                        "candidate answers, or set finetune.multiple_choice.choice_columns to one column per choice")
    return [_text(choice, f"{column}[{index}]", where) for index, choice in enumerate(value)]


def _label_of(value: Any, count: int, column: str, where: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 2.0 from a pandas-written file
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)  # csv cells are text
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise DataError(f"{where}: the label in column {column!r} is {describe_value(value)}; give the index of the "
                        f"right choice, 0 to {count - 1}")
    return value


def read_choice_split(source: str | Path, *, context_column: str = "text", choice_columns: Sequence[str] = ("choices",),
                      label_column: str = "label", delimiter: str | None = None, split: str = "train",
                      with_labels: bool = True, cli_flags: bool = False) -> ChoiceSplit:
    """Read and check one split; every error names the file, the line and the setting to change."""
    needed = {"text_column": context_column} | ({"label_column": label_column} if with_labels else {})
    records = read_records(source, split=split, delimiter=delimiter, columns=[*needed.values(), *choice_columns])
    _check_columns(records, needed, cli_flags)
    _check_choice_columns(records, choice_columns)
    contexts: list[str] = []
    choices: list[list[str]] = []
    labels: list[int] = []
    for number, row in records.rows:
        where = records.where(number)
        contexts.append(_text(row.get(context_column), context_column, where))
        choices.append(_choices_of(row, choice_columns, where))  # type: ignore[arg-type]
        if with_labels:
            labels.append(_label_of(row.get(label_column), len(choices[-1]), label_column, where))
    if not contexts:
        raise DataError(f"{records.source}: no rows; the {split} split needs at least one question")
    return ChoiceSplit(records.source, contexts, choices, labels if with_labels else None)


def _check_choice_columns(records: Records, choice_columns: Sequence[str]) -> None:
    missing = [column for column in choice_columns if column not in records.columns]
    if missing:
        found = ", ".join(repr(c) for c in records.columns)
        raise DataError(f"{records.source}: no column {missing[0]!r} (columns found: {found}); set "
                        "finetune.multiple_choice.choice_columns to the column(s) holding the candidate answers")


def with_choices(source: str, contexts: list[str], choice_columns: Sequence[str],
                 delimiter: str | None = None) -> ChoiceSplit:
    """Prediction input: contexts already read from `source` (predict's reader), with their rows' candidates."""
    records = read_records(source, split="input", delimiter=delimiter, columns=list(choice_columns))
    _check_choice_columns(records, choice_columns)
    choices = [_choices_of(row, choice_columns, records.where(number)) for number, row in records.rows]  # type: ignore[arg-type]
    if len(choices) != len(contexts):
        raise DataError(f"{records.source}: {len(choices)} rows of candidates for {len(contexts)} contexts; the file "
                        "changed while it was read")
    return ChoiceSplit(records.source, contexts, choices, None)


def load_choice_data(section: FinetuneSection) -> ChoiceData:
    """The train/validation/test splits a `finetune:` section names."""
    if not section.train_file:
        raise ConfigError("finetune.train_file is not set; give a csv/tsv/jsonl/parquet file with a context column, "
                          "the candidate answers and the right one's index")
    read = functools.partial(read_choice_split, context_column=section.text_column,
                             choice_columns=section.multiple_choice.choice_columns, label_column=section.label_column,
                             delimiter=section.delimiter)
    return ChoiceData(read(section.train_file, split="train"),
                      read(section.validation_file, split="validation") if section.validation_file else None,
                      read(section.test_file, split="test") if section.test_file else None)


class ChoiceDataset(torch.utils.data.Dataset):
    """A tokenized split: every (context, choice) pair's tokens in one flat array; a question is a run of
    consecutive pairs (`first_pair`)."""

    def __init__(self, split: ChoiceSplit, tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        configured = bert_tokenizer(tokenizer, max_length)
        self.source = split.source
        pairs = [(context, choice) for context, choices in zip(split.contexts, split.choices, strict=True)
                 for choice in choices]
        encodings = configured.encode_batch(pairs)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.token_ids = np.concatenate([np.asarray(e.ids, dtype=np.int32) for e in encodings])
        self.token_type_ids = np.concatenate([np.asarray(e.type_ids, dtype=np.int8) for e in encodings])
        self.first_pair = np.concatenate([[0], np.cumsum([len(choices) for choices in split.choices])])
        self.labels = np.asarray(split.labels, dtype=np.int64) if split.labels is not None else None

    def __len__(self) -> int:
        return len(self.first_pair) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        pairs = range(self.first_pair[index], self.first_pair[index + 1])
        example: dict[str, Any] = {
            "input_ids": [self.token_ids[self.offsets[p]:self.offsets[p + 1]] for p in pairs],
            "token_type_ids": [self.token_type_ids[self.offsets[p]:self.offsets[p + 1]] for p in pairs]}
        if self.labels is not None:
            example["label"] = int(self.labels[index])
        return example


def collate_choices(examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every pair of the batch's questions as one unpadded sequence, and how many pairs each question has."""
    ids = [pair for example in examples for pair in example["input_ids"]]
    type_ids = [pair for example in examples for pair in example["token_type_ids"]]
    inputs = unpadded_inputs(np.concatenate(ids), np.concatenate(type_ids), np.array([len(p) for p in ids]))
    batch: dict[str, Any] = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                             for key, value in inputs.items()}
    batch |= {"choice_counts": torch.tensor([len(e["input_ids"]) for e in examples]), "num_samples": len(examples)}
    if "label" in examples[0]:
        batch["labels"] = torch.tensor([e["label"] for e in examples])
    return batch


# ---------------------------------------------------------------------------------------------
# model


@dataclass
class MultipleChoiceOutput:
    logits: torch.Tensor  # [questions, most choices]: one score per candidate, -inf past a question's own count
    loss_sum: torch.Tensor | None = None  # summed cross-entropy over the questions
    correct: torch.Tensor | None = None  # questions whose best-scored candidate is the right one


class BertforgeForMultipleChoice(SavableModel, nn.Module):
    """Encoder + a one-output sequence head per (context, choice) pair, softmax over each question's pairs."""

    head_kind = "multiple_choice"
    hf_suffixes = ("ForMultipleChoice",)

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.encoder = BertforgeModel(config)
        self.head = SequenceHead(config, 1, input_dropout=config.choice_input_dropout,
                                 dropout=config.choice_dropout_rate)
        init_head(self.head, config)

    def forward(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None,
                position_ids: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                choice_counts: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, num_samples: int | None = None) -> MultipleChoiceOutput:
        """Scores of the unpadded pairs, grouped by `choice_counts` (None: all pairs are one question's)."""
        packed = pack_inputs(input_ids, cu_seqlens, max_seqlen, position_ids, token_type_ids, attention_mask)
        hidden = self.encoder.encode(packed, self.head.input_rows(packed.cu_seqlens))
        scores = self.head(hidden, packed.cu_seqlens).squeeze(-1)
        pairs = scores.shape[0]
        counts = choice_counts if choice_counts is not None else torch.tensor([pairs], device=scores.device)
        question = torch.repeat_interleave(torch.arange(len(counts), device=scores.device), counts, output_size=pairs)
        starts = torch.cumsum(counts, 0) - counts
        position = torch.arange(pairs, device=scores.device) - starts[question]
        logits = scores.new_full((len(counts), int(counts.max())), float("-inf"))
        logits[question, position] = scores
        output = MultipleChoiceOutput(logits)
        if labels is not None:
            output.loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
            output.correct = (logits.argmax(dim=-1) == labels).sum()
        return output

    @classmethod
    def for_head(cls, config: EncoderConfig, **_: object) -> BertforgeForMultipleChoice:
        return cls(config)

    def pooler_module(self) -> nn.Module | None:
        return self.head.pooler

    def _copy_own_head(self, source: BertforgeForMultipleChoice) -> None:
        self.head.load_state_dict(source.head.state_dict())

    def head_arguments(self) -> dict[str, object]:
        return {}


# ---------------------------------------------------------------------------------------------
# the task


class MultipleChoiceTask(FinetuneTask):
    """Fine-tune a multiple-choice model on `finetune.*` files, from `model.init_from` or from scratch."""

    examples = "questions"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.data: ChoiceData | None = None

    def build_datasets(self) -> TaskData:
        section = self.config.finetune
        if self.data is None:
            self.data = load_choice_data(self._with_resolved_files())
        self._check_best_metric()
        tokenizer = self.tokenizer_dir()
        train = ChoiceDataset(self.data.train, tokenizer, section.max_length)
        if self.data.validation is not None:
            self.validation_rows = self.draw_validation(self.data.validation, self.data.validation.labels,
                                                        "right choice")
        validation = (ChoiceDataset(self.validation_rows, tokenizer, section.max_length)
                      if self.validation_rows is not None else None)
        pairs = int(train.first_pair[-1])
        log.info(f"multiple-choice data: {len(train):,} training questions ({pairs / len(train):.1f} choices, "
                 f"{train.num_tokens / pairs:.1f} tokens per pair on average, no padding), "
                 f"{len(validation) if validation else 0:,} validation")
        return TaskData(train=train, collate=collate_choices, validation=validation,
                        tokens_per_sample=train.num_tokens / len(train))

    def build_model(self) -> nn.Module:
        section = self.config.model
        if section.init_from:
            from bertforge.models.loading import load_for_task, runtime_overrides

            model = load_for_task(resolve_model(section.init_from).path, TASK_TYPE,
                                  config_overrides=runtime_overrides(section))
        else:
            from bertforge.models import encoder_config_from_section

            model = BertforgeForMultipleChoice(
                encoder_config_from_section(section, self.tokenizer_tokens()))
        self._check_model_fits_input(model)
        return model

    def loss_units(self, batch: Batch) -> dict[str, float]:
        return {LOSS_UNIT: float(batch["num_samples"])}

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        output = model(**model_inputs(batch, extra=("choice_counts",)), labels=batch["labels"])
        loss = output.loss_sum / batch["global_loss_units"][LOSS_UNIT]
        return loss, {"accuracy": float(output.correct) / batch["num_samples"]}

    def metric_names(self) -> set[str]:
        return set(METRICS)

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        logits, labels = choice_logits(model, batches)
        assert labels is not None
        return choice_metrics(logits, labels)

    def final_splits(self) -> dict[str, ChoiceSplit]:  # type: ignore[override]
        assert self.data is not None
        return final_splits_with_validation(self.data.test, self.data.validation, self.validation_rows)

    def evaluate_split(self, model: nn.Module, name: str, split: ChoiceSplit) -> EvaluationReport:
        dataset = ChoiceDataset(split, self.tokenizer_dir(), self.config.finetune.max_length)
        return evaluate_choices(model, dataset, name, self.config.train.micro_batch_size)


# ---------------------------------------------------------------------------------------------
# scoring: the task's evaluations, `bertforge evaluate` and `bertforge predict`


@torch.no_grad()
def choice_logits(model: nn.Module, batches: Iterable[Batch]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[questions, most choices] scores (-inf past a question's count), and the labels when batches have them."""
    device = model_device(model)
    logits: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    for batch in batches:
        inputs = batch_on_device(model_inputs(batch, extra=("choice_counts",)), device)
        logits.append(model(**inputs).logits.float().cpu())
        if "labels" in batch:
            labels.append(batch["labels"])
    widest = max(part.shape[1] for part in logits)
    logits = [F.pad(part, (0, widest - part.shape[1]), value=float("-inf")) for part in logits]
    return torch.cat(logits), (torch.cat(labels) if labels else None)


def choice_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    return {"accuracy": float((logits.argmax(dim=-1) == labels).float().mean()),
            "loss": float(F.cross_entropy(logits, labels))}


def evaluate_choices(model: nn.Module, dataset: ChoiceDataset, split: str, batch_size: int) -> EvaluationReport:
    logits, labels = choice_logits(model, iterate_once(dataset, collate_choices, batch_size))
    assert labels is not None
    metrics = choice_metrics(logits, labels) | {"examples": float(len(dataset))}
    return EvaluationReport(split, dataset.source, TASK_TYPE, [], metrics, [], None)


def choice_rows(model: nn.Module, split: ChoiceSplit, tokenizer: Path, max_length: int,
                settings: EngineSettings | None = None) -> Predictions:
    """One dict per question: the chosen candidate, its index and probability, and every candidate's."""
    from bertforge.inference import Predictions

    done = choice_scores(model, split, tokenizer, max_length, settings)
    rows = []
    for context, choices, logits in zip(split.contexts, split.choices, done.results, strict=True):
        probabilities = torch.softmax(logits, dim=-1)
        best = int(probabilities.argmax())
        rows.append({"text": context, "choice": choices[best], "choice_id": best,
                     "score": float(probabilities[best]),
                     "probabilities": [float(p) for p in probabilities]})
    return Predictions(rows, done.truncated)


def evaluate_choice_split(model: nn.Module, split: ChoiceSplit, tokenizer: Path, max_length: int, name: str,
                          settings: EngineSettings | None = None) -> EvaluationReport:
    """`bertforge evaluate`: accuracy and mean cross-entropy of the right choice, through the inference engine."""
    assert split.labels is not None
    scores = choice_scores(model, split, tokenizer, max_length, settings).results
    widest = max(len(row) for row in scores)
    logits = torch.stack([F.pad(row, (0, widest - len(row)), value=float("-inf")) for row in scores])
    metrics = choice_metrics(logits, torch.tensor(split.labels)) | {"examples": float(len(split))}
    return EvaluationReport(name, split.source, TASK_TYPE, [], metrics, [], None)


def choice_scores(model: nn.Module, split: ChoiceSplit, tokenizer: Path, max_length: int,
                  settings: EngineSettings | None = None) -> EngineRun:
    """Each question's candidates' scores, through the inference engine (a question and all its candidates in one
    batch, its cost their tokens together)."""
    from bertforge import engine
    from bertforge.backends import backend_for

    encode_pairs = engine.text_encoder(tokenizer, max_length)

    def encode(questions: list[tuple[str, list[str]]]) -> list[dict[str, Any]]:
        pairs = encode_pairs([(context, choice) for context, choices in questions for choice in choices])
        examples, first = [], 0
        for _, choices in questions:
            mine = pairs[first:first + len(choices)]
            first += len(choices)
            examples.append({"input_ids": [pair["input_ids"] for pair in mine],
                             "token_type_ids": [pair["token_type_ids"] for pair in mine],
                             "truncated": any(pair["truncated"] for pair in mine)})
        return examples

    def split_rows(logits: torch.Tensor, examples: list[dict[str, Any]]) -> list[torch.Tensor]:
        return [row[:len(example["input_ids"])] for row, example in zip(logits.float(), examples, strict=True)]

    workload = engine.Workload(encode=encode, tokens=lambda example: sum(len(ids) for ids in example["input_ids"]),
                               collate=collate_choices, split=split_rows,
                               size=lambda question: len(question[0]) + sum(len(choice) for choice in question[1]),
                               truncated=engine.was_truncated)
    settings = settings or engine.EngineSettings()
    backend = backend_for(settings.backend, model, tokenizer, max_length, lambda output: output.logits,
                          extra=("choice_counts",))
    return engine.run(list(zip(split.contexts, split.choices, strict=True)), workload, backend, settings)
