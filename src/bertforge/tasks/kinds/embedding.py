"""Sentence embeddings (text pairs, contrastive or cosine): the `embedding` kind's record."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.data.pairs import collate_pairs, load_pair_data
from bertforge.errors import BertforgeError
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.tasks.kinds.kind import TaskKind

if TYPE_CHECKING:
    import torch
    from torch import nn

    from bertforge.config import Config, FinetuneSection
    from bertforge.data.labels import LabeledSplit
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel, Predictions
    from bertforge.tasks.evaluation import EvaluationReport
    from bertforge.train.task import Task


def task(config: Config) -> Task:
    from bertforge.tasks.embedding import EmbeddingTask

    return EmbeddingTask(config)


def metric_names(section: FinetuneSection, data: Any) -> set[str]:
    from bertforge.tasks.embedding import COSINE_METRICS
    from bertforge.tasks.retrieval import RETRIEVAL_METRICS

    return set(RETRIEVAL_METRICS if section.embedding.loss == "mnrl" else COSINE_METRICS) | {"loss"}


def evaluate(loaded: LoadedModel, args: argparse.Namespace) -> EvaluationReport:
    """Retrieval of each query's text among all texts, or (--embedding-metric cosine) score correlation."""
    from bertforge.engine import settings_of
    from bertforge.tasks.embedding import evaluate_pairs_file

    embedder = model_of(loaded)
    assert embedder is not None
    metric = args.embedding_metric or ("cosine" if loaded.run_settings is not None
                                       and loaded.run_settings.embedding.loss == "cosine" else "retrieval")
    return evaluate_pairs_file(loaded, embedder, args.data, split=args.split_name, text_column=args.text_column,
                               text_pair_column=args.text_pair_column, negative_column=args.negative_column,
                               metric=metric, label_column=args.label_column, delimiter=args.delimiter,
                               batch_size=args.batch_size, settings=settings_of(args, "evaluating"))


def predict(loaded: LoadedModel, split: LabeledSplit, settings: EngineSettings) -> Predictions:
    raise BertforgeError(f"{loaded.name} is a sentence-embedding model: it has no labels to predict; get its vectors "
                         f"with `bertforge embed {loaded.name} --input FILE`")


def model_of(loaded: LoadedModel) -> nn.Module | None:
    """An embedding run's model, or a sentence-transformers directory (such as an embedding run's final/) as one."""
    from bertforge.models.loading import as_embedding_model
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    if type(loaded.model) is not BertforgeForEmbedding and read_sentence_transformers(loaded.location.path) is None:
        return None
    return as_embedding_model(loaded.model, loaded.location.path).eval()  # type: ignore[arg-type]


def export(model: nn.Module, tokenizer_dir: Path | None, out_dir: Path, max_length: int) -> Any:
    """A sentence-transformers directory (`SentenceTransformer(dir)` loads it) truncating at `max_length`."""
    from bertforge.models.sentence_transformers_format import export_sentence_transformers

    return export_sentence_transformers(model, tokenizer_dir, out_dir, max_seq_length=max_length)  # type: ignore[arg-type]


def for_onnx(model: nn.Module) -> tuple[nn.Module, str | None]:
    """The transformer's graph, as sentence-transformers' ONNX backend exports it."""
    assert isinstance(model, BertforgeForEmbedding)
    return model.encoder, (f"model.onnx holds the transformer (last_hidden_state); pool it by {model.config.pooling}"
                           f"{' and normalize' if model.normalize else ''} to get the sentence vectors")


def from_onnx(model: nn.Module, hidden: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """The graph gives every token's last state (`for_onnx`): pooled, and normalized, as the forward does."""
    import torch
    import torch.nn.functional as F

    from bertforge.models.heads import pool, pooled_rows

    assert isinstance(model, BertforgeForEmbedding)
    cu_seqlens = torch.as_tensor(batch["cu_seqlens"])
    rows = pooled_rows(cu_seqlens, model.config.pooling)
    vectors = pool(hidden if rows is None else hidden[rows], cu_seqlens, model.config.pooling)
    return F.normalize(vectors, dim=-1) if model.normalize else vectors


KIND = TaskKind(
    name="embedding", task_types=("embedding",), settings="embedding", serve_routes=("/v1/embeddings",),
    shared_keys=frozenset({"text_column", "text_pair_column", "label_column", "delimiter"}),
    model_class=BertforgeForEmbedding, task=task, read=load_pair_data, collate=collate_pairs,
    metric_names=metric_names, evaluate=evaluate, predict=predict, model_of=model_of, export=export, for_onnx=for_onnx,
    from_onnx=from_onnx)
