"""Embedding losses, and in-batch negatives that stay global under accumulation and data parallelism.

MultipleNegativesRanking (sentence-transformers' `MultipleNegativesRankingLoss`): every anchor is
scored against every positive and hard negative of the batch by scaled cosine similarity, and the
cross-entropy asks for its own positive. Its quality grows with the number of candidates, so a
global batch of 256 must mean 256 candidates even when it is 8 micro-batches on 4 ranks.

* Data parallelism: the embeddings of every rank are gathered (`train.distributed.all_gather_rows`)
  and every rank computes the same loss over the global batch. The gather sends each rank back the
  gradient of its own rows only; DDP then averages the parameter gradients over ranks, so the loss
  is multiplied by the world size, as the trainer does for losses normalised over the global batch.
* Accumulation (GradCache, Gao et al. 2021): pass 1 embeds every micro-batch without a graph;
  the loss over all of them gives the gradient of each embedding; pass 2 embeds each micro-batch
  again with a graph and back-propagates `sum(embedding * its gradient)`, whose parameter gradient is
  exactly the big batch's. Memory is one micro-batch's activations plus the embeddings. Dropout
  must draw the same masks in both passes, so the RNG state before each micro-batch of pass 1 is
  restored before the same micro-batch of pass 2 (and the state after pass 1 restored at the end,
  which keeps the RNG stream, and so exact resume, as if each micro-batch had run once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from bertforge.batch import model_inputs
from bertforge.train.task import Batch, StepRunner

Loss = Callable[[list[torch.Tensor], Sequence[Batch], Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]


def roles_of(embeddings: torch.Tensor, batch: Batch) -> list[torch.Tensor]:
    """A micro-batch's embeddings split by role (`data.pairs.collate_pairs`): [anchors, positives(, negatives)]."""
    return list(embeddings.split(int(batch["num_samples"])))


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def multiple_negatives_ranking(anchors: torch.Tensor, candidates: torch.Tensor, scale: float) -> torch.Tensor:
    """Mean cross-entropy of each anchor's scaled cosine similarities to all candidates; anchor i's positive
    is candidate i (the other positives and every hard negative are its negatives)."""
    targets = torch.arange(anchors.shape[0], device=anchors.device)
    return F.cross_entropy(cosine_matrix(anchors, candidates) * scale, targets)


def cosine_errors(first: torch.Tensor, second: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Squared errors of cos(first_i, second_i) against the target scores (sentence-transformers'
    `CosineSimilarityLoss` is their mean)."""
    return (F.cosine_similarity(first.float(), second.float(), dim=-1) - scores.float()) ** 2


def mnrl_over(embeddings: list[torch.Tensor], batches: Sequence[Batch], gather: Callable[[torch.Tensor], torch.Tensor],
              scale: float) -> torch.Tensor:
    """MNRL over the micro-batches' embeddings and, through `gather`, those of every rank."""
    by_role = list(zip(*(roles_of(e, b) for e, b in zip(embeddings, batches, strict=True)), strict=True))
    anchors, *candidates = (gather(torch.cat(role)) for role in by_role)
    return multiple_negatives_ranking(anchors, torch.cat(candidates), scale)


def embed(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """The embeddings of every text of a micro-batch, through the (possibly wrapped) model."""
    return model(**model_inputs(batch))


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _restore_rng(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def global_batch_step(micro_batches: Sequence[Batch], runner: StepRunner, loss: Loss) -> float:
    """Forward and backward of one optimizer step whose loss couples every micro-batch of every rank.

    `loss(embeddings per micro-batch, micro-batches, gather)` must give the same value on every rank.
    One micro-batch: a plain forward and backward. Several: the two passes described above.
    Returns the loss of the step (the same on every rank)."""
    model, device = runner.model, runner.device
    if len(micro_batches) == 1:
        with runner.micro_batch(True):
            value = loss([embed(model, micro_batches[0])], micro_batches, runner.gather)
        runner.backward(value * runner.world_size)
        return float(value.detach())
    states, cached = [], []
    with torch.no_grad():
        for batch in micro_batches:
            states.append(_rng_state(device))
            with runner.autocast():
                cached.append(embed(model, batch).float())
    after = _rng_state(device)
    leaves = [embeddings.requires_grad_() for embeddings in cached]
    value = loss(leaves, micro_batches, runner.gather)
    value.backward()  # the gradients of the embeddings only: the leaves hold no graph to the weights
    for index, (batch, leaf) in enumerate(zip(micro_batches, leaves, strict=True)):
        _restore_rng(states[index], device)
        with runner.micro_batch(index == len(micro_batches) - 1):
            surrogate = (embed(model, batch).float() * leaf.grad).sum() * runner.world_size
        runner.backward(surrogate)
    _restore_rng(after, device)
    return float(value.detach())
