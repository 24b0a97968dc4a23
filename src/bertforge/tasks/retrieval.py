"""Retrieval metrics of sentence embeddings: each query ranks the whole corpus by cosine similarity.

The evaluation set is built from held-out pairs: the distinct anchors are the queries, the distinct
positives (and hard negatives) the corpus, and a query's relevant documents are the positives it
is paired with. The metrics are those of sentence-transformers' `InformationRetrievalEvaluator` and
the MTEB/BEIR tables: MRR@10 (reciprocal rank of the first relevant document within the top 10),
recall@k (the fraction of a query's relevant documents in its top k) and nDCG@10 (binary gains),
each averaged over queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertforge.data.pairs import PairSplit

RECALL_AT = (1, 5, 10)
RANK_DEPTH = 10  # MRR and nDCG look at the top 10, recall at its largest k
RETRIEVAL_METRICS = ("mrr_at_10", *(f"recall_at_{k}" for k in RECALL_AT), "ndcg_at_10")
QUERY_CHUNK = 1024  # queries scored at once: bounds the [queries, corpus] similarity block


@dataclass
class RetrievalSet:
    """Queries and corpus of held-out pairs, named by rows of the pair embeddings (role 0 anchors, 1 positives,
    2 negatives): a text that several pairs share is scored once."""

    query_rows: list[int]  # the first row holding each distinct anchor
    corpus_rows: list[tuple[int, int]]  # (role, row) of the first occurrence of each distinct positive / negative
    relevant: list[set[int]]  # per query: indices into the corpus


def retrieval_set(split: PairSplit, rows: int | None = None) -> RetrievalSet:
    """Distinct anchors as queries, distinct positives and negatives as the corpus, pairs as relevance
    (of the first `rows` pairs: an evaluation capped by data.validation_samples)."""
    rows = len(split) if rows is None else rows
    corpus_index: dict[str, int] = {}
    corpus_rows: list[tuple[int, int]] = []
    for role, texts in ((1, split.positives), (2, split.negatives or [])):
        for row, text in enumerate(texts[:rows]):
            if text not in corpus_index:
                corpus_index[text] = len(corpus_rows)
                corpus_rows.append((role, row))
    relevant: dict[str, set[int]] = {}
    query_rows: list[int] = []
    for row, (anchor, positive) in enumerate(zip(split.anchors[:rows], split.positives[:rows], strict=True)):
        if anchor not in relevant:
            relevant[anchor] = set()
            query_rows.append(row)
        relevant[anchor].add(corpus_index[positive])
    return RetrievalSet(query_rows, corpus_rows, list(relevant.values()))


def retrieval_scores(split: PairSplit, roles: list[torch.Tensor]) -> dict[str, float]:
    """The retrieval metrics of pair embeddings by role ([rows, dim] each), rows in the order of `split`."""
    found = retrieval_set(split, rows=roles[0].shape[0])
    queries = roles[0][found.query_rows]
    corpus = torch.stack([roles[role][row] for role, row in found.corpus_rows])
    return retrieval_metrics(top_ranked(queries, corpus), found.relevant)


def top_ranked(queries: torch.Tensor, corpus: torch.Tensor, depth: int = RANK_DEPTH) -> np.ndarray:
    """[queries, depth] corpus indices by descending cosine similarity (ties: the lower index first)."""
    queries = torch.nn.functional.normalize(queries.float(), dim=-1)
    corpus = torch.nn.functional.normalize(corpus.float(), dim=-1)
    depth = min(depth, corpus.shape[0])
    ranked = []
    for start in range(0, queries.shape[0], QUERY_CHUNK):
        scores = queries[start:start + QUERY_CHUNK] @ corpus.T
        # a stable sort, so equal scores rank deterministically (topk's order for ties is unspecified)
        ranked.append(torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :depth])
    return torch.cat(ranked).numpy() if ranked else np.zeros((0, depth), dtype=np.int64)


def retrieval_metrics(ranked: np.ndarray, relevant: Sequence[set[int]]) -> dict[str, float]:
    """MRR@10, recall@1/5/10 and nDCG@10 averaged over queries, from each query's ranked corpus indices."""
    if len(relevant) == 0:
        return dict.fromkeys(RETRIEVAL_METRICS, 0.0)
    discounts = 1.0 / np.log2(np.arange(2, RANK_DEPTH + 2))
    totals = dict.fromkeys(RETRIEVAL_METRICS, 0.0)
    for top, wanted in zip(ranked, relevant, strict=True):
        hits = np.array([int(index) in wanted for index in top[:RANK_DEPTH]], dtype=bool)
        first = int(np.argmax(hits)) if hits.any() else None
        totals["mrr_at_10"] += 1.0 / (first + 1) if first is not None else 0.0
        for k in RECALL_AT:
            totals[f"recall_at_{k}"] += hits[:k].sum() / len(wanted)
        ideal = discounts[:min(len(wanted), RANK_DEPTH)].sum()
        totals["ndcg_at_10"] += float((discounts[:len(hits)] * hits).sum() / ideal)
    return {name: float(value / len(relevant)) for name, value in totals.items()}
