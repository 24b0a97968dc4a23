"""Characters `bertforge tokenizer train --normalize` removes before the tokenizer's own normalizer, and a
tokenizer's normalisation in words.

Arabic is written with marks most text leaves out and some adds: the harakat or tashkeel (short vowels,
tanwin, shadda, sukun: U+064B-U+0652) and the superscript alef (U+0670), and the tatweel (U+0640) that
stretches a word for looks ("مرحـــبا"). Kept, "تعذّر" and "تعذر" are different words to the vocabulary
and to the model; removed, they are one. The hamza and madda of أ إ آ ؤ ئ are letters, not marks: these
normalisations keep them, where BERT's accent stripping (NFD, then every combining mark dropped) folds
"سأل" (asked) into "سال" (flowed).

The removal is a `Replace` normalizer in `tokenizer.json`, so `load_tokenizer` (every bertforge command)
and `transformers.AutoTokenizer` apply the same one: `save_tokenizer` names the generic fast tokenizer
class for such a tokenizer, since BERT's, RoBERTa's and XLM-R's classes rebuild their normalizer from
their own settings and would drop it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, normalizers

from bertforge.errors import DataError


@dataclass(frozen=True)
class Normalization:
    """One named removal: the characters (a regular-expression class body) and what it does, in words."""

    name: str
    characters: str
    describe: str


NORMALIZATIONS: dict[str, Normalization] = {n.name: n for n in (
    Normalization("arabic-diacritics", "\u064b-\u0652\u0670",
                  "Arabic diacritics removed"),
    Normalization("tatweel", "\u0640", "tatweel removed"),
)}
PRESETS: dict[str, tuple[str, ...]] = {"arabic": ("arabic-diacritics", "tatweel")}
NAMES = (*PRESETS, *NORMALIZATIONS)


def resolve(names: Iterable[str]) -> tuple[str, ...]:
    """The normalisations `names` asks for, presets expanded, each once, in the registry's order."""
    wanted: set[str] = set()
    for name in names:
        if name in PRESETS:
            wanted.update(PRESETS[name])
        elif name in NORMALIZATIONS:
            wanted.add(name)
        else:
            raise DataError(f"--normalize {name!r} is not a normalisation; choose from {', '.join(NAMES)}")
    return tuple(name for name in NORMALIZATIONS if name in wanted)


def with_removals(normalizer: normalizers.Normalizer | None, names: tuple[str, ...]) -> normalizers.Normalizer | None:
    """`normalizer` preceded by the removal of the characters of `names` (resolved)."""
    if not names:
        return normalizer
    removal = normalizers.Replace(Regex(f"[{''.join(NORMALIZATIONS[name].characters for name in names)}]"), "")
    return removal if normalizer is None else normalizers.Sequence([removal, normalizer])


def normalizer_steps(tokenizer: Tokenizer) -> list[dict]:
    """The saved form of each step of a tokenizer's normalizer (a Sequence's steps, or the one)."""
    spec = json.loads(tokenizer.to_str()).get("normalizer") or {}
    return spec.get("normalizers", [spec]) if spec.get("type") == "Sequence" else [spec]


def removals_of(tokenizer: Tokenizer) -> tuple[str, ...]:
    """The normalisations of this registry a tokenizer applies (read from its normalizer, as saved)."""
    found: set[str] = set()
    for step in normalizer_steps(tokenizer):
        pattern = (step.get("pattern") or {}).get("Regex", "") if step.get("type") == "Replace" else ""
        if step.get("content") == "" and pattern.startswith("[") and pattern.endswith("]"):
            found.update(name for name, n in NORMALIZATIONS.items() if n.characters in pattern[1:-1])
    return tuple(name for name in NORMALIZATIONS if name in found)


def describe(tokenizer: Tokenizer) -> str:
    """What the normalizer does, in words: "uncased, accents kept, tatweel removed"."""
    bert = next((step for step in normalizer_steps(tokenizer) if step.get("type") == "BertNormalizer"), None)
    if bert is None:
        parts = ["cased", "accents kept"]  # byte-level BPE and Unigram keep the text as it is
    else:
        strip = bert["lowercase"] if bert.get("strip_accents") is None else bert["strip_accents"]
        parts = ["uncased" if bert["lowercase"] else "cased", "accents stripped" if strip else "accents kept"]
    return ", ".join(parts + [NORMALIZATIONS[name].describe for name in removals_of(tokenizer)])
