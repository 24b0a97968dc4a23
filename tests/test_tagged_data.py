"""Tagged data for token classification: CoNLL text, jsonl, parquet and saved Hugging Face datasets, the
tag order, and errors that name the file and the line (every error case asserts on its message)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from bertforge.config import ClassificationSettings, FinetuneSection
from bertforge.data.tagged import (
    TAG_PATTERN,
    TaggedData,
    TaggedSplit,
    load_tagged_data,
    read_tagged_file,
    read_tagged_split,
    sorted_tags,
)
from bertforge.errors import ConfigError, DataError

# CoNLL-2003's layout: word, POS, chunk, NER tag; a -DOCSTART- line and the blank line after it
CONLL2003 = """\
-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


def write_text(path: Path, text: str) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(text)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    return write_text(path, "".join(json.dumps(row) + "\n" for row in rows))


def section(**values: object) -> FinetuneSection:
    return FinetuneSection(task_type="token_classification", **values)  # type: ignore[arg-type]


def load(**values: object) -> TaggedData:
    return load_tagged_data(section(**values), tokens_column="tokens", tags_column="tags")


def raises(error: type[Exception], message: str) -> pytest.RaisesContext:  # type: ignore[type-arg]
    """pytest.raises matching `message` literally (file paths hold regex characters)."""
    return pytest.raises(error, match=re.escape(message))


# ---------------------------------------------------------------------------------------------
# formats


def test_conll2003_file_skips_docstart_and_takes_the_last_column(tmp_path: Path) -> None:
    words, tags, numbers = read_tagged_file(write_text(tmp_path / "train.conll", CONLL2003))
    assert words == [["EU", "rejects", "German", "call", "."], ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert tags == [["B-ORG", "O", "B-MISC", "O", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
    assert numbers == [3, 9, 14]  # the line each sentence starts on


def test_two_column_gzipped_conll_file_with_tabs_and_crlf(tmp_path: Path) -> None:
    text = "Mary\tB-PER\r\nlives\tO\r\nin\tO\r\nNew\tB-LOC\r\nYork\tI-LOC\r\n\r\n\r\nHi\tO\r\n"
    source = write_text(tmp_path / "dev.conll.gz", text)
    words, tags, numbers = read_tagged_file(source)
    assert words == [["Mary", "lives", "in", "New", "York"], ["Hi"]]
    assert tags == [["B-PER", "O", "O", "B-LOC", "I-LOC"], ["O"]]
    assert numbers == [1, 8]
    data = load(train_file=str(source))
    assert data.tag_names == ["O", "B-LOC", "I-LOC", "B-PER"]
    assert data.train.tags == [[3, 0, 0, 1, 2], [0]]
    assert data.train.entity_types == ["LOC", "PER"]


def test_jsonl_with_tag_names(tmp_path: Path) -> None:
    rows = [{"tokens": ["John", "lives", "in", "New York"], "tags": ["S-PER", "O", "O", "S-LOC"], "id": 1},
            {"tokens": ["Bye"], "tags": ["O"], "id": 2}]
    data = load(train_file=str(write_jsonl(tmp_path / "train.jsonl", rows)))
    assert isinstance(data.train, TaggedSplit) and len(data.train) == 2
    assert data.train.words == [["John", "lives", "in", "New York"], ["Bye"]]  # a word may hold a space in jsonl
    assert data.tag_names == ["O", "S-LOC", "S-PER"]
    assert data.train.tags == [[2, 0, 0, 1], [0]]
    assert data.validation is None and data.test is None


def test_jsonl_with_integer_ids_into_finetune_labels(tmp_path: Path) -> None:
    labels = ["O", "B-PER", "I-PER", "B-LOC"]
    train = write_jsonl(tmp_path / "train.jsonl", [{"tokens": ["Ann", "Lee", "of", "Oslo"], "tags": [1, 2, 0, 3]}])
    validation = write_jsonl(tmp_path / "validation.jsonl", [{"tokens": ["Oslo"], "tags": ["B-LOC"]}])
    data = load(train_file=str(train), validation_file=str(validation), labels=labels)
    assert data.tag_names == labels  # the given order, not the sorted one
    assert data.train.tags == [[1, 2, 0, 3]]
    assert data.validation is not None and data.validation.tags == [[3]]
    _, tags, _ = read_tagged_file(train, id_names=labels)
    assert tags == [["B-PER", "I-PER", "O", "B-LOC"]]


def test_integer_ids_without_labels_and_out_of_range_ids_are_errors(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"tokens": ["a"], "tags": ["O"]},
                                                   {"tokens": ["Ann", "Lee"], "tags": [1, 2]}])
    with raises(DataError, f"{train}:2, word 1: tag 1 in column 'tags' is an integer id, and nothing says which "
                           "tag it means; list the tags in id order in finetune.labels"):
        load(train_file=str(train))
    with raises(DataError, f"{train}:2, word 2: tag id 2 in column 'tags' is out of range for the 2 tags of "
                           "finetune.labels"):
        load(train_file=str(train), labels=["O", "B-PER"])


def test_parquet_with_tag_names(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([{"words": ["Rome", "wins"], "ner": ["B-LOC", "O"]},
                                         {"words": ["Yes"], "ner": ["O"]}]), path)
    split = load_tagged_data(section(train_file=str(path)), tokens_column="words", tags_column="ner").train
    assert split.words == [["Rome", "wins"], ["Yes"]]
    assert (split.tag_names, split.tags) == (["O", "B-LOC"], [[1, 0], [0]])
    pq.write_table(pa.Table.from_pylist([{"words": ["Rome"], "ner": ["B-LOC"]},
                                         {"words": ["Yes"], "ner": ["O", "O"]}]), path)
    with raises(DataError, f"{path} row 2: 1 words in column 'words' but 2 tags"):
        read_tagged_file(path, tokens_column="words", tags_column="ner")


def test_saved_dataset_with_sequence_of_class_labels_maps_ids_to_their_names(tmp_path: Path) -> None:
    import datasets

    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"]
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=names))})
    train = datasets.Dataset.from_dict({"tokens": [["Ann", "at", "Acme", "Inc"]], "ner_tags": [[1, 0, 3, 4]]},
                                       features=features)
    test = datasets.Dataset.from_dict({"tokens": [["Bob"]], "ner_tags": [[1]]}, features=features)
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(tmp_path / "saved")

    words, tags, numbers = read_tagged_file(tmp_path / "saved", tags_column="ner_tags")
    assert (words, tags, numbers) == ([["Ann", "at", "Acme", "Inc"]], [["B-PER", "O", "B-ORG", "I-ORG"]], [1])
    data = load_tagged_data(section(train_file=str(tmp_path / "saved"), test_file=str(tmp_path / "saved")),
                            tokens_column="tokens", tags_column="ner_tags")
    assert data.tag_names == ["O", "B-ORG", "I-ORG", "B-PER"]
    assert data.train.tags == [[3, 0, 1, 2]]
    assert data.test is not None and data.test.words == [["Bob"]] and data.test.tags == [[3]]


def test_without_tags_a_one_column_file_is_read_as_words(tmp_path: Path) -> None:
    source = write_text(tmp_path / "input.txt", "Where\nis\nParis\n\nHere\n")
    words, tags, numbers = read_tagged_file(source, with_tags=False)
    assert (words, tags, numbers) == ([["Where", "is", "Paris"], ["Here"]], None, [1, 5])
    split = read_tagged_split(source, ["O", "B-LOC"], tokens_column="tokens", tags_column="tags", with_tags=False)
    assert (split.words, split.tags, split.tag_names, len(split)) == ([["Where", "is", "Paris"], ["Here"]], None,
                                                                       ["O", "B-LOC"], 2)
    with raises(DataError, f"{source}:1: one column ('Where') and no tag; a tagged file has the word first and "
                           "its tag last"):
        read_tagged_file(source)


def test_read_tagged_split_encodes_against_the_given_tags(tmp_path: Path) -> None:
    source = write_text(tmp_path / "eval.bio", "Oslo B-LOC\nis O\n\nOslo E-LOC\n")
    split = read_tagged_split(source, ["O", "B-LOC", "I-LOC", "E-LOC"], tokens_column="tokens", tags_column="tags",
                              origin="the model's tags (ner-model)")
    assert (split.words, split.tags) == ([["Oslo", "is"], ["Oslo"]], [[1, 0], [3]])
    with pytest.raises(DataError) as caught:
        read_tagged_split(source, ["O", "B-LOC", "I-LOC"], tokens_column="tokens", tags_column="tags",
                          origin="the model's tags (ner-model)")
    assert str(caught.value) == (f"{source}:4: tag 'E-LOC' (word 'Oslo') is not one of the 3 tags of the model's "
                                 "tags (ner-model) (O, B-LOC, I-LOC); fix the file, or use a model trained with "
                                 "this tag")


# ---------------------------------------------------------------------------------------------
# the tag list


def test_tag_order_is_o_first_then_by_type_then_prefix(tmp_path: Path) -> None:
    text = "a I-PER\nb E-PER\nc O\nd S-LOC\ne B-PER\nf B-LOC\ng I-LOC\nh S-PER\ni E-LOC\nj B-MISC\n"
    data = load(train_file=str(write_text(tmp_path / "train.iob", text)))
    assert data.tag_names == ["O", "B-LOC", "I-LOC", "E-LOC", "S-LOC", "B-MISC",
                              "B-PER", "I-PER", "E-PER", "S-PER"]
    assert data.train.entity_types == ["LOC", "MISC", "PER"]
    assert sorted_tags(["I-X", "B-X"]) == ["B-X", "I-X"]  # no O: none is invented


def test_tag_pattern_accepts_io_bio_and_bioes_tags_only() -> None:
    accepted = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-noun.animal", "I-verb.motion"]
    refused = ["o", "B", "B-", "U-PER", "L-PER", "b-per", "B_PER", "PER", "OO", "B-P ER", "0"]
    assert [t for t in accepted if TAG_PATTERN.fullmatch(t)] == accepted
    assert [t for t in refused if TAG_PATTERN.fullmatch(t)] == []


def test_explicit_labels_are_checked(tmp_path: Path) -> None:
    train = write_text(tmp_path / "train.conll", "Paris B-LOC\nis O\n\nRome B-GPE\n")
    with raises(ConfigError, "finetune.labels lists O more than once; give each tag once"):
        load(train_file=str(train), labels=["O", "B-LOC", "O"])
    with raises(ConfigError, "finetune.labels lists 'LOC', which is not a tag; token classification tags are O, or "
                             "B-, I-, E- or S-"):
        load(train_file=str(train), labels=["O", "LOC"])
    with raises(DataError, f"{train}:4: tag 'B-GPE' (word 'Rome') is not one of the 2 tags of finetune.labels "
                           "(O, B-LOC); fix the file, or list every tag in finetune.labels"):
        load(train_file=str(train), labels=["O", "B-LOC"])


def test_unknown_tag_in_the_test_split_names_its_line_and_the_known_tags(tmp_path: Path) -> None:
    train_lines = "".join(f"w{i} B-T{i:02d}\n" for i in range(12))
    train = write_text(tmp_path / "train.conll", train_lines + "\nend O\n")
    test = write_text(tmp_path / "test.conll", "x O\n\ny O\nz B-NEW\n")
    with pytest.raises(DataError) as caught:
        load(train_file=str(train), test_file=str(test))
    assert str(caught.value) == (f"{test}:4: tag 'B-NEW' (word 'z') is not one of the 13 tags of the training data "
                                 "(O, B-T00, B-T01, B-T02, B-T03, B-T04, B-T05, B-T06, B-T07, B-T08, ...); fix the "
                                 "file, or list every tag in finetune.labels")
    write_text(test, "x O\n\ny O\nz B-T11\n")
    assert load(train_file=str(train), test_file=str(test)).test is not None


# ---------------------------------------------------------------------------------------------
# errors: each names the file and the line (or row)


def test_malformed_tag_names_the_line_the_tag_and_the_accepted_forms(tmp_path: Path) -> None:
    source = write_text(tmp_path / "train.conll", CONLL2003.replace("Blackburn NNP I-NP I-PER",
                                                                    "Blackburn NNP I-NP NNP"))
    with raises(DataError, f"{source}:10: 'NNP' (the last column, word 'Blackburn') is not a tag; use O, or B-, "
                           "I-, E- or S- followed by the entity type (B-PER, I-LOC, S-MISC)"):
        read_tagged_file(source)
    bilou = write_jsonl(tmp_path / "bilou.jsonl", [{"tokens": ["a"], "tags": ["O"]},
                                                   {"tokens": ["Ann", "Lee"], "tags": ["B-PER", "L-PER"]}])
    with raises(DataError, f"{bilou}:2, word 2: 'L-PER' (column 'tags', word 'Lee') is not a tag; use O, or B-, "
                           "I-, E- or S- followed by the entity type (B-PER, I-LOC, S-MISC); BILOU tags map to "
                           "BIOES: U- is S-, L- is E-"):
        read_tagged_file(bilou)


def test_inconsistent_column_counts_name_the_line(tmp_path: Path) -> None:
    source = write_text(tmp_path / "train.conll", "EU NNP B-ORG\nrejects VBZ O\n\nNew York B-LOC I-LOC\n")
    with raises(DataError, f"{source}:4: 4 columns but the first token line (1) has 3; every token line needs the "
                           "same columns"):
        read_tagged_file(source)
    short = write_text(tmp_path / "short.conll", "EU B-ORG\nrejects\n")
    with raises(DataError, f"{short}:2: 1 column but the first token line (1) has 2"):
        read_tagged_file(short)


def test_empty_files_and_files_without_sentences(tmp_path: Path) -> None:
    empty = write_text(tmp_path / "empty.conll", "")
    only_docstart = write_text(tmp_path / "docs.conll", "-DOCSTART- -X- -X- O\n\n\n-DOCSTART- -X- -X- O\n")
    for source in (empty, only_docstart):
        with raises(DataError, f"{source}: no sentences; a CoNLL file has one token per line"):
            read_tagged_file(source)
    empty_jsonl = write_text(tmp_path / "empty.jsonl", "\n")
    with raises(DataError, f"{empty_jsonl}: no rows; the file is empty"):
        read_tagged_file(empty_jsonl)


def test_missing_column_lists_the_columns_and_the_config_key(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "train.jsonl", [{"words": ["a"], "tags": ["O"]}])
    with raises(DataError, f"{source}:1: no column 'tokens' (columns found: 'words', 'tags'); set "
                           "finetune.tagging.tokens_column to one of them"):
        load(train_file=str(source))
    with raises(DataError, f"{source}:1: no column 'ner' (columns found: 'words', 'tags'); set "
                           "finetune.tagging.tags_column to one of them"):
        load_tagged_data(section(train_file=str(source)), tokens_column="words", tags_column="ner")
    later = write_jsonl(tmp_path / "later.jsonl", [{"tokens": ["a"], "tags": ["O"]}, {"tokens": ["b"]}])
    with raises(DataError, f"{later}:2: the row has no field 'tags'; add it (finetune.tagging.tags_column)"):
        read_tagged_file(later)


def test_tokens_and_tags_must_have_equal_lengths(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "train.jsonl", [{"tokens": ["a", "b"], "tags": ["O", "O"]},
                                                    {"tokens": ["c", "d", "e"], "tags": ["O", "O"]}])
    with raises(DataError, f"{source}:2: 3 words in column 'tokens' but 2 tags in column 'tags'; give each word "
                           "exactly one tag"):
        read_tagged_file(source)


def test_bad_words_and_tag_values_name_the_row(tmp_path: Path) -> None:
    cases = [
        ({"tokens": ["a", ""], "tags": ["O", "O"]}, ":2, word 2: empty word '' in column 'tokens'"),
        ({"tokens": ["a", " "], "tags": ["O", "O"]}, ":2, word 2: empty word ' ' in column 'tokens'"),
        ({"tokens": "a b", "tags": ["O", "O"]}, ":2: column 'tokens' holds a string, not a list of words"),
        ({"tokens": ["a", 5], "tags": ["O", "O"]}, ":2, word 2: 5 in column 'tokens' is not a string"),
        ({"tokens": [], "tags": []}, ":2: no words in column 'tokens'; remove the row"),
        ({"tokens": ["a"], "tags": "O"}, ":2: column 'tags' holds str 'O', not a list of tags"),
        ({"tokens": ["a"], "tags": [None]}, ":2, word 1: tag None in column 'tags' is neither a tag name nor an "
                                            "integer id"),
        ({"tokens": ["a"], "tags": ["3"]}, ":2, word 1: '3' (column 'tags', word 'a') is not a tag; use O, or B-, "
                                           "I-, E- or S- followed by the entity type (B-PER, I-LOC, S-MISC); "
                                           "integer tag ids are numbers, not strings"),
    ]
    for number, (row, message) in enumerate(cases):
        source = write_jsonl(tmp_path / f"bad{number}.jsonl", [{"tokens": ["ok"], "tags": ["O"]}, row])
        with raises(DataError, f"{source}{message}"):
            read_tagged_file(source)


def test_whitespace_only_word_in_a_conll_file_names_the_line(tmp_path: Path) -> None:
    source = write_text(tmp_path / "train.conll", "a O\n\u00a0 O\n")
    with raises(DataError, f"{source}:2: the word '\\xa0' is only whitespace"):
        read_tagged_file(source)


def test_unreadable_files_are_data_errors(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.conll"
    latin1.write_bytes("Paris B-LOC\n\nK\u00f6ln B-LOC\n".encode("latin-1"))
    with raises(DataError, f"{latin1}:3: not valid UTF-8 (bytes f6)"):
        read_tagged_file(latin1)
    truncated = tmp_path / "cut.conll.gz"
    truncated.write_bytes(gzip.compress(CONLL2003.encode() * 50)[:200])
    with raises(DataError, f"{truncated}: the compressed data is truncated or corrupt"):
        read_tagged_file(truncated)
    tsv = write_text(tmp_path / "train.tsv", "Paris\tB-LOC\n")
    with raises(DataError, f"{tsv}: a csv/tsv row holds one text per cell, not a sentence's words and tags; give "
                           "a CoNLL file (one token per line: rename it to .conll)"):
        read_tagged_file(tsv)
    odd = write_text(tmp_path / "train.tags", "Paris B-LOC\n")
    with raises(DataError, f"{odd}: unknown file type '.tags' for tagged data; use .conll, .iob, .bio, .txt"):
        read_tagged_file(odd)


def test_train_file_is_required_and_classification_settings_are_refused(tmp_path: Path) -> None:
    with raises(ConfigError, "finetune.train_file is not set"):
        load()
    train = write_text(tmp_path / "train.conll", "Paris B-LOC\n")
    with raises(ConfigError, "config key `finetune.classification.class_weights` is set but only applies to "
                             "finetune.task_type=classification (this run's is token_classification)"):
        load(train_file=str(train), classification=ClassificationSettings(class_weights=[1.0, 2.0]))
