"""Evenly spaced slices of a WordNet parity task (`scripts/build_parity_tasks.py`), written as split files.

The real fine-tunes of the tests read a few hundred rows of tasks whose train splits hold tens of thousands
(wordnet-embedding: 204,364); the script's own builder makes the rows, and only the slices are written
(writing every split and task.json, as `build_parity_tasks.py --tasks NAME` does, cost 2.1 s of CPU for
wordnet-embedding and 0.6 s for supersense-tagging, for rows no test reads; its main also builds the WordNet
noun graph that wordnet-embedding does not use). Each row is written as the script writes it (`jsonl_bytes`).
"""

from __future__ import annotations

from pathlib import Path

from helpers.scripts import load_repo_script

SCRIPT = load_repo_script("scripts/build_parity_tasks.py", "build_parity_tasks_for_slices")
BUILDERS = {"supersense-tagging": SCRIPT.build_supersense_tagging, "wordnet-embedding": SCRIPT.build_wordnet_embedding}


def every_nth(rows: list[dict], count: int) -> list[dict]:
    """`count` rows spread over the whole split (every len // count-th), in the split's order."""
    return rows[::max(len(rows) // count, 1)][:count]


def parity_task_slices(name: str, out_dir: Path, counts: dict[str, int]) -> tuple[dict[str, Path], list[str] | None]:
    """({split: its slice's .jsonl in `out_dir`}, the task's whole label set) for the task `name`."""
    task = BUILDERS[name]()
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, count in counts.items():
        files[split] = out_dir / f"{split}.jsonl"
        files[split].write_bytes(SCRIPT.jsonl_bytes(every_nth(task.splits[split], count)))
    return files, task.labels()
