"""Tagged sentences as model batches: words tokenized once, each word's tag on its first sub-word.

The alignment is `run_ner.py`'s: a word split into several WordPiece tokens is labeled on its
first piece; the other pieces, [CLS] and [SEP] are not labeled. Unlike `run_ner.py` the unlabeled
tokens are not carried as -100 targets through a padded batch: the batch names the first pieces
(`rows`, indices into the unpadded tokens), and the model's last layer and head compute those rows
only (`models.token_classification`). Words cut off by `max_length` are not labeled, as in
`run_ner.py`; the dataset counts them so the task can say how many.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.progress import Progress

from bertforge.batch import unpadded_inputs
from bertforge.console import console, progress_enabled
from bertforge.data.labeled import TOKENIZE_CHUNK, bert_tokenizer, pad_token_id

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from bertforge.data.tagged import TaggedSplit


def words_tokenizer(configured: Tokenizer) -> Tokenizer:
    """`configured` for pre-split words. Byte-level BPE marks a word start by the space before it (`Ġword`),
    which a word handed over alone lacks: each would be encoded as a text's first word, unlike the running text
    the model was pre-trained and is asked to predict on. As transformers' run_ner does for RoBERTa
    (`add_prefix_space=True`), each word gets that space. Other tokenizers are left as they are (BERT's split
    on whitespace anyway; XLM-R's Metaspace prepends its `▁` to every word)."""
    import json

    from tokenizers import Tokenizer

    spec = json.loads(configured.to_str())
    pre_tokenizer = spec.get("pre_tokenizer") or {}
    parts = pre_tokenizer.get("pretokenizers", []) if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    byte_level = [part for part in parts if part.get("type") == "ByteLevel"]
    if not byte_level:
        return configured
    for part in byte_level:
        part["add_prefix_space"] = True
    return Tokenizer.from_str(json.dumps(spec))


def first_pieces(word_ids: Sequence[int | None]) -> np.ndarray:
    """Token positions that start a word (`word_ids` as a `tokenizers` Encoding gives them; None = special)."""
    starts = [position for position, word in enumerate(word_ids)
              if word is not None and (position == 0 or word_ids[position - 1] != word)]
    return np.asarray(starts, dtype=np.int64)


class TaggedDataset(torch.utils.data.Dataset):
    """A tokenized tagged split: token ids in one flat array, and per sentence its words' first pieces.

    `word_starts[offsets_words[i]:offsets_words[i+1]]` are sentence i's first-piece positions (relative
    to the sentence's first token) of the words that survived truncation, in word order; `tags`, when
    the split has tags, holds those words' tag ids in the same layout.
    """

    def __init__(self, split: TaggedSplit, tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        configured = words_tokenizer(bert_tokenizer(tokenizer, max_length))
        self.pad_token_id = pad_token_id(configured, tokenizer)
        self.tag_names = list(split.tag_names)
        self.source = split.source
        ids: list[np.ndarray] = []
        starts: list[np.ndarray] = []
        with Progress(console=console, transient=True, disable=not progress_enabled()) as progress:
            bar = progress.add_task(f"tokenizing {Path(split.source).name}", total=len(split.words))
            for begin in range(0, len(split.words), TOKENIZE_CHUNK):
                chunk = split.words[begin:begin + TOKENIZE_CHUNK]
                for encoding in configured.encode_batch(chunk, is_pretokenized=True):
                    ids.append(np.asarray(encoding.ids, dtype=np.int32))
                    starts.append(first_pieces(encoding.word_ids))
                progress.advance(bar, len(chunk))
        self.offsets = _offsets([len(a) for a in ids])
        self.word_offsets = _offsets([len(s) for s in starts])
        self.token_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
        self.word_starts = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
        self.words_cut = sum(len(words) for words in split.words) - len(self.word_starts)
        self.tags: np.ndarray | None = None
        if split.tags is not None:  # the words kept are each sentence's first ones: truncation cuts the end
            kept = np.diff(self.word_offsets)
            self.tags = np.concatenate([np.asarray(tags[:count], dtype=np.int64)
                                        for tags, count in zip(split.tags, kept, strict=True)]
                                       ) if split.tags else np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def words_of(self, index: int) -> int:
        """How many of sentence `index`'s words are labeled (the rest fell beyond max_length)."""
        return int(self.word_offsets[index + 1] - self.word_offsets[index])

    def __getitem__(self, index: int) -> dict[str, Any]:
        start, end = self.offsets[index], self.offsets[index + 1]
        words = slice(self.word_offsets[index], self.word_offsets[index + 1])
        example: dict[str, Any] = {"input_ids": self.token_ids[start:end], "word_starts": self.word_starts[words]}
        if self.tags is not None:
            example["tags"] = self.tags[words]
        return example


def _offsets(lengths: Sequence[int]) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=offsets[1:])
    return offsets


def collate_tagged(examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The unpadded batch plus `rows` (every word's first piece, as an index into the batch's tokens),
    `words_per_sample` and, with tags, `labels` (one per row)."""
    lengths = np.array([len(e["input_ids"]) for e in examples], dtype=np.int64)
    token_ids = np.concatenate([e["input_ids"] for e in examples])
    inputs = unpadded_inputs(token_ids, np.zeros(len(token_ids), dtype=np.int64), lengths)
    batch: dict[str, Any] = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                             for key, value in inputs.items()}
    sequence_starts = inputs["cu_seqlens"][:-1].astype(np.int64)
    batch["rows"] = torch.from_numpy(np.concatenate([start + e["word_starts"]
                                                     for start, e in zip(sequence_starts, examples, strict=True)]))
    batch["words_per_sample"] = [len(e["word_starts"]) for e in examples]
    batch["num_samples"] = len(examples)
    if "tags" in examples[0]:
        batch["labels"] = torch.from_numpy(np.concatenate([e["tags"] for e in examples]))
    return batch
