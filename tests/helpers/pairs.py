"""Text pairs of real WordNet text for the embedding tests (from the bundled supersense glosses)."""

from __future__ import annotations

import json
from pathlib import Path

from bertforge.data.bundled import supersense_lines


def gloss_pairs(rows: int, split: str = "train") -> list[dict[str, str]]:
    """A WordNet gloss's first clause as the anchor, the whole gloss as its positive, the next gloss as a hard
    negative."""
    glosses = [json.loads(line)["text"] for line in supersense_lines(split, rows + 1)]
    return [{"anchor": g.split(";")[0].split(",")[0], "positive": g, "negative": glosses[i + 1]}
            for i, g in enumerate(glosses[:rows])]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
