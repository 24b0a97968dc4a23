"""Pre-training corpora: a corpus file's documents as `bertforge prepare` reads them, the debian-docs corpus
(`scripts/build_pretraining_corpus.py` writes it into the cache) and a mix of two corpora."""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

from benchmarks.common.reports import write_atomically

DEBIAN_DOCS_BUILD = "python scripts/build_pretraining_corpus.py"


def bundled_documents() -> list[str]:
    """The bundled corpus' documents in order, read as `bertforge prepare` reads them."""
    from bertforge.data.bundled import corpus_path

    return corpus_documents(corpus_path())


def corpus_documents(corpus: Path) -> list[str]:
    """The corpus' documents in order, read as `bertforge prepare` reads them."""
    from bertforge.data.sources import iter_documents, resolve_inputs

    return [document.text for document in iter_documents(resolve_inputs([str(corpus)]))]


def document_lines(documents: list[str]) -> list[str]:
    return [line for document in documents for line in document.split("\n") if line.strip()]


def debian_docs_corpus() -> Path:
    """The debian-docs corpus file, where `scripts/build_pretraining_corpus.py` writes it by default (the cache:
    $BERTFORGE_CACHE, else ~/.cache/bertforge); a missing one ends the program with the command that builds it."""
    from bertforge.storage import cache_root

    path = cache_root() / "corpora" / "debian-docs" / "corpus.txt"
    if not path.is_file():
        print(f"error: the debian-docs corpus is not built ({path} is missing); build it with "
              f"`{DEBIAN_DOCS_BUILD}`", file=sys.stderr)
        raise SystemExit(2)
    return path


def write_mixed_corpus(large: Path, small: Path, large_share: float, out: Path) -> dict[str, int]:
    """All of `small`'s documents and every k-th of `large`'s, k chosen so that `large` gives about `large_share`
    of the text, interleaved evenly (document i of a part's n sits at (i + 0.5) / n of the file), so that the
    last 2% of documents, the validation split, holds both parts in their shares. Written atomically as a
    bertforge .txt corpus; returns the documents taken from each part."""
    large_documents, small_documents = corpus_documents(large), corpus_documents(small)
    large_chars, small_chars = sum(map(len, large_documents)), sum(map(len, small_documents))
    stride = max(1, round(large_chars * (1 - large_share) / (large_share * small_chars)))
    taken = large_documents[::stride]
    placed = sorted([((index + 0.5) / len(taken), 0, text) for index, text in enumerate(taken)]
                    + [((index + 0.5) / len(small_documents), 1, text) for index, text in enumerate(small_documents)])
    write_atomically(out, "".join(f"{text}\n\n" for _, _, text in placed))
    return {"large": len(taken), "small": len(small_documents)}



# The tech-dictionaries corpus: technical English that neither downstream task's text is drawn from (the supersense
# task holds WordNet glosses, manpages man page DESCRIPTIONs): three dictd databases from Debian, one document per
# entry: FOLDOC (computing), the Jargon File (hacker usage) and V.E.R.A. (computing acronyms).
TECH_DICTIONARIES = ("foldoc", "jargon", "vera")
TECH_DICTIONARIES_BUILD = "apt-get install dict-foldoc dict-jargon dict-vera"
DICTD_DIR = Path("/usr/share/dictd")
DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"  # the index's base-64 numbers
DICTD_DATE = re.compile(r"^\(\d{4}-\d{2}-\d{2}\)$")  # FOLDOC's last-edited stamp, a paragraph of its own


def dictd_number(text: str) -> int:
    """An offset or length of a dictd index: base 64, most significant digit first."""
    value = 0
    for character in text:
        value = value * 64 + DICTD_DIGITS.index(character)
    return value


def dictd_entries(name: str, directory: Path = DICTD_DIR) -> list[str]:
    """The raw entries of the dictd database `name` in its index's order (by headword); its own `00-database-*`
    entries (URL, licence, short name) are left out."""
    data = gzip.decompress((directory / f"{name}.dict.dz").read_bytes())
    entries = []
    for line in (directory / f"{name}.index").read_text(encoding="utf-8").splitlines():
        headword, offset, length = line.split("\t")[:3]
        if not headword.startswith("00"):
            start = dictd_number(offset)
            entries.append(data[start:start + dictd_number(length)].decode("utf-8", errors="replace"))
    return entries


def dictionary_document(entry: str) -> str:
    """One dictd entry as prose: the headword line, then each paragraph reflowed onto one line, without the
    cross-reference braces ({modem} -> modem) and FOLDOC's date stamps."""
    headword, _, body = entry.strip("\n").partition("\n")
    paragraphs = [" ".join(paragraph.split()) for paragraph in re.split(r"\n\s*\n", body)]
    paragraphs = [re.sub(r"[{}]", "", text) for text in paragraphs if text and not DICTD_DATE.match(text)]
    return "\n".join([headword.strip(), *paragraphs])


def tech_dictionaries_corpus() -> Path:
    """The tech-dictionaries corpus file in the cache ($BERTFORGE_CACHE, else ~/.cache/bertforge), written once from
    the installed dictd databases (deterministic: each database's entries in its index order, once each, the three spread evenly through the file
    as `write_mixed_corpus` spreads its parts, so that the validation split, the last 2% of documents, holds all
    three in their shares);
    missing databases end the program with the command that installs them."""
    from bertforge.storage import cache_root

    missing = [name for name in TECH_DICTIONARIES if not (DICTD_DIR / f"{name}.index").is_file()]
    if missing:
        print(f"error: the tech-dictionaries corpus needs the dictd databases {', '.join(missing)} "
              f"(not in {DICTD_DIR}); install them with `{TECH_DICTIONARIES_BUILD}`", file=sys.stderr)
        raise SystemExit(2)
    path = cache_root() / "corpora" / "tech-dictionaries" / "corpus.txt"
    if not path.is_file():
        placed = []
        for rank, name in enumerate(TECH_DICTIONARIES):
            documents = [dictionary_document(entry) for entry in dictd_entries(name)]
            documents = [text for text in dict.fromkeys(documents) if "\n" in text]  # once each, a body
            placed += [((index + 0.5) / len(documents), rank, text) for index, text in enumerate(documents)]
        write_atomically(path, "".join(f"{text}\n\n" for _, _, text in sorted(placed)))
    return path


def shared_lines(documents: list[str], texts: list[str]) -> list[str]:
    """The lines of `documents` that are also a line of `texts`, compared lower-cased with whitespace collapsed: a
    corpus meant to hold none of a task's text must give none."""
    def key(line: str) -> str:
        return " ".join(line.lower().split())

    task_lines = {key(line) for text in texts for line in text.split("\n") if line.strip()}
    return [line for line in document_lines(documents) if key(line) in task_lines]
