"""`bertforge embed`: sentence vectors of a file of texts, batched and unpadded, written as one .npy matrix.

Any model reference works: an embedding run (or its final/, a sentence-transformers directory), a
checkpoint, all-MiniLM-L6-v2 or another sentence-transformers directory (its pooling and Normalize
are read from its files, and texts are truncated at its max_seq_length, so the vectors are the ones
`SentenceTransformer(dir).encode` gives), or any other encoder (mean pooling).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from bertforge.console import log
from bertforge.errors import BertforgeError, DataError
from bertforge.inference import LoadedModel, load_model

if TYPE_CHECKING:
    from bertforge.engine import EngineSettings

VECTORS_SUFFIX = ".npy"


@dataclass
class Embedder:
    model: nn.Module  # a BertforgeForEmbedding in eval mode
    tokenizer: Path
    max_length: int  # tokens per text, [CLS] and [SEP] included
    name: str


def load_embedder(reference: str | Path) -> Embedder:
    """The embedding model any reference names, with its tokenizer and truncation length."""
    from bertforge.models.loading import as_embedding_model
    from bertforge.models.sentence_transformers_format import read_sentence_transformers
    from bertforge.tasks.kinds.embedding import KIND as EMBEDDING

    loaded: LoadedModel = load_model(reference)
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

    path = Path(source).expanduser()
    if path.suffix == ".txt":
        if not path.is_file():
            raise DataError(f"{source}: no such file")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DataError(f"{source}: not UTF-8 text; convert it (iconv -t utf-8)") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                raise DataError(f"{source}:{number}: empty line; every line is one text (row {number - 1} of "
                                "the output), so remove it")
        if not lines:
            raise DataError(f"{source}: no lines; the file is empty")
        return lines
    records = read_records(source, columns=[text_column], delimiter=delimiter)
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

    done = engine.run(texts, engine.text_workload(embedder.tokenizer, embedder.max_length, engine.rows_of),
                      engine.torch_backend(embedder.model), settings or engine.EngineSettings(label="embedding texts"))
    vectors = np.zeros((len(texts), embedder.model.config.hidden_size), dtype=np.float32)
    if done.results:
        vectors[:] = torch.stack(done.results).numpy()
    return Embedded(vectors, done.truncated)


def check_vectors_path(out: str | Path, overwrite: bool, sources: Sequence[tuple[str | Path, str]] = ()) -> Path:
    """Where the vectors go: a .npy path, never a source, an earlier output of `embed` only with `overwrite`
    (checked before any work)."""
    from bertforge.output_guard import claim_file

    path = Path(out).expanduser()
    if path.suffix != VECTORS_SUFFIX and not path.is_dir():
        raise BertforgeError(f"--out {out} does not end in {VECTORS_SUFFIX}; the vectors are a NumPy array "
                             f"(np.load reads it): give e.g. {path.with_suffix(VECTORS_SUFFIX)}")
    return claim_file(out, command="embed", flag="--out", what="vectors file", overwrite=overwrite, sources=sources,
                      recognise=is_vectors_file, example_name="vectors.npy")


def is_vectors_file(path: Path) -> bool:
    """A .npy file, as `embed` wrote before it kept a ledger."""
    try:
        with open(path, "rb") as handle:
            return handle.read(6) == b"\x93NUMPY"
    except OSError:
        return False


def write_vectors(vectors: np.ndarray, path: Path) -> Path:
    """Write atomically (a reader, or a crash, never sees half a file) and note it in the directory's ledger."""
    from bertforge.output_guard import record_outputs, replace_file

    def write(staging: Path) -> None:
        with open(staging, "wb") as f:
            np.save(f, vectors)

    replace_file(path, write)
    record_outputs(path.parent, [path.name], "embed")
    return path
