"""The Debian-documentation pre-training corpus builder (scripts/build_pretraining_corpus.py) on small
synthetic HTML, texinfo and text files, and on a tiny .deb built here with dpkg-deb: the conversion keeps
prose and drops navigation and code, duplicate paragraphs appear once, man pages (the `manpages` parity
task's text) are refused, and the output is byte-for-byte reproducible."""

import gzip
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers.scripts import load_repo_script

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "build_pretraining_corpus.py"


bpc = load_repo_script("scripts/build_pretraining_corpus.py", "build_pretraining_corpus")

PROSE = [
    "The parser reads the whole file before it checks any of the options that were given.",
    "When the cache is full, the oldest entry is removed and the new one is stored in its place.",
    "A document that has no paragraphs left after the filters and the removal of repeated paragraphs is not "
    "written to the corpus at all.",
    "Paragraphs that appear in more than one document, such as licence notices, are kept only the first time.",
]
HTML = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Navigation title that should not appear</title>
<script>var sidebarText = "script text that should not appear";</script></head>
<body>
<div class="related" role="navigation"><ul><li><a href="index.html">index of the manual that should not appear</a></li>
<li><a href="next.html">next chapter of the manual that should not appear</a></li></ul></div>
<header>The header of the page that should not appear in the output</header>
<div class="body">
<h1>A heading that should not appear<a class="headerlink" href="#x">\u00b6</a></h1>
<p>{PROSE[0]}</p>
<pre>for item in the_list_that_should_not_appear: print(item, "in a pre block")</pre>
<div class="highlight-python3"><div class="highlight"><pre>x = code_that_should_not_appear()</pre></div></div>
<table><tr><td>a table cell of the page</td><td>that should not appear anywhere</td></tr></table>
<ul><li>{PROSE[1]}</li></ul>
<p>{PROSE[2].replace(" at all", "<br>at all")}</p>
<p>x = y + 1; z = [0, 1, 2, 3] * 42 / 7 - (5 % 3) {{}}</p>
</div>
<div class="footer">Copyright 2024, the authors of this manual that should not appear</div>
</body></html>
"""


def test_html_keeps_paragraphs_and_drops_navigation_code_and_tables(tmp_path: Path) -> None:
    page = tmp_path / "chapter.html"
    page.write_text(HTML, encoding="utf-8")
    documents = bpc.documents_of(str(page), page.read_bytes())
    assert len(documents) == 1
    kept = [p for p in documents[0] if bpc.paragraph_drop_reason(p) is None]
    assert kept == PROSE[:3]  # <br> is a space, not a paragraph break
    assert not any("should not appear" in p for p in documents[0]), documents[0]
    assert bpc.paragraph_drop_reason("x = y + 1; z = [0, 1, 2, 3] * 42 / 7 - (5 % 3) {}") == "non-letters"
    assert bpc.paragraph_drop_reason("Next Previous Up") == "short"
    assert bpc.paragraph_drop_reason("Le fichier est lu en entier avant la vérification des options") == "not English"


def test_latin1_html_text_and_info_files(tmp_path: Path) -> None:
    legacy = tmp_path / "old.html"
    legacy.write_bytes('<html><head><meta http-equiv="Content-Type" content="text/html; charset=iso-8859-1">'
                       '</head><body><p>The caf\u00e9 is open on the days that the manual lists.</p></body></html>'
                       .encode("latin-1"))  # fmt: skip
    assert bpc.documents_of(str(legacy), legacy.read_bytes()) == [["The caf\u00e9 is open on the days that the manual lists."]]

    text = tmp_path / "README.txt.gz"
    text.write_bytes(gzip.compress(
        b"Introduction\n============\n\nThe parser reads the whole file before it\nchecks any of the options.\n\n"
        b"    for line in lines:\n        print(line)\n"))
    assert bpc.documents_of(str(text), text.read_bytes()) == [["The parser reads the whole file before it checks any of the options."]]

    info = tmp_path / "manual.info-1.gz"
    info.write_bytes(gzip.compress(
        b"This is manual.info, produced by makeinfo version 6.8 from manual.texi.\n\n"
        b"\x1f\nFile: manual.info,  Node: Caches,  Next: Files,  Up: Top\n\n2 Caches\n********\n\n"
        b"When the cache is full, the oldest entry is removed, *note Eviction::.\n\n"
        b"     cache_put (key, value);\n\n* Menu:\n\n* Eviction::     How entries leave.\n\n"
        b"\x1f\nTag Table:\nNode: Caches\x7f123\n\x1f\nEnd Tag Table\n"))
    assert bpc.documents_of(str(info), info.read_bytes()) == [
        ["When the cache is full, the oldest entry is removed, Eviction."]]
    assert bpc.documents_of("logo.png", b"\x89PNG") == []


def test_duplicate_paragraphs_are_written_once(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    with open(path, "wb") as stream:
        corpus = bpc.Corpus(stream)
        first = corpus.add([PROSE[0], PROSE[1], "Next Previous Up"])
        second = corpus.add([PROSE[1], "  " + PROSE[0].replace(" ", "  ") + "  ", PROSE[2]])
        third = corpus.add([PROSE[2], PROSE[1]])  # nothing new: the document is dropped
        short = corpus.add(["The cache is cleared when the program exits."])  # under MIN_DOCUMENT_WORDS
        again = corpus.add(["The cache is cleared when the program exits.", PROSE[3], PROSE[3]])
    assert first and second and third == 0 and short == 0 and again
    assert path.read_text(encoding="utf-8") == (f"{PROSE[0]}\n{PROSE[1]}\n\n{PROSE[2]}\n\n"
                                                f"The cache is cleared when the program exits.\n{PROSE[3]}\n\n")
    assert (corpus.documents, corpus.paragraphs) == (3, 5)
    assert corpus.dropped == {"duplicate paragraphs": 5, "short paragraphs": 1, "short documents": 1}


def test_man_pages_wordnet_and_package_descriptions_are_refused(tmp_path: Path) -> None:
    for path in ("usr/share/man/man1/ls.1.gz", "./usr/share/man/de/man8/apt.8.gz", "/usr/share/man/man3/printf.3.gz",
                 "usr/share/doc/cmake-data/html/manual/cmake.1.html", "usr/share/doc/gettext/bindtextdomain.3.html",
                 "usr/share/doc/openssl/html/man7/x509.7ssl.html", "usr/share/doc/postfix/html/postconf.5.html"):
        assert bpc.refusal(path) == "man page", path
    assert bpc.refusal("usr/share/wordnet/data.noun") == "WordNet"
    assert bpc.refusal("var/lib/dpkg/status") == "package description"
    assert bpc.refusal("usr/share/doc-base/python3.11-doc") == "package description"
    for path in ("usr/share/doc/python3.11/html/whatsnew/3.11.html", "usr/share/doc/x/html/whats_new/v1.2.html",
                 "usr/share/doc/x/html/release.0.10.1.html", "usr/share/doc/rust-doc/html/std/primitive.u8.html",
                 "usr/share/doc/linux-doc-6.1/html/admin-guide/README.html"):
        assert bpc.refusal(path) is None, path

    man = tmp_path / "usr/share/man/man1/tool.1.html"  # a man page rendered to HTML, found by its path
    man.parent.mkdir(parents=True)
    man.write_text(f"<p>{PROSE[0]}</p>", encoding="utf-8")
    package = bpc.Package("fake-doc", ("*.html",))
    with open(tmp_path / "corpus.txt", "wb") as stream:
        corpus = bpc.Corpus(stream)
        entry = bpc.add_package(corpus, package, [(str(man.relative_to(tmp_path)), man.read_bytes())])
    assert entry["refused"] == {"usr/share/man/man1/tool.1.html": "man page"}
    assert entry["files"] == {} and corpus.documents == 0


def test_paragraphs_sharing_words_with_evaluation_texts_are_dropped(tmp_path: Path) -> None:
    manpages = tmp_path / "tasks" / "manpages"
    manpages.mkdir(parents=True)
    (manpages / "task.json").write_text("{}", encoding="utf-8")
    (manpages / "test.jsonl").write_text(json.dumps({"text": "Some tool. " + PROSE[1].upper(), "label": "1",
                                                     "id": "man1/tool.1.gz"}) + "\n", encoding="utf-8")  # fmt: skip
    (tmp_path / "tasks" / "notes").mkdir()  # not a task: no task.json
    (tmp_path / "tasks" / "notes" / "test.jsonl").write_text(json.dumps({"text": PROSE[0]}) + "\n", encoding="utf-8")
    supersense = tmp_path / "supersense"
    supersense.mkdir()
    (supersense / "train.jsonl.gz").write_bytes(gzip.compress(
        json.dumps({"tokens": PROSE[3].split()[:9], "tags": ["O"] * 9}).encode() + b"\n"))
    found, sources = bpc.evaluation_shingles(tmp_path / "tasks", supersense)
    assert sorted(sources) == ["samples/supersense/train.jsonl.gz", "tasks/manpages/test.jsonl"]
    with open(tmp_path / "corpus.txt", "wb") as stream:
        corpus = bpc.Corpus(stream, found)
        corpus.add(PROSE)
    # PROSE[1] is in the man page text (case and punctuation aside), PROSE[3]'s first 9 words in a tagged sentence
    assert (tmp_path / "corpus.txt").read_text(encoding="utf-8") == f"{PROSE[0]}\n{PROSE[2]}\n\n"
    assert corpus.dropped == {"evaluation-text paragraphs": 2}


def _tiny_deb(root: Path, debs: Path) -> Path:
    """fake-doc 1.0-1: two HTML pages (written in reverse name order), a man page and a PNG."""
    docs = root / "usr/share/doc/fake-doc/html"
    docs.mkdir(parents=True)
    (docs / "b-second.html").write_text(f"<p>{PROSE[1]}</p><p>{PROSE[0]}</p><p>{PROSE[2]}</p>", encoding="utf-8")
    (docs / "a-first.html").write_text(f"<nav><p>{PROSE[2]} Home.</p></nav><p>{PROSE[0]}</p><p>{PROSE[1]}</p>",
                                       encoding="utf-8")  # fmt: skip
    (docs / "logo.png").write_bytes(b"\x89PNG\r\n")
    man = root / "usr/share/man/man1"
    man.mkdir(parents=True)
    (man / "fake.1.gz").write_bytes(gzip.compress(b".TH FAKE 1\n.SH DESCRIPTION\nA man page.\n"))
    return _pack_deb(root, debs, "fake-doc")


def _pack_deb(root: Path, debs: Path, name: str) -> Path:
    """`root` packed with dpkg-deb as `name` 1.0-1 into `debs/`."""
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(f"Package: {name}\nVersion: 1.0-1\nArchitecture: all\n"
                                         "Maintainer: Nobody <nobody@example.org>\nDescription: fake docs\n")  # fmt: skip
    debs.mkdir()
    deb = debs / f"{name}_1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)], check=True,
                   capture_output=True)  # fmt: skip
    return deb


def test_build_from_a_deb_is_byte_for_byte_reproducible(tmp_path: Path) -> None:
    if shutil.which("dpkg-deb") is None:
        pytest.fail("needs dpkg-deb (Debian's dpkg package), which the corpus script reads packages with")
    deb = _tiny_deb(tmp_path / "root", tmp_path / "debs")
    package = bpc.Package("fake-doc", ("usr/share/doc/fake-doc/html/*", "usr/share/man/*"))
    outputs = []
    for run in ("one", "two"):
        bpc.build_corpus([package], tmp_path / "debs", tmp_path / run, offline=True, tasks_dir=None,
                         supersense_dir=None)  # fmt: skip
        outputs.append({name: (tmp_path / run / name).read_bytes() for name in (bpc.CORPUS_FILE, bpc.MANIFEST_FILE)})
        assert sorted(p.name for p in (tmp_path / run).iterdir()) == [bpc.CORPUS_FILE, bpc.MANIFEST_FILE]  # no temp files
    assert outputs[0] == outputs[1]
    # sorted file order: a-first.html before b-second.html; its nav dropped; b's repeats dropped
    assert outputs[0][bpc.CORPUS_FILE].decode() == f"{PROSE[0]}\n{PROSE[1]}\n\n{PROSE[2]}\n\n"
    manifest = json.loads(outputs[0][bpc.MANIFEST_FILE])
    (entry,) = manifest["packages"]
    assert (entry["package"], entry["version"], entry["deb"]) == ("fake-doc", "1.0-1", deb.name)
    assert entry["files"] == {"usr/share/doc/fake-doc/html/a-first.html": len(f"{PROSE[0]}\n{PROSE[1]}\n\n"),
                              "usr/share/doc/fake-doc/html/b-second.html": len(f"{PROSE[2]}\n\n")}  # fmt: skip
    assert entry["refused"] == {"usr/share/man/man1/fake.1.gz": "man page"}
    assert manifest["corpus"]["documents"] == 2 and manifest["dropped"] == {"duplicate paragraphs": 2}


def test_missing_deb_offline_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = bpc.main(["--offline", "--quiet", "--debs", str(tmp_path / "debs"), "--out", str(tmp_path / "out"),
                     "--packages", "debian-faq"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "debian-faq" in err and "apt-get download" in err, err
    assert not (tmp_path / "out" / bpc.CORPUS_FILE).exists()


def _faq_deb(root: Path, debs: Path) -> Path:
    """debian-faq 1.0-1 (a name from the script's package list, so --replay accepts it): three English pages."""
    docs = root / "usr/share/doc/debian/FAQ"
    docs.mkdir(parents=True)
    for index, paragraph in enumerate(PROSE[:3]):
        filler = (f"This is page number {index} of the frequently asked questions that the test builds, page by "
                  "page, from a small fake package of its own.")  # enough words for a document on its own
        (docs / f"ch-{index}.en.html").write_text(f"<p>{paragraph}</p><p>{filler}</p>", encoding="utf-8")
    return _pack_deb(root, debs, "debian-faq")


def _task(tasks: Path, text: str) -> None:
    """A parity task (task.json + test.jsonl) in `tasks` whose one test text is `text`."""
    task = tasks / "manpages"
    task.mkdir(parents=True, exist_ok=True)
    (task / "task.json").write_text("{}", encoding="utf-8")
    (task / "test.jsonl").write_text(json.dumps({"text": text, "label": "1"}) + "\n", encoding="utf-8")


def _build(tmp_path: Path, out: str, tasks: Path, *more: str) -> tuple[int, str]:
    code = bpc.main(["--offline", "--quiet", "--debs", str(tmp_path / "debs"), "--out", str(tmp_path / out),
                     "--tasks", str(tasks), *more])  # fmt: skip
    return code, (tmp_path / out / bpc.CORPUS_FILE).read_text(encoding="utf-8") if code == 0 else ""


def test_replay_rebuilds_the_corpus_after_the_evaluation_texts_changed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    if shutil.which("dpkg-deb") is None:
        pytest.fail("needs dpkg-deb (Debian's dpkg package), which the corpus script reads packages with")
    _faq_deb(tmp_path / "root", tmp_path / "debs")
    tasks = tmp_path / "tasks"
    _task(tasks, PROSE[1])  # the first build keeps PROSE[1] out
    code, first = _build(tmp_path, "first", tasks, "--packages", "debian-faq")
    assert code == 0 and PROSE[1] not in first and PROSE[2] in first
    manifest = json.loads((tmp_path / "first" / bpc.MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["evaluation_texts"]["dropped_paragraphs"] == [bpc.paragraph_key(PROSE[1]).hex()]
    _task(tasks, PROSE[2])  # the task moved on, as debian-sections does with the archive
    code, today = _build(tmp_path, "today", tasks, "--packages", "debian-faq")
    assert code == 0 and today != first and PROSE[1] in today  # without --replay: another corpus
    capsys.readouterr()
    code, replayed = _build(tmp_path, "replayed", tasks, "--replay", str(tmp_path / "first" / bpc.MANIFEST_FILE))
    assert code == 0 and replayed == first
    again = json.loads((tmp_path / "replayed" / bpc.MANIFEST_FILE).read_text(encoding="utf-8"))
    assert again["corpus"]["sha256"] == manifest["corpus"]["sha256"]
    assert again["evaluation_texts"]["dropped_paragraphs"] == manifest["evaluation_texts"]["dropped_paragraphs"]
    assert {key: again["replayed"][key] for key in ("identical", "kept_sharing_today", "dropped_not_sharing_today")} \
        == {"identical": True, "kept_sharing_today": 1, "dropped_not_sharing_today": 1}
    assert "identical to the corpus" in capsys.readouterr().out


def test_replay_refuses_another_deb_and_a_manifest_without_drops(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    if shutil.which("dpkg-deb") is None:
        pytest.fail("needs dpkg-deb (Debian's dpkg package), which the corpus script reads packages with")
    _faq_deb(tmp_path / "root", tmp_path / "debs")
    _task(tmp_path / "tasks", PROSE[1])
    assert _build(tmp_path, "first", tmp_path / "tasks", "--packages", "debian-faq")[0] == 0
    manifest = json.loads((tmp_path / "first" / bpc.MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["packages"][0]["deb_sha256"] = "0" * 64  # the manifest names another .deb of debian-faq 1.0-1
    (tmp_path / "other.json").write_text(json.dumps(manifest), encoding="utf-8")
    del manifest["evaluation_texts"]["dropped_paragraphs"]  # as manifests written before --replay existed
    (tmp_path / "old.json").write_text(json.dumps(manifest), encoding="utf-8")
    capsys.readouterr()
    for name, expected in (("other.json", "is not the .deb of debian-faq 1.0-1"),
                           ("old.json", "records no evaluation-text drops")):  # fmt: skip
        code, _ = _build(tmp_path, "replayed", tmp_path / "tasks", "--replay", str(tmp_path / name))
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and expected in err, err
        assert not (tmp_path / "replayed" / bpc.CORPUS_FILE).exists()


def test_a_replayed_offline_build_reads_each_deb_once_for_its_sha256(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The check against the replayed pin and the manifest's record share one digest: each .deb used to be read
    twice."""
    if shutil.which("dpkg-deb") is None:
        pytest.fail("needs dpkg-deb (Debian's dpkg package), which the corpus script reads packages with")
    deb = _faq_deb(tmp_path / "root", tmp_path / "debs")
    _task(tmp_path / "tasks", PROSE[1])
    assert _build(tmp_path, "first", tmp_path / "tasks", "--packages", "debian-faq")[0] == 0
    hashed: list[Path] = []
    real_sha256 = bpc._sha256
    monkeypatch.setattr(bpc, "_sha256", lambda path: hashed.append(path) or real_sha256(path))
    code, _ = _build(tmp_path, "replayed", tmp_path / "tasks", "--replay", str(tmp_path / "first" / bpc.MANIFEST_FILE))
    assert code == 0 and hashed == [deb]
    manifest = json.loads((tmp_path / "replayed" / bpc.MANIFEST_FILE).read_text(encoding="utf-8"))
    assert manifest["packages"][0]["deb_sha256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
