"""Labels that look like mistakes: a typo in one training row's label silently becomes a class of its own
(only "46 classes" in the log hints at it), so a rare label, or one a letter or two from a much more frequent
one, is named in a warning before training starts."""

from __future__ import annotations

from collections.abc import Mapping

RARE = 5  # seen fewer times than this in the training split
CLOSE_EDITS = 2  # at most this many single-character edits apart
TYPO_ROWS = 10  # ...and the rarer label on fewer rows than this and a tenth of the other's: real classes such
TYPO_SHARE = 0.1  # as WordNet's adj.ppl (45 rows) next to adj.all (11,550) are not typos


def edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def suspicious_labels(counts: Mapping[str, int]) -> list[str]:
    """One sentence per label that is rare, or close to a far more frequent label (a likely typo of it)."""
    found = []
    for label, count in sorted(counts.items(), key=lambda item: (item[1], item[0])):
        twins = [other for other, other_count in counts.items() if other != label and count < TYPO_ROWS
                 and count <= TYPO_SHARE * other_count
                 and edit_distance(label.lower(), other.lower()) <= min(CLOSE_EDITS, max(len(label) // 3, 1))]
        if twins:
            found.append(f"label {label!r} ({count:,} row{'s' if count != 1 else ''}) is close to {', '.join(repr(t) for t in twins)} "
                         f"({', '.join(f'{counts[t]:,}' for t in twins)} rows): a typo?")
        elif count < RARE and len(counts) > 1:
            found.append(f"label {label!r} is seen only {count:,} time{'s' if count != 1 else ''} in the training data")
    return found
