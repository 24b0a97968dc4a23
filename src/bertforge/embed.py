"""`bertforge embed`: sentence vectors of a file of texts, batched and unpadded, written as one .npy matrix, or
as a Parquet table / JSON lines of each row's id and vector.

Any model reference works: an embedding run (or its final/, a sentence-transformers directory), a
checkpoint, all-MiniLM-L6-v2 or another sentence-transformers directory (its pooling and Normalize
are read from its files, and texts are truncated at its max_seq_length, so the vectors are the ones
`SentenceTransformer(dir).encode` gives), or any other encoder (mean pooling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from bertforge.console import log
from bertforge.errors import BertforgeError, DataError
from bertforge.inference import LoadedModel, load_model

if TYPE_CHECKING:
    from bertforge.engine import EngineSettings

VECTORS_SUFFIX = ".npy"
ROW_SUFFIXES = (".parquet", ".jsonl")  # outputs of rows (id, vector) rather than one matrix


@dataclass
class Embedder:
    model: nn.Module  # a BertforgeForEmbedding in eval mode
    tokenizer: Path
    max_length: int  # tokens per text, [CLS] and [SEP] included
    name: str


def load_embedder(reference: str | Path) -> Embedder:
    """The embedding model any reference names, with its tokenizer and truncation length."""
    return embedder_of(load_model(reference))


def embedder_of(loaded: LoadedModel) -> Embedder:
    """The embedder of a loaded model (`bertforge serve` loads each model once and reads its kind first)."""
    from bertforge.models.loading import as_embedding_model
    from bertforge.models.sentence_transformers_format import read_sentence_transformers
    from bertforge.tasks.kinds.embedding import KIND as EMBEDDING

    path = loaded.location.path
    model = EMBEDDING.model_of(loaded)
    if model is None:
        log.info(f"{loaded.name} is not an embedding model: its vectors are the mean of its token states")
        model = as_embedding_model(loaded.model, path).eval()
    max_length = loaded.max_length
    settings = read_sentence_transformers(path)
    if loaded.location.run_dir is None and settings is not None and settings.max_seq_length is not None:
        max_length = min(max_length, settings.max_seq_length)  # sentence-transformers counts [CLS] and [SEP]
    return Embedder(model, loaded.tokenizer(), max_length, loaded.name)


def read_texts(source: str | Path, text_column: str = "text", delimiter: str | None = None) -> list[str]:
    """Texts to embed (or to predict on): a .txt file, one per line, or a column of a csv/tsv/jsonl/parquet file."""
    from bertforge.data.labels import _check_columns, _text
    from bertforge.data.records import read_records
    from bertforge.locate import resolve_data_file
    from bertforge.storage import origin

    path = Path(resolve_data_file(str(source)) or source).expanduser()  # s3:// and bundled: too
    shown = origin(path) if origin(path) != str(path) else source  # an object's URL, not its cached copy
    if path.suffix == ".txt":
        if not path.is_file():
            raise DataError(f"{shown}: no such file")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DataError(f"{shown}: not UTF-8 text; convert it (iconv -t utf-8)") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                raise DataError(f"{shown}:{number}: empty line; every line is one text (row {number - 1} of "
                                "the output), so remove it")
        if not lines:
            raise DataError(f"{shown}: no lines; the file is empty")
        return lines
    records = read_records(path, columns=[text_column], delimiter=delimiter)
    _check_columns(records, {"text_column": text_column}, cli_flags=True)
    texts = [_text(row.get(text_column), text_column, records.where(number)) for number, row in records.rows]
    if not texts:
        raise DataError(f"{records.source}: no rows; the file is empty")
    return texts


def embed_texts(embedder: Embedder, texts: Sequence[str], settings: EngineSettings | None = None) -> np.ndarray:
    """[texts, hidden] float32 vectors, in the order of `texts` (`embed_run` says how many were truncated)."""
    return embed_run(embedder, texts, settings).vectors


@dataclass
class Embedded:
    vectors: np.ndarray  # [texts, hidden] float32, row i = text i
    truncated: int  # texts cut at the model's length


def embed_run(embedder: Embedder, texts: Sequence[str], settings: EngineSettings | None = None) -> Embedded:
    """The vectors of `texts` through the inference engine (length-sorted token-budget batches, unpadded)."""
    from bertforge import engine
    from bertforge.backends import backend_for

    settings = settings or engine.EngineSettings(label="embedding texts")
    backend = backend_for(settings.backend, embedder.model, embedder.tokenizer, embedder.max_length)
    done = engine.run(texts, engine.text_workload(embedder.tokenizer, embedder.max_length, engine.rows_of), backend,
                      settings)
    vectors = np.zeros((len(texts), embedder.model.config.hidden_size), dtype=np.float32)
    if done.results:
        vectors[:] = torch.stack(done.results).numpy()
    return Embedded(vectors, done.truncated)


def check_vectors_path(out: str | Path, overwrite: bool, sources: Sequence[tuple[str | Path, str]] = ()) -> Path:
    """Where the vectors go: a .npy (or .parquet, .jsonl) path, never a source, an earlier output of `embed` only
    with `overwrite` (checked before any work)."""
    from bertforge.output_guard import claim_file

    check_vectors_suffix(str(out))
    return claim_file(out, command="embed", flag="--out", what="vectors file", overwrite=overwrite, sources=sources,
                      recognise=is_vectors_file, example_name="vectors.npy")


def check_vectors_suffix(out: str) -> None:
    """The vectors are a .npy matrix, or rows of id and vector (.parquet, .jsonl)."""
    suffix = Path(out).suffix
    if suffix != VECTORS_SUFFIX and suffix not in ROW_SUFFIXES and not Path(out).expanduser().is_dir():
        raise BertforgeError(f"--out {out} does not end in {VECTORS_SUFFIX}, {' or '.join(ROW_SUFFIXES)}; the vectors "
                             f"are a NumPy array (np.load reads it) or a table of each row's id and vector: give e.g. "
                             f"{Path(out).with_suffix(VECTORS_SUFFIX)}")


def is_vectors_file(path: Path) -> bool:
    """A .npy file, as `embed` wrote before it kept a ledger."""
    try:
        with open(path, "rb") as handle:
            return handle.read(6) == b"\x93NUMPY"
    except OSError:
        return False


def write_vectors(vectors: np.ndarray, path: Path, ids: Sequence[str | int] | None = None) -> Path:
    """Write atomically (a reader, or a crash, never sees half a file) and note it in the directory's ledger."""
    from bertforge.output_guard import record_outputs

    save_vectors(vectors, path, ids)
    record_outputs(path.parent, [path.name], "embed")
    return path


def save_vectors(vectors: np.ndarray, path: Path, ids: Sequence[str | int] | None = None) -> Path:
    """`path` whole or not at all: a .npy matrix (row i = text i), or for .parquet / .jsonl one row per text of
    its id and its vector (Parquet: a fixed-size list of float32, so a reader gets the matrix back in one call)."""
    from bertforge.inference import write_jsonl
    from bertforge.output_guard import replace_file

    if path.suffix == VECTORS_SUFFIX:
        def write(staging: Path) -> None:
            with open(staging, "wb") as f:
                np.save(f, vectors)

        return replace_file(path, write)
    if ids is None or len(ids) != len(vectors):
        raise ValueError(f"{path}: a table of vectors needs one id per vector")
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1))
        table = pa.table({"id": list(ids), "vector": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])})
        return replace_file(path, lambda staging: pq.write_table(table, staging))
    return write_jsonl([{"id": row_id, "vector": vector} for row_id, vector in zip(ids, vectors.tolist(), strict=True)],
                       path)


def vectors_of_table(table: Any) -> np.ndarray:
    """The [rows, hidden] float32 matrix of an `embed --out x.parquet` table's vector column."""
    column = table.column("vector").combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), column.type.list_size)
