"""Sentence-embedding fine-tuning (`finetune.task_type: embedding`): contrastive or cosine-regression.

A sibling of the other kinds on `FinetuneTask`, with the same tokenizer and model reference resolution (`model.init_from`: all-MiniLM-L6-v2, a pre-training run, a checkpoint,
an HF or sentence-transformers directory, whose pooling is read from its files), checkpoints as
model directories, best-checkpoint reload. Pairs come from csv/tsv/jsonl/parquet (`data.pairs`);
every text of a micro-batch is embedded in one unpadded forward pass.

`finetune.embedding.loss`:
* mnrl — MultipleNegativesRanking over the whole global batch: the in-batch negatives stay global
  under accumulation (GradCache) and across ranks (gathered embeddings), `tasks.contrastive`.
  Validation: retrieval of each held-out anchor's positive among all held-out positives (MRR@10,
  recall@1/5/10, nDCG@10, `tasks.retrieval`), usable as `train.best_metric`.
* cosine — MSE of cos(a, b) against a score; a sum over pairs divided by the global batch's pairs,
  so the trainer's accumulation gives one big batch's step. Validation: Pearson, Spearman, MSE.

`final/` is a sentence-transformers directory (`SentenceTransformer(run/final)` loads it) holding
the same vectors as `bertforge embed`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from bertforge.batch import model_inputs
from bertforge.console import log
from bertforge.data.pairs import PairData, PairDataset, PairSplit, collate_pairs, load_pair_data
from bertforge.data.validation_subset import final_splits_with_validation
from bertforge.device import batch_on_device, model_device
from bertforge.errors import BertforgeError
from bertforge.locate import resolve_model
from bertforge.tasks.contrastive import (
    cosine_errors,
    global_batch_step,
    mnrl_over,
    multiple_negatives_ranking,
    roles_of,
)
from bertforge.tasks.evaluation import DEFAULT_BATCH_SIZE, EvaluationReport
from bertforge.tasks.finetune_base import FinetuneTask
from bertforge.tasks.metrics import compute_metrics
from bertforge.tasks.retrieval import RETRIEVAL_METRICS, retrieval_scores
from bertforge.train.map_style import iterate_once
from bertforge.train.task import Batch, StepRunner, TaskData

if TYPE_CHECKING:
    from bertforge.engine import EngineSettings
    from bertforge.inference import LoadedModel

TASK_TYPE = "embedding"
LOSS_UNIT = "pairs"  # the cosine loss is averaged over the pairs of the global batch
COSINE_METRICS = ("pearson", "spearman", "mse")


class EmbeddingTask(FinetuneTask):
    """Fine-tune a sentence-embedding model on `finetune.*` pairs, from `model.init_from` or from scratch."""

    examples = "pairs"

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config)
        self.pairs: PairData | None = None
        self.settings = config.finetune.embedding

    @property
    def mnrl(self) -> bool:
        return self.settings.loss == "mnrl"

    # --- data -----------------------------------------------------------------------------------

    def build_datasets(self) -> TaskData:
        section = self.config.finetune
        if self.pairs is None:
            self.pairs = load_pair_data(self._with_resolved_files())
        self._check_best_metric()
        tokenizer = self.tokenizer_dir()
        train = PairDataset(self.pairs.train, tokenizer, section.max_length)
        validation = self.pairs.validation
        if validation is not None:  # pairs have no classes: a plain seeded sample
            validation = self.validation_rows = self.draw_validation(validation, None, "")
        validation_set = PairDataset(validation, tokenizer, section.max_length) if validation is not None else None
        texts = len(train.columns)
        log.info(f"embedding data: {len(train):,} training {'triplets' if texts == 3 else 'pairs'} "
                 f"({train.num_tokens / max(len(train) * texts, 1):.1f} tokens per text on average, no padding), "
                 f"{len(validation_set) if validation_set else 0:,} validation, loss {self.settings.loss}")
        return TaskData(train=train, collate=collate_pairs, validation=validation_set,
                        tokens_per_sample=train.num_tokens / max(len(train), 1))

    # --- model ----------------------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        section, normalize = self.config.model, self.settings.normalize
        if section.init_from:
            from bertforge.models.loading import load_for_task, runtime_overrides

            model = load_for_task(resolve_model(section.init_from).path, TASK_TYPE, normalize=normalize,
                                  config_overrides=runtime_overrides(section))
        else:
            from bertforge.models import BertforgeForEmbedding, encoder_config_from_section

            encoder = encoder_config_from_section(section, self.tokenizer_tokens())
            # a preset's pooling is a classifier's (BERT's pooler); a sentence embedding is the token mean
            model = BertforgeForEmbedding(dataclasses.replace(encoder, pooling=section.pooling or "mean"), normalize)
        self._check_model_fits_input(model)
        return model

    # --- training -------------------------------------------------------------------------------

    def loss_units(self, batch: Batch) -> dict[str, float] | None:
        return None if self.mnrl else {LOSS_UNIT: float(batch["num_samples"])}

    def forward_step(self, batch: Batch, model: nn.Module) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch: MNRL among its own pairs (a whole step when it is the only
        micro-batch of one process; else `train_step` runs), or its part of the global cosine loss."""
        roles = roles_of(model(**model_inputs(batch)), batch)
        if self.mnrl:
            return multiple_negatives_ranking(roles[0], torch.cat(roles[1:]), self.settings.similarity_scale), {}
        errors = cosine_errors(roles[0], roles[1], batch["labels"])
        return errors.sum() / batch["global_loss_units"][LOSS_UNIT], {}

    def train_step(self, micro_batches: Sequence[Batch], runner: StepRunner) -> tuple[float, dict[str, float]] | None:
        """MNRL with the negatives of every micro-batch and rank of the step (`tasks.contrastive`)."""
        if not self.mnrl or (len(micro_batches) == 1 and runner.world_size == 1):
            return None
        scale = self.settings.similarity_scale
        loss = global_batch_step(micro_batches, runner,
                                 lambda embeddings, batches, gather: mnrl_over(embeddings, batches, gather, scale))
        return loss, {}

    def metric_names(self) -> set[str]:
        return set(RETRIEVAL_METRICS if self.mnrl else COSINE_METRICS) | {"loss"}

    def evaluate(self, model: nn.Module, batches: Iterable[Batch]) -> dict[str, float]:
        assert self.validation_rows is not None
        return pair_metrics(model, batches, self.validation_rows, self.settings.loss, self.settings.similarity_scale)

    # --- the end --------------------------------------------------------------------------------

    def final_splits(self) -> dict[str, PairSplit]:  # type: ignore[override]
        assert self.pairs is not None
        return final_splits_with_validation(self.pairs.test, self.pairs.validation, self.validation_rows)

    def evaluate_split(self, model: nn.Module, name: str, split: PairSplit) -> EvaluationReport:
        return evaluate_pairs(model, split, self.tokenizer_dir(), self.config.finetune.max_length, name,
                              self.settings.loss, self.settings.similarity_scale, self.config.train.micro_batch_size)


@torch.no_grad()
def pair_metrics(model: nn.Module, batches: Iterable[Batch], split: PairSplit, embedding_loss: str,
                 scale: float) -> dict[str, float]:
    """Retrieval metrics and the mean micro-batch MNRL (mnrl), or Pearson/Spearman/MSE of the cosine
    similarities against the scores (cosine), of the pairs in `batches` (the first rows of `split`, in order)."""
    device = model_device(model)
    by_batch: list[list[torch.Tensor]] = []
    scores: list[torch.Tensor] = []
    for batch in batches:
        outputs = model(**batch_on_device(model_inputs(batch), device))
        by_batch.append([role.float().cpu() for role in roles_of(outputs, batch)])
        if "labels" in batch:
            scores.append(batch["labels"])
    return metrics_of_embeddings(by_batch, torch.cat(scores) if scores else None, split, embedding_loss, scale)


def metrics_of_embeddings(by_batch: list[list[torch.Tensor]], scores: torch.Tensor | None, split: PairSplit,
                          embedding_loss: str, scale: float) -> dict[str, float]:
    """`pair_metrics` of the embeddings of each batch's pairs, by role (anchors, positives[, negatives])."""
    roles = [torch.cat(role) for role in zip(*by_batch, strict=True)]
    if embedding_loss == "cosine":
        assert scores is not None
        similarities = F.cosine_similarity(roles[0], roles[1], dim=-1)
        return compute_metrics("regression", similarities.numpy(), scores.numpy()) | {
            "loss": float(cosine_errors(roles[0], roles[1], scores).mean())}
    losses = [float(multiple_negatives_ranking(b[0], torch.cat(b[1:]), scale)) for b in by_batch]
    return retrieval_scores(split, roles) | {"loss": sum(losses) / max(len(losses), 1)}


def evaluate_pairs(model: nn.Module, split: PairSplit, tokenizer: Path, max_length: int, name: str,
                   embedding_loss: str, scale: float, batch_size: int) -> EvaluationReport:
    """The evaluation report (`<name>_results.json`, `<name>_report.md`) of an embedding model on pairs."""
    dataset = PairDataset(split, tokenizer, max_length)
    metrics = pair_metrics(model, iterate_once(dataset, collate_pairs, batch_size), split, embedding_loss, scale)
    return EvaluationReport(name, split.source, TASK_TYPE, [], metrics | {"examples": float(len(split))}, [], None)


def evaluate_pairs_file(loaded: LoadedModel, embedder: nn.Module, data: str | Path, *, split: str = "evaluation",
                        text_column: str = "text", text_pair_column: str | None = None,
                        negative_column: str | None = None, metric: str = "retrieval", label_column: str = "label",
                        delimiter: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                        settings: EngineSettings | None = None) -> EvaluationReport:
    """An embedding model on pairs: retrieval metrics, or (metric cosine) the correlation of cos(a, b) with scores.

    Every text is embedded through the inference engine (`settings`); the reported MNRL loss is the mean over
    consecutive blocks of `batch_size` pairs, as a training evaluation's micro-batches give it."""
    from bertforge import engine
    from bertforge.backends import backend_for
    from bertforge.config import FinetuneSection
    from bertforge.data.pairs import PairColumns, read_pair_split
    from bertforge.locate import resolve_data_file

    if text_pair_column is None:
        raise BertforgeError(f"{loaded.name} is an embedding model: it is scored on pairs; give --text-pair-column "
                             "(the text relevant to --text-column's)")
    columns = PairColumns(text_column, text_pair_column, negative=negative_column if metric == "retrieval" else None,
                          score=label_column if metric == "cosine" else None)
    pairs = read_pair_split(resolve_data_file(str(data)) or str(data), columns, delimiter=delimiter, split=split,
                            cli_flags=True)
    # the reported loss is MNRL at the run's similarity_scale (sentence-transformers' 20 for other models)
    section = (loaded.run_settings or FinetuneSection()).embedding
    loss = "mnrl" if metric == "retrieval" else "cosine"
    workload = engine.text_workload(loaded.tokenizer(), loaded.max_length, engine.rows_of)
    columns = [pairs.anchors, pairs.positives] + ([pairs.negatives] if pairs.negatives is not None else [])
    settings = settings or engine.EngineSettings(label="evaluating")
    backend = backend_for(settings.backend, embedder, loaded.tokenizer(), loaded.max_length)
    roles = [torch.stack(engine.run(texts, workload, backend, settings).results) for texts in columns]
    by_batch = [[role[start:start + batch_size] for role in roles] for start in range(0, len(pairs), batch_size)]
    scores = torch.tensor(pairs.scores, dtype=torch.float32) if pairs.scores is not None else None
    metrics = metrics_of_embeddings(by_batch, scores, pairs, loss, section.similarity_scale)
    return EvaluationReport(split, pairs.source, TASK_TYPE, [], metrics | {"examples": float(len(pairs))}, [], None)
