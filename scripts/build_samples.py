#!/usr/bin/env python3
"""Build the real-text samples bundled in ``src/bertforge/samples`` from Debian packages.

Sources (``apt-get install wordnet-base bible-kjv``):

* the King James Bible, read through the ``bible`` program -> pre-training corpus (one
  chapter per document, one verse per line);
* WordNet 3.0 glosses -> the "gloss -> supersense" classification set (label = the synset's
  lexicographer file, e.g. ``noun.animal``), split 80/10/10 by a stable hash, plus the TRAIN
  glosses only as extra pre-training documents (so fine-tuning evaluation never sees
  pre-training text).

The output is byte-for-byte reproducible (sorted order, gzip with mtime=0 and a fixed level,
sha1-based split), so ``--check`` can prove the committed files came from this script.
Standard library only, so it runs on a fresh machine:

    python scripts/build_samples.py            # rebuild into src/bertforge/samples
    python scripts/build_samples.py --check    # rebuild into a temp dir and compare
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "src" / "bertforge" / "samples"

WORDNET_DIR = Path("/usr/share/wordnet")
LEXNAMES_MAN = Path("/usr/share/man/man5/lexnames.5WN.gz")
WORDNET_COPYRIGHT = Path("/usr/share/doc/wordnet-base/copyright")
BIBLE_PROGRAM = "bible"
BIBLE_RANGE = "Gen1:1-Rev22:21"
DEBIAN_PACKAGES = ("wordnet-base", "bible-kjv")

# WordNet data files in the order rows are emitted; the synset id prefix is the ss_type letter.
WORDNET_FILES = ("noun", "verb", "adj", "adv")
SPLITS = ("train", "validation", "test")
GLOSSES_PER_DOCUMENT = 32  # upper bound; runs are cut into balanced chunks of 16..32 lines
GZIP_LEVEL = 9
MAX_TOTAL_BYTES = 8_000_000  # the whole samples dir must stay small enough to ship in the wheel

EXPECTED_KJV_VERSES = 31_102
EXPECTED_KJV_CHAPTERS = 1_189
EXPECTED_LEXNAMES = 45

CORPUS_FILE = "corpus.txt.gz"
LICENSE_FILE = "LICENSE-WordNet.txt"
NOTICE_FILE = "NOTICE.md"
MANIFEST_FILE = "manifest.json"

_VERSE_RE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
_LEXNAME_RE = re.compile(r"^(\d\d)\t(\S+)\s*\t")


class BuildError(Exception):
    """A source is missing or does not look the way this script expects."""


@dataclass(frozen=True)
class Synset:
    """One WordNet synset reduced to what the samples need."""

    id: str  # "<ss_type>.<offset>", e.g. "n.00001740"; unique across the four data files
    label: str  # lexicographer file name, e.g. "noun.Tops"
    lexnum: int
    text: str  # the gloss: definition plus example sentences, stripped


# --------------------------------------------------------------------------------------- sources


def _require(path: Path) -> Path:
    if not path.exists():
        raise BuildError(
            f"{path} not found: install the sources with `apt-get install -y wordnet-base bible-kjv`"
        )
    return path


def read_lexnames(man_page: Path = LEXNAMES_MAN) -> dict[int, str]:
    """Lexicographer file numbers -> names, parsed from the table in the lexnames(5WN) man page."""
    with gzip.open(_require(man_page), "rt", encoding="utf-8") as f:
        names = {int(m.group(1)): m.group(2) for line in f if (m := _LEXNAME_RE.match(line))}
    if len(names) != EXPECTED_LEXNAMES or sorted(names) != list(range(EXPECTED_LEXNAMES)):
        raise BuildError(
            f"expected lexnames 00..{EXPECTED_LEXNAMES - 1} in {man_page}, found {sorted(names)}"
        )
    return names


def read_synsets(wordnet_dir: Path, lexnames: dict[int, str]) -> list[Synset]:
    """All synsets with a non-empty gloss, in data-file order (noun, verb, adj, adv; by offset)."""
    synsets: list[Synset] = []
    for name in WORDNET_FILES:
        path = _require(wordnet_dir / f"data.{name}")
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.startswith("  "):  # the license header of every data file
                    continue
                head, sep, gloss = line.partition(" | ")
                fields = head.split()
                if not sep or len(fields) < 4 or not fields[0].isdigit():
                    raise BuildError(f"unexpected line in {path}: {line[:80]!r}")
                text = gloss.strip()
                if not text:
                    continue
                lexnum = int(fields[1])
                synsets.append(Synset(f"{fields[2]}.{fields[0]}", lexnames[lexnum], lexnum, text))
    return synsets


def read_kjv(program: str = BIBLE_PROGRAM) -> list[tuple[str, list[str]]]:
    """KJV chapters in canonical order as (reference like "Ge1", verses without numbers)."""
    exe = shutil.which(program)
    if exe is None:
        raise BuildError(f"`{program}` not found: install it with `apt-get install -y bible-kjv`")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["LC_ALL"] = "C"
    # -f prints "Ge1:1 text" one verse per line; a huge -l keeps long verses on one line.
    out = subprocess.run(
        [exe, "-f", "-l100000", BIBLE_RANGE], check=True, capture_output=True, env=env
    ).stdout.decode("utf-8")
    chapters: list[tuple[str, list[str]]] = []
    verses = 0
    for line in out.splitlines():
        if not line.strip():
            continue
        m = _VERSE_RE.match(line)
        if m is None:
            raise BuildError(f"unexpected `bible` output line: {line[:80]!r}")
        ref = f"{m.group(1)}{m.group(2)}"
        if not chapters or chapters[-1][0] != ref:
            chapters.append((ref, []))
        chapters[-1][1].append(" ".join(m.group(4).split()))
        verses += 1
    if verses != EXPECTED_KJV_VERSES or len(chapters) != EXPECTED_KJV_CHAPTERS:
        raise BuildError(
            f"expected {EXPECTED_KJV_VERSES} verses in {EXPECTED_KJV_CHAPTERS} chapters from `bible`, "
            f"got {verses} in {len(chapters)}"
        )
    return chapters


def read_wordnet_license(copyright_file: Path = WORDNET_COPYRIGHT) -> str:
    """The WordNet 3.0 license stanza of the Debian copyright file, un-indented, otherwise verbatim."""
    lines = _require(copyright_file).read_text(encoding="utf-8").splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "License: WordNet3.0")
    except StopIteration:
        raise BuildError(f"no 'License: WordNet3.0' stanza in {copyright_file}") from None
    body: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        body.append("" if line.strip() == "." else line[1:])
    if not body:
        raise BuildError(f"empty WordNet license in {copyright_file}")
    return "\n".join(body).rstrip() + "\n"


def debian_version(package: str) -> str:
    """Installed Debian package version, recorded so a rebuild can tell why it differs."""
    try:
        res = subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package], check=True, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return res.stdout.strip() or "unknown"


# ------------------------------------------------------------------------------------- transforms


def split_of(text: str) -> str:
    """Stable 80/10/10 split by sha1 of the gloss text.

    Hashing the text rather than the synset id puts identical glosses (WordNet has ~1,000 synsets
    sharing ~380 texts, e.g. "a genus of bacteria") into the same split, so no test text is ever
    seen in training or pre-training.
    """
    bucket = int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:8], "big") % 100
    return "train" if bucket < 80 else "validation" if bucket < 90 else "test"


def balanced_chunks(items: list[str], max_size: int) -> Iterator[list[str]]:
    """Cut items into ceil(n / max_size) consecutive chunks whose sizes differ by at most one."""
    if not items:
        return
    n_chunks = -(-len(items) // max_size)
    base, extra = divmod(len(items), n_chunks)
    start = 0
    for i in range(n_chunks):
        size = base + (1 if i < extra else 0)
        yield items[start : start + size]
        start += size


def wordnet_documents(train: list[Synset]) -> list[list[str]]:
    """TRAIN glosses as documents: per lexicographer file (by number), consecutive synsets."""
    by_lexnum: dict[int, list[str]] = {}
    for s in train:
        by_lexnum.setdefault(s.lexnum, []).append(s.text)
    return [
        chunk for num in sorted(by_lexnum) for chunk in balanced_chunks(by_lexnum[num], GLOSSES_PER_DOCUMENT)
    ]


def corpus_text(documents: Iterable[list[str]]) -> str:
    """bertforge's .txt document format: one sentence/verse per line, a blank line between documents."""
    return "\n\n".join("\n".join(doc) for doc in documents) + "\n"


def _texts_with_several_labels(synsets: Iterable[Synset]) -> int:
    """How many gloss texts WordNet gives to synsets of different lexicographer files (label noise)."""
    labels: dict[str, set[str]] = {}
    for s in synsets:
        labels.setdefault(s.text, set()).add(s.label)
    return sum(1 for found in labels.values() if len(found) > 1)


def jsonl_text(rows: Iterable[Synset]) -> str:
    return "".join(
        json.dumps({"text": s.text, "label": s.label, "id": s.id}, ensure_ascii=False) + "\n" for s in rows
    )


# ---------------------------------------------------------------------------------------- writing


def gzip_bytes(data: bytes) -> bytes:
    """Deterministic gzip: no file name, mtime 0, fixed level (same zlib -> same bytes)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=GZIP_LEVEL, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def _file_entry(data: bytes, **extra: object) -> dict[str, object]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), **extra}


def _content_entry(raw: bytes) -> dict[str, object]:
    # The hash of the uncompressed text lets a reader tell a zlib difference from a data difference.
    return {"content_sha256": hashlib.sha256(raw).hexdigest(), "content_bytes": len(raw)}


def notice_text(manifest: dict) -> str:
    files = manifest["files"]
    corpus = files[CORPUS_FILE]
    ss = manifest["supersense"]
    versions = manifest["sources"]
    split_lines = "\n".join(
        f"| `supersense/{split}.jsonl.gz` | {ss['splits'][split]:,} | {files[f'supersense/{split}.jsonl.gz']['bytes']:,} |"
        for split in SPLITS
    )
    return f"""# Bundled samples

Small, real English text shipped inside the `bertforge` package so that the quickstart, the
tests and the benchmarks run on a fresh machine with no downloads. Everything here is generated
by `scripts/build_samples.py` from two Debian packages (`apt-get install wordnet-base bible-kjv`;
versions used: wordnet-base {versions["wordnet-base"]}, bible-kjv {versions["bible-kjv"]}).

| file | rows / documents | bytes |
|---|---|---|
| `{CORPUS_FILE}` | {corpus["documents"]:,} documents, {corpus["lines"]:,} lines | {corpus["bytes"]:,} |
{split_lines}

## `{CORPUS_FILE}` — pre-training corpus

bertforge's `.txt` document format (gzip): one sentence per line, a blank line between documents.

* {corpus["kjv_chapters"]:,} documents from the **King James Version** of the Bible (public domain):
  one chapter per document, one verse per line ({corpus["kjv_verses"]:,} verses), verse numbers
  removed, runs of whitespace collapsed. Text from the `bible-kjv` package
  (`bible -f {BIBLE_RANGE}`).
* {corpus["wordnet_documents"]:,} documents of **WordNet 3.0** glosses ({corpus["wordnet_glosses"]:,} lines):
  only the glosses of synsets in the supersense **train** split, grouped by lexicographer file,
  consecutive synsets, at most {GLOSSES_PER_DOCUMENT} glosses per document, one gloss per line.
  Validation and test glosses never appear in the corpus, so a model pre-trained on it can be
  evaluated on the supersense task without leakage.

## `supersense/{{train,validation,test}}.jsonl.gz` — WordNet gloss → supersense

A {len(ss["labels"])}-class text classification set. One JSON object per line:
`{{"text": ..., "label": ..., "id": ...}}`.

* `text`: the synset's gloss as it appears after the `|` in `/usr/share/wordnet/data.*` (the
  definition followed by its quoted example sentences), surrounding whitespace removed.
* `label`: the synset's lexicographer file ("supersense"), e.g. `noun.animal`, `verb.motion`,
  `adj.all`, named after the table in the `lexnames(5WN)` man page.
* `id`: `<ss_type>.<offset>` — `n`, `v`, `a` (head adjective), `s` (satellite adjective) or `r`,
  and the 8-digit byte offset in the matching data file, e.g. `n.00001740`.

Split: 80/10/10 by the first 8 bytes of `sha1(text)` modulo 100 (train < 80 ≤ validation < 90 ≤
test). Hashing the text (not the id) keeps the few hundred glosses that WordNet repeats across
synsets (e.g. "a genus of bacteria") in one split; {ss["texts_with_several_labels"]} of those texts carry more than
one label (unavoidable label noise, kept). Some labels are rare (`noun.Tops`,
`adj.ppl`): see `manifest.json` for per-split label counts.

## Other files

* `{LICENSE_FILE}`: the WordNet 3.0 license (from `/usr/share/doc/wordnet-base/copyright`), which
  must accompany copies of the WordNet-derived files. The KJV text is in the public domain.
* `{MANIFEST_FILE}`: sha256, size and row/document counts of every file, the label set, per-split
  counts, and the Debian package versions used.

## Rebuilding

```
apt-get install -y wordnet-base bible-kjv
python scripts/build_samples.py           # rewrite src/bertforge/samples
python scripts/build_samples.py --check   # rebuild in a temp dir, compare byte for byte
```

The build is deterministic (sorted order, gzip level {GZIP_LEVEL} with mtime 0, sha1 split). Compressed
bytes can only differ with another zlib build; `content_sha256` in the manifest then still
identifies the data.
"""


def build(out_dir: Path, wordnet_dir: Path = WORDNET_DIR) -> dict:
    """Write every sample file into out_dir (which must be empty or absent) and return the manifest."""
    lexnames = read_lexnames()
    synsets = read_synsets(wordnet_dir, lexnames)
    chapters = read_kjv()
    license_text = read_wordnet_license()

    by_split: dict[str, list[Synset]] = {split: [] for split in SPLITS}
    for s in synsets:
        by_split[split_of(s.text)].append(s)
    train = by_split["train"]

    wn_docs = wordnet_documents(train)
    kjv_docs = [verses for _, verses in chapters]
    corpus_raw = corpus_text([*kjv_docs, *wn_docs]).encode("utf-8")

    (out_dir / "supersense").mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, object]] = {}

    corpus_gz = gzip_bytes(corpus_raw)
    (out_dir / CORPUS_FILE).write_bytes(corpus_gz)
    files[CORPUS_FILE] = _file_entry(
        corpus_gz,
        **_content_entry(corpus_raw),
        documents=len(kjv_docs) + len(wn_docs),
        lines=sum(len(d) for d in kjv_docs) + sum(len(d) for d in wn_docs),
        kjv_chapters=len(kjv_docs),
        kjv_verses=sum(len(d) for d in kjv_docs),
        wordnet_documents=len(wn_docs),
        wordnet_glosses=sum(len(d) for d in wn_docs),
    )

    label_counts: dict[str, dict[str, int]] = {}
    for split in SPLITS:
        rows = by_split[split]
        raw = jsonl_text(rows).encode("utf-8")
        gz = gzip_bytes(raw)
        name = f"supersense/{split}.jsonl.gz"
        (out_dir / name).write_bytes(gz)
        files[name] = _file_entry(gz, **_content_entry(raw), rows=len(rows))
        counts: dict[str, int] = {}
        for s in rows:
            counts[s.label] = counts.get(s.label, 0) + 1
        label_counts[split] = dict(sorted(counts.items()))

    license_bytes = license_text.encode("utf-8")
    (out_dir / LICENSE_FILE).write_bytes(license_bytes)
    files[LICENSE_FILE] = _file_entry(license_bytes)

    manifest: dict = {
        "format_version": 1,
        "generator": "scripts/build_samples.py",
        "sources": {pkg: debian_version(pkg) for pkg in DEBIAN_PACKAGES},
        "files": files,
        "supersense": {
            "labels": sorted({s.label for s in synsets}),
            "splits": {split: len(by_split[split]) for split in SPLITS},
            "split_rule": "sha1(text)[:8] as big-endian int % 100: <80 train, <90 validation, else test",
            "texts_with_several_labels": _texts_with_several_labels(synsets),
            "label_counts": label_counts,
        },
    }
    # NOTICE is generated from the manifest's counts, then hashed into it (no cycle: NOTICE has no hashes).
    notice_bytes = notice_text(manifest).encode("utf-8")
    (out_dir / NOTICE_FILE).write_bytes(notice_bytes)
    files[NOTICE_FILE] = _file_entry(notice_bytes)

    manifest_bytes = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    (out_dir / MANIFEST_FILE).write_bytes(manifest_bytes)

    total = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
    if total > MAX_TOTAL_BYTES:
        raise BuildError(f"samples total {total:,} bytes, over the {MAX_TOTAL_BYTES:,}-byte budget")
    return manifest


# ------------------------------------------------------------------------------------------- main


def _relative_files(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def check(committed: Path, wordnet_dir: Path) -> int:
    """Rebuild into a temp dir and compare byte for byte; 0 if identical, 1 (with a report) if not."""
    with tempfile.TemporaryDirectory(prefix="bertforge-samples-") as tmp:
        fresh = Path(tmp)
        manifest = build(fresh, wordnet_dir)
        expected, actual = _relative_files(fresh), _relative_files(committed)
        problems = [f"missing from {committed}: {name}" for name in sorted(expected - actual)]
        problems += [f"not produced by the build: {name}" for name in sorted(actual - expected)]
        problems += [
            f"differs: {name}"
            for name in sorted(expected & actual)
            if (fresh / name).read_bytes() != (committed / name).read_bytes()
        ]
    if not problems:
        print(f"OK: {len(expected)} files in {committed} are reproduced byte for byte")
        return 0
    print(f"MISMATCH: {len(problems)} file(s) in {committed} differ from a fresh build:", file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    try:
        old = json.loads((committed / MANIFEST_FILE).read_text(encoding="utf-8"))
        if old.get("sources") != manifest["sources"]:
            print(
                f"  note: Debian package versions differ: committed {old.get('sources')}, "
                f"here {manifest['sources']}",
                file=sys.stderr,
            )
        same_content = [
            name
            for name, entry in manifest["files"].items()
            if "content_sha256" in entry
            and old.get("files", {}).get(name, {}).get("content_sha256") == entry["content_sha256"]
            and old["files"][name].get("sha256") != entry["sha256"]
        ]
        if same_content:
            print(
                f"  note: {', '.join(same_content)}: same uncompressed content, different gzip bytes "
                "(another zlib build?)",
                file=sys.stderr,
            )
    except (OSError, ValueError, KeyError):
        pass
    print("Rebuild with `python scripts/build_samples.py` and commit the result.", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="samples directory (default: %(default)s)"
    )
    parser.add_argument("--wordnet-dir", type=Path, default=WORDNET_DIR, help="WordNet data.* directory")
    parser.add_argument("--check", action="store_true", help="rebuild in a temp dir and compare with --out")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        if args.check:
            return check(args.out, args.wordnet_dir)
        # Build next to the target, then swap, so a failed build never leaves a half-written dir.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".samples-", dir=args.out.parent) as tmp:
            manifest = build(Path(tmp) / "samples", args.wordnet_dir)
            for name in (CORPUS_FILE, "supersense", LICENSE_FILE, NOTICE_FILE, MANIFEST_FILE):
                target = args.out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
            args.out.mkdir(parents=True, exist_ok=True)
            for item in (Path(tmp) / "samples").iterdir():
                shutil.move(str(item), str(args.out / item.name))
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    ss = manifest["supersense"]
    print(
        f"wrote {args.out}: {total:,} bytes; corpus {manifest['files'][CORPUS_FILE]['documents']:,} documents; "
        f"supersense {len(ss['labels'])} labels, splits {ss['splits']} in {time.perf_counter() - start:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
