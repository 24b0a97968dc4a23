"""Ray Data: a bertforge model on every actor of a `Dataset.map_batches` pool, for corpora one machine is too slow for.

    import ray
    from bertforge.ray import BertforgeEmbedder

    vectors = ray.data.read_parquet("s3://bucket/docs/").map_batches(
        BertforgeEmbedder, fn_constructor_kwargs={"model": "all-MiniLM-L6-v2"},
        compute=ray.data.ActorPoolStrategy(size=8), batch_size=4096, udf_modifying_row_count=False)

Ray builds the class once per actor (so the model loads once per worker process) and calls it on each batch:
a pandas DataFrame, a pyarrow Table or a dict of NumPy arrays (Ray's `batch_format`) holding a text column.
The batch comes back in the same format with the same columns and the model's outputs added, row for row.
Each batch runs through the inference engine (`bertforge.engine`): sorted by length into unpadded
token-budget batches, so a large `batch_size` (thousands of texts) is what keeps the forward passes full.
`pip install 'bertforge[ray]'` installs Ray Data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bertforge.engine import DEFAULT_BATCH_SIZE, DEFAULT_MAX_BATCH_TOKENS, EngineSettings
from bertforge.errors import BertforgeError

RayBatch = Any  # pandas.DataFrame | pyarrow.Table | dict[str, np.ndarray]


def column_of(batch: RayBatch, column: str) -> list[str]:
    """A batch's text column as a list of strings, or an error naming the column and those there are."""
    names = list(batch.column_names if hasattr(batch, "column_names") else batch.keys())
    if column not in names:
        raise BertforgeError(f"the batch has no column {column!r} (it has {', '.join(map(str, names))}); pass "
                             "text_column=... to name the text column")
    values = batch.column(column).to_pylist() if hasattr(batch, "column_names") else batch[column].tolist()
    for number, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise BertforgeError(f"row {number} of a batch: column {column!r} holds {value!r}, not a text; fill it "
                                 "in or filter the row out (ds.filter) before map_batches")
    return [str(value) for value in values]


def with_columns(batch: RayBatch, added: dict[str, Sequence[Any] | np.ndarray]) -> RayBatch:
    """`batch` in its own format with `added` columns (a 2-D array: one row vector per row)."""
    if hasattr(batch, "column_names"):  # pyarrow.Table
        import pyarrow as pa

        for name, values in added.items():
            if isinstance(values, np.ndarray) and values.ndim == 2:
                flat = pa.array(np.ascontiguousarray(values).reshape(-1))
                batch = batch.append_column(name, pa.FixedSizeListArray.from_arrays(flat, values.shape[1]))
            else:
                batch = batch.append_column(name, pa.array(list(values)))
        return batch
    if isinstance(batch, dict):
        return {**batch, **{name: values if isinstance(values, np.ndarray) else _array(values)
                            for name, values in added.items()}}
    extended = batch.copy()  # pandas.DataFrame: a column of vectors is a column of 1-D arrays
    for name, values in added.items():
        extended[name] = list(values)
    return extended


def _array(values: Sequence[Any]) -> np.ndarray:
    """Scalars as a typed array; dicts and lists (probabilities, entities) as an object array."""
    if values and isinstance(values[0], dict | list):
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
    return np.asarray(values)


class BertforgeEmbedder:
    """`map_batches` callable: adds `vector_column`, each row's sentence vector (what `bertforge embed` writes)."""

    def __init__(self, model: str, *, text_column: str = "text", vector_column: str = "vector",
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from bertforge.embed import load_embedder

        self.embedder = load_embedder(model)
        self.text_column, self.vector_column = text_column, vector_column
        self.settings = EngineSettings(max_batch_tokens, batch_size, "embedding texts")

    def __call__(self, batch: RayBatch) -> RayBatch:
        from bertforge.embed import embed_run

        vectors = embed_run(self.embedder, column_of(batch, self.text_column), self.settings).vectors
        return with_columns(batch, {self.vector_column: vectors})


class BertforgePredictor:
    """`map_batches` callable: adds the columns `bertforge predict` writes for the model's kind (label, label_id,
    score, probabilities; score for regression; entities for tagging), each row's own."""

    def __init__(self, model: str, *, text_column: str = "text", text_pair_column: str | None = None,
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        from bertforge.inference import kind_of_loaded, load_model

        self.loaded = load_model(model)
        self.kind = kind_of_loaded(self.loaded)
        self.text_column, self.text_pair_column = text_column, text_pair_column
        self.settings = EngineSettings(max_batch_tokens, batch_size, "predicting")

    def __call__(self, batch: RayBatch) -> RayBatch:
        from bertforge.data.labels import LabeledSplit

        texts = column_of(batch, self.text_column)
        pairs = column_of(batch, self.text_pair_column) if self.text_pair_column else None
        rows = self.kind.predict(self.loaded, LabeledSplit.unlabeled("a Ray batch", texts, pairs), self.settings).rows
        outputs = [key for key in (rows[0] if rows else {}) if key not in ("text", "text_pair")]
        return with_columns(batch, {key: [row[key] for row in rows] for key in outputs})
