"""The parity benchmark's fine-tuning tasks (scripts/build_parity_tasks.py) from this machine's Debian text.

The sources are installed by `make test` (apt-get install wordnet-base manpages); without them these
tests fail with the package to install rather than skip. `debian-sections` is built only where
`apt-get update` has left package lists.
"""

import contextlib
import gzip
import hashlib
import importlib.util
import io
import json
import re
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from bertforge.data.bundled import corpus_path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "build_parity_tasks.py"
SPLITS = ("train", "validation", "test")
PAIR_SIZES = {"train": 12_000, "validation": 2_000, "test": 4_000}
PAIR_TASKS = ("wordnet-pairs", "wordnet-similarity")
REQUIRED_SOURCES = {
    Path("/usr/share/wordnet/data.noun"): "wordnet-base",
    Path("/usr/share/man/man7/man.7.gz"): "manpages",
}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_parity_tasks", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bpt = _load_script()


def _task_names() -> list[str]:
    names = ["manpages", *PAIR_TASKS]
    return [*names, "debian-sections"] if bpt.apt_lists_present() else names


def _sha1_tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    missing = [f"{path} (apt-get install -y {pkg})" for path, pkg in REQUIRED_SOURCES.items() if not path.exists()]
    if missing:
        pytest.fail("parity task sources not installed: " + "; ".join(missing) + " -- `make test` installs them")
    out = tmp_path_factory.mktemp("tasks")
    names = _task_names()
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out), "--tasks", ",".join(names)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return {"out": out, "names": names, "stdout": res.stdout}


@pytest.fixture(scope="module")
def tasks(build: dict[str, Any]) -> dict[str, dict[str, Any]]:
    loaded = {}
    for name in build["names"]:
        task_dir = build["out"] / name
        meta = json.loads((task_dir / "task.json").read_text(encoding="utf-8"))
        loaded[name] = {"meta": meta, **{split: _read_jsonl(task_dir / f"{split}.jsonl") for split in SPLITS}}
    return loaded


@pytest.fixture(scope="module")
def graph() -> Any:
    return bpt.NounGraph(bpt.read_nouns())


def test_the_build_prints_one_line_per_task_with_its_counts(build: dict[str, Any]) -> None:
    lines = build["stdout"].strip().split("\n")
    assert len(lines) == len(build["names"]) + 1 and lines[-1].startswith("done in ")
    for name, line in zip(build["names"], lines, strict=False):
        assert line.startswith(f"{name}: train ") and "validation" in line and "test" in line, line


def test_counts_match_task_json_and_the_files_match_their_recorded_sha1(
    build: dict[str, Any], tasks: dict[str, dict[str, Any]]
) -> None:
    for name, task in tasks.items():
        meta = task["meta"]
        assert meta["counts"] == {split: len(task[split]) for split in SPLITS}, name
        for split in SPLITS:
            data = (build["out"] / name / f"{split}.jsonl").read_bytes()
            assert hashlib.sha1(data).hexdigest() == meta["files"][f"{split}.jsonl"]["sha1"], (name, split)
            assert data.endswith(b"\n") and b"\r" not in data
        assert meta["sources"] and all(v and v != "unknown" for v in meta["sources"].values()), name


def test_pair_tasks_have_the_fixed_sizes(tasks: dict[str, dict[str, Any]]) -> None:
    for name in PAIR_TASKS:
        assert tasks[name]["meta"]["counts"] == PAIR_SIZES, name


def test_task_json_describes_columns_and_sorted_labels(tasks: dict[str, dict[str, Any]]) -> None:
    for name, task in tasks.items():
        meta = task["meta"]
        pair = name in PAIR_TASKS
        assert meta["text_column"] == "text" and meta["label_column"] == "label"
        assert meta["text_pair_column"] == ("text_pair" if pair else None)
        expected_type = "regression" if name == "wordnet-similarity" else "classification"
        assert meta["task_type"] == expected_type, name
        rows = [row for split in SPLITS for row in task[split]]
        for row in rows:
            assert row["text"] and row["text"] == row["text"].strip()
            if pair:
                assert list(row) == ["text", "text_pair", "label"]
                assert row["text_pair"] and row["text"] != row["text_pair"]
        if expected_type == "classification":
            assert meta["labels"] == sorted({row["label"] for row in rows}), name
            assert set(meta["labels"]) == {row["label"] for row in task["train"]}, f"{name}: a label missing from train"
        else:
            assert meta["labels"] is None


def test_no_test_text_appears_in_train(tasks: dict[str, dict[str, Any]]) -> None:
    for name, task in tasks.items():
        columns = ["text", "text_pair"] if name in PAIR_TASKS else ["text"]
        seen = {split: {row[c] for row in task[split] for c in columns} for split in SPLITS}
        anchors = {split: {row["text"] for row in task[split]} for split in SPLITS}
        assert not anchors["test"] & seen["train"], f"{name}: a test anchor text is in train"
        assert not seen["test"] & seen["train"], f"{name}: a test text is in train"
        assert not seen["validation"] & seen["train"], f"{name}: a validation text is in train"
        pairs = {split: {tuple(row[c] for c in columns) for row in task[split]} for split in SPLITS}
        for split in SPLITS:
            assert len(pairs[split]) == len(task[split]), f"{name}: duplicate rows in {split}"


def test_manpages_are_section_labelled_descriptions_of_20_to_200_words(tasks: dict[str, dict[str, Any]]) -> None:
    task = tasks["manpages"]
    rows = [row for split in SPLITS for row in task[split]]
    counts = Counter(row["label"] for row in rows)
    assert set(counts) <= {str(n) for n in range(1, 9)} and len(counts) >= 3, counts
    assert min(counts.values()) >= 30, counts
    assert len({row["text"] for row in rows}) == len(rows), "duplicate texts"
    for row in rows:
        assert 20 <= len(row["text"].split()) <= 200, row["id"]
        assert row["id"].startswith(f"man{row['label']}/"), row["id"]
    # troff left in the text (pages about troff itself may quote such escapes, hence a tolerance)
    leftovers = [row["id"] for row in rows if re.search(r"\\f[BIRP]|\\\([a-z]{2}|\\-|\\&", row["text"])]
    assert len(leftovers) <= max(3, len(rows) // 100), leftovers[:20]
    total = len(rows)
    assert total > 300
    assert abs(len(task["train"]) / total - 0.8) < 0.05 and abs(len(task["test"]) / total - 0.1) < 0.05


def test_wordnet_pairs_are_balanced_siblings_vs_same_lexfile_non_siblings(
    tasks: dict[str, dict[str, Any]], graph: Any
) -> None:
    task = tasks["wordnet-pairs"]
    assert task["meta"]["labels"] == ["different", "same"]
    for split in SPLITS:
        assert Counter(row["label"] for row in task[split]) == {
            "same": PAIR_SIZES[split] // 2,
            "different": PAIR_SIZES[split] // 2,
        }, split
    by_text: dict[str, list[Any]] = {}
    for noun in graph.nouns.values():
        by_text.setdefault(noun.definition, []).append(noun)
    checked = 0
    for row in task["test"][:400]:
        a, b = by_text[row["text"]], by_text[row["text_pair"]]
        if len(a) != 1 or len(b) != 1:
            continue  # a definition WordNet gives to several synsets
        (a,), (b,) = a, b
        siblings = bool(set(a.hypernyms) & set(b.hypernyms))
        assert siblings == (row["label"] == "same"), row
        if not siblings:
            assert a.lexnum == b.lexnum, row
        checked += 1
    assert checked > 300


def _independent_wup(graph: Any, a: str, b: str) -> float:
    """max over common ancestors c of 2*maxdepth(c) / (2*maxdepth(c) + dist(c, a) + dist(c, b))."""

    def up_distances(start: str) -> dict[str, int]:
        dist, queue = {start: 0}, deque([start])
        while queue:
            node = queue.popleft()
            for h in graph.nouns[node].hypernyms:
                if h not in dist:
                    dist[h] = dist[node] + 1
                    queue.append(h)
        return dist

    depth: dict[str, int] = {}

    def max_depth(node: str) -> int:
        if node not in depth:
            hypernyms = graph.nouns[node].hypernyms
            depth[node] = 1 + max((max_depth(h) for h in hypernyms), default=0)
        return depth[node]

    da, db = up_distances(a), up_distances(b)
    return max(2 * max_depth(c) / (2 * max_depth(c) + da[c] + db[c]) for c in da.keys() & db.keys())


def test_wu_palmer_matches_known_values_and_an_independent_computation(
    tasks: dict[str, dict[str, Any]], graph: Any
) -> None:
    dog, cat, entity = "02084071", "02121620", "00001740"
    assert graph.wup(dog, cat) == 0.8571  # NLTK: dog.n.01.wup_similarity(cat.n.01)
    assert graph.wup(dog, dog) == 1.0 and graph.wup(entity, dog) == 0.2  # entity is depth 1, dog depth 9 on its shortest path
    by_text: dict[str, list[str]] = {}
    for noun in graph.nouns.values():
        by_text.setdefault(noun.definition, []).append(noun.offset)
    checked = 0
    for row in tasks["wordnet-similarity"]["test"][:300]:
        a, b = by_text[row["text"]], by_text[row["text_pair"]]
        if len(a) == 1 and len(b) == 1:
            assert row["label"] == round(_independent_wup(graph, a[0], b[0]), 4), row
            checked += 1
    assert checked > 250


def test_wordnet_similarity_labels_are_floats_in_0_1_spread_over_the_range(
    tasks: dict[str, dict[str, Any]],
) -> None:
    task = tasks["wordnet-similarity"]
    for split in SPLITS:
        labels = [row["label"] for row in task[split]]
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 and round(v, 4) == v for v in labels), split
        bins = Counter(min(int(v * 10), 9) for v in labels)
        # every tenth of [0.1, 0.9) holds at least 2% of the pairs: not one narrow cluster
        assert all(bins[b] >= 0.02 * len(labels) for b in range(1, 9)), (split, sorted(bins.items()))
        assert task["meta"]["label_histogram"][split] == [bins[b] for b in range(10)]


def test_held_out_wordnet_definitions_are_not_in_the_bundled_pretraining_corpus(
    tasks: dict[str, dict[str, Any]],
) -> None:
    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        in_corpus = {bpt.definition_of(line.strip()) for line in f}
    for name in PAIR_TASKS:
        for split in ("validation", "test"):
            texts = {row[c] for row in tasks[name][split] for c in ("text", "text_pair")}
            assert not texts & in_corpus, (name, split)


def test_debian_sections_respects_caps_and_section_sizes(tasks: dict[str, dict[str, Any]]) -> None:
    if "debian-sections" not in tasks:
        pytest.skip("no apt package lists (apt-get update) to build debian-sections from")
    task = tasks["debian-sections"]
    assert len(task["train"]) <= 20_000 and len(task["test"]) <= 4_000 and len(task["validation"]) <= 4_000
    assert all("/" not in row["label"] for split in SPLITS for row in task[split])
    before = task["meta"]["rows_before_caps"]
    assert sum(before.values()) >= 200 * len(task["meta"]["labels"])


def test_a_rebuild_is_byte_identical_and_an_unchanged_task_is_not_rewritten(
    build: dict[str, Any], tmp_path: Path
) -> None:
    again = tmp_path / "again"
    with contextlib.redirect_stdout(io.StringIO()):
        assert bpt.main(["--out", str(again), "--tasks", ",".join(build["names"])]) == 0
    assert _sha1_tree(again) == _sha1_tree(build["out"])

    before = {p: p.stat().st_mtime_ns for p in sorted((again / "wordnet-pairs").iterdir())}
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert bpt.main(["--out", str(again), "--tasks", "wordnet-pairs"]) == 0
    assert "(up to date)" in stdout.getvalue()
    assert {p: p.stat().st_mtime_ns for p in sorted((again / "wordnet-pairs").iterdir())} == before
    assert not [p for p in again.rglob("*.tmp")], "temp files left behind"


@pytest.mark.parametrize(
    ("option", "task", "package"),
    [("--wordnet-dir", "wordnet-pairs", "wordnet-base"), ("--man-dir", "manpages", "manpages")],
)
def test_a_missing_source_is_a_one_line_error_naming_the_package_with_exit_code_2(
    tmp_path: Path, option: str, task: str, package: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "out"), "--tasks", task, option, str(empty)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert f"apt-get install -y {package}" in lines[0]
    assert not (tmp_path / "out" / task).exists()


def test_man_description_turns_troff_into_plain_text() -> None:
    source = "\n".join(
        [
            '.TH FOO 1 "2024" "foo 1.0"',
            ".SH NAME",
            "foo \\- do things",
            '.SH "DESCRIPTION"',
            '.\\" a comment line',
            ".B foo",
            "reads \\fIfiles\\fR and \\f(CWwrites\\fP them \\(em quickly\\&.",
            ".BR bar (1),",
            ".IR file .txt",
            ".PP",
            ".TP",
            "\\-v, \\-\\-verbose \\e path \\%no\\:break \\(bu item \\s-1SMALL\\s0 \\f[B]bold\\f[] x  \\\" trailing",
            ".TS",
            "l l.",
            "table\tcell",
            ".TE",
            ".SH OPTIONS",
            "not part of it",
        ]
    )
    assert bpt.man_description(source) == (
        "foo reads files and writes them \u2014 quickly. bar(1), file.txt "
        "-v, --verbose \\ path nobreak item SMALL bold x"
    )
    assert bpt.man_description(source, max_words=3) == "foo reads files"
    assert bpt.man_description(".TH X 1\n.SH NAME\nx \\- y\n") is None
    assert bpt.man_description(".SH\nDESCRIPTION\nsecond line heading\n") == "second line heading"
