"""Inference with a trained model: predict, evaluate, fill-mask — batched and unpadded.

The same unpadded path as training: examples are tokenized once (`LabeledDataset`), batched by
`collate_unpadded` and run through the packed encoder, so a batch of short texts costs its real
tokens only. Any `MODEL` shape `bertforge.locate` understands works (run directory, final/,
checkpoint, bertforge or Hugging Face directory). Outputs, metrics and the evaluation report come
from `bertforge.tasks.evaluation`, which the fine-tuning task's final test evaluation uses too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from bertforge.console import log
from bertforge.data.labeled import LabeledDataset
from bertforge.data.labels import Columns, LabeledSplit, LabelSet, read_labeled_split
from bertforge.errors import BertforgeError, DataError, first_line
from bertforge.locate import ModelLocation, resolve_model, tokenizer_dir_for
from bertforge.models.serialization import CORRUPT_FILE_MARKS, DAMAGED_WEIGHTS_ERRORS
from bertforge.tasks.evaluation import (
    DEFAULT_BATCH_SIZE,
    EvaluationReport,
    batches_of,
    evaluate_dataset,
    outputs_of,
)

if TYPE_CHECKING:
    from bertforge.config import FinetuneSection
    from bertforge.tasks.kinds import TaskKind

DEFAULT_MAX_LENGTH = 512
DEFAULT_ID_COLUMN = "id"  # carried into predict's rows when the input has it and --id-column is not given


# ---------------------------------------------------------------------------------------------
# loading


@dataclass
class LoadedModel:
    model: nn.Module  # a bertforge model in eval mode
    location: ModelLocation
    tokenizer_dir: Path | None
    max_length: int  # tokens per example: the fine-tuning run's finetune.max_length, else the model's limit
    run_settings: FinetuneSection | None = None  # the finetune section of the run the model belongs to, if any

    @property
    def name(self) -> str:
        return str(self.location.path)

    def tokenizer(self) -> Path:
        if self.tokenizer_dir is None:
            raise BertforgeError(f"no tokenizer found for {self.name}: it has no tokenizer.json/vocab.txt and no run "
                                 "directory naming one; copy the tokenizer files into the model directory")
        return self.tokenizer_dir

    def classifier(self) -> nn.Module:
        """The sequence classifier this is (the model with a `problem_type`), else an error saying to fine-tune."""
        if getattr(self.model, "problem_type", None) is None:
            raise BertforgeError(f"{self.name} is a {type(self.model).__name__} without a classification head; "
                                 "fine-tune it first (`bertforge finetune`) and use the fine-tuned model")
        return self.model


def kind_of_loaded(loaded: LoadedModel) -> TaskKind:
    """The task kind whose model `loaded` holds (`bertforge.tasks.kinds`); a model without a fine-tuned head
    (a bare encoder, a pre-training model) is an error saying to fine-tune it first."""
    from bertforge.tasks.kinds import KINDS

    found = next((kind for kind in KINDS if kind.model_of(loaded) is not None), None)
    if found is None:
        raise BertforgeError(f"{loaded.name} is a {type(loaded.model).__name__} without a classification head; "
                             "fine-tune it first (`bertforge finetune`) and use the fine-tuned model")
    return found


def load_model(reference: str | Path) -> LoadedModel:
    """Load any model `bertforge.locate` understands, on the CPU, in eval mode."""
    import bertforge.tasks.kinds  # noqa: F401  (every kind's model class, so a directory holding one loads)
    from bertforge.models.loading import load_model_directory

    location = resolve_model(reference)
    try:
        model = load_model_directory(location.path)
    except DAMAGED_WEIGHTS_ERRORS as error:
        if isinstance(error, RuntimeError | ValueError) and not any(
                mark in str(error) for mark in CORRUPT_FILE_MARKS):
            raise  # not a damaged file: a bug to report, not the user's to fix
        raise BertforgeError(f"{location.path}: the model's weights cannot be read ({first_line(error)}); the file is "
                             "truncated or corrupt: copy or export the model again") from None
    model.eval()
    limit = model.config.max_sequence_length if model.config.position == "learned" else DEFAULT_MAX_LENGTH
    max_length = min(DEFAULT_MAX_LENGTH, limit)
    run_settings = None
    if location.run_dir is not None:
        from bertforge.run_directory import RunDirectory

        run_settings = RunDirectory(location.run_dir).load_config().finetune
        max_length = min(run_settings.max_length, limit)
    return LoadedModel(model, location, tokenizer_dir_for(location), max_length, run_settings)


# ---------------------------------------------------------------------------------------------
# predict


def read_inputs(source: str | Path, *, text_column: str = "text", text_pair_column: str | None = None,
                delimiter: str | None = None) -> LabeledSplit:
    """Texts to predict on, from a .txt file or any file `bertforge.data.records` reads (labels are ignored)."""
    return read_prediction_inputs(source, text_column=text_column, text_pair_column=text_pair_column,
                                  delimiter=delimiter).split


@dataclass
class PredictionInputs:
    """What `predict` runs on: the texts (and pairs), and each text's id when the input has an id column."""

    split: LabeledSplit  # read without labels
    ids: list[Any] | None


def texts_given(texts: Sequence[str], text_pairs: Sequence[str] | None = None,
                source: str = "the command line") -> PredictionInputs:
    """Texts given directly (`predict --text`), with their second texts for a pair model."""
    for number, text in enumerate([*texts, *(text_pairs or [])], start=1):
        if not text.strip():
            raise BertforgeError(f"{source}: text {number} is empty; give each --text / --text-pair some words")
    pairs = list(text_pairs) if text_pairs is not None else None
    return PredictionInputs(LabeledSplit(source, "classification", list(texts), pairs, None, []), None)


def read_prediction_inputs(source: str | Path, *, text_column: str = "text", text_pair_column: str | None = None,
                           id_column: str | None = None, delimiter: str | None = None) -> PredictionInputs:
    """A `.txt` file (one text per line, as `embed` reads it) or the text column(s) of a csv/tsv/jsonl/parquet
    file, saved dataset or `bundled:` split, with the `id_column` of each row (None: `id`, when there is one)."""
    from bertforge.data.labels import _check_columns, _text
    from bertforge.data.records import read_records
    from bertforge.embed import read_texts
    from bertforge.locate import resolve_data_file

    path = resolve_data_file(str(source)) or str(source)
    if Path(path).suffix == ".txt":
        for flag, given in (("--text-pair-column", text_pair_column), ("--id-column", id_column)):
            if given is not None:
                raise BertforgeError(f"{source}: a .txt file is one text per line, with no column {given!r} "
                                     f"({flag}); give a csv/tsv/jsonl/parquet file with that column")
        return texts_given(read_texts(path), source=str(source))
    needed = {"text_column": text_column} | ({"text_pair_column": text_pair_column} if text_pair_column else {})
    records = read_records(path, split="input", delimiter=delimiter,
                           columns=[*needed.values(), id_column or DEFAULT_ID_COLUMN])
    if id_column is None and DEFAULT_ID_COLUMN in records.columns:
        id_column = DEFAULT_ID_COLUMN
    _check_columns(records, needed | ({"id_column": id_column} if id_column else {}), cli_flags=True)
    texts: list[str] = []
    pairs: list[str] | None = [] if text_pair_column else None
    ids: list[Any] | None = [] if id_column else None
    for number, row in records.rows:
        where = records.where(number)
        texts.append(_text(row.get(text_column), text_column, where))
        if pairs is not None:
            pairs.append(_text(row.get(text_pair_column), text_pair_column, where))  # type: ignore[arg-type]
        if ids is not None:
            ids.append(_row_id(row.get(id_column), id_column, where))  # type: ignore[arg-type]
    if not texts:
        raise DataError(f"{records.source}: no rows; give at least one text")
    return PredictionInputs(LabeledSplit(records.source, "classification", texts, pairs, None, []), ids)


def _row_id(value: Any, column: str, where: str) -> str | int:
    """An id as the input holds it: a string or an integer (5.0 from a pandas-written file is 5)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (isinstance(value, str) and value.strip()) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    shown = "missing" if value in (None, "") or isinstance(value, float) else f"{value!r}"
    raise DataError(f"{where}: the id in column {column!r} is {shown}; give every row a string or integer id, or "
                    "name another column with --id-column")


def with_ids(rows: list[dict[str, Any]], ids: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Each output row led by its input row's id (`predict --id-column`)."""
    if ids is None:
        return rows
    return [{"id": row_id} | row for row_id, row in zip(ids, rows, strict=True)]


def prediction_rows(loaded: LoadedModel, split: LabeledSplit, batch_size: int = DEFAULT_BATCH_SIZE) -> list[dict[str, Any]]:
    """One dict per input text: the label and its probability, all probabilities (or the regression value)."""
    classifier = loaded.classifier()
    dataset = LabeledDataset(split, loaded.tokenizer(), loaded.max_length)
    logits, _ = outputs_of(classifier, batches_of(dataset, batch_size))
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
    return rows


@torch.no_grad()
def entity_rows(loaded: LoadedModel, texts: Sequence[str], batch_size: int = DEFAULT_BATCH_SIZE) -> list[dict[str, Any]]:
    """One dict per text with its entities, each {entity_group, score, word, start, end} as
    `transformers.pipeline("token-classification", aggregation_strategy="first")` gives them.

    Words are the tokenizer's own (whitespace and punctuation split), each tagged by its first
    sub-word, as the model was trained; an entity's score is the mean of its words' probabilities.
    """
    from seqeval.metrics.sequence_labeling import get_entities

    from bertforge.batch import model_inputs
    from bertforge.data.aligned import collate_tagged, first_pieces
    from bertforge.data.labeled import bert_tokenizer

    model = loaded.model
    names = model.label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
    tokenizer = bert_tokenizer(loaded.tokenizer(), loaded.max_length)
    rows: list[dict[str, Any]] = []
    for begin in range(0, len(texts), batch_size):
        chunk = list(texts[begin:begin + batch_size])
        encodings = tokenizer.encode_batch(chunk)
        starts = [first_pieces(encoding.word_ids) for encoding in encodings]
        batch = collate_tagged([{"input_ids": np.asarray(encoding.ids, dtype=np.int32), "word_starts": first}
                                for encoding, first in zip(encodings, starts, strict=True)])
        probabilities = torch.softmax(model(**model_inputs(batch, extra=("rows",))).logits.float(), dim=-1)
        scores, tag_ids = probabilities.max(dim=-1)
        done = 0
        for text, encoding, first in zip(chunk, encodings, starts, strict=True):
            count = len(first)
            tags = [names[i] for i in tag_ids[done:done + count].tolist()]
            word_scores = scores[done:done + count].tolist()
            done += count
            spans = _word_spans(encoding.word_ids, encoding.offsets)
            entities = []
            for kind, first_word, last_word in get_entities(tags):
                start, end = spans[first_word][0], spans[last_word][1]
                entities.append({"entity_group": kind, "score": float(np.mean(word_scores[first_word:last_word + 1])),
                                 "word": text[start:end], "start": start, "end": end})
            rows.append({"text": text, "entities": entities})
    return rows


def _word_spans(word_ids: Sequence[int | None], offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each word's (first character, end character) in the text, in word order."""
    spans: dict[int, tuple[int, int]] = {}
    for word, (start, end) in zip(word_ids, offsets, strict=True):
        if word is not None:
            spans[word] = (spans[word][0], end) if word in spans else (start, end)
    return [spans[word] for word in sorted(spans)]


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines under a staging name, then rename: never a half-written file."""
    from bertforge.output_guard import replace_file

    def write(staging: Path) -> None:
        with open(staging, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    return replace_file(Path(path), write)


# ---------------------------------------------------------------------------------------------
# evaluate


def evaluate_file(loaded: LoadedModel, data: str | Path, *, split: str = "evaluation", text_column: str = "text",
                  text_pair_column: str | None = None, label_column: str = "label",
                  label_map: dict[str, str] | None = None, delimiter: str | None = None,
                  batch_size: int = DEFAULT_BATCH_SIZE) -> EvaluationReport:
    """Read a labeled file against the model's own labels (an unknown label is an error naming its line)."""
    from bertforge.locate import resolve_data_file

    classifier = loaded.classifier()
    task_type = classifier.problem_type
    labels = None
    if task_type == "classification":
        names = classifier.label_names or [str(i) for i in range(classifier.num_labels)]
        labels = LabelSet(names, origin=f"the model's labels ({loaded.name})")
    labeled = read_labeled_split(resolve_data_file(str(data)) or str(data), task_type=task_type, labels=labels,
                                 columns=Columns(text_column, text_pair_column, label_column), label_map=label_map,
                                 delimiter=delimiter, split=split, cli_flags=True)
    dataset = LabeledDataset(labeled, loaded.tokenizer(), loaded.max_length)
    return evaluate_dataset(classifier, dataset, split, batch_size)


def evaluate_tagged_file(loaded: LoadedModel, data: str | Path, *, split: str = "evaluation",
                         tokens_column: str = "tokens", tags_column: str = "tags",
                         batch_size: int = DEFAULT_BATCH_SIZE) -> EvaluationReport:
    """A token classifier on a tagged file read against the model's own tags (an unknown tag names its line)."""
    from bertforge.data.aligned import TaggedDataset
    from bertforge.data.tagged import read_tagged_split
    from bertforge.locate import resolve_data_file
    from bertforge.tasks.tagging import evaluate_tagged

    model = loaded.model
    names = model.label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
    tagged = read_tagged_split(resolve_data_file(str(data)) or str(data), names, tokens_column=tokens_column,
                               tags_column=tags_column, origin=f"the model's tags ({loaded.name})",
                               cli_flags=True)
    dataset = TaggedDataset(tagged, loaded.tokenizer(), loaded.max_length)
    return evaluate_tagged(model, dataset, split, batch_size)


def evaluate_pairs_file(loaded: LoadedModel, embedder: nn.Module, data: str | Path, *, split: str = "evaluation",
                        text_column: str = "text", text_pair_column: str | None = None,
                        negative_column: str | None = None, metric: str = "retrieval", label_column: str = "label",
                        delimiter: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE) -> EvaluationReport:
    """An embedding model on pairs: retrieval metrics, or (metric cosine) the correlation of cos(a, b) with scores."""
    from bertforge.data.pairs import PairColumns, read_pair_split
    from bertforge.locate import resolve_data_file
    from bertforge.tasks.embedding import evaluate_pairs

    if text_pair_column is None:
        raise BertforgeError(f"{loaded.name} is an embedding model: it is scored on pairs; give --text-pair-column "
                             "(the text relevant to --text-column's)")
    columns = PairColumns(text_column, text_pair_column, negative=negative_column if metric == "retrieval" else None,
                          score=label_column if metric == "cosine" else None)
    pairs = read_pair_split(resolve_data_file(str(data)) or str(data), columns, delimiter=delimiter, split=split,
                            cli_flags=True)
    from bertforge.config import FinetuneSection

    # the reported loss is MNRL at the run's similarity_scale (sentence-transformers' 20 for other models)
    settings = (loaded.run_settings or FinetuneSection()).embedding
    loss = "mnrl" if metric == "retrieval" else "cosine"
    return evaluate_pairs(embedder, pairs, loaded.tokenizer(), loaded.max_length, split, loss,
                          settings.similarity_scale, batch_size)


# ---------------------------------------------------------------------------------------------
# fill-mask


MASK_SPELLINGS = ("[MASK]", "<mask>")  # BERT's and RoBERTa's: fill-mask takes either for the model's own


@dataclass(frozen=True)
class MaskPrediction:
    """One candidate for one [MASK], shaped like a `transformers` fill-mask pipeline result."""

    score: float
    token: int
    token_str: str
    sequence: str


@torch.no_grad()
def fill_mask(loaded: LoadedModel, text: str, top_k: int = 5) -> list[list[MaskPrediction]]:
    """The `top_k` most likely tokens for each [MASK] in `text` (one list per mask, left to right)."""
    from bertforge.data.labeled import bert_tokenizer
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.models import BertforgeForPreTraining

    model = loaded.model
    if not isinstance(model, BertforgeForPreTraining):
        raise BertforgeError(f"{loaded.name} is a {type(model).__name__} without a masked-language-model head; "
                             "fill-mask needs a pre-trained model (a `bertforge pretrain` run or an HF *ForMaskedLM)")
    if top_k < 1:
        raise BertforgeError(f"--top-k is {top_k}; give at least 1")
    special = load_tokenizer(loaded.tokenizer())
    tokenizer = bert_tokenizer(loaded.tokenizer(), loaded.max_length)
    mask_token = special.special_tokens["mask"]
    for spelling in MASK_SPELLINGS:  # BERT's [MASK] written for a RoBERTa model, or the other way round
        if spelling != mask_token and special.tokenizer.token_to_id(spelling) is None:
            text = text.replace(spelling, mask_token)
    encoding = tokenizer.encode(text)
    ids = torch.tensor(encoding.ids, dtype=torch.long)
    masked_positions = (ids == special.mask_id).nonzero().flatten()
    written = text.count(mask_token)
    if written > masked_positions.numel():  # truncation to the model's length cut them off
        cut = written - masked_positions.numel()
        message = (f"{cut} of the {written} {mask_token} tokens lie beyond the model's limit of {loaded.max_length} "
                   "tokens and were cut off; shorten the text before them")
        if masked_positions.numel() == 0:
            raise BertforgeError(message)
        log.warning(message)
    if masked_positions.numel() == 0:
        raise BertforgeError(f"the text has no {mask_token} token to fill; write e.g. \"the {mask_token} of the law\"")
    output = model(input_ids=ids, token_type_ids=torch.tensor(encoding.type_ids, dtype=torch.long),
                   masked_positions=masked_positions)
    probabilities = torch.softmax(output.mlm_logits.float(), dim=-1)
    k = min(top_k, probabilities.shape[-1])
    results = []
    for row, position in enumerate(masked_positions.tolist()):
        scores, candidates = probabilities[row].topk(k)
        predictions = []
        for score, token in zip(scores.tolist(), candidates.tolist(), strict=True):
            filled = ids.clone()
            filled[position] = token
            sequence = tokenizer.decode(filled.tolist(), skip_special_tokens=masked_positions.numel() == 1)
            token_str = tokenizer.decode([token], skip_special_tokens=False)
            predictions.append(MaskPrediction(score, token, token_str, sequence))
        results.append(predictions)
    return results
