"""A typo in a training label becomes a class of its own: rare labels and near-twins of a frequent one are named."""

from __future__ import annotations

import gzip
import json
from collections import Counter

from bertforge.data.bundled import supersense_path
from bertforge.data.label_warnings import suspicious_labels


def test_a_typo_and_a_rare_label_are_named() -> None:
    assert suspicious_labels({"positive": 50, "negative": 48, "postive": 1, "neutral": 3}) == [
        "label 'postive' (1 row) is close to 'positive' (50 rows): a typo?",
        "label 'neutral' is seen only 3 times in the training data"]


def test_the_bundled_supersense_classes_raise_no_warning() -> None:
    with gzip.open(supersense_path("train"), "rt", encoding="utf-8") as rows:
        counts = Counter(json.loads(line)["label"] for line in rows)
    assert suspicious_labels(counts) == []
    assert suspicious_labels(counts | {"noun.animl": 2}) == [
        "label 'noun.animl' (2 rows) is close to 'noun.animal' (6,013 rows): a typo?"]
