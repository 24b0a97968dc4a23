"""Build a directory in the GLUE layout from real English text, for tests of the GLUE parsers and runner.

GLUE cannot be downloaded here, so every task's files are written from the bundled WordNet
supersense data (glosses and their quoted example sentences) in that task's exact file format:
headers or none, column positions, label encodings, MRPC's byte-order mark, MNLI's 12-column train
and 16-column dev files with the gold label last and annotator labels that sometimes disagree.
The tasks are learnable stand-ins, not the real ones:

- CoLA: a gloss's example sentence (acceptable, 1) or the same words shuffled (unacceptable, 0, "*").
- SST-2: lower-cased noun glosses (1) vs verb glosses (0), with SST-2's space before the tab.
- MRPC, QQP, RTE, QNLI: two glosses, positive when they share a supersense.
- STS-B: 0-5 similarity from shared supersense, shared part of speech and word overlap.
- MNLI: entailment = same supersense, neutral = same part of speech, contradiction = different;
  matched dev draws premises from noun/verb glosses like train, mismatched from adjectives/adverbs.

Each task directory also holds `STAND-IN.txt` (`bertforge.tasks.glue_tasks.STAND_IN_FILE`), saying what
the task is instead, so `bertforge glue` marks these tasks as stand-ins in its results table and sets
none of them against BERT-base's published numbers.

Deterministic (seeded per task and split) and small: `build_glue_layout(dir)` writes 300 train and
100 dev rows per task in well under a second. Run as a script to write a copy: `python
tests/glue_layout.py OUT_DIR`.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bertforge.data.bundled import supersense_path
from bertforge.tasks.glue_tasks import STAND_IN_FILE

TRAIN_ROWS = 300
DEV_ROWS = 100
BOM = "\ufeff"
EXAMPLE_SENTENCE = re.compile(r'"[^"]{12,}"')

# (text, text pair or None, label exactly as written in the file) for every row, per task and split
Expected = dict[str, dict[str, list[tuple[str, str | None, str]]]]


@dataclass(frozen=True)
class Gloss:
    text: str
    supersense: str
    number: int  # the synset offset, used for ids

    @property
    def pos(self) -> str:
        return self.supersense.split(".")[0]


@functools.cache
def _glosses(split: str) -> tuple[Gloss, ...]:
    with gzip.open(supersense_path(split), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return tuple(Gloss(r["text"], r["label"], int(r["id"].split(".")[1])) for r in rows)


class GlossPairs:
    """Draws gloss pairs by relation: same supersense, same part of speech only, or different POS."""

    POOL = 600  # candidates kept per part of speech: enough variety, cheap to filter per draw

    def __init__(self, glosses: tuple[Gloss, ...], rng: random.Random, premise_pos: tuple[str, ...]) -> None:
        self.rng = rng
        self.premises = [g for g in glosses if g.pos in premise_pos]
        self.by_supersense: dict[str, list[Gloss]] = defaultdict(list)
        by_pos: dict[str, list[Gloss]] = defaultdict(list)
        for gloss in glosses:
            self.by_supersense[gloss.supersense].append(gloss)
            by_pos[gloss.pos].append(gloss)
        self.by_pos = {pos: rng.sample(gs, min(len(gs), self.POOL)) for pos, gs in sorted(by_pos.items())}

    def draw(self, relation: str) -> tuple[Gloss, Gloss]:
        while True:  # redraw a premise that has no partner of this relation (adverbs have one supersense)
            first = self.rng.choice(self.premises)
            if relation == "same_supersense":
                candidates = self.by_supersense[first.supersense]
            elif relation == "same_pos":
                candidates = [g for g in self.by_pos[first.pos] if g.supersense != first.supersense]
            else:
                candidates = [g for pos, gs in self.by_pos.items() if pos != first.pos for g in gs]
            candidates = [g for g in candidates if g.text != first.text]
            if candidates:
                return first, self.rng.choice(candidates)


def _balanced(values: tuple[str, ...], count: int, rng: random.Random) -> list[str]:
    labels = [values[i % len(values)] for i in range(count)]
    rng.shuffle(labels)
    return labels


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def _write(path: Path, lines: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text((BOM if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------
# one writer per task: (rows, rng, glosses, split file stem) -> (file lines, expected rows)

Rows = list[tuple[str, str | None, str]]


def _cola(count: int, rng: random.Random, glosses: tuple[Gloss, ...], _: str) -> tuple[list[str], Rows]:
    examples = sorted({m for g in glosses for m in EXAMPLE_SENTENCE.findall(g.text)})
    lines, expected = [], []
    for label in _balanced(("1", "0"), count, rng):
        sentence = rng.choice(examples)
        if label == "0":
            words = sentence.split()
            while words == sentence.split():
                rng.shuffle(words)
            sentence = " ".join(words)
        # no header: source code, label, "*" marking the original unacceptable judgement, sentence
        lines.append(f"wn30\t{label}\t{'*' if label == '0' else ''}\t{sentence}")
        expected.append((sentence, None, label))
    return lines, expected


def _sst2(count: int, rng: random.Random, glosses: tuple[Gloss, ...], _: str) -> tuple[list[str], Rows]:
    by_pos = {"1": [g for g in glosses if g.pos == "noun"], "0": [g for g in glosses if g.pos == "verb"]}
    lines, expected = ["sentence\tlabel"], []
    for label in _balanced(("1", "0"), count, rng):
        sentence = rng.choice(by_pos[label]).text.lower() + " "  # SST-2 leaves a space before the tab
        lines.append(f"{sentence}\t{label}")
        expected.append((sentence, None, label))
    return lines, expected


ALL_POS = ("noun", "verb", "adj", "adv")
PairRow = Callable[[int, str, str, str, Gloss, Gloss], str]  # (index, label, text, pair, first, second) -> line


def _question(gloss: str) -> str:
    return f"What is {gloss}?"


def _pair_task(header: str, relation_of: dict[str, str], row: PairRow,
               questions: tuple[bool, bool] = (False, False)) -> Callable[..., tuple[list[str], Rows]]:
    """A writer for the two-text tasks: a balanced label per row, then a gloss pair of its relation."""

    def write(count: int, rng: random.Random, glosses: tuple[Gloss, ...], _: str) -> tuple[list[str], Rows]:
        pairs = GlossPairs(glosses, rng, ALL_POS)
        lines, expected = [header], []
        for index, label in enumerate(_balanced(tuple(relation_of), count, rng)):
            first, second = pairs.draw(relation_of[label])
            text = _question(first.text) if questions[0] else first.text
            pair = _question(second.text) if questions[1] else second.text
            lines.append(row(index, label, text, pair, first, second))
            expected.append((text, pair, label))
        return lines, expected

    return write


_mrpc = _pair_task("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                   {"1": "same_supersense", "0": "different_pos"},
                   lambda i, label, text, pair, a, b: f"{label}\t{a.number}\t{b.number}\t{text}\t{pair}")
_qqp = _pair_task("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                  {"1": "same_supersense", "0": "same_pos"},
                  lambda i, label, text, pair, a, b: f"{i}\t{a.number}\t{b.number}\t{text}\t{pair}\t{label}",
                  questions=(True, True))
_qnli = _pair_task("index\tquestion\tsentence\tlabel",
                   {"entailment": "same_supersense", "not_entailment": "different_pos"},
                   lambda i, label, text, pair, a, b: f"{i}\t{text}\t{pair}\t{label}", questions=(True, False))
_rte = _pair_task("index\tsentence1\tsentence2\tlabel",
                  {"entailment": "same_supersense", "not_entailment": "same_pos"},
                  lambda i, label, text, pair, a, b: f"{i}\t{text}\t{pair}\t{label}")


def _stsb(count: int, rng: random.Random, glosses: tuple[Gloss, ...], split: str) -> tuple[list[str], Rows]:
    pairs = GlossPairs(glosses, rng, ALL_POS)
    lines = ["index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"]
    expected: Rows = []
    relations = _balanced(("same_supersense", "same_pos", "different_pos"), count, rng)
    for index, relation in enumerate(relations):
        first, second = pairs.draw(relation)
        a, b = _words(first.text), _words(second.text)
        overlap = len(a & b) / max(1, len(a | b))
        score = 5.0 * (0.6 * (first.supersense == second.supersense) + 0.2 * (first.pos == second.pos) + 0.2 * overlap)
        written = f"{score:.3f}"
        lines.append(f"{index}\tmain-glosses\tWordNet\t{split}\t{index:04d}\tnone\tnone\t{first.text}\t{second.text}"
                     f"\t{written}")
        expected.append((first.text, second.text, written))
    return lines, expected


MNLI_RELATIONS = {"entailment": "same_supersense", "neutral": "same_pos", "contradiction": "different_pos"}


def _mnli(count: int, rng: random.Random, glosses: tuple[Gloss, ...], split: str) -> tuple[list[str], Rows]:
    premise_pos = ("adj", "adv") if split == "dev_mismatched" else ("noun", "verb")
    pairs = GlossPairs(glosses, rng, premise_pos)
    columns = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
               "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]
    annotators = ["label1"] if split == "train" else ["label1", "label2", "label3", "label4", "label5"]
    lines, expected = ["\t".join([*columns, *annotators, "gold_label"])], []
    for index, gold in enumerate(_balanced(tuple(MNLI_RELATIONS), count, rng)):
        first, second = pairs.draw(MNLI_RELATIONS[gold])
        votes = [gold] * len(annotators)
        if split != "train" and index % 4 == 0:  # a dissenting first annotator: only gold_label is the label
            votes[0] = next(label for label in MNLI_RELATIONS if label != gold)
        parses = []
        for gloss in (first, second):
            words = gloss.text.split()
            parses.append(("( " + " ".join(words) + " )", "(ROOT (S " + " ".join(f"(NN {w})" for w in words) + "))"))
        lines.append("\t".join([str(index), str(first.number), f"{first.number}{gold[0]}", f"wordnet-{first.pos}",
                                parses[0][0], parses[1][0], parses[0][1], parses[1][1], first.text, second.text,
                                *votes, gold]))
        expected.append((first.text, second.text, gold))
    return lines, expected


WRITERS = {"CoLA": _cola, "SST-2": _sst2, "MRPC": _mrpc, "STS-B": _stsb, "QQP": _qqp, "MNLI": _mnli,
           "QNLI": _qnli, "RTE": _rte}
DEV_SPLITS = {"MNLI": ("dev_matched", "dev_mismatched")}


# the first line of each task's STAND-IN.txt: what the task is instead of GLUE's
STAND_IN_DESCRIPTIONS = {
    "CoLA": "WordNet example sentences (acceptable) vs the same words shuffled (unacceptable)",
    "SST-2": "WordNet noun glosses (1) vs verb glosses (0)",
    "MRPC": "two WordNet glosses, positive when they share a supersense",
    "STS-B": "0-5 similarity of two WordNet glosses from shared supersense, part of speech and word overlap",
    "QQP": "two WordNet glosses, positive when they share a supersense",
    "MNLI": "WordNet glosses: entailment = same supersense, neutral = same part of speech, contradiction = neither",
    "QNLI": "two WordNet glosses, positive when they share a supersense",
    "RTE": "two WordNet glosses, positive when they share a supersense",
}


def build_glue_layout(root: str | Path, train_rows: int = TRAIN_ROWS, dev_rows: int = DEV_ROWS) -> Expected:
    """Write `root/<Task>/<split>.tsv` for the 8 tasks, and each task's STAND-IN.txt; returns every row written,
    as the file holds it."""
    root = Path(root)
    expected: Expected = {}
    for title, writer in WRITERS.items():
        expected[title] = {}
        (root / title).mkdir(parents=True, exist_ok=True)
        (root / title / STAND_IN_FILE).write_text(
            f"a stand-in written by tests/glue_layout.py, not GLUE's data: {STAND_IN_DESCRIPTIONS[title]}\n",
            encoding="utf-8")
        for split in ("train", *DEV_SPLITS.get(title, ("dev",))):
            rng = random.Random(f"glue-layout/{title}/{split}")
            glosses = _glosses("train" if split == "train" else "validation")
            lines, rows = writer(train_rows if split == "train" else dev_rows, rng, glosses, split)
            _write(root / title / f"{split}.tsv", lines, bom=title == "MRPC")  # MRPC's files start with a BOM
            expected[title][split] = rows
    return expected


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/glue_layout.py OUT_DIR")
    written = build_glue_layout(sys.argv[1])
    for task_title, splits in written.items():
        print(task_title, {split: len(rows) for split, rows in splits.items()})
