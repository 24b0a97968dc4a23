"""A user's own task for `bertforge train --task examples/tasks/bag_of_words.py:BagOfWordsSupersense`.

It shows the whole white-box API on the bundled WordNet supersense data: a hashed bag-of-words
classifier (no BERT at all — the trainer knows nothing about BERT). Run it with:

    bertforge train --task examples/tasks/bag_of_words.py:BagOfWordsSupersense \
        examples/tasks/bag_of_words.yaml
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable

import torch
from torch import nn

from bertforge.data.bundled import supersense_lines
from bertforge.train.task import Batch, Task, TaskData

BUCKETS = 8192
WORD = re.compile(r"[a-z]+")


def hashed_words(text: str) -> list[int]:
    return [zlib.crc32(word.encode()) % BUCKETS for word in WORD.findall(text.lower())] or [0]


def read_split(split: str, limit: int) -> list[dict[str, str]]:
    """`limit` evenly spaced rows: the files list synsets grouped by part of speech."""
    return [json.loads(line) for line in supersense_lines(split, limit)]


class BagOfWordsModel(nn.Module):
    def __init__(self, num_labels: int, width: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(BUCKETS, width, mode="mean")
        self.dropout = nn.Dropout(dropout)
        self.classify = nn.Linear(width, num_labels)

    def forward(self, words: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.classify(self.dropout(self.embed(words, offsets)))


class BagOfWordsSupersense(Task):
    """Classify WordNet glosses into their 45 supersenses from hashed words."""

    train_rows = 4096
    validation_rows = 512
    width = 64
    dropout = 0.1

    def build_datasets(self) -> TaskData:
        train = read_split("train", self.train_rows)
        self.labels = sorted({row["label"] for row in train})
        label_ids = {label: index for index, label in enumerate(self.labels)}

        def encode(rows: list[dict[str, str]]) -> list[tuple[list[int], int]]:
            return [(hashed_words(row["text"]), label_ids.get(row["label"], 0)) for row in rows]

        return TaskData(train=encode(train), collate=collate,
                        validation=encode(read_split("validation", self.validation_rows)))

    def build_model(self) -> nn.Module:
        return BagOfWordsModel(num_labels=len(self.labels), width=self.width, dropout=self.dropout)

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        logits = model(batch["words"], batch["offsets"])
        loss = nn.functional.cross_entropy(logits, batch["labels"])
        return loss, {"accuracy": float((logits.argmax(-1) == batch["labels"]).float().mean())}

    def tokens_in_batch(self, batch: Batch) -> int:
        return int(batch["words"].numel())

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        correct = total = 0
        loss_sum = 0.0
        for batch in batches:
            logits = model(batch["words"], batch["offsets"])
            loss_sum += float(nn.functional.cross_entropy(logits, batch["labels"], reduction="sum"))
            correct += int((logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
        return {"loss": loss_sum / total, "accuracy": correct / total}


def collate(examples: list[tuple[list[int], int]]) -> Batch:
    lengths = torch.tensor([len(words) for words, _ in examples])
    return {"words": torch.tensor([w for words, _ in examples for w in words]),
            "offsets": torch.cumsum(lengths, 0) - lengths,
            "labels": torch.tensor([label for _, label in examples]),
            "num_samples": len(examples)}
