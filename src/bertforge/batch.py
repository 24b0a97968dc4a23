"""The batch contract: the two layouts every loader builds and every model reads, in one place.

**Unpadded** (what bertforge's models run on): the micro-batch's sequences concatenated, no padding —

| key | shape, dtype | what |
|---|---|---|
| `input_ids` | [tokens] int64 | every sequence's token ids, one after another |
| `token_type_ids` | [tokens] int64 | segment A = 0, B = 1 |
| `position_ids` | [tokens] int64 | index of each token within its own sequence |
| `cu_seqlens` | [sequences + 1] int32 | where each sequence starts; the last entry is the token count |
| `max_seqlen` | int | the longest sequence (attention kernels size their work by it) |

**Padded** (what Hugging Face models run on, and `data.layout=padded` builds for comparisons):
`input_ids`, `attention_mask` (1 = real token) and `token_type_ids`, each [rows, width] int64.

Besides the model inputs a batch carries its task's targets — `labels` (fine-tuning),
`masked_positions` + `masked_labels` or padded MLM `labels`, `next_sentence_label` — and
`num_samples`. The model side (`models.encoder.pack_inputs`) also accepts the padded layout and
derives what is missing; the data side builds both layouts from sequence lengths here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

UNPADDED_INPUTS = ("input_ids", "cu_seqlens", "max_seqlen", "position_ids", "token_type_ids")
PADDED_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def unpadded_inputs(input_ids: np.ndarray, token_type_ids: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """The unpadded model inputs of concatenated sequences of `lengths` tokens."""
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return {
        "input_ids": input_ids.astype(np.int64, copy=False),
        "cu_seqlens": starts.astype(np.int32),
        "max_seqlen": int(lengths.max()) if len(lengths) else 0,
        "position_ids": np.arange(starts[-1], dtype=np.int64) - np.repeat(starts[:-1], lengths),
        "token_type_ids": token_type_ids.astype(np.int64, copy=False),
    }


def padded_grid(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of every token of concatenated sequences laid out one sequence per row."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows = np.repeat(np.arange(len(lengths)), lengths)
    return rows, np.arange(int(starts[-1])) - starts[rows]


def model_inputs(batch: Mapping[str, Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of `batch` a model's `forward` takes (either layout), plus the `extra` a head needs."""
    return {key: batch[key] for key in (*UNPADDED_INPUTS, "attention_mask", *extra) if key in batch}
