"""`data.validation_samples`: the rows of a validation split that evaluations during training score.

The subset chooses the best checkpoint and stops training early, so it must stand for the whole
split: a seeded sample, never the file's head (a file sorted by label would hand the first 2,000
rows of the bundled supersense validation split 4 of its 45 classes). Classification and tagging
draw a stratified sample: every class gets at least one row when the subset has room for it,
the rest goes to the classes in proportion to their size, so per-class metrics keep their support.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

Split = TypeVar("Split")


@dataclass(frozen=True)
class ValidationSubset:
    """Which rows of a split the evaluations score, and how they were drawn (for the report)."""

    rows: list[int]  # row indices into the split, in file order
    of: int  # rows in the whole split
    seed: int
    stratified_by: str | None  # "label", "entity type", or None for a plain seeded sample

    @property
    def is_whole_split(self) -> bool:
        return len(self.rows) == self.of

    def describe(self) -> dict[str, Any]:
        return {"rows": len(self.rows), "of": self.of, "seed": self.seed, "stratified_by": self.stratified_by}


def sample_rows(size: int, limit: int | None, seed: int, strata: Sequence[Hashable] | None = None) -> list[int]:
    """`limit` of `size` row indices in ascending order: all when `limit` is None or not smaller; else a
    seeded sample, stratified by `strata` (one key per row) when given."""
    if limit is None or limit >= size:
        return list(range(size))
    rng = random.Random(seed)
    if strata is None:
        return sorted(rng.sample(range(size), limit))
    groups: dict[Hashable, list[int]] = {}
    for row, key in enumerate(strata):
        groups.setdefault(key, []).append(row)
    keys = sorted(groups, key=repr)  # a fixed order, whatever order the rows come in
    chosen: list[int] = []
    for key, quota in zip(keys, stratum_quotas([len(groups[key]) for key in keys], limit, rng), strict=True):
        chosen += rng.sample(groups[key], quota)
    return sorted(chosen)


def stratum_quotas(sizes: Sequence[int], limit: int, rng: random.Random) -> list[int]:
    """Rows to take from each stratum: one each first (as many strata as fit, chosen at random when not
    all do), the rest in proportion to what is left of each (largest remainders), never more than it holds."""
    if limit < len(sizes):
        picked = set(rng.sample(range(len(sizes)), limit))
        return [1 if index in picked else 0 for index in range(len(sizes))]
    left = [size - 1 for size in sizes]
    remaining, capacity = limit - len(sizes), sum(left)
    if capacity == 0:
        return [1] * len(sizes)
    exact = [remaining * size / capacity for size in left]
    quotas = [int(share) for share in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda index: (quotas[index] - exact[index], index))
    for index in by_remainder[:remaining - sum(quotas)]:
        quotas[index] += 1
    return [1 + quota for quota in quotas]


def subset_of_split(split: Split, subset: ValidationSubset) -> Split:
    """The same split (a `LabeledSplit`, `TaggedSplit` or `PairSplit`) holding only `subset.rows`: every
    list field with one entry per row is cut, the rest (source, label names) kept."""
    if subset.is_whole_split:
        return split
    size = subset.of
    changes = {field.name: [value[row] for row in subset.rows]
               for field in dataclasses.fields(split)  # type: ignore[arg-type]
               if isinstance(value := getattr(split, field.name), list) and len(value) == size
               and field.name not in ("label_names", "tag_names")}
    return dataclasses.replace(split, **changes)  # type: ignore[type-var]


def rarest_entity_types(tags: Sequence[Sequence[int]], tag_names: Sequence[str]) -> list[str | None]:
    """Per sentence, its rarest entity type in the split (None for a sentence without one): the stratum
    that keeps the rare types of a tagging split in a subset."""
    from bertforge.data.tagged import entity_type  # the trainer imports this module for sample_rows alone

    type_of = [entity_type(name) for name in tag_names]
    sentence_types = [{type_of[tag] for tag in sentence} - {None} for sentence in tags]
    counts = Counter(entity for types in sentence_types for entity in types)
    return [min(types, key=lambda entity: (counts[entity], entity)) if types else None
            for types in sentence_types]


def final_splits_with_validation(test: Split | None, validation: Split | None, chosen: Split | None
                                 ) -> dict[str, Split]:
    """The splits a fine-tune scores with its best checkpoint at the end: the test split, and as `validation`
    the rows whose evaluations chose that checkpoint (`chosen`, all of `validation` or a subset), so the run
    shows what the choice rested on; without a test split, a subset's whole split as `validation_full` too."""
    splits: dict[str, Split] = {}
    if test is not None:
        splits["test"] = test
    if chosen is not None:
        splits["validation"] = chosen
        if test is None and validation is not None and chosen is not validation:
            splits["validation_full"] = validation
    return splits
