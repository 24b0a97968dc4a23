"""Inference with a trained model: loading it, reading what to run it on, writing rows; fill-mask.

What a model of each task kind predicts and how it is evaluated on a file live in that kind's own
module (`tasks/classify.py`, `tasks/tagging.py`, `tasks/embedding.py`, `tasks/multiple_choice.py`),
reached through its record (`bertforge.tasks.kinds`); they run their inputs through the inference engine
(`bertforge.engine`: length-sorted token-budget unpadded batches, results in input order).
Any `MODEL` shape `bertforge.locate` understands works (run directory, final/, checkpoint, bertforge
or Hugging Face directory).
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
from bertforge.data.labels import LabeledSplit
from bertforge.errors import BertforgeError, DataError, first_line
from bertforge.locate import ModelLocation, resolve_model, tokenizer_dir_for
from bertforge.models.serialization import CORRUPT_FILE_MARKS, DAMAGED_WEIGHTS_ERRORS

if TYPE_CHECKING:
    from bertforge.config import FinetuneSection
    from bertforge.engine import EngineSettings
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
    from bertforge.models.init import weights_from_checkpoint
    from bertforge.models.loading import load_model_directory

    location = resolve_model(reference)
    try:
        with weights_from_checkpoint():
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
    return PredictionInputs(LabeledSplit.unlabeled(source, texts, text_pairs), None)


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
    return PredictionInputs(LabeledSplit.unlabeled(records.source, texts, pairs), ids)


def _row_id(value: Any, column: str, where: str) -> str | int:
    """An id as the input holds it: a string or an integer (5.0 from a pandas-written file is 5)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if (isinstance(value, str) and value.strip()) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    shown = "missing" if value in (None, "") or isinstance(value, float) else f"{value!r}"
    raise DataError(f"{where}: the id in column {column!r} is {shown}; give every row a string or integer id, or "
                    "name another column with --id-column")


@dataclass
class Predictions:
    """What a kind's `predict` gives: one row per input, in input order, and how many inputs were truncated."""

    rows: list[dict[str, Any]]
    truncated: int


def with_ids(rows: list[dict[str, Any]], ids: Sequence[Any] | None) -> list[dict[str, Any]]:
    """Each output row led by its input row's id (`predict --id-column`)."""
    if ids is None:
        return rows
    return [{"id": row_id} | row for row_id, row in zip(ids, rows, strict=True)]


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Rows as JSON lines, or as a Parquet table when `path` ends in .parquet (the same columns; nested
    values such as the probabilities or the entities become structs and lists); never a half-written file."""
    if Path(path).suffix == ".parquet":
        return write_parquet(rows, path)
    return write_jsonl(rows, path)


def write_parquet(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertforge.output_guard import replace_file

    table = pa.Table.from_pylist(list(rows))
    return replace_file(Path(path), lambda staging: pq.write_table(table, staging))


def write_jsonl(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write rows as JSON lines under a staging name, then rename: never a half-written file."""
    from bertforge.output_guard import replace_file

    def write(staging: Path) -> None:
        with open(staging, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    return replace_file(Path(path), write)


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


def fill_mask(loaded: LoadedModel, text: str, top_k: int = 5) -> list[list[MaskPrediction]]:
    """The `top_k` most likely tokens for each [MASK] in `text` (one list per mask, left to right)."""
    return fill_masks(loaded, [text], top_k)[0]


def fill_masks(loaded: LoadedModel, texts: Sequence[str], top_k: int = 5,
               settings: EngineSettings | None = None) -> list[list[list[MaskPrediction]]]:
    """`fill_mask` of each text, through the inference engine: the MLM head runs only on the [MASK] rows."""
    from bertforge import engine
    from bertforge.data.labeled import bert_tokenizer, collate_unpadded
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.models import BertforgeForPreTraining

    model = loaded.model
    if not isinstance(model, BertforgeForPreTraining):
        raise BertforgeError(f"{loaded.name} is a {type(model).__name__} without a masked-language-model head; "
                             "fill-mask needs a pre-trained model (a `bertforge pretrain` run or an HF *ForMaskedLM)")
    if top_k < 1:
        raise BertforgeError(f"--top-k is {top_k}; give at least 1")
    special = load_tokenizer(loaded.tokenizer())
    mask_token = special.special_tokens["mask"]
    own = [_own_mask(text, mask_token, special.tokenizer) for text in texts]
    encode_texts = engine.text_encoder(loaded.tokenizer(), loaded.max_length)

    def encode(chunk: list[str]) -> list[dict[str, Any]]:
        examples = encode_texts(chunk)
        for text, example in zip(chunk, examples, strict=True):
            example["masked"] = np.flatnonzero(example["input_ids"] == special.mask_id)
            _check_masks(text, mask_token, int(example["masked"].size), loaded.max_length)
        return examples

    def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collate_unpadded(examples)
        starts = batch["cu_seqlens"][:-1].long()
        batch["masked_positions"] = torch.cat([start + torch.from_numpy(example["masked"])
                                               for start, example in zip(starts, examples, strict=True)])
        return batch

    def split(probabilities: torch.Tensor, examples: list[dict[str, Any]]) -> list[tuple[np.ndarray, torch.Tensor]]:
        """Each text's token ids and its masks' probabilities."""
        parts = probabilities.split([int(example["masked"].size) for example in examples])
        return [(example["input_ids"], part) for example, part in zip(examples, parts, strict=True)]

    workload = engine.Workload(encode=encode, tokens=engine.tokens_of, collate=collate, split=split,
                               size=len, truncated=engine.was_truncated)
    backend = engine.torch_backend(model, lambda output: torch.softmax(output.mlm_logits.float(), dim=-1),
                                   extra=("masked_positions",))
    done = engine.run(own, workload, backend, settings or engine.EngineSettings(label="filling masks"))
    tokenizer = bert_tokenizer(loaded.tokenizer(), loaded.max_length)  # for decoding
    return [_mask_predictions(tokenizer, ids, probabilities, special.mask_id, top_k) for ids, probabilities in done.results]


def _own_mask(text: str, mask_token: str, tokenizer: Any) -> str:
    """`text` with BERT's [MASK] written for a RoBERTa model (or the other way round) as the model's own."""
    for spelling in MASK_SPELLINGS:
        if spelling != mask_token and tokenizer.token_to_id(spelling) is None:
            text = text.replace(spelling, mask_token)
    return text


def _check_masks(text: str, mask_token: str, kept: int, max_length: int) -> None:
    """An error when the text has no mask the model sees; a warning when truncation cut some off."""
    written = text.count(mask_token)
    if written > kept:  # truncation to the model's length cut them off
        message = (f"{written - kept} of the {written} {mask_token} tokens lie beyond the model's limit of "
                   f"{max_length} tokens and were cut off; shorten the text before them")
        if kept == 0:
            raise BertforgeError(message)
        log.warning(message)
    if kept == 0:
        raise BertforgeError(f"the text has no {mask_token} token to fill; write e.g. \"the {mask_token} of the law\"")


def _mask_predictions(tokenizer: Any, input_ids: np.ndarray, probabilities: torch.Tensor, mask_id: int,
                      top_k: int) -> list[list[MaskPrediction]]:
    """The top-k candidates of each mask of one text, with the text they would make."""
    ids = torch.from_numpy(input_ids.astype(np.int64))
    masked_positions = (ids == mask_id).nonzero().flatten()
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
