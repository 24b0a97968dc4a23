#!/usr/bin/env python3
"""Build a pre-training corpus of English prose (about 140 MB) from Debian documentation packages.

The bundled corpus (the King James Bible plus WordNet train glosses, a few MB) is too small to choose
pre-training settings by measurement (issue 18); this builds a larger real one from the manuals in
Debian's main archive: the Linux kernel, Python, PostgreSQL, Rust, Java, Qt, LLVM, Erlang, Racket,
SageMath, Django, SciPy and other documentation, the Debian Reference, Handbook and Policy, LibreOffice
and GIMP help. Only this script goes into the repository, not the text. On Debian 12 (bookworm) the 57
packages give about 33,000 documents, 142 MB and 22.6 million words from 740 MB of ``.deb`` files.

The packages (``PACKAGES`` below, a fixed list; apt's candidate versions, or with ``--replay`` an earlier
manifest's) are fetched with ``apt-get download`` into ``DIR/debs`` (kept, and re-fetched only when the
wanted version changes) and read straight
from the ``.deb`` files with ``dpkg-deb --fsys-tarfile``. Nothing is installed: no root is needed, and
``/usr/share/man``, the source of the ``manpages`` parity task, stays as it was (perl-doc, for one, would
add 200 man pages to it). Only ``apt-get`` and its package lists are needed; ``apt-get update`` is run
when the lists are missing and this runs as root. With ``--offline``, or where there is no apt-get, the
``.deb`` files already in ``DIR/debs`` are used. What is missing is named on one line, with exit status 2.

Conversion: HTML through the standard library's ``html.parser``. Navigation bars, sidebars, headers,
footers, headings, tables, ``<pre>`` and other code blocks, and API signatures are dropped, and block
elements end a paragraph. Texinfo ``.info`` files lose their node headers, menus and indexes; plain
``.txt`` files lose underlined headings and indented blocks. ``.gz`` files are decompressed. A paragraph
is kept when it has at least ``MIN_WORDS`` words, when ``MIN_LETTER_FRACTION`` of its non-space characters
are letters, and (from ``STOPWORD_CHECK_WORDS`` words on) when enough of its words are common English
words. An exact duplicate of an earlier paragraph is dropped, so repeated boilerplate (licence notices,
"See also" lines, the same docstring in Rust's ``std`` and ``core``) appears once.

Kept out, because evaluation tasks are built from them (scripts/build_parity_tasks.py and the bundled
supersense set):

* anything under ``/usr/share/man``, and the HTML renditions of man pages. These are ``name.N.html``
  files and, by each package's excludes, git-doc's ``git*.html``, LLVM's and Clang's ``CommandGuide``,
  PostgreSQL's SQL and application reference pages, and others. perl-doc's POD is not used at all;
* anything from WordNet;
* Debian package descriptions: apt and dpkg databases, doc-base and AppStream files. Tables are
  dropped, which removes the package tables of the Debian Reference;
* as a safety net for what a path cannot tell, every paragraph that shares a run of ``SHINGLE_WORDS``
  words (case and punctuation aside) with a text of any task built in ``--tasks``. This is
  scripts/build_parity_tasks.py's output, so build the tasks first. The bundled supersense set is
  checked too.

Output: ``DIR/corpus.txt`` holds one paragraph per line, with documents (an HTML page, an info node, a
text file) separated by a blank line; this is the format ``bertforge prepare pretrain`` reads.
``DIR/manifest.json`` records each package's version and ``.deb`` sha256, the files used and the bytes of
text each gave, the files refused and why, what the filters dropped, the evaluation files checked (with
their sha1), the key of each paragraph dropped as evaluation text, and the corpus's sha256. Packages and
files are read in sorted order, and nothing depends on time or locale. The same ``.deb`` files and task
files therefore give byte-identical output. Both files are written through a temp file and ``os.replace``.

The debian-sections task is built from Debian's archive, which changes daily, so a build on another day
keeps out other paragraphs (three builds gave 32,342, 32,337 and 32,341 training documents to the
time-to-quality study). ``--replay MANIFEST`` rebuilds the corpus an earlier manifest describes: its
packages at its versions (a ``.deb`` whose sha256 differs is refused) and exactly the paragraphs it dropped
as evaluation text; it says whether the result is identical and how many kept paragraphs share words with
today's evaluation texts. Standard library only:

    python scripts/build_parity_tasks.py                        # the evaluation tasks, to keep them out
    python scripts/build_pretraining_corpus.py                  # into ~/.cache/bertforge/corpora/debian-docs
    python scripts/build_pretraining_corpus.py --out /tmp/docs --packages python3.11-doc,debian-reference-en
    python scripts/build_pretraining_corpus.py --offline        # rebuild from the .deb files already fetched
    python scripts/build_pretraining_corpus.py --replay benchmarks/results/MANIFEST.json   # an earlier corpus
    bertforge prepare pretrain --input ~/.cache/bertforge/corpora/debian-docs/corpus.txt --tokenizer TOK --out DIR
"""

from __future__ import annotations

import argparse
import codecs
import fnmatch
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, BinaryIO

FORMAT_VERSION = 1
CORPUS_FILE = "corpus.txt"
MANIFEST_FILE = "manifest.json"
DEBS_DIR = "debs"
APT_LISTS_DIR = Path("/var/lib/apt/lists")

MIN_WORDS = 4  # a paragraph needs this many whitespace-separated words (drops headings, labels, stray links)
MIN_LETTER_FRACTION = 0.7  # of its non-space characters (drops code, tables of numbers, ASCII art)
STOPWORD_CHECK_WORDS = 8  # from this many words on, a paragraph must also read as English:
MIN_STOPWORD_FRACTION = 0.08  # at least this fraction of its words are common English function words
MIN_DOCUMENT_WORDS = 20  # documents with fewer words (after the filters and de-duplication) are dropped
SHINGLE_WORDS = 8  # a paragraph sharing a run of this many words with an evaluation text is dropped

REPO_ROOT = Path(__file__).resolve().parent.parent
SUPERSENSE_DIR = REPO_ROOT / "src" / "bertforge" / "samples" / "supersense"  # the bundled gloss -> supersense set
TASK_SPLITS = ("train", "validation", "test")
NON_TEXT_FIELDS = frozenset(("id", "label", "kind", "tags"))

# Common English function words: prose has 30-45 % of these, code, identifier lists and other languages
# far fewer. Lower-case, compared after stripping punctuation.
STOPWORDS = frozenset("""
a about after all also an and any are as at be because been before being both but by can could did do
does each either for from had has have he her his how however if in into is it its may might more most
must no not of on one only or other our out same should since so some such than that the their them
then there these they this those through to under until up was we were what when where whether which
while who will with without would you your
""".split())


@dataclass(frozen=True)
class Package:
    """A Debian package and the files of it that hold English prose (fnmatch globs on the path inside it)."""

    name: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def selects(self, path: str) -> bool:
        return (any(fnmatch.fnmatchcase(path, pattern) for pattern in self.include)
                and not any(fnmatch.fnmatchcase(path, pattern) for pattern in self.exclude + GLOBAL_EXCLUDE))


# Sphinx, javadoc and docbook by-products that hold no prose of their own (sources of the HTML, search
# and index pages, rendered source code).
GLOBAL_EXCLUDE = (
    "*/_sources/*", "*/_static/*", "*/_modules/*", "*/_downloads/*", "*/_images/*", "*/genindex*.html",
    "*/search.html", "*/py-modindex.html", "*/np-modindex.html", "*/searchindex.*", "*/objects.inv",
)

DOC = "usr/share/doc"
PACKAGES = (
    Package("apache2-doc", (f"{DOC}/apache2-doc/manual/en/*.html",), (f"{DOC}/apache2-doc/manual/en/programs/*",)),
    Package("aptitude-doc-en", (f"{DOC}/aptitude/html/en/*.html",)),
    Package("autoconf-doc", (f"{DOC}/autoconf/*.html",)),
    Package("bash-doc", (f"{DOC}/bash/bashref.html",)),  # bash.html is bash(1)
    Package("bind9-doc", (f"{DOC}/bind9-doc/arm/*.html",), (f"{DOC}/bind9-doc/arm/manpages.html",)),
    Package("clang-15-doc", (f"{DOC}/clang-15/html/*.html",), ("*/CommandGuide/*",)),  # = clang's man pages
    Package("cmake-doc", (f"{DOC}/cmake-data/html/*.html",)),  # manual/*.[1-8].html: refused as man pages
    Package("debian-faq", (f"{DOC}/debian/FAQ/*.en.html",)),
    Package("debian-handbook", (f"{DOC}/debian-handbook/html/en-US/*.html",)),
    Package("debian-policy", (f"{DOC}/debian-policy/*.html",)),
    Package("debian-reference-en", ("usr/share/debian-reference/*.en.html",)),
    Package("debmake-doc", (f"{DOC}/debmake-doc/html/*.en.html",)),
    Package("developers-reference", ("usr/share/developers-reference/*.html",)),
    Package("diffutils-doc", (f"{DOC}/diffutils/*.html",)),
    Package("erlang-doc", (f"{DOC}/erlang-doc/*.html",)),
    Package("exim4-doc-html", (f"{DOC}/exim4-doc-html/*.html",)),
    Package("gap-doc", ("usr/share/gap/doc/*.html",), ("*_mj.html",)),  # chapN_mj.html: chapN.html with MathJax
    Package("gettext-doc", (f"{DOC}/gettext/*.html",)),  # its *.1.html / *.3.html are man pages: refused
    Package("gimp-help-en", ("usr/share/gimp/2.0/help/en/*.html",)),
    Package("git-doc", (f"{DOC}/git-doc/*.html",),  # git*.html, everyday and scalar are git's man pages
            (f"{DOC}/git-doc/git*.html", f"{DOC}/git-doc/everyday.html", f"{DOC}/git-doc/scalar.html",
             f"{DOC}/git-doc/index.html", f"{DOC}/git-doc/howto-index.html")),
    Package("gnu-standards", (f"{DOC}/gnu-standards/*.html",)),
    Package("gnucash-docs", (f"{DOC}/gnucash-docs/gnucash-guide-en/*.html", f"{DOC}/gnucash-docs/gnucash-help-en/*.html")),
    Package("gnuplot-doc", (f"{DOC}/gnuplot/htmldocs/*.html",)),
    Package("gnutls-doc", (f"{DOC}/gnutls-doc/html/*.html",)),
    Package("harden-doc", (f"{DOC}/harden-doc/html/en-US/*.html",)),
    Package("haskell98-report", (f"{DOC}/haskell98-report/html/*.html",)),
    Package("installation-guide-amd64", (f"{DOC}/installation-guide-amd64/en/*.html",)),
    Package("libboost1.74-doc", (f"{DOC}/libboost1.74-doc/*.html",)),
    Package("libreoffice-help-en-us", ("usr/share/libreoffice/help/en-US/*.html",)),
    Package("lilypond-doc-html", (f"{DOC}/lilypond/html/Documentation/*.html",),  # big pages repeat the split ones
            (f"{DOC}/lilypond/html/Documentation/*.[a-z][a-z].html", "*-big-page.html")),
    Package("linux-doc-6.1", (f"{DOC}/linux-doc-6.1/html/*.html",), (f"{DOC}/linux-doc-6.1/html/translations/*",)),
    Package("llvm-15-doc", (f"{DOC}/llvm-15-doc/html/*.html",),  # CommandGuide = the llvm-*(1) man pages
            (f"{DOC}/llvm-15-doc/html/AMDGPU/*", "*/CommandGuide/*")),
    Package("maxima-doc", (f"{DOC}/maxima-doc/html/*.html",)),
    Package("nodejs-doc", (f"{DOC}/nodejs/api/*.html",), (f"{DOC}/nodejs/api/all.html",)),
    Package("octave-doc", (f"{DOC}/octave/*.html",)),
    Package("openjdk-17-doc", (f"{DOC}/openjdk-17-jre-headless/api/*.html",),
            (f"{DOC}/openjdk-17-jre-headless/api/*/class-use/*", "*/package-tree.html", "*/package-use.html",
             "*/overview-tree.html", "*/index-files/*", "*/allclasses*.html", "*/allpackages*.html",
             "*/constant-values.html", "*/serialized-form.html", "*/deprecated-list.html", "*/index-all.html")),
    Package("postfix-doc", (f"{DOC}/postfix/html/*.html",)),  # its *.[1-8].html man pages: refused
    Package("postgresql-doc-15", (f"{DOC}/postgresql-doc-15/html/*.html",),  # SQL and app reference = man pages
            (f"{DOC}/postgresql-doc-15/html/app-*.html", f"{DOC}/postgresql-doc-15/html/sql-*.html")),
    Package("python-astropy-doc", (f"{DOC}/python-astropy-doc/html/*.html",)),
    Package("python-biopython-doc", (f"{DOC}/python-biopython-doc/Doc/*.html",), ("*/_templates/*",)),
    Package("python-celery-doc", (f"{DOC}/python-celery-doc/html/*.html",)),
    Package("python-django-doc", (f"{DOC}/python-django-doc/html/*.html",)),
    Package("python-pandas-doc", (f"{DOC}/python-pandas-doc/html/*.html",)),
    Package("python-pytest-doc", (f"{DOC}/python-pytest-doc/html/*.html",)),
    Package("python-scipy-doc", (f"{DOC}/python-scipy-doc/html/*.html",)),
    Package("python-sklearn-doc", (f"{DOC}/python-sklearn-doc/html/*.html",)),
    Package("python-sqlalchemy-doc", (f"{DOC}/python-sqlalchemy-doc/html/*.html",)),
    Package("python-sympy-doc", (f"{DOC}/python-sympy-doc/html/*.html",)),
    Package("python3.11-doc", (f"{DOC}/python3.11/html/*.html",)),
    Package("qtbase5-doc-html", ("usr/share/qt5/doc/*.html",), ("*-members.html", "*-obsolete.html")),
    Package("r-doc-html", ("usr/share/R/doc/manual/*.html",)),
    Package("racket-doc", (f"{DOC}/racket/*.html",), (f"{DOC}/racket/deinprogramm/*",)),  # German teaching languages
    Package("rust-doc", (f"{DOC}/rust-doc/html/*.html",),
            (f"{DOC}/rust-doc/html/src/*", "*/arch/*", "*/core_arch/*", "*/all.html", "*/sidebar-items*")),
    Package("sagemath-doc", (f"{DOC}/sagemath/html/en/*.html",), ("*/references/index.html",)),  # bibliography
    Package("sphinx-doc", (f"{DOC}/sphinx-doc/html/*.html",)),
    Package("sqlite3-doc", (f"{DOC}/sqlite3/*.html",),  # requirements.html repeats the manual's sentences, annotated
            ("*/requirements.html", "*/doc_*_crossref.html", "*/keyword_index.html", "*/matrix/*", "*/toc.html",
             "*/sqldiff.html")),  # sqldiff(1)
    Package("wireshark-doc", (f"{DOC}/wireshark/*_html_chunked/*.html",)),
)
PACKAGE_NAMES = tuple(package.name for package in PACKAGES)

# A man page rendered to HTML or text: NAME.SECTION[suffix][.html|.txt][.gz] (cmake.1.html, x509.7ssl.html),
# NAME starting with a letter and not ending in a version number (v1.1.html, release.0.10.1.html, 3.11.html).
_MAN_RENDITION = re.compile(r"^([A-Za-z_][\w+.-]*)\.[1-9][a-z]{0,4}(?:\.html?|\.txt)?(?:\.gz)?$")
_VERSION_TAIL = re.compile(r"(?:^|[._-])v?\d+$")
_PACKAGE_DESCRIPTION_DIRS = ("var/lib/dpkg/", "var/lib/apt/", "usr/share/doc-base/", "usr/share/metainfo/",
                             "usr/share/appdata/")


class BuildError(Exception):
    """A package or a tool is missing, or a source does not look the way this script expects."""


def refusal(path: str) -> str | None:
    """Why the file at ``path`` (inside a package, or absolute) must never enter the corpus, or None.

    Evaluation tasks are built from these: the ``manpages`` parity task from /usr/share/man (and a man
    page's HTML rendition is the same text), the supersense and WordNet tasks from WordNet, the
    ``debian-sections`` task from package descriptions.
    """
    path = path.lstrip("./")
    lower = path.lower()
    rendition = _MAN_RENDITION.match(path.rsplit("/", 1)[-1])
    if (lower.startswith("usr/share/man/") or "/man/man" in f"/{lower}"
            or (rendition and not _VERSION_TAIL.search(rendition.group(1)))):
        return "man page"
    if "wordnet" in lower:
        return "WordNet"
    if lower.startswith(_PACKAGE_DESCRIPTION_DIRS) or lower.endswith("/debian/control"):
        return "package description"
    return None


# ------------------------------------------------------------------------------------------ HTML


_BLOCK_TAGS = frozenset("""
address article aside blockquote body caption center dd details dialog dir div dl dt fieldset figcaption
figure footer form frameset h1 h2 h3 h4 h5 h6 header hr html li main menu nav ol p pre section summary table
tbody td tfoot th thead tr ul
""".split())
_VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements dropped with everything inside them: non-content, navigation, headings, tables, code, forms.
_SKIP_TAGS = frozenset("""
head script style noscript template nav header footer aside h1 h2 h3 h4 h5 h6 table pre code-block samp
kbd form button select textarea svg math iframe object canvas video audio
""".split())
# Class tokens of navigation and code elements in the generators Debian's documentation comes from
# (Sphinx, DocBook, texinfo, javadoc, rustdoc, texi2html, latex2html).
_SKIP_CLASSES = frozenset("""
related sphinxsidebar sphinxsidebarwrapper footer header headerlink navheader navfooter navigation nav
nav-panel navbar breadcrumb breadcrumbs toc toctree-wrapper contents shortcontents menu sidebar
sidebar-elems search searchbox topnav bottomnav top-nav sub-nav legalnotice copyright list-of-figures
list-of-tables list-of-examples list-of-equations programlisting screen synopsis cmdsynopsis funcsynopsis
literallayout example lisp smallexample verbatim literal-block-wrapper doctest highlight sig sig-object
member-signature type-signature inheritance summary item-decl code-header out-of-band rustdoc-breadcrumbs
src-link rightside since index node mw-editsection sphx-glr-timing sphx-glr-footer sphx-glr-download-link-note
""".split())
_SKIP_ROLES = frozenset(("navigation", "search", "banner", "contentinfo"))


class _HTMLText(HTMLParser):
    """The paragraphs of an HTML page: text of block elements, skipped elements left out.

    ``keep`` holds the source positions (line, column) of elements not to skip even though they look
    like navigation: in a page with unbalanced tags such an element can swallow the rest of the page (Qt's
    ``<div class="header">`` is never closed), so ``html_paragraphs`` parses a page again with the element
    kept when it held more than four fifths of the page's text.
    """

    def __init__(self, keep: frozenset[tuple[int, int]] = frozenset()) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.swallowed: tuple[int, int] | None = None  # where an element that hid most of the text began
        self._keep = keep
        self._pieces: list[str] = []
        self._skip_tag: str | None = None
        self._skip_depth = 0
        self._skip_start = (0, 0)
        self._skip_chars = 0  # text in the element being skipped
        self._kept_chars = 0
        self._largest: tuple[int, tuple[int, int]] = (0, (0, 0))  # most text in a skipped navigation element

    def _flush(self) -> None:
        if self._pieces:
            text = " ".join("".join(self._pieces).split())
            if text:
                self.paragraphs.append(text)
            self._pieces = []

    @staticmethod
    def _skipped(tag: str, attrs: list[tuple[str, str | None]]) -> bool:
        if tag in _SKIP_TAGS:
            return True
        for name, value in attrs:
            if not value:
                continue
            if name == "class":
                tokens = value.split()
                if any(token in _SKIP_CLASSES or token.startswith("highlight-") for token in tokens):
                    return True
            elif name == "role" and value in _SKIP_ROLES:
                return True
        return False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth += 1
            return
        if tag == "br":
            self._pieces.append(" ")
        elif tag in _BLOCK_TAGS:
            self._flush()
        if tag not in _VOID_TAGS and self._skipped(tag, attrs) and self.getpos() not in self._keep:
            self._skip_tag, self._skip_depth, self._skip_start = tag, 1, self.getpos()

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._skip_tag is None:
            if tag == "br":
                self._pieces.append(" ")
            elif tag in _BLOCK_TAGS:
                self._flush()

    def handle_endtag(self, tag: str) -> None:
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._end_skip()
            return
        if tag in _BLOCK_TAGS:
            self._flush()

    def _end_skip(self) -> None:
        if self._skip_tag not in _SKIP_TAGS:  # skipped for its class or role
            self._largest = max(self._largest, (self._skip_chars, self._skip_start))
        self._skip_tag, self._skip_chars = None, 0

    def handle_data(self, data: str) -> None:
        if self._skip_tag is None:
            self._pieces.append(data)
            self._kept_chars += len(data)
        else:
            self._skip_chars += len(data)

    def close(self) -> None:
        super().close()
        self._flush()
        if self._skip_tag is not None:
            self._end_skip()
        chars, start = self._largest
        if chars > 4 * self._kept_chars:  # it hid 80 % of the text
            self.swallowed = start


_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", re.IGNORECASE)


def decode_html(data: bytes) -> str:
    """HTML bytes as text: the charset its <meta> names (UTF-8 when none or unknown), bad bytes replaced."""
    match = _CHARSET.search(data[:4096])
    encoding = "utf-8"
    if match:
        try:
            encoding = codecs.lookup(match.group(1).decode("ascii")).name
        except LookupError:
            pass
    return data.decode(encoding, errors="replace")


def html_paragraphs(html: str) -> list[str]:
    """The raw paragraphs of an HTML page (before the prose filters)."""
    keep: frozenset[tuple[int, int]] = frozenset()
    for _ in range(8):  # each pass keeps one more "navigation" element that hid most of the text
        parser = _HTMLText(keep)
        parser.feed(html)
        parser.close()
        if parser.swallowed is None:
            break
        keep |= {parser.swallowed}
    return parser.paragraphs


# ------------------------------------------------------------------------------- info and text


_UNDERLINE = re.compile(r"^\s*([*=\-.~^#_+])\1{2,}\s*$")
_INFO_XREF = re.compile(r"\*[Nn]ote\s+([^:]+?)::")
_INFO_XREF_NAMED = re.compile(r"\*[Nn]ote\s+([^:]+?):\s*[^.,]*[.,]")
_INFO_MENU_LINE = re.compile(r"^\* (?:Menu:|.*::|[^:]+:\s+.*\.(?:\s+\(line\s+\d+\))?$)")


def decode_text(data: bytes) -> str:
    """UTF-8, or Latin-1 for the older files that are not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _blocks(lines: Iterable[str]) -> Iterator[list[str]]:
    """Runs of non-blank lines."""
    block: list[str] = []
    for line in lines:
        if line.strip():
            block.append(line.rstrip())
        elif block:
            yield block
            block = []
    if block:
        yield block


def _drop_underlined(block: list[str]) -> list[str]:
    """The block without heading underlines (``=====``) and the heading lines above them."""
    kept: list[str] = []
    for line in block:
        if _UNDERLINE.match(line):
            if kept:
                kept.pop()
            continue
        kept.append(line)
    return kept


def text_paragraphs(text: str) -> list[str]:
    """Paragraphs of a plain-text file: blank-line separated blocks, lines joined; indented blocks
    (code, examples, tables) and underlined headings dropped."""
    paragraphs = []
    for block in _blocks(text.splitlines()):
        block = _drop_underlined(block)
        if not block or all(line.startswith(("    ", "\t")) for line in block):
            continue
        paragraphs.append(" ".join(" ".join(block).split()))
    return paragraphs


def info_documents(text: str) -> list[list[str]]:
    """One document per node of a texinfo ``.info`` file: its paragraphs, node headers, menus, index
    entries, the file's preamble and its tag tables dropped, ``*note X::`` cross references as ``X``."""
    documents = []
    for number, node in enumerate(text.split("\x1f")):
        lines = node.lstrip("\n").split("\n")
        if number == 0 or not lines or not lines[0].startswith("File:"):
            continue  # the "This is foo.info, produced by makeinfo" preamble, Tag Table, Indirect, Local Variables
        paragraphs = []
        for block in _blocks(lines[1:]):
            block = [line for line in _drop_underlined(block) if not _INFO_MENU_LINE.match(line)]
            if not block or all(line.startswith("     ") for line in block):
                continue  # @example, @lisp, @smallexample: indented five spaces
            paragraph = " ".join(" ".join(block).split())
            paragraph = _INFO_XREF_NAMED.sub(r"\1", _INFO_XREF.sub(r"\1", paragraph))
            paragraphs.append(paragraph)
        documents.append(paragraphs)
    return documents


# ------------------------------------------------------------------------------------- filters


def _words(paragraph: str) -> list[str]:
    return paragraph.split()


def paragraph_drop_reason(paragraph: str) -> str | None:
    """Why a paragraph is not English prose (``short``, ``non-letters``, ``not English``), or None."""
    words = _words(paragraph)
    if len(words) < MIN_WORDS:
        return "short"
    visible = sum(not c.isspace() for c in paragraph)
    letters = sum(c.isalpha() for c in paragraph)
    if letters < MIN_LETTER_FRACTION * visible:
        return "non-letters"
    if len(words) >= STOPWORD_CHECK_WORDS:
        common = sum(word.strip(".,;:!?()[]\"'`").lower() in STOPWORDS for word in words)
        if common < MIN_STOPWORD_FRACTION * len(words):
            return "not English"
    return None


def documents_of(path: str, data: bytes) -> list[list[str]]:
    """The raw documents (lists of paragraphs) of one file, by its name: ``.html``/``.htm``/``.xhtml``,
    ``.info`` (and split ``.info-N``), ``.txt``/``.text``; each optionally ``.gz``. Other files give none."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise BuildError(f"{path}: not a valid gzip file ({exc})") from exc
        name = name[:-3]
    if name.endswith((".html", ".htm", ".xhtml")):
        return [html_paragraphs(decode_html(data))]
    if re.search(r"\.info(?:-\d+)?$", name):
        return info_documents(decode_text(data))
    if name.endswith((".txt", ".text")):
        return [text_paragraphs(decode_text(data))]
    return []


# -------------------------------------------------------------------------------------- corpus


_WORD = re.compile(r"\w+")


def shingles(text: str, size: int = SHINGLE_WORDS) -> Iterator[str]:
    """Each run of ``size`` words of the text, lower-cased, punctuation dropped."""
    words = _WORD.findall(text.lower())
    for start in range(len(words) - size + 1):
        yield " ".join(words[start:start + size])


def _row_texts(row: dict[str, object]) -> Iterator[str]:
    for key, value in row.items():
        if key in NON_TEXT_FIELDS:
            continue
        if isinstance(value, str):
            yield value
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            yield " ".join(value)  # a token-classification row's words


def evaluation_shingles(tasks_dir: Path | None, supersense_dir: Path | None = SUPERSENSE_DIR
                        ) -> tuple[set[str], dict[str, str]]:  # fmt: skip
    """The shingles of every evaluation text, and the sha1 of each file they came from: every task that
    scripts/build_parity_tasks.py built in ``tasks_dir`` (``<task>/{train,validation,test}.jsonl``) and the
    bundled supersense set. Texts shorter than SHINGLE_WORDS words are not checked."""
    files: list[tuple[str, Path]] = []
    if tasks_dir is not None and tasks_dir.is_dir():
        for task in sorted(path for path in tasks_dir.iterdir() if (path / "task.json").is_file()):
            files += [(f"tasks/{task.name}/{split}.jsonl", task / f"{split}.jsonl") for split in TASK_SPLITS
                      if (task / f"{split}.jsonl").is_file()]  # fmt: skip
    if supersense_dir is not None:
        files += [(f"samples/supersense/{split}.jsonl.gz", supersense_dir / f"{split}.jsonl.gz")
                  for split in TASK_SPLITS if (supersense_dir / f"{split}.jsonl.gz").is_file()]  # fmt: skip
    found: set[str] = set()
    sources = {}
    for name, path in files:
        data = path.read_bytes()
        sources[name] = hashlib.sha1(data).hexdigest()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        for line in data.decode("utf-8").splitlines():
            if line.strip():
                for text in _row_texts(json.loads(line)):
                    found.update(shingles(text))
    return found, sources


def paragraph_key(paragraph: str) -> bytes:
    """A paragraph's identity (12 bytes of BLAKE2b of its normalised text): for de-duplication, and for the
    manifest's record of the paragraphs dropped as evaluation text, which --replay reuses."""
    return hashlib.blake2b(paragraph.encode("utf-8"), digest_size=12).digest()


@dataclass
class Corpus:
    """Documents written in order, each paragraph at most once in the whole corpus and none that shares a
    run of SHINGLE_WORDS words with an evaluation text.

    With ``replay`` (the keys of the paragraphs an earlier build dropped as evaluation text), exactly those
    paragraphs are dropped instead, so that the earlier corpus is rebuilt although today's evaluation texts
    differ (the debian-sections task follows Debian's archive, which changes every day). How far today's
    texts disagree with the replayed drops is counted, not acted on: ``kept_sharing_today`` paragraphs
    share words with today's texts but were kept, ``dropped_not_sharing_today`` share none but were dropped."""

    stream: BinaryIO
    evaluation: set[str] = field(default_factory=set)  # from evaluation_shingles()
    replay: frozenset[bytes] | None = None  # from ReplayManifest.dropped_keys
    seen: set[bytes] = field(default_factory=set)
    evaluation_drops: set[bytes] = field(default_factory=set)  # keys of the paragraphs dropped as evaluation text
    kept_sharing_today: int = 0
    dropped_not_sharing_today: int = 0
    documents: int = 0
    paragraphs: int = 0
    words: int = 0
    bytes: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    digest: Any = field(default_factory=hashlib.sha256)

    def add(self, paragraphs: Iterable[str]) -> int:
        """Filter, de-duplicate and write one document; the bytes written (0 when nothing is left)."""
        kept = []
        keys: set[bytes] = set()
        for paragraph in paragraphs:
            paragraph = " ".join(paragraph.replace("\u00b6", " ").split())  # Sphinx's pilcrow permalinks
            reason = paragraph_drop_reason(paragraph)
            key = paragraph_key(paragraph)
            if reason is None and self._is_evaluation_text(paragraph, key):
                reason = "evaluation-text"
                self.evaluation_drops.add(key)
            if reason:
                self.dropped[f"{reason} paragraphs"] += 1
                continue
            if key in self.seen or key in keys:
                self.dropped["duplicate paragraphs"] += 1
                continue
            keys.add(key)
            kept.append(paragraph)
        words = sum(len(_words(paragraph)) for paragraph in kept)
        if not kept or words < MIN_DOCUMENT_WORDS:
            if kept:
                self.dropped["short documents"] += 1
            return 0
        self.seen |= keys  # only paragraphs written count as seen
        data = ("\n".join(kept) + "\n\n").encode("utf-8")
        self.stream.write(data)
        self.digest.update(data)
        self.documents += 1
        self.paragraphs += len(kept)
        self.words += words
        self.bytes += len(data)
        return len(data)

    def _is_evaluation_text(self, paragraph: str, key: bytes) -> bool:
        shares = bool(self.evaluation) and not self.evaluation.isdisjoint(shingles(paragraph))
        if self.replay is None:
            return shares
        dropped = key in self.replay
        self.kept_sharing_today += shares and not dropped
        self.dropped_not_sharing_today += dropped and not shares
        return dropped


# ------------------------------------------------------------------------------------ packages


def _run(command: list[str], cwd: Path | None = None) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        message = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise BuildError(f"`{' '.join(command)}` failed: {message[-1] if message else f'exit {result.returncode}'}")
    return result.stdout


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def apt_lists_present(lists_dir: Path = APT_LISTS_DIR) -> bool:
    return any(lists_dir.glob("*_Packages*"))


def _cached_debs(debs_dir: Path, name: str) -> list[Path]:
    return sorted(path for path in debs_dir.glob(f"{name}_*.deb") if path.name.split("_", 1)[0] == name)


@dataclass(frozen=True)
class Deb:
    """A fetched ``.deb`` and its sha256, read once: the pin check and the manifest share that digest."""
    path: Path
    sha256: str


def fetch_debs(names: list[str], debs_dir: Path, offline: bool,
               pins: dict[str, tuple[str, str]] | None = None) -> dict[str, Deb]:  # fmt: skip
    """Each package's ``.deb`` in ``debs_dir``: apt's candidate version, downloaded unless already there
    (checked by sha256); with ``offline``, or without apt-get, the one already there. With ``pins`` (name ->
    version and .deb sha256, from a replayed manifest) that version, and a .deb of another sha256 is refused."""
    debs_dir.mkdir(parents=True, exist_ok=True)
    pins = pins or {}
    if offline or shutil.which("apt-get") is None:
        found = {name: _cached_debs(debs_dir, name) for name in names}
        missing = [name for name, paths in found.items() if len(paths) != 1]
        if missing:
            how = "" if offline else "this machine has no apt-get; "
            wanted = " ".join(f"{name}={pins[name][0]}" if name in pins else name for name in missing)
            raise BuildError(f"{how}need exactly one .deb of each of {' '.join(missing)} in {debs_dir} "
                             f"(`apt-get download {wanted}` there on a Debian machine)")
        debs = {name: Deb(paths[0], _sha256(paths[0])) for name, paths in found.items()}
        for name, deb in debs.items():
            if name in pins and deb.sha256 != pins[name][1]:
                raise BuildError(f"{deb.path} is not the .deb of {name} {pins[name][0]} that the replayed manifest "
                                 f"names (sha256 {pins[name][1][:12]}...): put that one in {debs_dir}")
        return debs
    if not apt_lists_present():
        if not _is_root():
            raise BuildError("apt has no package lists: run `apt-get update` as root, then this again")
        _run(["apt-get", "update"])
    debs: dict[str, Deb] = {}
    for name in names:
        wanted = f"{name}={pins[name][0]}" if name in pins else name
        # 'URL' FILENAME SIZE SHA256:HEX -- the candidate version (or the pinned one), whether installed or not
        try:
            line = _run(["apt-get", "download", "--print-uris", wanted]).strip().splitlines()
        except BuildError as error:
            if name not in pins:
                raise
            raise BuildError(f"apt cannot fetch {name} {pins[name][0]}, the version the replayed manifest names "
                             f"({error}); put that .deb in {debs_dir} (snapshot.debian.org keeps every version) "
                             "and run again with --offline") from None
        fields = line[-1].split() if line else []
        if len(fields) < 4 or not fields[3].lower().startswith("sha256:"):
            raise BuildError(f"apt-get download --print-uris {name}: unexpected output {line!r}")
        filename, sha256 = fields[1], fields[3].split(":", 1)[1].lower()
        if name in pins and sha256 != pins[name][1]:
            raise BuildError(f"apt's {name} {pins[name][0]} has sha256 {sha256[:12]}..., not the replayed "
                             f"manifest's {pins[name][1][:12]}...: put that .deb in {debs_dir} and run with --offline")
        path = debs_dir / filename
        if not (path.is_file() and _sha256(path) == sha256):
            _run(["apt-get", "download", wanted], cwd=debs_dir)
            if not path.is_file():  # apt names the file after the URL, so look again
                cached = _cached_debs(debs_dir, name)
                path = max(cached, key=lambda p: p.stat().st_mtime) if cached else path
            if not path.is_file() or _sha256(path) != sha256:
                raise BuildError(f"apt-get download {name} did not leave {filename} with sha256 {sha256}")
        for stale in _cached_debs(debs_dir, name):
            if stale != path:
                stale.unlink()
        debs[name] = Deb(path, sha256)
    return debs


def deb_field(deb: Path, name: str) -> str:
    return _run(["dpkg-deb", "--field", str(deb), name]).strip()


def deb_members(deb: Path, package: Package) -> Iterator[tuple[str, bytes]]:
    """(path, bytes) of each regular file of the package that it selects, in archive order."""
    process = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)  # fmt: skip
    assert process.stdout is not None
    try:
        with tarfile.open(fileobj=process.stdout, mode="r|") as archive:
            for member in archive:
                path = member.name.lstrip("./")
                if member.isfile() and package.selects(path):
                    extracted = archive.extractfile(member)
                    assert extracted is not None
                    yield path, extracted.read()
    finally:
        process.stdout.close()
        stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
        if process.wait() != 0:
            raise BuildError(f"dpkg-deb --fsys-tarfile {deb}: {stderr.strip() or 'failed'}")


# -------------------------------------------------------------------------------------- replay


def _filters() -> dict[str, object]:
    return {"min_words": MIN_WORDS, "min_letter_fraction": MIN_LETTER_FRACTION,
            "stopword_check_words": STOPWORD_CHECK_WORDS, "min_stopword_fraction": MIN_STOPWORD_FRACTION,
            "min_document_words": MIN_DOCUMENT_WORDS}  # fmt: skip


@dataclass(frozen=True)
class ReplayManifest:
    """What ``--replay`` takes from an earlier build's manifest.json: its packages at their versions and
    .deb sha256, the paragraphs it dropped as evaluation text, and its corpus's sha256 to compare with."""

    path: Path
    pins: dict[str, tuple[str, str]]  # package -> (version, .deb sha256)
    dropped_keys: frozenset[bytes]
    corpus_sha256: str
    documents: int

    @classmethod
    def read(cls, path: Path) -> ReplayManifest:
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            pins = {entry["package"]: (entry["version"], entry["deb_sha256"]) for entry in manifest["packages"]}
            evaluation, corpus, filters = manifest["evaluation_texts"], manifest["corpus"], manifest["filters"]
            corpus_sha256, documents = corpus["sha256"], corpus["documents"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise BuildError(f"--replay {path}: not a manifest.json this script wrote ({error!r})") from None
        if "dropped_paragraphs" not in evaluation:
            raise BuildError(f"--replay {path}: it records no evaluation-text drops (written before 2026-12-02), so "
                             "its corpus cannot be rebuilt once the evaluation tasks change; build without --replay")
        unknown = sorted(set(pins) - set(PACKAGE_NAMES))
        if unknown:
            raise BuildError(f"--replay {path}: packages this script does not know: {', '.join(unknown)}")
        differing = sorted(key for key in _filters() if filters.get(key) != _filters()[key])
        if evaluation.get("shingle_words") != SHINGLE_WORDS:
            differing.append("shingle_words")
        if manifest.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:  # a slimmed copy may omit it
            differing.append("format_version")
        if differing:
            raise BuildError(f"--replay {path}: built with other filters ({', '.join(differing)}) than this script's, "
                             "so its corpus cannot be rebuilt; check out the commit that built it")
        return cls(path, pins, frozenset(bytes.fromhex(key) for key in evaluation["dropped_paragraphs"]),
                   corpus_sha256, documents)  # fmt: skip


# --------------------------------------------------------------------------------------- build


def write_atomic(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory and os.replace, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def add_package(corpus: Corpus, package: Package, files: Iterable[tuple[str, bytes]]) -> dict[str, object]:
    """Convert one package's files and add them to the corpus in path order; its manifest entry."""
    converted: dict[str, list[list[str]]] = {}
    refused: dict[str, str] = {}
    for path, data in files:
        reason = refusal(path)
        if reason:
            refused[path] = reason
        else:
            converted[path] = documents_of(path, data)
    used: dict[str, int] = {}
    start = (corpus.documents, corpus.paragraphs, corpus.words, corpus.bytes)
    for path in sorted(converted):
        written = sum(corpus.add(document) for document in converted[path])
        if written:
            used[path] = written
    return {
        "package": package.name,
        "documents": corpus.documents - start[0],
        "paragraphs": corpus.paragraphs - start[1],
        "words": corpus.words - start[2],
        "bytes": corpus.bytes - start[3],
        "files_read": len(converted),
        "files": used,
        "refused": dict(sorted(refused.items())),
    }


def build_corpus(packages: Iterable[Package], debs_dir: Path, out_dir: Path, offline: bool = False,
                 progress: bool = False, tasks_dir: Path | None = None,
                 supersense_dir: Path | None = SUPERSENSE_DIR, replay: ReplayManifest | None = None
                 ) -> dict[str, object]:  # fmt: skip
    """Fetch, convert and write ``out_dir/corpus.txt`` and ``manifest.json``; the manifest. Paragraphs that
    share a run of words with the evaluation texts (``evaluation_shingles``) are left out; with ``replay``,
    the replayed manifest's packages are used at its versions and exactly the paragraphs it dropped as
    evaluation text are left out (``Corpus``)."""
    if replay is not None:
        packages = [package for package in PACKAGES if package.name in replay.pins]
    packages = sorted(packages, key=lambda package: package.name)
    debs = fetch_debs([package.name for package in packages], debs_dir, offline,
                      pins=replay.pins if replay is not None else None)  # fmt: skip
    evaluation, evaluation_sources = evaluation_shingles(tasks_dir, supersense_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus_path = out_dir / CORPUS_FILE
    tmp = corpus_path.with_name(f".{CORPUS_FILE}.{os.getpid()}.tmp")
    entries = []
    try:
        with open(tmp, "wb") as stream:
            corpus = Corpus(stream, evaluation, replay.dropped_keys if replay is not None else None)
            for package in packages:
                started = time.perf_counter()
                deb = debs[package.name]
                if deb_field(deb.path, "Package") != package.name:
                    raise BuildError(f"{deb.path} is not a .deb of {package.name}")
                entry = add_package(corpus, package, deb_members(deb.path, package))
                entries.append({"package": package.name, "version": deb_field(deb.path, "Version"),
                                "deb": deb.path.name, "deb_sha256": deb.sha256, **entry})  # fmt: skip
                if progress:
                    print(f"  {package.name}: {entry['documents']:,} documents, {entry['bytes'] / 1e6:.1f} MB "
                          f"({time.perf_counter() - started:.0f}s)", file=sys.stderr, flush=True)
        os.replace(tmp, corpus_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    manifest: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "generator": "scripts/build_pretraining_corpus.py",
        "corpus": {"file": CORPUS_FILE, "sha256": corpus.digest.hexdigest(), "bytes": corpus.bytes,
                   "documents": corpus.documents, "paragraphs": corpus.paragraphs, "words": corpus.words},
        "filters": _filters(),
        "evaluation_texts": {"shingle_words": SHINGLE_WORDS, "shingles": len(evaluation), "files": evaluation_sources,
                             "dropped_paragraphs": sorted(key.hex() for key in corpus.evaluation_drops)},
        "dropped": dict(sorted(corpus.dropped.items())),
        "packages": entries,
    }
    if replay is not None:
        manifest["replayed"] = {"manifest": str(replay.path), "corpus_sha256": replay.corpus_sha256,
                                "identical": corpus.digest.hexdigest() == replay.corpus_sha256,
                                "kept_sharing_today": corpus.kept_sharing_today,
                                "dropped_not_sharing_today": corpus.dropped_not_sharing_today}  # fmt: skip
    write_atomic(out_dir / MANIFEST_FILE, (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    return manifest


# ---------------------------------------------------------------------------------------- main


def _cache_dir() -> Path:
    cache = os.environ.get("BERTFORGE_CACHE")
    return Path(cache) if cache else Path.home() / ".cache" / "bertforge"


def default_out() -> Path:
    return _cache_dir() / "corpora" / "debian-docs"


def default_tasks() -> Path:
    """Where scripts/build_parity_tasks.py writes its tasks by default."""
    return _cache_dir() / "tasks"


def _parse_packages(value: str) -> list[Package]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in PACKAGE_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown package(s) {', '.join(unknown) or '(none)'}; "
                                         f"choose from {', '.join(PACKAGE_NAMES)}")  # fmt: skip
    return [package for package in PACKAGES if package.name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="output directory (default: "
                        "$BERTFORGE_CACHE/corpora/debian-docs or ~/.cache/bertforge/corpora/debian-docs)")  # fmt: skip
    parser.add_argument("--debs", type=Path, default=None, help="where the .deb files are kept (default: OUT/debs)")
    parser.add_argument("--packages", type=_parse_packages, default=None,
                        help="comma-separated subset of the fixed package list")
    parser.add_argument("--offline", action="store_true", help="use the .deb files already in --debs; no apt-get")
    parser.add_argument("--tasks", type=Path, default=None, help="the parity tasks whose texts are kept out "
                        "(default: $BERTFORGE_CACHE/tasks or ~/.cache/bertforge/tasks, scripts/build_parity_tasks.py's)")
    parser.add_argument("--replay", type=Path, default=None, metavar="MANIFEST",
                        help="rebuild the corpus an earlier manifest.json describes: its packages at its versions "
                             "and .deb sha256, and the paragraphs it dropped as evaluation text (not today's tasks')")
    parser.add_argument("--quiet", action="store_true", help="no per-package progress on stderr")
    args = parser.parse_args(argv)
    if args.replay is not None and args.packages is not None:
        parser.error("--packages and --replay: the replayed manifest names the packages")
    out_dir: Path = args.out or default_out()
    tasks_dir: Path = args.tasks or default_tasks()
    packages: list[Package] = args.packages or list(PACKAGES)
    start = time.perf_counter()
    replay = None
    try:
        if args.replay is not None:
            replay = ReplayManifest.read(args.replay)
        manifest = build_corpus(packages, args.debs or out_dir / DEBS_DIR, out_dir, offline=args.offline,
                                progress=not args.quiet, tasks_dir=tasks_dir, replay=replay)  # fmt: skip
    except (BuildError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    corpus = manifest["corpus"]
    assert isinstance(corpus, dict)
    if not any(tasks_dir.glob("*/task.json")):  # said after the build, so a failed one ends with its error alone
        print(f"note: no parity tasks in {tasks_dir}, so only the bundled supersense set was kept out; build them "
              "first (python scripts/build_parity_tasks.py) to keep their texts out too", file=sys.stderr)
    print(f"debian-docs: {corpus['documents']:,} documents, {corpus['bytes'] / 1e6:.1f} MB of text, "
          f"{corpus['words']:,} words from {len(manifest['packages']):,} packages -> {out_dir / CORPUS_FILE} "
          f"({time.perf_counter() - start:.0f}s)")
    if replay is not None:
        replayed = manifest["replayed"]
        assert isinstance(replayed, dict)
        if not replayed["identical"]:
            print(f"warning: this is not the corpus {replay.path} describes ({replay.documents:,} documents, sha256 "
                  f"{replay.corpus_sha256[:12]}...); compare the two manifests' packages", file=sys.stderr)
        else:
            print(f"identical to the corpus {replay.path} describes; {replayed['kept_sharing_today']:,} of its "
                  "paragraphs share words with today's evaluation texts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
