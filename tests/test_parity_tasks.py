"""The parity benchmark's fine-tuning tasks (scripts/build_parity_tasks.py) from this machine's Debian text.

The sources are installed by `make test` (apt-get install wordnet-base manpages); without them these
tests fail with the package to install rather than skip. `debian-sections` is built only where
`apt-get update` has left package lists.
"""

import contextlib
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest
from helpers.scripts import load_repo_script

from bertforge.data.bundled import corpus_path

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "build_parity_tasks.py"
SPLITS = ("train", "validation", "test")
PAIR_SIZES = {"train": 12_000, "validation": 2_000, "test": 4_000}
PAIR_TASKS = ("wordnet-pairs", "wordnet-similarity")
TOKEN_TASKS = ("supersense-tagging",)
EMBEDDING_TASKS = ("wordnet-embedding",)
CHOICE_TASKS = ("wordnet-choice",)
WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_FILES = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}  # id letter -> data.* file
# supersense-tagging built from wordnet-base 1:3.0-37 (Debian patches glosses, so another version may differ)
TAGGING_VERSION = "1:3.0-37"
TAGGING_COUNTS = {"train": 37_925, "validation": 4_590, "test": 4_666}
TAGGING_ENTITIES = {"train": 38_303, "validation": 4_622, "test": 4_705}
TAGGING_DROPPED = 1_063
# wordnet-embedding from the same wordnet-base version
EMBEDDING_COUNTS = {"train": 204_364, "validation": 4_539, "test": 4_635}
EMBEDDING_KINDS = {"train": {"example": 38_843, "word": 165_521}, "validation": {"example": 4_539},
                   "test": {"example": 4_635}}
REQUIRED_SOURCES = {
    Path("/usr/share/wordnet/data.noun"): "wordnet-base",
    Path("/usr/share/man/man7/man.7.gz"): "manpages",
    **{Path(f"/usr/share/man/{directory}/man1/chmod.1.gz"): f"manpages-{language}"
       for language, directory in (("de", "de"), ("fr", "fr"), ("es", "es"), ("ja", "ja"), ("zh", "zh_CN"))},
}


bpt = load_repo_script("scripts/build_parity_tasks.py", "build_parity_tasks")


def _task_names() -> list[str]:
    names = ["manpages", "manpages-multilingual", *PAIR_TASKS, *TOKEN_TASKS, *EMBEDDING_TASKS, *CHOICE_TASKS]
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
    """Every task built once, by the script's `main` in this process: no time limit a slow machine can outrun (a
    subprocess under a 300 s limit timed out at a load average of 16 on 2 cores, erroring all 21 tests that use
    it). The rebuild test runs the script as its own process, so the two builds differ in their string-hash seeds."""
    missing = [f"{path} (apt-get install -y {pkg})" for path, pkg in REQUIRED_SOURCES.items() if not path.exists()]
    if missing:
        pytest.fail("parity task sources not installed: " + "; ".join(missing) + " -- `make test` installs them")
    out = tmp_path_factory.mktemp("tasks")
    names = _task_names()
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = bpt.main(["--out", str(out), "--tasks", ",".join(names)])
    assert code == 0, stdout.getvalue()
    return {"out": out, "names": names, "stdout": stdout.getvalue()}


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


@pytest.fixture(scope="module")
def wordnet_glosses() -> dict[str, str]:
    """(id letter, offset) -> whole stripped gloss, read straight from the data files: "n02084071" -> gloss.
    Read once for the three tests that check rows against WordNet."""
    glosses: dict[str, str] = {}
    for name in sorted(set(WORDNET_FILES.values())):
        with (WORDNET_DIR / f"data.{name}").open(encoding="utf-8") as f:
            for line in f:
                if not line.startswith("  "):
                    head, _, gloss = line.partition(" | ")
                    offset, _, letter = head.split()[:3]
                    glosses[f"{letter}{offset}"] = gloss.strip()
    return glosses


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
        if name in TOKEN_TASKS or name in EMBEDDING_TASKS or name in CHOICE_TASKS:
            continue  # test_supersense_tagging_task_json_describes_a_token_task, test_wordnet_embedding_*, _choice_*
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
        if name in TOKEN_TASKS or name in EMBEDDING_TASKS or name in CHOICE_TASKS:
            continue  # test_supersense_tagging_follows_the_gloss_split_rule, test_wordnet_embedding_*, _choice_*
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


def test_multilingual_manpages_split_by_page_in_six_languages_with_no_dominant_section(
        tasks: dict[str, dict[str, Any]]) -> None:
    task = tasks["manpages-multilingual"]
    languages = ["en", "de", "fr", "es", "ja", "zh"]
    assert task["meta"]["languages"] == languages and task["meta"]["group_column"] == "language"
    pages = {split: {row["page"] for row in task[split]} for split in SPLITS}
    assert not pages["train"] & pages["test"] and not pages["train"] & pages["validation"]
    assert not pages["validation"] & pages["test"], "a page (or a translation of it) is in two splits"
    for split in SPLITS:
        assert {row["language"] for row in task[split]} == set(languages), split
        for row in task[split]:
            assert row["id"].startswith(f"{row['language']}/man{row['label']}/"), row["id"]
            assert bpt.text_units(row["text"]) >= bpt.MULTI_MIN_UNITS and len(row["text"]) <= bpt.MULTI_MAX_CHARS
    # real translations: the Japanese and Chinese rows are written in their scripts, the German in German
    test = task["test"]
    assert all(bpt.cjk_share(row["text"]) >= 0.3 for row in test if row["language"] in ("ja", "zh"))
    german = " ".join(row["text"] for row in test if row["language"] == "de").split()
    assert sum(word in ("die", "der", "und", "ist") for word in german) > len(german) // 50
    # the same page in several languages: English pages are those with a translation
    by_page = Counter(row["page"] for split in SPLITS for row in task[split])
    assert sum(count >= 3 for count in by_page.values()) > 100
    train = Counter(row["label"] for row in task["train"])
    assert max(train.values()) / sum(train.values()) < 0.35, train  # the cap per language and section
    per_language = task["meta"]["label_counts_per_language"]
    for split in SPLITS:
        for language in languages:
            rows = [row for row in task[split] if row["language"] == language]
            assert per_language[split][language] == dict(sorted(Counter(row["label"] for row in rows).items()))


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


def _tagging_rows(tasks: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict[str, Any]]]:
    """supersense-tagging rows by id, with their split."""
    task = tasks["supersense-tagging"]
    return {row["id"]: (split, row) for split in SPLITS for row in task[split]}


def _entities(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, start, end) of each BIO entity; asserts the sequence is well-formed on the way."""
    spans: list[tuple[str, int, int]] = []
    for i, tag in enumerate(tags):
        if tag == "O":
            continue
        prefix, _, kind = tag.partition("-")
        assert prefix in ("B", "I") and kind, tags
        if prefix == "I":
            assert i > 0 and tags[i - 1] in (f"B-{kind}", f"I-{kind}"), f"{tag} at {i} of {tags}"
            spans[-1] = (kind, spans[-1][1], i + 1)
        else:
            spans.append((kind, i, i + 1))
    return spans


def test_supersense_tagging_has_the_expected_counts(tasks: dict[str, dict[str, Any]]) -> None:
    task = tasks["supersense-tagging"]
    meta = task["meta"]
    counts = {split: len(task[split]) for split in SPLITS}
    entities = {split: sum(len(_entities(row["tags"])) for row in task[split]) for split in SPLITS}
    assert meta["counts"] == counts and meta["entity_counts"] == entities
    total = sum(counts.values())
    assert 40_000 <= total <= 55_000 and abs(counts["train"] / total - 0.8) < 0.02, counts
    assert 0 < meta["sentences_dropped"] < 0.05 * meta["examples"]
    assert total + meta["sentences_dropped"] + meta["duplicates_removed"] + meta["conflicts_removed"] + meta[
        "held_out_in_train_glosses_removed"
    ] == meta["examples"]
    if meta["sources"]["wordnet-base"] == TAGGING_VERSION:
        assert counts == TAGGING_COUNTS and entities == TAGGING_ENTITIES
        assert meta["sentences_dropped"] == TAGGING_DROPPED and len(meta["labels"]) == 89


def test_supersense_tagging_rows_are_well_formed_bio_with_an_entity_of_their_synsets_class(
    tasks: dict[str, dict[str, Any]],
) -> None:
    lexfile = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
    for split in SPLITS:
        for row in tasks["supersense-tagging"][split]:
            assert list(row) == ["tokens", "tags", "id"], row
            assert re.fullmatch(r"[nvasr]\d{8}-\d+", row["id"]), row["id"]
            tokens, tags = row["tokens"], row["tags"]
            assert len(tokens) == len(tags) > 0, row["id"]
            assert all(t and not re.search(r"\s", t) for t in tokens), row["id"]
            spans = _entities(tags)
            assert spans, f"{row['id']}: no entity"
            assert {kind for kind, _, _ in spans} == {spans[0][0]}, f"{row['id']}: one synset, one class"
            assert spans[0][0].startswith(lexfile[row["id"][0]] + "."), row["id"]


def test_supersense_tagging_task_json_describes_a_token_task(tasks: dict[str, dict[str, Any]]) -> None:
    task = tasks["supersense-tagging"]
    meta = task["meta"]
    assert meta["task_type"] == "token_classification"
    assert meta["tokens_column"] == "tokens" and meta["tags_column"] == "tags"
    assert "text_column" not in meta and "label_column" not in meta
    tags = {tag for split in SPLITS for row in task[split] for tag in row["tags"]}
    assert meta["labels"] == sorted(tags) and "O" in tags
    types = {tag[2:] for tag in tags if tag != "O"}
    assert {tag[2:] for tag in tags if tag.startswith("B-")} == types  # every type begins an entity somewhere
    assert len(types) == 45, sorted(types)  # all lexicographer files: noun.Tops..verb.weather, adj.*, adv.all
    for split in SPLITS:
        kinds = Counter(kind for row in task[split] for kind, _, _ in _entities(row["tags"]))
        assert meta["entity_type_counts"][split] == dict(sorted(kinds.items())), split
    assert meta["sources"]["wordnet-base"] and meta["sentences_dropped"] > 0


def test_supersense_tagging_follows_the_gloss_split_rule(tasks: dict[str, dict[str, Any]],
                                                         wordnet_glosses: dict[str, str]) -> None:
    glosses = wordnet_glosses
    rows = _tagging_rows(tasks)
    split_of_gloss: dict[str, str] = {}
    for row_id, (split, _) in rows.items():
        gloss = glosses[row_id.split("-")[0]]
        assert bpt.split_of(gloss) == split, row_id
        assert split_of_gloss.setdefault(gloss, split) == split, f"{row_id}: its gloss is in two splits"
    words = {split: {tuple(row["tokens"]) for row in tasks["supersense-tagging"][split]} for split in SPLITS}
    for split in SPLITS:
        assert len(words[split]) == len(tasks["supersense-tagging"][split]), f"duplicate sentences in {split}"
    assert not words["train"] & words["validation"] and not words["train"] & words["test"]
    assert not words["validation"] & words["test"]
    with gzip.open(corpus_path(), "rt", encoding="utf-8") as f:
        in_corpus = {line.strip() for line in f}
    held_out = {gloss for gloss, split in split_of_gloss.items() if split != "train"}
    assert held_out and not held_out & in_corpus
    assert any(gloss in in_corpus for gloss, split in split_of_gloss.items() if split == "train")


def test_supersense_tagging_hand_checked_examples(tasks: dict[str, dict[str, Any]]) -> None:
    rows = _tagging_rows(tasks)
    # data.noun 01781698: itch_mite, sarcoptid (05 noun.animal); "itch mites cause scabies":
    # a two-word lemma whose second word is a regular plural
    assert rows["n01781698-0"] == (
        "train",
        {"tokens": ["itch", "mites", "cause", "scabies"],
         "tags": ["B-noun.animal", "I-noun.animal", "O", "O"], "id": "n01781698-0"},
    )  # fmt: skip
    # data.noun 02075296: carnivore (noun.animal);
    # "terrestrial carnivores have four or five clawed digits on each limb"
    _, row = rows["n02075296-0"]
    assert row["tokens"] == "terrestrial carnivores have four or five clawed digits on each limb".split()
    assert row["tags"] == ["O", "B-noun.animal"] + ["O"] * 9
    # data.noun 05563266: foot (noun.body); "his bare feet projected from his trousers": noun.exc feet -> foot
    _, row = rows["n05563266-0"]
    assert row["tokens"] == "his bare feet projected from his trousers".split()
    assert row["tags"] == ["O", "O", "B-noun.body", "O", "O", "O", "O"]
    # data.verb 02684078: leave_off (verb.stative); "the road leaves off at the edge of the forest"
    _, row = rows["v02684078-0"]
    assert row["tokens"][2:4] == ["leaves", "off"]
    assert row["tags"][2:4] == ["B-verb.stative", "I-verb.stative"]


def test_supersense_tagging_tokenizer_and_lemma_matching() -> None:
    assert bpt.tokenize("he didn't see the well-known dog's tail, did he?") == [
        "he", "didn't", "see", "the", "well-known", "dog's", "tail", ",", "did", "he", "?"
    ]  # fmt: skip
    assert bpt.gloss_examples('a thing; "first one"; "" ; "  second  "') == [(0, "first one"), (2, "second")]
    morph = bpt.Morphology(bpt.read_exceptions())
    words = "The Dogs ran after the dog's owners and a dog".split()
    assert bpt.lemma_spans(words, [("dog",)], "n", morph) == [(1, 2), (5, 6), (9, 10)]
    assert bpt.lemma_spans("she ran home".split(), [("run",)], "v", morph) == [(1, 2)]  # verb.exc
    assert bpt.lemma_spans("he looked it up".split(), [("look", "up")], "v", morph) == []  # split collocation
    lemmas = [("look",), ("look", "up")]  # the longest lemma wins
    assert bpt.lemma_spans("he looked up the word".split(), lemmas, "v", morph) == [(1, 3)]
    assert bpt.lemma_spans("as far as".split(), [("a",)], "n", morph) == []  # short nouns are not stripped
    assert bpt.lemma_spans("the happiest day".split(), [("happy",)], "a", morph) == [(1, 2)]  # adj.exc
    assert bpt.lemma_spans("the nicest day".split(), [("nice",)], "a", morph) == [(1, 2)]  # -est -> -e
    assert bpt.bio_tags(4, [(0, 1), (2, 4)], "noun.act") == ["B-noun.act", "O", "B-noun.act", "I-noun.act"]


def test_wordnet_embedding_has_the_expected_counts(tasks: dict[str, dict[str, Any]]) -> None:
    task = tasks["wordnet-embedding"]
    meta = task["meta"]
    counts = {split: len(task[split]) for split in SPLITS}
    kinds = {split: dict(sorted(Counter(row["kind"] for row in task[split]).items())) for split in SPLITS}
    assert meta["counts"] == counts and meta["kind_counts"] == kinds
    assert (meta["task_type"], meta["text_column"], meta["text_pair_column"], meta["labels"]) == \
        ("embedding", "anchor", "positive", None)
    assert set(kinds["validation"]) == set(kinds["test"]) == {"example"}  # held out: "find the gloss of this usage"
    examples = sum(kinds[split]["example"] for split in SPLITS)
    assert abs(kinds["train"]["example"] / examples - 0.8) < 0.03, kinds
    if meta["sources"]["wordnet-base"] == TAGGING_VERSION:
        assert counts == EMBEDDING_COUNTS and kinds == EMBEDDING_KINDS


def test_wordnet_embedding_pairs_a_word_or_usage_with_its_synsets_definition_in_its_glosss_split(
    tasks: dict[str, dict[str, Any]], wordnet_glosses: dict[str, str]
) -> None:
    glosses = wordnet_glosses
    for split in SPLITS:
        for row in tasks["wordnet-embedding"][split]:
            assert list(row) == ["anchor", "positive", "kind", "id"]
            gloss = glosses[row["id"].split("-")[0]]
            assert bpt.split_of(gloss) == split
            assert row["positive"] == bpt.definition_of(gloss) and row["positive"]
            if row["kind"] == "example":
                assert row["anchor"] in [quoted.strip() for quoted in re.findall(r'"([^"]*)"', gloss)], row
            else:
                assert row["kind"] == "word" and row["anchor"] and '"' not in row["anchor"], row
    texts = {split: {text for row in tasks["wordnet-embedding"][split] for text in (row["anchor"], row["positive"])}
             for split in SPLITS}
    assert not texts["validation"] & texts["train"] and not texts["test"] & texts["train"]
    for split in SPLITS:
        pairs = {(row["anchor"], row["positive"]) for row in tasks["wordnet-embedding"][split]}
        assert len(pairs) == len(tasks["wordnet-embedding"][split]), f"duplicate pairs in {split}"


def test_wordnet_choice_asks_for_a_usages_definition_among_four_of_its_own_split(
    tasks: dict[str, dict[str, Any]], wordnet_glosses: dict[str, str]
) -> None:
    task = tasks["wordnet-choice"]
    meta = task["meta"]
    assert (meta["task_type"], meta["text_column"], meta["choice_columns"], meta["label_column"], meta["labels"]) == \
        ("multiple_choice", "text", ["choices"], "label", None)
    glosses = wordnet_glosses
    definitions_in: dict[str, set[str]] = {split: set() for split in SPLITS}
    for gloss in glosses.values():
        definitions_in[bpt.split_of(gloss)].add(bpt.definition_of(gloss))
    for split in SPLITS:
        positions = Counter(row["label"] for row in task[split])
        assert set(positions) == {0, 1, 2, 3} and min(positions.values()) > 0.2 * len(task[split]), positions
        for row in task[split]:
            assert list(row) == ["text", "choices", "label", "id"]
            gloss = glosses[row["id"].split("-")[0]]
            assert bpt.split_of(gloss) == split  # split by the whole gloss: no question leaks
            assert row["choices"][row["label"]] == bpt.definition_of(gloss)
            assert len(set(row["choices"])) == 4 and set(row["choices"]) <= definitions_in[split], row
            word, _, usage = row["text"].partition(": ")
            assert word and usage in [quoted.strip() for quoted in re.findall(r'"([^"]*)"', gloss)], row
    # the distractors are other senses of the word first: most questions are about the word's meaning
    other_senses = meta["other_senses_used"] / sum(3 * len(task[split]) for split in SPLITS)
    assert other_senses > 0.5, other_senses


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
    # the script as a process of its own (as users run it): another string-hash seed than the build's, so an
    # order taken from a set would show here; the limit only stops a hang (the build is ~40 s of CPU on idle cores)
    res = subprocess.run([sys.executable, str(SCRIPT), "--out", str(again), "--tasks", ",".join(build["names"])],
                         capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout + res.stderr
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
    [
        ("--wordnet-dir", "wordnet-pairs", "wordnet-base"),
        ("--wordnet-dir", "supersense-tagging", "wordnet-base"),
        ("--man-dir", "manpages", "manpages"),
        ("--man-dir", "manpages-multilingual", "manpages"),
    ],
)
def test_a_missing_source_is_a_one_line_error_naming_the_package_with_exit_code_2(
    tmp_path: Path, option: str, task: str, package: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the script's `main` in this process (an interpreter start-up fewer per case): an exception it let through
    # would fail the test here just as a traceback on stderr would
    empty = tmp_path / "empty"
    empty.mkdir()
    code = bpt.main(["--out", str(tmp_path / "out"), "--tasks", task, option, str(empty)])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), err
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
