"""Token classification metrics: entity-level precision, recall and F1 by `seqeval`, and token accuracy.

`seqeval` is the field's reference (`run_ner.py` and the CoNLL shared tasks' `conlleval` agree with
it), so it is used rather than rewritten. Its default mode reads IO, BIO and BIOES tags alike. An
entity counts as found only when its type and its exact span of words both match.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np

from bertforge.tasks.metrics import ClassReport

ENTITY_METRICS = ("precision", "recall", "f1", "accuracy")


def tag_sequences(tag_ids: np.ndarray, words_per_sentence: Sequence[int], tag_names: Sequence[str]) -> list[list[str]]:
    """Flat per-word tag ids -> one list of tag names per sentence."""
    names = np.asarray(tag_names, dtype=object)[np.asarray(tag_ids, dtype=np.int64)]
    bounds = np.concatenate([[0], np.cumsum(words_per_sentence)]).astype(np.int64)
    return [list(names[bounds[i]:bounds[i + 1]]) for i in range(len(words_per_sentence))]


def entity_metrics(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro-averaged entity precision/recall/F1 and the share of words tagged right."""
    from seqeval.metrics import f1_score, precision_score, recall_score

    words = sum(len(sentence) for sentence in gold)
    right = sum(g == p for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True))
    with warnings.catch_warnings():  # no predicted entity yet (early in training) is a 0, not a warning
        warnings.simplefilter("ignore")
        return {"precision": float(precision_score(gold, predicted, zero_division=0)),
                "recall": float(recall_score(gold, predicted, zero_division=0)),
                "f1": float(f1_score(gold, predicted, zero_division=0)),
                "accuracy": right / words if words else 0.0}


def per_type_report(gold: list[list[str]], predicted: list[list[str]]) -> list[ClassReport]:
    """Entity-level precision/recall/F1 per entity type; support = the type's true entities."""
    from seqeval.metrics import classification_report

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = classification_report(gold, predicted, output_dict=True, zero_division=0)
    return [ClassReport(name, float(row["precision"]), float(row["recall"]), float(row["f1-score"]),
                        int(row["support"]))
            for name, row in sorted(table.items()) if not name.endswith(" avg")]
