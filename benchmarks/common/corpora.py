"""Pre-training corpora: a corpus file's documents as `bertforge prepare` reads them, the debian-docs corpus
(`scripts/build_pretraining_corpus.py` writes it into the cache) and a mix of two corpora."""

from __future__ import annotations

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
