"""Labeled examples as model batches: tokenized once, batched with no padding.

Examples are tokenized once, with BERT's `[CLS] a [SEP] b [SEP]` layout, longest-first truncation
and no padding; `collate_unpadded` concatenates them into the unpadded batch the encoder consumes
(`bertforge.batch`). `collate_padded` (dynamic padding) exists only for the Hugging Face reference
path. The rows come from `bertforge.data.labels` (label set, splits) and `bertforge.data.records`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.progress import Progress

from bertforge.batch import unpadded_inputs
from bertforge.console import console, progress_enabled
from bertforge.data.labels import LabeledSplit
from bertforge.errors import DataError

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

TOKENIZE_CHUNK = 8192  # examples per `encode_batch` call: big enough to keep the Rust threads busy


# ---------------------------------------------------------------------------------------------
# tokenization: once, into flat arrays


def bert_tokenizer(tokenizer: Tokenizer | str | Path, max_length: int) -> Tokenizer:
    """A copy of `tokenizer` set up for encoder inputs: no padding, longest-first truncation, and the
    tokenizer's own special tokens in its family's layout.

    The template is set here rather than trusted from tokenizer.json, so a tokenizer saved with another
    post-processor (or none) still gives the layout its model was trained on: BERT's `[CLS] a [SEP] b [SEP]`
    with segment ids 0/1, or, for a tokenizer that marks a pair with two separators (RoBERTa, XLM-R,
    CamemBERT: `<s> a </s></s> b </s>`), that layout with segment ids all 0, as those models were trained.
    """
    from tokenizers import Tokenizer

    directory = None
    if isinstance(tokenizer, Tokenizer):
        configured = Tokenizer.from_str(tokenizer.to_str())
    else:
        path = Path(tokenizer)
        file = path / "tokenizer.json" if path.is_dir() else path
        directory = file.parent
        if not file.is_file():
            raise DataError(f"{path}: no tokenizer.json; point at a tokenizer directory (bertforge or Hugging Face "
                            "format) or re-save it with AutoTokenizer.from_pretrained(dir).save_pretrained(dir)")
        try:
            configured = Tokenizer.from_file(str(file))
        except Exception as error:  # the tokenizers library raises a bare Exception for a bad file
            raise DataError(f"{file}: not a readable tokenizer.json ({error}); re-save the tokenizer") from None
    special = special_token_roles(configured, directory)
    configured.no_padding()
    configured.enable_truncation(max_length, strategy="longest_first")
    configured.post_processor = input_template(configured, special["cls"], special["sep"])
    return configured


def special_token_roles(tokenizer: Tokenizer, directory: Path | None = None) -> dict[str, str]:
    """cls/sep/pad (and mask, where it has one) -> the tokenizer's token: as its directory's
    special_tokens_map.json names them, else BERT's or RoBERTa's, whichever its vocabulary holds."""
    from bertforge.special_tokens import special_tokens_of

    special = special_tokens_of(directory, tokenizer)
    for role in ("cls", "sep", "pad"):
        if role not in special:
            raise DataError(f"the tokenizer has no {role} token (BERT's [CLS] [SEP] [PAD], RoBERTa's <s> </s> <pad>, "
                            "or one named in its special_tokens_map.json); fine-tuning needs one")
    return special


def marks_pairs_with_two_separators(tokenizer: Tokenizer) -> bool:
    """Whether the tokenizer's own post-processor writes RoBERTa's pair layout (`</s></s>` between the texts)."""
    # the post-processor's own JSON: the whole tokenizer's (MiniLM's 30k words) took 27 ms to write and parse
    processor = json.loads(tokenizer.post_processor.__getstate__()) if tokenizer.post_processor is not None else {}
    if processor.get("type") == "RobertaProcessing":
        return True
    if processor.get("type") != "TemplateProcessing":
        return False
    between, seen_a = 0, False
    for piece in processor.get("pair", []):
        if "Sequence" in piece:
            if seen_a:
                return between >= 2
            seen_a = True
        elif seen_a:
            between += 1
    return False


def input_template(tokenizer: Tokenizer, cls: str, sep: str) -> TemplateProcessing:
    from tokenizers.processors import TemplateProcessing

    ids = [(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))]
    if marks_pairs_with_two_separators(tokenizer):
        return TemplateProcessing(single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}",
                                  special_tokens=ids)
    return TemplateProcessing(single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ids)


def pad_token_id(configured: Tokenizer, source: Tokenizer | str | Path) -> int:
    """The pad id of a tokenizer `bert_tokenizer` configured from `source` (a tokenizer or its path)."""
    directory = None if not isinstance(source, str | Path) else (Path(source) if Path(source).is_dir()
                                                                 else Path(source).parent)
    return int(configured.token_to_id(special_token_roles(configured, directory)["pad"]))


class LabeledDataset(torch.utils.data.Dataset):
    """A tokenized split: every example's token ids in one flat array, sliced by `offsets`.

    Flat int32 arrays instead of a list of tensors: a few bytes per token, cheap to pickle into
    data-loader workers, and the lengths come for free (`lengths`) for token budgets and stats.
    """

    def __init__(self, split: LabeledSplit, tokenizer: Tokenizer | str | Path, max_length: int) -> None:
        configured = bert_tokenizer(tokenizer, max_length)
        self.pad_token_id = pad_token_id(configured, tokenizer)
        self.task_type = split.task_type
        self.label_names = list(split.label_names)
        self.source = split.source
        self.groups, self.group_column = split.groups, split.group_column
        ids: list[np.ndarray] = []
        type_ids: list[np.ndarray] = []
        inputs: list[str] | list[tuple[str, str]] = (
            split.texts if split.text_pairs is None else list(zip(split.texts, split.text_pairs, strict=True)))
        with Progress(console=console, transient=True, disable=not progress_enabled()) as progress:
            bar = progress.add_task(f"tokenizing {Path(split.source).name}", total=len(inputs))
            for start in range(0, len(inputs), TOKENIZE_CHUNK):
                chunk = inputs[start:start + TOKENIZE_CHUNK]
                for encoding in configured.encode_batch(chunk):
                    ids.append(np.asarray(encoding.ids, dtype=np.int32))
                    type_ids.append(np.asarray(encoding.type_ids, dtype=np.int8))
                progress.advance(bar, len(chunk))
        lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
        self.offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.token_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
        self.token_type_ids = np.concatenate(type_ids) if type_ids else np.zeros(0, dtype=np.int8)
        self.labels: np.ndarray | None = None
        if split.labels is not None:
            dtype = np.float32 if split.task_type == "regression" else np.int64
            self.labels = np.asarray(split.labels, dtype=dtype)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example, [CLS]/[SEP] included."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, index: int) -> dict[str, Any]:
        start, end = self.offsets[index], self.offsets[index + 1]
        example: dict[str, Any] = {"input_ids": self.token_ids[start:end],
                                   "token_type_ids": self.token_type_ids[start:end]}
        if self.labels is not None:
            label = self.labels[index]
            example["label"] = float(label) if self.task_type == "regression" else int(label)
        return example


# ---------------------------------------------------------------------------------------------
# batches


def _labels_tensor(examples: Sequence[Mapping[str, Any]]) -> torch.Tensor | None:
    if "label" not in examples[0]:
        return None
    values = [e["label"] for e in examples]
    dtype = torch.float32 if isinstance(values[0], float) else torch.long
    return torch.tensor(values, dtype=dtype)


def collate_unpadded(examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The unpadded batch (`bertforge.batch`): all sequences concatenated, `cu_seqlens` marking where each starts."""
    lengths = np.array([len(e["input_ids"]) for e in examples], dtype=np.int64)
    inputs = unpadded_inputs(np.concatenate([e["input_ids"] for e in examples]),
                             np.concatenate([e["token_type_ids"] for e in examples]), lengths)
    batch: dict[str, Any] = {key: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
                             for key, value in inputs.items()} | {"num_samples": len(examples)}
    labels = _labels_tensor(examples)
    if labels is not None:
        batch["labels"] = labels
    return batch


def collate_padded(examples: Sequence[Mapping[str, Any]], pad_token_id: int = 0,
                   pad_to_length: int | None = None) -> dict[str, Any]:
    """[B, L] batch for Hugging Face models: padded to the longest example, or to `pad_to_length`."""
    longest = max(len(e["input_ids"]) for e in examples)
    width = max(longest, pad_to_length or 0)
    input_ids = torch.full((len(examples), width), pad_token_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(examples), width), dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, example in enumerate(examples):
        length = len(example["input_ids"])
        input_ids[row, :length] = torch.from_numpy(example["input_ids"].astype(np.int64))
        token_type_ids[row, :length] = torch.from_numpy(example["token_type_ids"].astype(np.int64))
        attention_mask[row, :length] = 1
    batch: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask,
                             "token_type_ids": token_type_ids, "num_samples": len(examples)}
    labels = _labels_tensor(examples)
    if labels is not None:
        batch["labels"] = labels
    return batch

