"""Text pairs for sentence-embedding fine-tuning, read strictly and tokenized once, batched unpadded.

Two shapes of rows (`finetune.embedding.loss`):

* mnrl: an anchor (`finetune.text_column`), its positive (`finetune.text_pair_column`) and an
  optional hard negative (`finetune.embedding.negative_column`), as sentence-transformers' (anchor, positive,
  negative) datasets;
* cosine: two texts and a similarity score (`finetune.label_column`), as STS-B.

Rows come from the same strict readers as classification data (`data.records`): a missing column,
an empty text or a non-numeric score stops with `file:line`. Each text is tokenized on its own
(`[CLS] text [SEP]`, no padding) into one flat array per column; a micro-batch is one unpadded
batch of every text it holds, in blocks by role — all anchors, then all positives, then the
negatives — so one forward pass embeds them all and the loss slices the embeddings by block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bertforge.batch import unpadded_inputs
from bertforge.data.labeled import TOKENIZE_CHUNK, bert_tokenizer
from bertforge.data.labels import _check_columns, _regression_target, _text, setting_name
from bertforge.data.records import read_records
from bertforge.errors import ConfigError, DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from bertforge.config import FinetuneSection


@dataclass(frozen=True)
class PairColumns:
    anchor: str = "text"
    positive: str = "text_pair"
    negative: str | None = None  # mnrl: a hard negative per anchor
    score: str | None = None  # cosine: the target similarity


@dataclass
class PairSplit:
    """One split of text pairs: anchors[i] goes with positives[i] (and negatives[i], scores[i])."""

    source: str
    anchors: list[str]
    positives: list[str]
    negatives: list[str] | None = None
    scores: list[float] | None = None

    def __len__(self) -> int:
        return len(self.anchors)


def read_pair_split(source: str | Path, columns: PairColumns, *, delimiter: str | None = None, split: str = "train",
                    cli_flags: bool = False) -> PairSplit:
    """Read and check one split of pairs (scored when `columns.score` is set)."""
    needed = {"text_column": columns.anchor, "text_pair_column": columns.positive}
    if columns.negative is not None:
        needed["negative_column"] = columns.negative
    if columns.score is not None:
        needed["label_column"] = columns.score
    records = read_records(source, split=split, delimiter=delimiter, columns=list(needed.values()))
    _check_columns(records, needed, cli_flags)
    values: dict[str, list[Any]] = {key: [] for key in needed}
    for number, row in records.rows:
        where = records.where(number)
        for key, column in needed.items():
            if column not in row:
                raise DataError(f"{where}: the row has no field {column!r}; add it ({setting_name(key, cli_flags)})")
            read = _regression_target if key == "label_column" else _text
            values[key].append(read(row[column], column, where))
    if not values["text_column"]:
        raise DataError(f"{records.source}: no rows; the {split} split needs at least one pair")
    return PairSplit(records.source, values["text_column"], values["text_pair_column"],
                     values.get("negative_column"), values.get("label_column"))


@dataclass
class PairData:
    train: PairSplit
    validation: PairSplit | None
    test: PairSplit | None


def pair_columns(section: FinetuneSection) -> PairColumns:
    """The columns `finetune.*` names for its `embedding.loss`."""
    settings = section.embedding
    if section.text_pair_column is None:
        what = "positive" if settings.loss == "mnrl" else "second"
        raise ConfigError(f"embedding fine-tuning reads pairs: set finetune.text_pair_column to the column of the "
                          f"{what} text (finetune.text_column holds the {'anchor' if what == 'positive' else 'first'})")
    if settings.loss == "cosine":
        if settings.negative_column is not None:
            raise ConfigError("finetune.embedding.negative_column is for embedding.loss=mnrl; the cosine loss scores "
                              "pairs (finetune.label_column); remove it or set finetune.embedding.loss=mnrl")
        return PairColumns(section.text_column, section.text_pair_column, score=section.label_column)
    return PairColumns(section.text_column, section.text_pair_column, negative=settings.negative_column)


def load_pair_data(section: FinetuneSection) -> PairData:
    """The train split (required) and the optional validation and test splits of `finetune.*`."""
    if not section.train_file:
        raise ConfigError("finetune.train_file is not set; give a csv/tsv/jsonl/parquet file of text pairs")
    columns = pair_columns(section)

    def read(source: str | None, split: str) -> PairSplit | None:
        if source is None:
            return None
        return read_pair_split(source, columns, delimiter=section.delimiter, split=split)

    train = read(section.train_file, "train")
    assert train is not None
    return PairData(train, read(section.validation_file, "validation"), read(section.test_file, "test"))


# ---------------------------------------------------------------------------------------------
# tokenized once, batched unpadded


class TokenizedTexts:
    """Texts tokenized one by one (`[CLS] text [SEP]`, truncated to `max_length`), in one flat array."""

    def __init__(self, texts: Sequence[str], tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        configured = bert_tokenizer(tokenizer, max_length)
        pieces: list[np.ndarray] = []
        for start in range(0, len(texts), TOKENIZE_CHUNK):
            pieces += [np.asarray(e.ids, dtype=np.int32) for e in configured.encode_batch(texts[start:start + TOKENIZE_CHUNK])]
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        self.offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.token_ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.token_ids[self.offsets[index]:self.offsets[index + 1]]

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])


def texts_batch(sequences: Sequence[np.ndarray]) -> dict[str, Any]:
    """The unpadded batch (`bertforge.batch`) of single texts, in the order given."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    ids = np.concatenate(sequences) if len(sequences) else np.zeros(0, dtype=np.int64)
    arrays = unpadded_inputs(ids, np.zeros(len(ids), dtype=np.int64), lengths)
    batch: dict[str, Any] = {key: torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray)
                             else value for key, value in arrays.items()}
    return batch


class PairDataset(torch.utils.data.Dataset):
    """A tokenized `PairSplit`: item i is the token ids of its texts (anchor, positive[, negative]) and score."""

    def __init__(self, split: PairSplit, tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        self.source = split.source
        columns = [split.anchors, split.positives] + ([split.negatives] if split.negatives is not None else [])
        self.columns = [TokenizedTexts(texts, tokenizer, max_length) for texts in columns]
        self.scores = np.asarray(split.scores, dtype=np.float32) if split.scores is not None else None

    def __len__(self) -> int:
        return len(self.columns[0])

    @property
    def num_tokens(self) -> int:
        return sum(column.num_tokens for column in self.columns)

    def __getitem__(self, index: int) -> dict[str, Any]:
        example: dict[str, Any] = {"texts": [column[index] for column in self.columns]}
        if self.scores is not None:
            example["score"] = float(self.scores[index])
        return example


def collate_pairs(examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One unpadded batch of every text of the examples, by role: anchors, positives, then negatives.

    `texts_per_example` says how many blocks of `num_samples` embeddings the model returns; `labels`
    holds the scores of scored pairs."""
    roles = len(examples[0]["texts"])
    batch = texts_batch([example["texts"][role] for role in range(roles) for example in examples])
    batch["num_samples"] = len(examples)
    batch["texts_per_example"] = roles
    if "score" in examples[0]:
        batch["labels"] = torch.tensor([example["score"] for example in examples], dtype=torch.float32)
    return batch

