#!/usr/bin/env python3
"""Build labeled fine-tuning tasks for the trainer parity benchmark from real text on a Debian machine.

Unlike the bundled WordNet gloss -> supersense set (short texts, single sentence, 45 classes),
these tasks have longer texts, a sentence-pair input, a regression target or word-level tags:

* ``manpages`` (``apt-get install manpages manpages-dev``): the DESCRIPTION section of every
  English man page in ``/usr/share/man/man1..man8`` -> its section number ("1".."8").
  Classification, texts of 20..200 words, 80/10/10 split by sha1 of the text. Which pages
  exist depends on the installed packages (``task.json`` lists them with their versions).
* ``wordnet-pairs`` (``apt-get install wordnet-base``): two WordNet 3.0 noun definitions ->
  "same" when the synsets share a direct hypernym (siblings), "different" otherwise; the
  negatives come from the same lexicographer file. Sentence-pair classification, 50/50,
  12,000 / 2,000 / 4,000 pairs.
* ``wordnet-similarity`` (``wordnet-base``): two noun definitions -> the Wu-Palmer similarity of
  their synsets on the noun hypernym graph, in [0, 1]. Sentence-pair regression, same sizes.
* ``supersense-tagging`` (``wordnet-base``): the quoted example sentences of WordNet glosses (all
  four parts of speech), split into words, each occurrence of the synset's own lemmas (inflected
  forms too: WordNet's exception lists and morphy's suffix rules) tagged in BIO with its
  lexicographer file (``B-noun.animal``, ``I-verb.motion``), the other words ``O``. Token
  classification, rows ``{"tokens": [...], "tags": [...], "id": "n02084071-0"}``; sentences where
  no lemma is found are dropped (counted in ``task.json``), one row per distinct word sequence.
* ``wordnet-embedding`` (``wordnet-base``): sentence-embedding pairs, rows ``{"anchor", "positive", "kind",
  "id"}``, the positive always a synset's definition (its gloss before the first quoted example). Train
  holds word -> definition pairs (each lemma of a synset, underscores as spaces) and usage ->
  definition pairs (each quoted example sentence of the gloss); validation and test hold usage ->
  definition pairs only: the retrieval evaluation "find the gloss of this usage". A held-out usage or
  definition that a train row also holds is dropped; identical (anchor, positive) rows are kept once.
* ``wordnet-choice`` (``wordnet-base``): multiple choice, rows ``{"text", "choices", "label", "id"}``: the
  context is a synset's first lemma and one of its quoted usage examples ("bank: he sat on the bank of
  the river"), the four choices definitions (the synset's own at index ``label``; distractors first the
  other senses of its lemmas, then random definitions of the same part of speech, all from the row's own
  split, drawn by a generator seeded with the row's id).
* ``arabic-messages`` (``apt-get install --no-install-recommends cinnamon-l10n evolution-common gimp-data
  gnucash-common krita-l10n vlc-l10n``): an Arabic interface message from those packages' ``.mo``
  catalogs -> the application (cinnamon, evolution, gimp, gnucash, krita, vlc). Classification,
  messages of 3+ Arabic words, harakat and tatweel kept; messages sharing a run of 4 words (compared
  without diacritics) share a split, 80/10/10 by sha1 of their group.
* ``debian-sections`` (needs ``apt-get update``): a package's short description -> its archive
  section. Built only where the apt lists exist (or when asked for by name).

In the two WordNet pair tasks every synset belongs to one split, the split of its whole gloss in the
bundled supersense set (sha1 of the gloss), and a pair is drawn only from synsets of one split:
so a given synset pair is always in the same split, no definition is in two splits, and no
validation/test definition is in the bundled pre-training corpus (which holds train glosses).
Supersense tagging likewise gives an example sentence its gloss's split (and keeps a sentence
that WordNet repeats in several glosses only once, in train if any of them is a train gloss).

Each task is written to ``DIR/<task>/{train,validation,test}.jsonl`` plus ``DIR/<task>/task.json``
(columns, labels, counts, per-split sha1 and the Debian package versions used). The output is
byte-for-byte reproducible from the same sources: sorted inputs, sha1-based splits, a seeded
``random.Random(0)`` for the sampled pairs. Standard library only:

    python scripts/build_parity_tasks.py                       # all tasks into ~/.cache/bertforge/tasks
    python scripts/build_parity_tasks.py --tasks manpages --out /tmp/tasks --force
"""

import argparse
import functools
import gzip
import hashlib
import html
import importlib.util
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType


def _load_build_samples() -> ModuleType:
    """The sibling ``build_samples.py``, for its split rule, WordNet location and error type."""
    name = "_bertforge_build_samples"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "build_samples.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load build_samples.py next to {__file__}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


_samples = _load_build_samples()
BuildError = _samples.BuildError
split_of: Callable[[str], str] = _samples.split_of  # 80/10/10 by sha1(text), the bundled samples' rule
debian_version: Callable[[str], str] = _samples.debian_version

WORDNET_DIR: Path = _samples.WORDNET_DIR
MAN_DIR = Path("/usr/share/man")
APT_LISTS_DIR = Path("/var/lib/apt/lists")
DPKG_INFO_DIR = Path("/var/lib/dpkg/info")

SPLITS = ("train", "validation", "test")
TASKS = ("manpages", "manpages-multilingual", "wordnet-pairs", "wordnet-similarity", "supersense-tagging",
         "wordnet-embedding", "wordnet-choice", "arabic-messages", "debian-sections")
OPTIONAL_TASKS = ("debian-sections",)  # skipped with a note, not an error, when its source is absent
TASK_FILE = "task.json"
FORMAT_VERSION = 1

MAN_SECTIONS = tuple(str(n) for n in range(1, 9))
MAN_MIN_WORDS = 20
MAN_MAX_WORDS = 200
MAN_MIN_CLASS = 30

PAIR_SIZES = {"train": 12_000, "validation": 2_000, "test": 4_000}
SEED = 0
ROOT_OFFSET = "00001740"  # entity.n.01, depth 1
HYPERNYM_POINTERS = ("@", "@i")
HISTOGRAM_BINS = 10

DEBIAN_MIN_SECTION = 200
DEBIAN_CAPS = {"train": 20_000, "validation": 4_000, "test": 4_000}


@dataclass
class Task:
    """One built task: its rows per split and the metadata that goes into task.json."""

    name: str
    description: str
    task_type: str  # "classification" | "regression" | "token_classification" | "embedding" | "multiple_choice"
    text_pair_column: str | None
    splits: dict[str, list[dict]]
    sources: dict[str, str]
    extra: dict[str, object] = field(default_factory=dict)

    def labels(self) -> list[str] | None:
        """The sorted label set (of a token task: its tag set, O included); None for regression."""
        if self.task_type == "token_classification":
            return sorted({tag for rows in self.splits.values() for row in rows for tag in row["tags"]})
        if self.task_type != "classification":  # regression scores, embedding pairs
            return None
        return sorted({row["label"] for rows in self.splits.values() for row in rows})

    def columns(self) -> dict[str, str | None]:
        """The task.json keys naming the row fields a fine-tuning config reads."""
        if self.task_type == "token_classification":
            return {"tokens_column": "tokens", "tags_column": "tags"}
        if self.task_type == "embedding":
            return {"text_column": "anchor", "text_pair_column": "positive"}
        if self.task_type == "multiple_choice":
            return {"text_column": "text", "choice_columns": ["choices"], "label_column": "label"}
        return {"text_column": "text", "text_pair_column": self.text_pair_column, "label_column": "label"}


def _require(path: Path, package: str, what: str = "") -> Path:
    if not path.exists():
        raise BuildError(f"{what or path} not found: install it with `apt-get install -y {package}`")
    return path


def _sha1_key(*parts: str) -> str:
    return hashlib.sha1("\t".join(parts).encode("utf-8")).hexdigest()


def _evenly_spaced(items: list, cap: int) -> list:
    """At most cap items, evenly spaced through the list (all of it when it is short enough)."""
    if len(items) <= cap:
        return items
    return [items[i * len(items) // cap] for i in range(cap)]


# -------------------------------------------------------------------------------------- man pages

_SH_RE = re.compile(r"\.SH(?:[ \t]+([^\n]*))?(?=\n|\Z)")  # at a line start: checked by the caller
_REQUEST_RE = re.compile(r"^[.'][ \t]*(\S*)[ \t]*(.*)$")
_FONT_MACROS = {"B", "I", "SM", "SB", "OP"}  # arguments joined with spaces
_ALTERNATING_MACROS = {"BR", "RB", "BI", "IB", "IR", "RI"}  # arguments joined without spaces
_SKIP_BLOCKS = {"TS": ".TE", "de": "..", "de1": "..", "am": "..", "ig": ".."}  # tables, macro definitions

_SPECIAL_CHARS = {
    "em": "\u2014", "en": "\u2013", "hy": "-", "mi": "-", "aq": "'", "dq": '"', "lq": '"', "rq": '"',
    "oq": "'", "cq": "'", "ga": "`", "ti": "~", "ha": "^", "rs": "\\", "sl": "/", "ba": "|", "pl": "+",
    "eq": "=", "lt": "<", "gt": ">", "<=": "<=", ">=": ">=", "->": "->", "<-": "<-", "co": "(C)",
    "rg": "(R)", "tm": "(TM)", "de": "\u00b0", "mu": "x", "di": "/", "Fo": '"', "Fc": '"',
}  # fmt: skip
_STRINGS = {'L"': '"', 'R"': '"', "C`": '"', "C'": '"', "C+": "C++", "lq": '"', "rq": '"', "Tm": "(TM)", "R": "(R)"}
_SINGLE_ESCAPES = {
    "-": "-", "e": "\\", "E": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", "t": " ", ".": ".",
    "'": "'", "`": "`", "&": "", ":": "", "%": "", "|": "", "^": "", "c": "", ")": "", ",": "", "/": "",
    "d": "", "u": "", "r": "", "a": "", "p": "", "{": "", "}": "", "!": "", "?": "", "\n": "",
}  # fmt: skip
_ESCAPE_RE = re.compile(
    r"""\\(?:
        f(?:\(..|\[[^\]]*\]|.)                                  # font: \fB \f(CW \f[BI]
      | s(?:[-+]?\(\d\d|\([-+]?\d\d|\[[^\]]*\]|'[^']*'|[-+]?\d)  # point size
      | [nkgmMFVY](?:\(..|\[[^\]]*\]|.)                          # registers, colours, font family
      | [NhvwoXbDlLRSxZABC](?P<delim>.)[^\n]*?(?P=delim)         # escapes with a delimited argument
      | \*(?:\((?P<str2>..)|\[(?P<strn>[^\]]*)\]|(?P<str1>.))   # string interpolation
      | \((?P<sc2>..)                                           # special character \(xx
      | \[(?P<scn>[^\]]*)\]                                      # special character \[name]
      | (?P<single>.)                                            # everything else: one character
    )""",
    re.X | re.S,
)


def _escape(m: re.Match[str]) -> str:
    if (name := m.group("str2") or m.group("strn") or m.group("str1")) is not None:
        return _STRINGS.get(name, "")
    if (name := m.group("sc2") or m.group("scn")) is not None:
        if name in _SPECIAL_CHARS:
            return _SPECIAL_CHARS[name]
        if re.fullmatch(r"u[0-9A-F]{4,6}", name):  # \[u2014]
            return chr(int(name[1:], 16))
        return " "
    if (char := m.group("single")) is not None:
        return _SINGLE_ESCAPES.get(char, char)
    return ""  # font, size, register, motion... escapes carry no text


def _strip_comment(line: str) -> str:
    """Cut a line at its troff comment (\\" or \\#), skipping escaped backslashes."""
    if '\\"' not in line and "\\#" not in line:
        return line
    for m in re.finditer(r"\\(.)", line):
        if m.group(1) in "\"#":
            return line[: m.start()]
    return line


def unescape(text: str) -> str:
    """troff escapes -> plain text (font changes dropped, \\- -> -, \\(em -> dash, \\e -> backslash...)."""
    return _ESCAPE_RE.sub(_escape, text)


def split_arguments(args: str) -> list[str]:
    """A troff request's arguments: blank-separated, double quotes group ("" is a literal quote)."""
    out: list[str] = []
    i, n = 0, len(args)
    while i < n:
        while i < n and args[i] in " \t":
            i += 1
        if i >= n:
            break
        buf: list[str] = []
        if args[i] == '"':
            i += 1
            while i < n:
                if args[i] == "\\" and i + 1 < n:
                    buf.append(args[i : i + 2])
                    i += 2
                elif args[i] == '"':
                    if i + 1 < n and args[i + 1] == '"':
                        buf.append('"')
                        i += 2
                    else:
                        i += 1
                        break
                else:
                    buf.append(args[i])
                    i += 1
        else:
            while i < n and args[i] not in " \t":
                if args[i] == "\\" and i + 1 < n:
                    buf.append(args[i : i + 2])
                    i += 2
                else:
                    buf.append(args[i])
                    i += 1
        out.append("".join(buf))
    return out


def troff_to_text(body: str, max_words: int | None = None) -> str:
    """Plain text of a man(7) source fragment: font macros keep their arguments, other requests go.

    With max_words, only the first max_words words are returned (and only that much is parsed).
    """
    words: list[str] = []
    end_of_block: str | None = None
    for raw in body.split("\n"):
        if max_words is not None and len(words) >= max_words:
            break
        if end_of_block is not None:
            if raw.startswith(end_of_block):
                end_of_block = None
            continue
        line = _strip_comment(raw)
        if line[:1] in (".", "'"):
            m = _REQUEST_RE.match(line)
            name, args = (m.group(1), m.group(2)) if m else ("", "")
            if name in _SKIP_BLOCKS:
                end_of_block = _SKIP_BLOCKS[name]
            elif name in _FONT_MACROS:
                words += unescape(" ".join(split_arguments(args))).split()
            elif name in _ALTERNATING_MACROS:
                words += unescape("".join(split_arguments(args))).split()
            continue  # any other request (.PP .TP .IP .RS .br .sp .nf .SS ...) has no text of its own
        words += unescape(line).split()
    return " ".join(words[:max_words])


def _heading(m: re.Match[str], source: str) -> tuple[str, int]:
    """A .SH heading's text and where its section body starts (the heading may be on the next line)."""
    if m.group(1) and m.group(1).strip():
        return m.group(1), m.end()
    nl = source.find("\n", m.end() + 1)
    nl = len(source) if nl < 0 else nl
    return source[m.end() + 1 : nl], nl


def _is_description_heading(title: str, headings: frozenset[str]) -> bool:
    """Whether a .SH title names the description: every word of it (parentheses aside) is one of `headings`
    ("DESCRIPTION", and the translations' "DESCRIPTION 描述", "描述 (DESCRIPTION)")."""
    words = re.findall(r"[^\s()（）]+", unescape(" ".join(split_arguments(title))).upper())
    return bool(words) and all(word in headings for word in words)


def man_description(source: str, max_words: int | None = None,
                    headings: frozenset[str] = frozenset({"DESCRIPTION"})) -> str | None:
    """The plain text of a man page's DESCRIPTION section (up to the next .SH), or None if it has none."""
    start: int | None = None
    for m in _SH_RE.finditer(source):
        if m.start() > 0 and source[m.start() - 1] != "\n":
            continue  # ".SH" inside a line
        if start is not None:
            return troff_to_text(source[start : m.start()], max_words)
        title, body_start = _heading(m, source)
        if _is_description_heading(title, headings):
            start = body_start
    return None if start is None else troff_to_text(source[start:], max_words)


def read_man_source(path: Path) -> str:
    data = path.read_bytes()
    if path.name.endswith(".gz"):
        data = gzip.decompress(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _is_redirect(source: str) -> bool:
    """A `.so other.1` page, man's way of making one page an alias of another."""
    for line in source.split("\n", 20)[:20]:
        if not line.strip() or line.startswith(('.\\"', "'\\\"")):
            continue
        return line.startswith(".so ") or line.startswith(".so\t")
    return False


def package_owners(paths: Iterable[Path], info_dir: Path = DPKG_INFO_DIR) -> dict[str, str]:
    """Installed file path -> owning Debian package, from dpkg's file lists (empty where there are none)."""
    wanted = {str(p) for p in paths}
    owners: dict[str, str] = {}
    if not info_dir.is_dir():
        return owners
    for lst in sorted(info_dir.glob("*.list")):
        package = lst.name[: -len(".list")].split(":")[0]
        try:
            lines = lst.read_text(encoding="utf-8", errors="replace").split("\n")
        except OSError:
            continue
        for line in lines:
            if line in wanted and line not in owners:
                owners[line] = package
    return owners


def debian_versions(packages: Iterable[str]) -> dict[str, str]:
    """Versions of many installed packages with one dpkg-query call ("unknown" where it fails)."""
    names = sorted(set(packages))
    if not names:
        return {}
    versions = dict.fromkeys(names, "unknown")
    try:
        res = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package}\t${Version}\n", *names], capture_output=True, text=True
        )
        for line in res.stdout.splitlines():
            name, _, version = line.partition("\t")
            if name in versions and version:
                versions[name] = version
    except OSError:
        pass
    return versions


MAN_MAX_PER_PACKAGE = 1000


def build_manpages(man_dir: Path = MAN_DIR, max_per_package: int | None = None) -> Task:
    """Man page DESCRIPTION -> section. max_per_package keeps at most that many pages of any one
    Debian package (evenly spaced in path order), against a package that ships thousands of pages."""
    install = "`apt-get install -y manpages manpages-dev`"
    pages = [
        (section, path)
        for section in MAN_SECTIONS
        if (man_dir / f"man{section}").is_dir()
        for path in sorted((man_dir / f"man{section}").iterdir())
        if path.is_file() and not path.is_symlink()
    ]
    if not pages:
        raise BuildError(f"no man pages in {man_dir}/man1..man8: install them with {install}")
    stats = {"pages": len(pages), "unreadable": 0, "redirects": 0, "no_description": 0, "too_short": 0,
             "duplicates": 0}  # fmt: skip
    kept: dict[str, tuple[str, Path]] = {}  # text -> (section, path); first in sorted path order wins
    for section, path in sorted(pages, key=lambda sp: str(sp[1])):
        try:
            source = read_man_source(path)
        except (OSError, EOFError, gzip.BadGzipFile):
            stats["unreadable"] += 1
            continue
        if _is_redirect(source):
            stats["redirects"] += 1
            continue
        text = man_description(source, MAN_MAX_WORDS)
        if text is None:
            stats["no_description"] += 1
            continue
        words = text.split()
        if len(words) < MAN_MIN_WORDS:
            stats["too_short"] += 1
            continue
        text = " ".join(words[:MAN_MAX_WORDS])
        if text in kept:
            stats["duplicates"] += 1
            continue
        kept[text] = (section, path)

    owners = package_owners(path for _, path in kept.values())

    def owner(path: Path) -> str:
        return owners.get(str(path), "(not from a package)")

    stats["over_package_cap"] = 0
    if max_per_package:
        texts_of: dict[str, list[str]] = {}
        for text, (_, path) in kept.items():  # in path order
            texts_of.setdefault(owner(path), []).append(text)
        keep = {text for texts in texts_of.values() for text in _evenly_spaced(texts, max_per_package)}
        stats["over_package_cap"] = len(kept) - len(keep)
        kept = {text: value for text, value in kept.items() if text in keep}

    per_section: dict[str, int] = {}
    for section, _ in kept.values():
        per_section[section] = per_section.get(section, 0) + 1
    dropped = {s: n for s, n in sorted(per_section.items()) if n < MAN_MIN_CLASS}
    rows_by_split: dict[str, list[tuple[str, dict]]] = {split: [] for split in SPLITS}
    for text, (section, path) in kept.items():
        if section in dropped:
            continue
        row = {"text": text, "label": section, "id": path.relative_to(man_dir).as_posix()}
        rows_by_split[split_of(text)].append((_sha1_key(text), row))
    if len({row["label"] for rows in rows_by_split.values() for _, row in rows}) < 2:
        raise BuildError(f"fewer than two man sections with {MAN_MIN_CLASS}+ pages in {man_dir}: install {install}")

    used = [path for section, path in kept.values() if section not in dropped]
    by_package: dict[str, int] = {}
    for path in used:
        by_package[owner(path)] = by_package.get(owner(path), 0) + 1
    stats["kept"] = len(used)
    return Task(
        name="manpages",
        description="DESCRIPTION section of an English man page (troff markup removed, first "
        f"{MAN_MAX_WORDS} words) -> its manual section; 80/10/10 split by sha1 of the text",
        task_type="classification",
        text_pair_column=None,
        splits={split: [row for _, row in sorted(rows, key=lambda kr: kr[0])] for split, rows in rows_by_split.items()},
        sources=debian_versions(p for p in by_package if not p.startswith("(")),
        extra={
            "max_pages_per_package": max_per_package,
            "page_stats": stats,
            "dropped_sections": dropped,
            "pages_per_package": dict(sorted(by_package.items(), key=lambda kv: (-kv[1], kv[0]))),
        },
    )


# one directory under /usr/share/man per language (zh: the simplified-script pages; manpages-zh ships the
# same pages in zh_TW too) and the words its translators title the description with
MAN_LANGUAGES: dict[str, tuple[str, str, frozenset[str]]] = {  # language -> (directory, package, headings)
    "en": ("", "manpages", frozenset({"DESCRIPTION"})),
    "de": ("de", "manpages-de", frozenset({"BESCHREIBUNG"})),
    "fr": ("fr", "manpages-fr", frozenset({"DESCRIPTION"})),
    "es": ("es", "manpages-es", frozenset({"DESCRIPCIÓN"})),
    "ja": ("ja", "manpages-ja", frozenset({"説明", "解説"})),
    "zh": ("zh_CN", "manpages-zh", frozenset({"描述", "说明", "DESCRIPTION"})),
}
MULTI_MAX_CHARS = 800  # about 200 words of English; CJK text has no spaces to count words by
MULTI_MIN_UNITS = 20  # words, a CJK character counting as one
MULTI_MAX_PER_CLASS = 150  # pages of one section in one language: section 1 would otherwise hold half of them
MULTI_MIN_CLASS = 40  # rows of a section over all languages
MULTI_MIN_CJK_SHARE = 0.3  # a ja/zh description with fewer CJK characters per unit was left in English
CJK_LANGUAGES = ("ja", "zh")
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def text_units(text: str) -> int:
    """Words for a language written with spaces, characters for Japanese and Chinese."""
    return len(_CJK_RE.sub(" ", text).split()) + len(_CJK_RE.findall(text))


def cjk_share(text: str) -> float:
    return len(_CJK_RE.findall(text)) / max(text_units(text), 1)


def page_name(path: Path) -> tuple[str, str]:
    """`ls.1.gz` -> ("ls", "1"): the page name and its section suffix (`3ssl`, `1p`, ...)."""
    stem = path.name.removesuffix(".gz")
    name, _, suffix = stem.rpartition(".")
    return name, suffix


def page_split(page: str) -> str:
    """70/10/20 by sha1 of the page name: a fifth of ~3,000 rows leaves ~100 test rows per language."""
    bucket = int.from_bytes(hashlib.sha1(page.encode("utf-8")).digest()[:8], "big") % 100
    return "train" if bucket < 70 else "validation" if bucket < 80 else "test"


def man_pages_of(directory: Path) -> list[tuple[str, Path]]:
    """(section, page file) of man1..man8 under directory, aliases (symlinks) left out, in path order."""
    return [(section, path) for section in MAN_SECTIONS if (directory / f"man{section}").is_dir()
            for path in sorted((directory / f"man{section}").iterdir()) if path.is_file() and not path.is_symlink()]


def build_manpages_multilingual(man_dir: Path = MAN_DIR) -> Task:
    """Man page DESCRIPTION -> section, in English, German, French, Spanish, Japanese and Chinese.

    The label is the manual section because a translated page keeps its original's: one label means
    the same in every language (a command, a file format, an overview, an admin command), it is read
    from the page, not guessed, and it asks what the text describes. English pages are those with a
    translation (same name and section) in one of the other languages, so the six describe the same
    pages; the split is by page name, so a page, its translations (and its namesakes in other
    sections) fall in one split and no test page was seen in training in any language.
    """
    install = "`apt-get install -y manpages manpages-de manpages-fr manpages-es manpages-ja manpages-zh`"
    translated: set[tuple[str, str]] = set()  # (page, section) of every translated page file
    for language, (subdir, _, _) in MAN_LANGUAGES.items():
        if language != "en":
            pages = man_pages_of(man_dir / subdir)
            if not pages:
                raise BuildError(f"no {language} man pages in {man_dir / subdir}/man1..man8: install them with {install}")
            translated |= {(page_name(path)[0], section) for section, path in pages}
    stats: dict[str, dict[str, int]] = {}
    texts: set[str] = set()  # English first: a description left untranslated is kept once, as English
    rows = {language: _description_rows(man_dir / subdir, language, headings, translated if language == "en" else None,
                                        texts, stats)
            for language, (subdir, _, headings) in MAN_LANGUAGES.items()}

    # a class's cap takes pages in one order (by hashed page name) in every language: mostly the same pages
    by_class: dict[tuple[str, str], list[dict]] = {}
    for language, by_page in rows.items():
        for (_, section), row in sorted(by_page.items(), key=lambda kv: (_sha1_key(kv[0][0]), kv[0])):
            by_class.setdefault((language, section), []).append(row)
    kept = [row for class_rows in by_class.values() for row in class_rows[:MULTI_MAX_PER_CLASS]]
    per_section = Counter(row["label"] for row in kept)
    dropped = {s: n for s, n in sorted(per_section.items()) if n < MULTI_MIN_CLASS}
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for row in kept:
        if row["label"] not in dropped:
            splits[page_split(row["page"])].append(row)
    if len({row["label"] for split_rows in splits.values() for row in split_rows}) < 2:
        raise BuildError(f"fewer than two man sections with {MULTI_MIN_CLASS}+ pages: install {install}")
    languages = list(MAN_LANGUAGES)
    counts = {split: {language: dict(sorted(Counter(row["label"] for row in split_rows
                                                    if row["language"] == language).items()))
                      for language in languages} for split, split_rows in splits.items()}
    return Task(
        name="manpages-multilingual",
        description="DESCRIPTION section of a man page in en, de, fr, es, ja or zh (troff markup removed, first "
        f"{MAN_MAX_WORDS} words and {MULTI_MAX_CHARS} characters) -> its manual section, which a translation keeps, "
        "so one label means the same in every language; English pages are those translated into another of the "
        f"five; at most {MULTI_MAX_PER_CLASS} pages per language and section; 70/10/20 split by sha1 of the page "
        "name, so a page and its translations share a split",
        task_type="classification",
        text_pair_column=None,
        splits={split: sorted(split_rows, key=lambda row: (_sha1_key(row["text"]), row["id"]))
                for split, split_rows in splits.items()},
        sources=debian_versions(package for _, package, _ in MAN_LANGUAGES.values()),
        extra={"group_column": "language", "languages": languages, "page_stats": stats,
               "dropped_sections": dropped, "label_counts_per_language": counts},
    )


def _description_rows(directory: Path, language: str, headings: frozenset[str], only: set[tuple[str, str]] | None,
                      texts: set[str], stats: dict[str, dict[str, int]]) -> dict[tuple[str, str], dict]:
    """(page name, section) -> its row, for the pages of one language's directory with a description long
    enough and not in `texts` yet (the texts kept so far, which it extends); `only`: those pages alone."""
    counts = stats.setdefault(language, {"pages": 0, "unreadable": 0, "redirects": 0, "no_description": 0,
                                         "too_short": 0, "untranslated": 0, "duplicates": 0})
    found: dict[tuple[str, str], dict] = {}
    for section, path in man_pages_of(directory):
        page, _ = page_name(path)
        if only is not None and (page, section) not in only:
            continue
        counts["pages"] += 1
        try:
            source = read_man_source(path)
        except (OSError, EOFError, gzip.BadGzipFile):
            counts["unreadable"] += 1
            continue
        if _is_redirect(source):
            counts["redirects"] += 1
            continue
        text = man_description(source, MAN_MAX_WORDS, headings)
        if text is None:
            counts["no_description"] += 1
            continue
        text = text[:MULTI_MAX_CHARS].rstrip()
        if text_units(text) < MULTI_MIN_UNITS:
            counts["too_short"] += 1
            continue
        if language in CJK_LANGUAGES and cjk_share(text) < MULTI_MIN_CJK_SHARE:
            counts["untranslated"] += 1
            continue
        if text in texts or (page, section) in found:
            counts["duplicates"] += 1
            continue
        texts.add(text)
        found[(page, section)] = {"text": text, "label": section, "language": language, "page": page,
                                  "id": f"{language}/{path.relative_to(directory).as_posix()}"}
    return found


# ---------------------------------------------------------------------------------------- WordNet


@dataclass(frozen=True)
class Noun:
    """A WordNet noun synset reduced to what the pair tasks need."""

    offset: str
    lexnum: int
    gloss: str  # the whole gloss (definition and examples), as in the bundled supersense set
    definition: str  # the gloss up to its first `; "` example
    hypernyms: tuple[str, ...]  # direct hypernyms and instance hypernyms, sorted


def definition_of(gloss: str) -> str:
    """The definition part of a WordNet gloss: the text before the first `; "` example, stripped."""
    definition = gloss.split('; "', 1)[0].strip()
    return "" if definition.startswith('"') else definition


def read_nouns(wordnet_dir: Path = WORDNET_DIR) -> dict[str, Noun]:
    """All noun synsets of data.noun by offset, with their direct (instance) hypernyms."""
    path = _require(wordnet_dir / "data.noun", "wordnet-base")
    nouns: dict[str, Noun] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):  # the license header
                continue
            head, sep, gloss = line.partition(" | ")
            fields = head.split()
            try:
                w_cnt = int(fields[3], 16)  # the word count is hexadecimal
                p_at = 4 + 2 * w_cnt
                p_cnt = int(fields[p_at])
                pointers = fields[p_at + 1 : p_at + 1 + 4 * p_cnt]
                if not sep or fields[2] != "n" or len(pointers) != 4 * p_cnt:
                    raise ValueError
            except (IndexError, ValueError):
                raise BuildError(f"unexpected line in {path}: {line[:80]!r}") from None
            hypernyms = {
                pointers[i + 1]
                for i in range(0, len(pointers), 4)
                if pointers[i] in HYPERNYM_POINTERS and pointers[i + 2] == "n"
            }
            gloss = gloss.strip()
            nouns[fields[0]] = Noun(fields[0], int(fields[1]), gloss, definition_of(gloss), tuple(sorted(hypernyms)))
    if ROOT_OFFSET not in nouns:
        raise BuildError(f"entity.n.01 ({ROOT_OFFSET}) not in {path}: is this WordNet 3.0?")
    return nouns


class NounGraph:
    """The noun hypernym graph and the split of every synset usable in a pair."""

    def __init__(self, nouns: dict[str, Noun]) -> None:
        self.nouns = nouns
        children: dict[str, list[str]] = {}
        for offset in sorted(nouns):
            for h in nouns[offset].hypernyms:
                children.setdefault(h, []).append(offset)
        self.children = children
        self._paths: dict[str, tuple[tuple[str, ...], ...]] = {}
        # A synset's split is its whole gloss's split in the bundled supersense set, so a definition
        # held out here is never in the bundled pre-training corpus; definitions that WordNet repeats
        # across synsets of different splits are left out so no text is in two splits.
        split = {o: split_of(n.gloss) for o, n in nouns.items() if n.definition}
        splits_of_text: dict[str, set[str]] = {}
        for o, s in split.items():
            splits_of_text.setdefault(nouns[o].definition, set()).add(s)
        self.split = {o: s for o, s in split.items() if len(splits_of_text[nouns[o].definition]) == 1}
        self.members = {s: sorted(o for o, x in self.split.items() if x == s) for s in SPLITS}
        self.by_lex: dict[str, dict[int, list[str]]] = {s: {} for s in SPLITS}
        for s in SPLITS:
            for o in self.members[s]:
                self.by_lex[s].setdefault(nouns[o].lexnum, []).append(o)

    def paths(self, offset: str) -> tuple[tuple[str, ...], ...]:
        """Every hypernym path from entity.n.01 down to offset (both included)."""
        if offset in self._paths:
            return self._paths[offset]
        if offset == ROOT_OFFSET:
            result: tuple[tuple[str, ...], ...] = ((offset,),)
        else:
            hypernyms = self.nouns[offset].hypernyms
            if not hypernyms:
                raise BuildError(f"noun synset {offset} has no path to entity.n.01")
            result = tuple(p + (offset,) for h in hypernyms for p in self.paths(h))
        self._paths[offset] = result
        return result

    def wup(self, a: str, b: str) -> float:
        """Wu-Palmer similarity 2*depth(lcs) / (depth(a)+depth(b)), the max over hypernym paths."""
        best = 0.0
        for pa in self.paths(a):
            for pb in self.paths(b):
                k = 0
                for x, y in zip(pa, pb, strict=False):
                    if x != y:
                        break
                    k += 1
                best = max(best, 2 * k / (len(pa) + len(pb)))
        return round(best, 4)

    def siblings(self, a: str, split: str) -> list[str]:
        """Synsets of the split sharing a direct hypernym with a, with another definition."""
        text = self.nouns[a].definition
        found = {
            c
            for h in self.nouns[a].hypernyms
            for c in self.children.get(h, ())
            if c != a and self.split.get(c) == split and self.nouns[c].definition != text
        }
        return sorted(found)

    def pair_row(self, a: str, b: str, label: object) -> dict[str, object]:
        return {"text": self.nouns[a].definition, "text_pair": self.nouns[b].definition, "label": label}


def _quotas(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class PairSet:
    """Sampled pairs, unique by synset pair and by text pair (WordNet repeats some definitions)."""

    def __init__(self, graph: NounGraph) -> None:
        self.graph = graph
        self.rows: dict[tuple[str, str], dict] = {}
        self.texts: set[tuple[str, str]] = set()

    def add(self, a: str, b: str, label: Callable[[], object]) -> bool:
        key = (min(a, b), max(a, b))
        first, second = sorted((self.graph.nouns[a].definition, self.graph.nouns[b].definition))
        texts = (first, second)
        if a == b or texts[0] == texts[1] or key in self.rows or texts in self.texts:
            return False
        self.rows[key] = self.graph.pair_row(a, b, label())
        self.texts.add(texts)
        return True

    def sorted_rows(self) -> list[dict]:
        """Rows in the order of sha1 of their sorted synset-offset pair (a fixed shuffle)."""
        return [row for _, row in sorted(self.rows.items(), key=lambda kv: _sha1_key(*kv[0]))]


def _wordnet_sources() -> dict[str, str]:
    return {"wordnet-base": debian_version("wordnet-base")}


def build_wordnet_pairs(wordnet_dir: Path = WORDNET_DIR, graph: NounGraph | None = None) -> Task:
    graph = graph or NounGraph(read_nouns(wordnet_dir))
    nouns = graph.nouns
    rng = random.Random(SEED)
    splits: dict[str, list[dict]] = {}
    for split in SPLITS:
        need = PAIR_SIZES[split] // 2
        anchors = list(graph.members[split])
        rng.shuffle(anchors)
        pairs = PairSet(graph)
        positives = negatives = 0
        for _ in range(5):  # passes over the anchors; one is almost always enough
            for a in anchors:
                if positives < need and (siblings := graph.siblings(a, split)):
                    if pairs.add(a, rng.choice(siblings), lambda: "same"):
                        positives += 1
                if negatives < need:
                    pool = graph.by_lex[split][nouns[a].lexnum]
                    hypernyms = set(nouns[a].hypernyms)
                    for _ in range(20):
                        b = rng.choice(pool)
                        if not hypernyms.intersection(nouns[b].hypernyms) and pairs.add(a, b, lambda: "different"):
                            negatives += 1
                            break
                if positives >= need and negatives >= need:
                    break
            if positives >= need and negatives >= need:
                break
        if positives < need or negatives < need:
            raise BuildError(f"wordnet-pairs: only {positives}+{negatives} of {2 * need} pairs in {split}")
        splits[split] = pairs.sorted_rows()
    return Task(
        name="wordnet-pairs",
        description="two WordNet 3.0 noun definitions -> 'same' if the synsets share a direct "
        "(instance) hypernym, else 'different' (negatives from the same lexicographer file); "
        "every synset in one split (its gloss's supersense split)",
        task_type="classification",
        text_pair_column="text_pair",
        splits=splits,
        sources=_wordnet_sources(),
    )


def _related_partner(graph: NounGraph, a: str, split: str, rng: random.Random) -> str | None:
    """A sibling, cousin or second cousin of a in the split: up 1..3 hypernym levels, down as many."""
    levels = rng.choice((1, 2, 3))
    for _ in range(30):
        node = a
        for _ in range(levels):
            hypernyms = graph.nouns[node].hypernyms
            if not hypernyms:
                break
            node = rng.choice(hypernyms)
        for _ in range(levels):
            below = graph.children.get(node)
            if not below:
                break
            node = rng.choice(below)
        if node != a and graph.split.get(node) == split and graph.nouns[node].definition != graph.nouns[a].definition:
            return node
    return None


def histogram(values: Iterable[float], bins: int = HISTOGRAM_BINS) -> list[int]:
    """Counts of values in [0, 1] over equal-width bins (1.0 falls into the last one)."""
    counts = [0] * bins
    for v in values:
        counts[min(int(v * bins), bins - 1)] += 1
    return counts


def build_wordnet_similarity(wordnet_dir: Path = WORDNET_DIR, graph: NounGraph | None = None) -> Task:
    graph = graph or NounGraph(read_nouns(wordnet_dir))
    nouns = graph.nouns
    rng = random.Random(SEED)
    splits: dict[str, list[dict]] = {}
    kinds = ("related", "same_lexfile", "other_lexfile")
    for split in SPLITS:
        quota = dict(zip(kinds, _quotas(PAIR_SIZES[split], len(kinds)), strict=True))
        members = graph.members[split]
        anchors = list(members)
        rng.shuffle(anchors)
        pairs = PairSet(graph)
        got = dict.fromkeys(kinds, 0)
        for _ in range(5):
            for a in anchors:
                for kind in kinds:
                    if got[kind] >= quota[kind]:
                        continue
                    if kind == "related":
                        b = _related_partner(graph, a, split, rng)
                    elif kind == "same_lexfile":
                        b = rng.choice(graph.by_lex[split][nouns[a].lexnum])
                    else:
                        b = rng.choice(members)
                        if nouns[b].lexnum == nouns[a].lexnum:
                            continue
                    if b is not None and pairs.add(a, b, functools.partial(graph.wup, a, b)):
                        got[kind] += 1
                        break  # one pair per anchor and pass, kinds in turn
                if got == quota:
                    break
            if got == quota:
                break
        if got != quota:
            raise BuildError(f"wordnet-similarity: only {got} of {quota} pairs in {split}")
        splits[split] = pairs.sorted_rows()
    return Task(
        name="wordnet-similarity",
        description="two WordNet 3.0 noun definitions -> Wu-Palmer similarity of the synsets on the "
        "noun hypernym graph (@ and @i; entity.n.01 at depth 1; max over hypernym paths), 4 decimals; "
        "1/3 siblings or cousins, 1/3 random pairs within a lexicographer file, 1/3 across files",
        task_type="regression",
        text_pair_column="text_pair",
        splits=splits,
        sources=_wordnet_sources(),
        extra={"pair_kinds": {split: dict(zip(kinds, _quotas(PAIR_SIZES[split], len(kinds)), strict=True))
                              for split in SPLITS}},  # fmt: skip
    )


# ----------------------------------------------------------------------------- supersense tagging

WORDNET_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}  # data.* file -> morphology class
TOKEN_RE = re.compile(r"\w+(?:[-'\u2019]\w+)*|[^\w\s]")  # words (with inner - and '), single punctuation
_EXAMPLE_RE = re.compile(r'"([^"]*)"')
_ADJ_MARKER_RE = re.compile(r"\((?:a|p|ip)\)$")  # syntactic marker of an adjective lemma: long(a), galore(ip)
# WordNet's morphy detachment rules (morph.c), tried on a word of the synset's part of speech
MORPHY_SUFFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
          ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"),
          ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}  # fmt: skip
_POSSESSIVES = ("'s", "\u2019s")


@dataclass(frozen=True)
class GlossSynset:
    """A synset of any part of speech reduced to what supersense tagging needs."""

    pos: str  # ss_type letter: n, v, a, s (satellite adjective) or r
    offset: str
    label: str  # lexicographer file name, e.g. "noun.animal" (satellites: "adj.all", as their file says)
    lemmas: tuple[str, ...]  # as in the data file, lower-cased, adjective markers removed: "domestic_dog"
    gloss: str  # the whole gloss, stripped: what the bundled supersense set (and its split) uses

    @property
    def morph_pos(self) -> str:
        return "a" if self.pos == "s" else self.pos


def read_gloss_synsets(wordnet_dir: Path = WORDNET_DIR) -> list[GlossSynset]:
    """Every synset of the four data files, in data-file order (noun, verb, adj, adv; by offset)."""
    lexnames = _samples.read_lexnames()
    synsets: list[GlossSynset] = []
    for name in WORDNET_POS:
        path = _require(wordnet_dir / f"data.{name}", "wordnet-base")
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):  # the license header
                    continue
                head, sep, gloss = line.partition(" | ")
                fields = head.split()
                try:
                    w_cnt = int(fields[3], 16)  # the word count is hexadecimal
                    words = fields[4 : 4 + 2 * w_cnt : 2]
                    label = lexnames[int(fields[1])]
                    if not sep or len(words) != w_cnt or fields[2] not in "nvasr":
                        raise ValueError
                except (IndexError, ValueError, KeyError):
                    raise BuildError(f"unexpected line in {path}: {line[:80]!r}") from None
                lemmas = tuple(dict.fromkeys(_ADJ_MARKER_RE.sub("", w).lower() for w in words))
                synsets.append(GlossSynset(fields[2], fields[0], label, lemmas, gloss.strip()))
    return synsets


def read_exceptions(wordnet_dir: Path = WORDNET_DIR) -> dict[str, dict[str, tuple[str, ...]]]:
    """WordNet's irregular forms per part of speech: {"n": {"geese": ("goose",)}, "v": {"ran": ("run",)}}.

    Multi-word entries (underscores) are left out: a collocation is matched word by word, each word
    through its own forms."""
    exceptions: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, pos in WORDNET_POS.items():
        table: dict[str, tuple[str, ...]] = {}
        with _require(wordnet_dir / f"{name}.exc", "wordnet-base").open(encoding="utf-8") as f:
            for line in f:
                inflected, *bases = line.lower().split()
                if bases and "_" not in inflected:
                    table[inflected] = tuple(dict.fromkeys(table.get(inflected, ()) + tuple(bases)))
        exceptions[pos] = table
    return exceptions


def tokenize(text: str) -> list[str]:
    """Words of a sentence by TOKEN_RE, original text kept: simple, deterministic, no model needed."""
    return TOKEN_RE.findall(text)


def gloss_examples(gloss: str) -> list[tuple[int, str]]:
    """(k, sentence) for the k-th double-quoted text of a gloss, stripped, empty ones skipped.

    Quotes pair left to right: the ~20 WordNet glosses with an odd number of quotes yield a stray
    fragment or two, which the lemma requirement then almost always drops."""
    return [(k, text.strip()) for k, text in enumerate(_EXAMPLE_RE.findall(gloss)) if text.strip()]


class Morphology:
    """Which base forms a lower-cased word can be an inflection of, per part of speech (memoized)."""

    def __init__(self, exceptions: dict[str, dict[str, tuple[str, ...]]]) -> None:
        self.exceptions = exceptions
        self._cache: dict[tuple[str, str], frozenset[str]] = {}

    def bases(self, word: str, pos: str) -> frozenset[str]:
        """The word itself, its exception-list bases and every morphy suffix rewrite; for nouns also
        those of the word without a possessive 's. Like morphy, nouns ending in -ss or of 1-2
        letters are not suffix-stripped (so "as" is no plural of the letter "a")."""
        key = (word, pos)
        if key not in self._cache:
            found = {word, *self.exceptions[pos].get(word, ())}
            if not (pos == "n" and (word.endswith("ss") or len(word) <= 2)):
                found.update(word[: -len(suffix)] + ending for suffix, ending in MORPHY_SUFFIXES[pos]
                             if word.endswith(suffix) and len(word) > len(suffix))  # fmt: skip
            if pos == "n" and word.endswith(_POSSESSIVES) and len(word) > 2:
                found |= self.bases(word[:-2], pos)
            self._cache[key] = frozenset(found)
        return self._cache[key]


def lemma_spans(words: list[str], lemmas: Iterable[tuple[str, ...]], pos: str, morph: Morphology
                ) -> list[tuple[int, int]]:  # fmt: skip
    """Non-overlapping [start, end) word spans where a lemma occurs, scanning left to right and trying
    the longest lemma first at each word: every word of the span equals the lemma's word ignoring
    case, or is an inflection of it (so "looked up" matches look_up, "attorneys general"
    attorney_general). Word by word keeps collocations simple; a split one ("looked it up") is missed."""
    lower = [w.lower() for w in words]
    candidates = sorted(set(lemmas), key=lambda seq: (-len(seq), seq))
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(lower):
        for seq in candidates:
            end = i + len(seq)
            if end <= len(lower) and all(seq[j] in morph.bases(lower[i + j], pos) for j in range(len(seq))):
                spans.append((i, end))
                i = end
                break
        else:
            i += 1
    return spans


def bio_tags(length: int, spans: Iterable[tuple[int, int]], label: str) -> list[str]:
    tags = ["O"] * length
    for start, end in spans:
        tags[start : end] = [f"B-{label}"] + [f"I-{label}"] * (end - start - 1)
    return tags


def entity_types(tags: Iterable[str]) -> list[str]:
    """The type of every entity of a BIO sequence (one per B- tag; the builder writes no bare I-)."""
    return [tag[2:] for tag in tags if tag.startswith("B-")]


def tagged_examples(synsets: Iterable[GlossSynset], morph: Morphology, stats: dict[str, int],
                    train_sentences: set[tuple[str, ...]]) -> list[tuple[str, dict]]:  # fmt: skip
    """(split, row) for every quoted example holding one of its synset's lemmas, in data-file order.

    The words of every example of a train gloss, tagged or not, are added to train_sentences."""
    out: list[tuple[str, dict]] = []
    for s in synsets:
        lemmas = [tuple(w.lower() for w in tokenize(lemma.replace("_", " "))) for lemma in s.lemmas]
        for k, sentence in gloss_examples(s.gloss):
            stats["examples"] += 1
            words = tokenize(sentence)
            split = split_of(s.gloss)
            if split == "train":
                train_sentences.add(tuple(words))
            spans = lemma_spans(words, (seq for seq in lemmas if seq), s.morph_pos, morph)
            if not spans:
                stats["dropped_no_lemma"] += 1
                continue
            tags = bio_tags(len(words), spans, s.label)
            out.append((split, {"tokens": words, "tags": tags, "id": f"{s.pos}{s.offset}-{k}"}))
    return out


def dedupe_examples(examples: list[tuple[str, dict]], stats: dict[str, int],
                    train_sentences: set[tuple[str, ...]]) -> dict[str, list[dict]]:  # fmt: skip
    """One row per token sequence: the first in (split train < validation < test, data-file) order.

    WordNet reuses example sentences across synsets: an identical (tokens, tags) row is a plain
    duplicate; the same words tagged differently (another synset's lemma) or under another split's
    gloss is a conflict. Preferring train keeps a sentence that some train gloss holds, and so the
    bundled pre-training corpus, out of validation and test; for the same reason a held-out
    sentence that is also an (untagged, lemma-less) example of a train gloss is dropped."""
    order = {split: i for i, split in enumerate(SPLITS)}
    seen: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for split, row in sorted(examples, key=lambda sr: order[sr[0]]):  # stable: data-file order within a split
        key = tuple(row["tokens"])
        if split != "train" and key in train_sentences and key not in seen:
            stats["held_out_in_train_glosses"] += 1
            continue
        if key in seen:
            stats["duplicates" if seen[key] == (split, tuple(row["tags"])) else "conflicts"] += 1
            continue
        seen[key] = (split, tuple(row["tags"]))
        splits[split].append(row)
    return {split: sorted(rows, key=lambda r: _sha1_key(r["id"])) for split, rows in splits.items()}


def build_supersense_tagging(wordnet_dir: Path = WORDNET_DIR) -> Task:
    synsets = read_gloss_synsets(wordnet_dir)
    morph = Morphology(read_exceptions(wordnet_dir))
    stats = dict.fromkeys(
        ("examples", "dropped_no_lemma", "duplicates", "conflicts", "held_out_in_train_glosses"), 0
    )
    train_sentences: set[tuple[str, ...]] = set()
    splits = dedupe_examples(tagged_examples(synsets, morph, stats, train_sentences), stats, train_sentences)
    return Task(
        name="supersense-tagging",
        description="the quoted example sentences of WordNet 3.0 glosses (all parts of speech), tokenized "
        "into words; the synset's own lemmas (exact, an exception-list form or a morphy suffix form; "
        "multi-word lemmas word by word) tagged in BIO with its lexicographer file (B-noun.animal, "
        "I-verb.motion), every other word O; sentences without a lemma dropped; split of the whole "
        "gloss as in the bundled supersense set",
        task_type="token_classification",
        text_pair_column=None,
        splits=splits,
        sources=_wordnet_sources(),
        extra={
            "tokenizer": TOKEN_RE.pattern,
            "lemma_forms": "case-insensitive: the lemma word, its bases in noun/verb/adj/adv.exc, or a "
            "morphy suffix rewrite [suffix, ending] below (not for nouns ending in -ss or of 1-2 letters); "
            "nouns also with a possessive 's",
            "morphy_suffixes": {pos: [list(r) for r in rules] for pos, rules in MORPHY_SUFFIXES.items()},
            "examples": stats["examples"],
            "sentences_dropped": stats["dropped_no_lemma"],
            "duplicates_removed": stats["duplicates"],
            "conflicts_removed": stats["conflicts"],
            "held_out_in_train_glosses_removed": stats["held_out_in_train_glosses"],
            "dedupe_rule": "one row per token sequence: the first in (train, validation, test; noun, verb, "
            "adj, adv data file; offset; example index) order; a validation/test sentence that is also an "
            "example of a train gloss is dropped",
        },
    )


# ------------------------------------------------------------------------------ WordNet embedding


def embedding_rows(synsets: Iterable[GlossSynset], stats: dict[str, int]) -> dict[str, list[dict]]:
    """(word | usage) -> definition rows per split, in data-file order, before the held-out filter."""
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    seen: set[tuple[str, str]] = set()
    for s in synsets:
        definition = definition_of(s.gloss)
        if not definition:
            stats["synsets_without_definition"] += 1
            continue
        split = split_of(s.gloss)
        pairs = [(f"w{i}", lemma.replace("_", " "), "word") for i, lemma in enumerate(s.lemmas)] if split == "train" \
            else []
        pairs += [(f"e{k}", sentence, "example") for k, sentence in gloss_examples(s.gloss)]
        for suffix, anchor, kind in pairs:
            if (anchor, definition) in seen:
                stats["duplicates_removed"] += 1
                continue
            seen.add((anchor, definition))
            splits[split].append({"anchor": anchor, "positive": definition, "kind": kind,
                                  "id": f"{s.pos}{s.offset}-{suffix}"})
    return splits


def build_wordnet_embedding(wordnet_dir: Path = WORDNET_DIR) -> Task:
    stats = dict.fromkeys(("synsets_without_definition", "duplicates_removed", "held_out_seen_in_train_removed"), 0)
    splits = embedding_rows(read_gloss_synsets(wordnet_dir), stats)
    train_texts = {text for row in splits["train"] for text in (row["anchor"], row["positive"])}
    for split in ("validation", "test"):
        kept = [row for row in splits[split] if row["anchor"] not in train_texts and row["positive"] not in train_texts]
        stats["held_out_seen_in_train_removed"] += len(splits[split]) - len(kept)
        splits[split] = kept
    return Task(
        name="wordnet-embedding",
        description="sentence-embedding pairs from WordNet 3.0 glosses (all parts of speech): anchor -> positive, "
        "the positive a synset's definition (the gloss before its first quoted example); train: each lemma "
        "(kind word) and each quoted example sentence (kind example) of a synset; validation/test: example "
        "sentences only, the retrieval evaluation 'find the gloss of this usage'; split of the whole gloss as in "
        "the bundled supersense set",
        task_type="embedding",
        text_pair_column="positive",
        splits={split: sorted(rows, key=lambda r: _sha1_key(r["id"])) for split, rows in splits.items()},
        sources=_wordnet_sources(),
        extra={**stats, "held_out_rule": "a validation/test row whose usage or definition is also a text of a train "
               "row is dropped; identical (anchor, positive) rows are kept once, the first in data-file order"},
    )


# -------------------------------------------------------------------------- WordNet multiple choice

CHOICES = 4


def choice_rows(synsets: list[GlossSynset], stats: dict[str, int]) -> dict[str, list[dict]]:
    """Per quoted usage example: `lemma: sentence` and four definitions, its synset's and three distractors.

    The distractors are first the other senses of the synset's lemmas (the word-sense question: which meaning of
    this word is used here?), then definitions of the same part of speech, each drawn by a random.Random seeded
    with the row's id; all from the row's own split (by the whole gloss, as the bundled supersense set), so no
    held-out definition appears in the training rows. The right definition's position is drawn the same way."""
    split = {s.offset + s.pos: split_of(s.gloss) for s in synsets}
    definition = {s.offset + s.pos: definition_of(s.gloss) for s in synsets}
    senses: dict[tuple[str, str], list[str]] = {}  # (split, lemma) -> synset keys, in data-file order
    by_pos: dict[tuple[str, str], list[str]] = {}  # (split, pos) -> synset keys with a definition
    for s in synsets:
        key = s.offset + s.pos
        if not definition[key]:
            continue
        by_pos.setdefault((split[key], s.morph_pos), []).append(key)
        for lemma in s.lemmas:
            senses.setdefault((split[key], lemma), []).append(key)
    splits: dict[str, list[dict]] = {name: [] for name in SPLITS}
    for s in synsets:
        key = s.offset + s.pos
        right = definition[key]
        if not right:
            stats["synsets_without_definition"] += 1
            continue
        for k, sentence in gloss_examples(s.gloss):
            row_id = f"{s.pos}{s.offset}-e{k}"
            rng = random.Random(_sha1_key(row_id))
            others = [o for lemma in s.lemmas for o in senses[(split[key], lemma)] if o != key]
            chosen = list(dict.fromkeys(definition[o] for o in others if definition[o] != right))[:CHOICES - 1]
            stats["other_senses_used"] += len(chosen)
            pool = by_pos[(split[key], s.morph_pos)]
            while len(chosen) < CHOICES - 1:
                candidate = definition[pool[rng.randrange(len(pool))]]
                if candidate != right and candidate not in chosen:
                    chosen.append(candidate)
            answer = rng.randrange(CHOICES)
            choices = chosen[:answer] + [right] + chosen[answer:]
            word = s.lemmas[0].replace("_", " ")
            splits[split[key]].append({"text": f"{word}: {sentence}", "choices": choices, "label": answer,
                                       "id": row_id})
    return splits


def build_wordnet_choice(wordnet_dir: Path = WORDNET_DIR) -> Task:
    stats = dict.fromkeys(("synsets_without_definition", "other_senses_used"), 0)
    splits = choice_rows(read_gloss_synsets(wordnet_dir), stats)
    return Task(
        name="wordnet-choice",
        description="multiple choice from WordNet 3.0 glosses (all parts of speech): the context is a synset's first "
        "lemma and one of its quoted usage examples ('bank: he sat on the bank of the river'), the four choices "
        "are definitions (the gloss before its first example): the synset's own and three distractors, first the "
        "other senses of its lemmas, then random definitions of the same part of speech, all from the row's split; "
        "label = the right definition's index; split of the whole gloss as in the bundled supersense set",
        task_type="multiple_choice",
        text_pair_column=None,
        splits={split: sorted(rows, key=lambda r: _sha1_key(r["id"])) for split, rows in splits.items()},
        sources=_wordnet_sources(),
        extra=stats,
    )


# -------------------------------------------------------------------------------- Debian sections


def apt_lists_present(lists_dir: Path = APT_LISTS_DIR) -> bool:
    return shutil.which("apt-cache") is not None and any(lists_dir.glob("*_Packages*"))


def build_debian_sections(lists_dir: Path = APT_LISTS_DIR) -> Task:
    if not apt_lists_present(lists_dir):
        raise BuildError(f"no apt package lists in {lists_dir}: run `apt-get update` (and install apt)")
    env = {**os.environ, "LC_ALL": "C"}
    out = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, env=env).stdout
    packages: list[tuple[str, str, str]] = []  # (package, section, short description)
    for stanza in out.decode("utf-8", errors="replace").split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.split("\n"):
            key, sep, value = line.partition(": ")
            if sep and not line.startswith(" ") and key in ("Package", "Section", "Description"):
                fields[key] = value.strip()
        if fields.get("Package") and fields.get("Section") and fields.get("Description"):
            section = fields["Section"].rsplit("/", 1)[-1]  # contrib/net -> net
            packages.append((fields["Package"], section, " ".join(fields["Description"].split())))
    by_text: dict[str, tuple[str, str]] = {}  # description -> (section, package); first package by name
    conflicting: set[str] = set()
    for package, section, text in sorted(packages):
        if text in by_text:
            if by_text[text][0] != section:
                conflicting.add(text)
            continue
        by_text[text] = (section, package)
    per_section: dict[str, int] = {}
    for section, _ in by_text.values():
        per_section[section] = per_section.get(section, 0) + 1
    keep = {s for s, n in per_section.items() if n >= DEBIAN_MIN_SECTION}
    by_split: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for text, (section, package) in sorted(by_text.items(), key=lambda kv: (kv[1][0], kv[0])):
        if section in keep:
            by_split[split_of(text)].append({"text": text, "label": section, "id": package})
    splits = {
        split: sorted(_evenly_spaced(rows, DEBIAN_CAPS[split]), key=lambda r: _sha1_key(r["text"]))
        for split, rows in by_split.items()
    }
    return Task(
        name="debian-sections",
        description="short description of a Debian package -> its archive section (area prefix "
        f"removed; sections with {DEBIAN_MIN_SECTION}+ packages); 80/10/10 split by sha1 of the "
        "description, capped by evenly spaced rows of the (section, description)-sorted split",
        task_type="classification",
        text_pair_column=None,
        splits=splits,
        sources={"apt": debian_version("apt")},
        extra={
            "packages": len(packages),
            "distinct_descriptions": len(by_text),
            "descriptions_with_several_sections": len(conflicting),
            "sections_dropped": len(per_section) - len(keep),
            "rows_before_caps": {split: len(rows) for split, rows in by_split.items()},
        },
    )


# --------------------------------------------------------------------------------- Arabic messages

# Six applications with a full Arabic translation in Debian, each a different kind of program (and
# >= 900 messages of 3+ Arabic words): which one a message belongs to is a question about its
# vocabulary (accounts and invoices, layers and brushes, mail and calendars...), the one pair close
# in subject (GIMP and Krita, both painting programs) keeps it from being trivial. The label is the
# package that ships the catalog, read from dpkg, not guessed.
ARABIC_PACKAGES = {  # Debian package -> label
    "cinnamon-l10n": "cinnamon",  # desktop shell, settings and the Nemo file manager
    "evolution-common": "evolution",  # mail, calendar and contacts
    "gimp-data": "gimp",  # image editor
    "gnucash-common": "gnucash",  # accounting
    "krita-l10n": "krita",  # painting
    "vlc-l10n": "vlc",  # media player
}
ARABIC_CATALOG_DIR = "/usr/share/locale/ar/LC_MESSAGES/"
ARABIC_MIN_WORDS = 3  # words holding an Arabic letter: one- and two-word labels ("Cancel") say little
ARABIC_SHARED_RUN = 4  # messages sharing a run of this many words are near-duplicates: one split
_ARABIC_LETTER_RE = re.compile(r"[\u0621-\u063f\u0641-\u064a\u0671-\u06d3]")  # letters, not tatweel (U+0640)
_ARABIC_MARKS_RE = re.compile(r"[\u064b-\u0652\u0670\u0640]")  # harakat, superscript alef, tatweel
_ARABIC_FOLD = str.maketrans({"أ": "ا", "إ": "ا", "آ": "ا", "ٱ": "ا", "ى": "ي", "ة": "ه"})
# GTK marks a menu accelerator with "_" (after any letter but an identifier's), Qt with "&" (not an entity)
_MNEMONIC_RE = re.compile(r"(?<![A-Za-z0-9_])_(?=[^\W\d_])|&(?![A-Za-z]+;|#\d+;)(?=[^\W\d_])")
_MARKUP_RE = re.compile(r"</?[A-Za-z][^<>]*>")
MO_MAGIC = 0x950412DE


def read_mo(path: Path) -> list[tuple[str, str]]:
    """The (msgid, msgstr) entries of a compiled gettext catalog (GNU .mo), the header's included. A plural
    entry holds its forms joined by NUL, a context precedes its msgid and EOT, as in the file."""
    data = path.read_bytes()
    order = next((o for o in "<>" if len(data) >= 20 and struct.unpack(o + "I", data[:4])[0] == MO_MAGIC), None)
    if order is None:
        raise BuildError(f"{path}: not a gettext .mo catalog")
    count, originals, translations = struct.unpack(order + "3I", data[8:20])

    def strings(table: int) -> list[bytes]:
        entries = [struct.unpack(order + "2I", data[table + 8 * i : table + 8 * i + 8]) for i in range(count)]
        return [data[offset : offset + length] for length, offset in entries]

    pairs = list(zip(strings(originals), strings(translations), strict=True))
    header = next((msgstr for msgid, msgstr in pairs if msgid == b""), b"").decode("ascii", "replace")
    charset = re.search(r"charset=([\w.-]+)", header)
    encoding = charset.group(1) if charset and charset.group(1).upper() != "CHARSET" else "utf-8"
    return [(msgid.decode(encoding), msgstr.decode(encoding)) for msgid, msgstr in pairs]


def arabic_message_text(msgstr: str) -> str:
    """A translation as a user reads it: its first (plural) form, accelerator markers, entities and markup
    removed, whitespace collapsed. Diacritics and tatweel stay: normalising them is the tokenizer's choice."""
    text = _MNEMONIC_RE.sub("", msgstr.split("\0")[0])
    return " ".join(_MARKUP_RE.sub(" ", html.unescape(text)).split())


def arabic_words(text: str) -> int:
    return sum(1 for word in text.split() if _ARABIC_LETTER_RE.search(word))


def comparison_words(text: str) -> list[str]:
    """Words compared to find duplicates: diacritics and tatweel dropped, alef, yeh and teh marbuta forms
    folded, digits, punctuation and format specifiers left out, Latin lower-cased."""
    folded = _ARABIC_MARKS_RE.sub("", text).translate(_ARABIC_FOLD).lower()
    return re.sub(r"[\W\d_]+", " ", folded).split()


def catalogs_of(package: str, info_dir: Path = DPKG_INFO_DIR) -> list[Path]:
    """The Arabic .mo files a package installed, from dpkg's file list, in path order."""
    lists = sorted(info_dir.glob(f"{package}.list")) + sorted(info_dir.glob(f"{package}:*.list"))
    if not lists:
        raise BuildError(f"{package} is not installed (no {info_dir}/{package}.list): install it with "
                         f"`apt-get install -y --no-install-recommends {' '.join(ARABIC_PACKAGES)}`")
    files = {line for lst in lists for line in lst.read_text(encoding="utf-8").split("\n")
             if line.startswith(ARABIC_CATALOG_DIR) and line.endswith(".mo")}
    return [Path(p) for p in sorted(files) if Path(p).is_file()]


def near_duplicate_groups(keys: Iterable[str], run: int = ARABIC_SHARED_RUN) -> dict[str, str]:
    """key -> its group's smallest key, where two keys (space-joined comparison words) are in one group when
    they share a run of `run` words, directly or through others (a message shorter than that is its own run)."""
    parent: dict[str, str] = {}

    def root(item: str) -> str:
        while parent.setdefault(item, item) != item:
            parent[item] = parent[parent[item]]
            item = parent[item]
        return item

    keys = list(keys)
    for key in keys:
        words = key.split()
        runs = [" ".join(words[i : i + run]) for i in range(len(words) - run + 1)] or [key]
        for shared in runs:
            a, b = root("k " + key), root("r " + shared)
            if a != b:
                parent[a] = b
    members: dict[str, list[str]] = {}
    for key in keys:
        members.setdefault(root("k " + key), []).append(key)
    return {key: min(group) for group in members.values() for key in group}


def build_arabic_messages(info_dir: Path = DPKG_INFO_DIR) -> Task:
    """An application's Arabic interface message -> which of six applications it comes from.

    The text is a translator's Arabic, as written (harakat and tatweel included, which a quarter of the
    messages carry), from the packages' own catalogs. A message whose words (compared without diacritics)
    are in two applications is dropped, one in an application twice is kept once; messages that share a
    run of four words are near-duplicates ("تعذر فتح الملف %s" / "تعذر فتح الملف: %s") and share a split,
    80/10/10 by sha1 of their group.
    """
    stats = {"messages": 0, "too_few_arabic_words": 0, "duplicates": 0, "in_several_packages": 0}
    found: dict[str, dict[str, dict]] = {}  # comparison key -> package -> row (first in catalog order)
    for package, label in ARABIC_PACKAGES.items():
        catalogs = catalogs_of(package, info_dir)
        if not catalogs:
            raise BuildError(f"{package} holds no Arabic catalog under {ARABIC_CATALOG_DIR}")
        for catalog in catalogs:
            for msgid, msgstr in sorted(read_mo(catalog)):
                if not msgid:  # the header
                    continue
                stats["messages"] += 1
                text = arabic_message_text(msgstr)
                if arabic_words(text) < ARABIC_MIN_WORDS:
                    stats["too_few_arabic_words"] += 1
                    continue
                key = " ".join(comparison_words(text))
                if package in found.setdefault(key, {}):
                    stats["duplicates"] += 1
                    continue
                english = msgid.split("\x04")[-1].split("\0")[0]
                found[key][package] = {"text": text, "label": label, "source": english,
                                       "id": f"{catalog.stem}/{_sha1_key(msgid)[:12]}"}
    rows: dict[str, dict] = {}
    for key, by_package in found.items():
        if len(by_package) > 1:
            stats["in_several_packages"] += len(by_package)
        else:
            rows[key] = next(iter(by_package.values()))
    group_of = near_duplicate_groups(sorted(rows))
    group_sizes = Counter(group_of.values())
    splits: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for key, row in rows.items():
        splits[split_of(group_of[key])].append(row)
    stats["kept"] = len(rows)
    return Task(
        name="arabic-messages",
        description="an Arabic interface message of one of six applications (its first plural form; accelerator "
        "markers, entities and markup removed; diacritics and tatweel kept) -> the application; messages of "
        f"{ARABIC_MIN_WORDS}+ Arabic words, unique without diacritics, those in two applications dropped; messages "
        f"sharing a run of {ARABIC_SHARED_RUN} words are one group, 80/10/10 split by sha1 of the group",
        task_type="classification",
        text_pair_column=None,
        splits={split: sorted(split_rows, key=lambda row: (_sha1_key(row["text"]), row["id"]))
                for split, split_rows in splits.items()},
        sources=debian_versions(ARABIC_PACKAGES),
        extra={"message_stats": stats, "near_duplicate_groups": len(group_sizes),
               "largest_group": max(group_sizes.values(), default=0),
               "with_diacritics_or_tatweel": sum(bool(_ARABIC_MARKS_RE.search(row["text"])) for row in rows.values())},
    )


# ---------------------------------------------------------------------------------------- writing


def jsonl_bytes(rows: Iterable[dict]) -> bytes:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and os.replace, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # open() honours the umask, mkstemp would not
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def label_summary(task: Task) -> dict[str, object]:
    if task.task_type == "multiple_choice":
        return {"answer_position_counts": {split: dict(sorted(Counter(row["label"] for row in rows).items()))
                                           for split, rows in task.splits.items()}}  # fmt: skip
    if task.task_type == "embedding":
        return {"kind_counts": {split: dict(sorted(Counter(row["kind"] for row in rows).items()))
                                for split, rows in task.splits.items()}}  # fmt: skip
    if task.task_type == "token_classification":
        types = {split: dict(sorted(Counter(t for row in rows for t in entity_types(row["tags"])).items()))
                 for split, rows in task.splits.items()}  # fmt: skip
        return {
            "entity_counts": {split: sum(c.values()) for split, c in types.items()},
            "entity_type_counts": types,
        }
    if task.task_type == "classification":
        counts = {}
        for split, rows in task.splits.items():
            c: dict[str, int] = {}
            for row in rows:
                c[row["label"]] = c.get(row["label"], 0) + 1
            counts[split] = dict(sorted(c.items()))
        return {"label_counts": counts}
    return {
        "label_histogram": {
            "bins": [round(i / HISTOGRAM_BINS, 2) for i in range(HISTOGRAM_BINS + 1)],
            **{split: histogram(row["label"] for row in rows) for split, rows in task.splits.items()},
        },
        "label_mean": {
            split: round(sum(row["label"] for row in rows) / max(len(rows), 1), 4)
            for split, rows in task.splits.items()
        },
    }


def task_files(task: Task) -> tuple[dict[str, bytes], bytes]:
    """The bytes of each split file and of task.json."""
    files = {f"{split}.jsonl": jsonl_bytes(task.splits[split]) for split in SPLITS}
    meta = {
        "format_version": FORMAT_VERSION,
        "task": task.name,
        "description": task.description,
        "task_type": task.task_type,
        **task.columns(),
        "labels": task.labels(),
        "counts": {split: len(task.splits[split]) for split in SPLITS},
        **label_summary(task),
        "files": {name: {"sha1": hashlib.sha1(data).hexdigest(), "bytes": len(data)} for name, data in files.items()},
        "sources": task.sources,
        "generator": "scripts/build_parity_tasks.py",
        **task.extra,
    }
    return files, (json.dumps(meta, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_task(task: Task, out_dir: Path, force: bool = False) -> bool:
    """Write the task's files (task.json last); False if task.json and every file are already current."""
    task_dir = out_dir / task.name
    files, meta = task_files(task)
    meta_path = task_dir / TASK_FILE
    if not force and meta_path.is_file() and meta_path.read_bytes() == meta:
        current = json.loads(meta)["files"]
        if all(
            (task_dir / name).is_file() and hashlib.sha1((task_dir / name).read_bytes()).hexdigest() == entry["sha1"]
            for name, entry in current.items()
        ):
            return False
    task_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_atomic(task_dir / name, data)
    write_atomic(meta_path, meta)
    return True


# ------------------------------------------------------------------------------------------- main


def default_out() -> Path:
    cache = os.environ.get("BERTFORGE_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "bertforge") / "tasks"


def _parse_tasks(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in TASKS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown task(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(TASKS)}")
    return list(dict.fromkeys(names))


def summary_line(task: Task, task_dir: Path, wrote: bool) -> str:
    counts = ", ".join(f"{split} {len(task.splits[split]):,}" for split in SPLITS)
    if task.task_type == "token_classification":
        entities = Counter(kind for rows in task.splits.values() for row in rows
                           for kind in entity_types(row["tags"]))  # fmt: skip
        tags = len(task.labels() or [])
        labels = f"{sum(entities.values()):,} entities of {len(entities)} types, {tags} tags"
    elif task.task_type == "multiple_choice":
        labels = f"{CHOICES} choices per question"
    elif task.task_type == "embedding":
        kinds = Counter(row["kind"] for rows in task.splits.values() for row in rows)
        labels = "pairs " + " ".join(f"{k}:{v:,}" for k, v in sorted(kinds.items()))
    elif task.task_type == "classification":
        totals: dict[str, int] = {}
        for rows in task.splits.values():
            for row in rows:
                totals[row["label"]] = totals.get(row["label"], 0) + 1
        labels = "labels " + " ".join(f"{k}:{v}" for k, v in sorted(totals.items()))
    else:
        values = [row["label"] for rows in task.splits.values() for row in rows]
        labels = f"label mean {sum(values) / len(values):.3f}, histogram {histogram(values)}"
    group = task.extra.get("group_column")
    if isinstance(group, str):  # the rows per group (language) and label, e.g. "en 1:150 3:29 ..."
        per_group: dict[str, Counter] = {}
        for rows in task.splits.values():
            for row in rows:
                per_group.setdefault(row[group], Counter())[row["label"]] += 1
        labels += f"; per {group}: " + ", ".join(
            f"{name} " + " ".join(f"{k}:{v}" for k, v in sorted(c.items())) for name, c in per_group.items())
    return f"{task.name}: {counts}; {labels} -> {task_dir} ({'written' if wrote else 'up to date'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: $BERTFORGE_CACHE/tasks "
                        "or ~/.cache/bertforge/tasks)")  # fmt: skip
    parser.add_argument("--tasks", type=_parse_tasks, default=None, help=f"comma-separated subset of {','.join(TASKS)}")
    parser.add_argument("--force", action="store_true", help="rewrite tasks whose task.json is unchanged")
    parser.add_argument("--wordnet-dir", type=Path, default=WORDNET_DIR, help="WordNet data.* directory")
    parser.add_argument("--man-dir", type=Path, default=MAN_DIR, help="directory holding man1..man8")
    # one package can dwarf the rest (google-cloud-cli ships ~16,000 templated pages in man1)
    parser.add_argument("--man-max-per-package", type=int, default=MAN_MAX_PER_PACKAGE, metavar="N",
                        help=f"manpages: keep at most N pages of any one package (default {MAN_MAX_PER_PACKAGE})")  # fmt: skip
    args = parser.parse_args(argv)
    out_dir: Path = args.out or default_out()
    explicit = args.tasks is not None
    names: list[str] = args.tasks or list(TASKS)
    start = time.perf_counter()
    graph: NounGraph | None = None
    try:
        for name in names:
            if name in OPTIONAL_TASKS and not explicit and not apt_lists_present():
                print(f"{name}: skipped, no apt package lists (run `apt-get update` to build it)")
                continue
            if name.startswith("wordnet-") and graph is None:
                graph = NounGraph(read_nouns(args.wordnet_dir))
            if name == "manpages":
                task = build_manpages(args.man_dir, args.man_max_per_package)
            elif name == "manpages-multilingual":
                task = build_manpages_multilingual(args.man_dir)
            elif name == "wordnet-pairs":
                task = build_wordnet_pairs(graph=graph)
            elif name == "wordnet-similarity":
                task = build_wordnet_similarity(graph=graph)
            elif name == "supersense-tagging":
                task = build_supersense_tagging(args.wordnet_dir)
            elif name == "wordnet-embedding":
                task = build_wordnet_embedding(args.wordnet_dir)
            elif name == "wordnet-choice":
                task = build_wordnet_choice(args.wordnet_dir)
            elif name == "arabic-messages":
                task = build_arabic_messages()
            else:
                task = build_debian_sections()
            wrote = write_task(task, out_dir, force=args.force)
            print(summary_line(task, out_dir / task.name, wrote), flush=True)
    except (BuildError, subprocess.CalledProcessError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"done in {time.perf_counter() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
