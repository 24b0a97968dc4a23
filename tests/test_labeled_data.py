"""Labeled fine-tuning data: every source format, the label rules, errors that name the file and line,
and tokenization into unpadded batches identical to what Hugging Face's tokenizer produces."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.config import ClassificationSettings, FinetuneSection
from bertforge.data.bundled import supersense_labels, supersense_path
from bertforge.data.labeled import LabeledDataset, collate_padded, collate_unpadded
from bertforge.data.labels import Columns, LabeledSplit, load_labeled_data, read_labeled_split
from bertforge.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def supersense_rows() -> list[dict[str, str]]:
    """150 real rows; the ones with quotes and commas in the text are kept on purpose."""
    with gzip.open(supersense_path("validation"), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    quoted = [r for r in rows if '"' in r["text"] and "," in r["text"]][:50]
    return quoted + rows[:100]


def write_csv(path: Path, rows: list[dict[str, str]], delimiter: str = ",") -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def section(**values: object) -> FinetuneSection:
    return FinetuneSection(**values)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# formats


def test_bundled_supersense_split_reads_with_the_sorted_label_set() -> None:
    split = read_labeled_split(supersense_path("validation"))
    assert len(split) == 11781
    assert split.label_names == supersense_labels()
    assert split.text_pairs is None
    assert split.labels is not None and set(split.labels) <= set(range(45))


def test_csv_tsv_jsonl_parquet_and_gzip_read_to_the_same_split(tmp_path: Path,
                                                               supersense_rows: list[dict[str, str]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    tsv_lines = ["text\tlabel\tid", *(f"{r['text']}\t{r['label']}\t{r['id']}" for r in supersense_rows)]
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(supersense_rows), parquet)
    sources = [
        write_csv(tmp_path / "rows.csv", supersense_rows),
        write_csv(tmp_path / "rows.csv.gz", supersense_rows),
        write_text(tmp_path / "rows.tsv", "\n".join(tsv_lines) + "\n"),
        write_jsonl(tmp_path / "rows.jsonl", supersense_rows),
        write_jsonl(tmp_path / "rows.jsonl.gz", supersense_rows),
        write_text(tmp_path / "rows.json", json.dumps(supersense_rows)),
        parquet,
    ]
    splits = [read_labeled_split(source) for source in sources]
    assert splits[0].texts == [r["text"] for r in supersense_rows]
    for split in splits[1:]:
        assert (split.texts, split.labels, split.label_names) == (splits[0].texts, splits[0].labels,
                                                                 splits[0].label_names), split.source


def test_tsv_is_read_with_quoting_off_so_a_leading_quote_swallows_nothing(tmp_path: Path) -> None:
    tsv = write_text(tmp_path / "quotes.tsv",
                     'text\tlabel\n"an opening quote that never closes\ta\nsecond row\tb\nthird "row"\ta\n')
    split = read_labeled_split(tsv)
    assert split.texts == ['"an opening quote that never closes', "second row", 'third "row"']
    assert split.labels == [0, 1, 0]


def test_text_pairs_come_from_the_pair_column(tmp_path: Path) -> None:
    rows = [{"premise": "a dog runs", "hypothesis": "an animal moves", "gold": "entailment"},
            {"premise": "a cat sleeps", "hypothesis": "a cat runs", "gold": "contradiction"}]
    split = read_labeled_split(write_jsonl(tmp_path / "nli.jsonl", rows),
                               columns=Columns(text="premise", text_pair="hypothesis", label="gold"))
    assert split.text_pairs == ["an animal moves", "a cat runs"]
    assert split.label_names == ["contradiction", "entailment"]
    assert split.labels == [1, 0]


def test_saved_hugging_face_dataset_and_its_class_label_names(tmp_path: Path) -> None:
    import datasets

    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    train = datasets.Dataset.from_dict({"sentence": ["good film", "bad film", "great"], "label": [1, 0, 1]},
                                       features=features)
    validation = datasets.Dataset.from_dict({"sentence": ["awful"], "label": [0]}, features=features)
    datasets.DatasetDict({"train": train, "validation": validation}).save_to_disk(tmp_path / "saved")
    train.save_to_disk(tmp_path / "single")

    read_train = read_labeled_split(tmp_path / "saved", columns=Columns(text="sentence"))
    assert read_train.texts == ["good film", "bad film", "great"]
    assert read_train.label_names == ["negative", "positive"]  # ClassLabel ids became their names
    assert read_train.labels == [1, 0, 1]
    by_suffix = read_labeled_split(f"{tmp_path / 'saved'}@validation", columns=Columns(text="sentence"))
    by_role = read_labeled_split(tmp_path / "saved", columns=Columns(text="sentence"), split="validation")
    assert by_suffix.texts == by_role.texts == ["awful"]
    assert read_labeled_split(tmp_path / "single", columns=Columns(text="sentence")).texts == read_train.texts
    with pytest.raises(DataError, match=r"no split 'test'.*train, validation"):
        read_labeled_split(tmp_path / "saved", columns=Columns(text="sentence"), split="test")


def test_load_dataset_reads_a_local_copy_of_a_hub_dataset_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     supersense_rows: list[dict[str, str]]) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")  # keep ~/.cache clean

    repository = tmp_path / "supersense-hub-copy"
    (repository / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(supersense_rows[:80]), repository / "data" / "train-00000-of-00001.parquet")
    pq.write_table(pa.Table.from_pylist(supersense_rows[80:]),
                   repository / "data" / "validation-00000-of-00001.parquet")
    train = read_labeled_split(f"hf:{repository}")
    validation = read_labeled_split(f"hf:{repository}", split="validation")
    assert train.texts == [r["text"] for r in supersense_rows[:80]]
    assert validation.texts == [r["text"] for r in supersense_rows[80:]]
    assert read_labeled_split(f"hf:{repository}@validation").texts == validation.texts


def test_a_folder_of_loose_files_is_refused_with_what_it_holds_not_merged(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    write_csv(folder / "train.csv", [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}])
    write_csv(folder / "reg_train.csv", [{"text": "fine", "label": "0.7"}])
    write_csv(folder / "val.csv", [{"text": "meh", "label": "neg"}])
    with pytest.raises(DataError, match=r"mine is a directory but not a dataset saved with save_to_disk \(it holds "
                                        r"reg_train.csv, train.csv, val.csv\); give one file, e.g. .*hf:"):
        read_labeled_split(folder)


# ---------------------------------------------------------------------------------------------
# labels


def test_label_map_merges_star_ratings_into_three_classes(tmp_path: Path) -> None:
    reviews = [{"review": f"review {i}", "stars": stars} for i, stars in enumerate([1, 2, 3, 4, 5, 5, 1])]
    train = write_jsonl(tmp_path / "train.jsonl", reviews)
    validation = write_csv(tmp_path / "validation.csv", [{"review": "fine", "stars": "3"},
                                                         {"review": "superb", "stars": "5"}])
    data = load_labeled_data(section(
        train_file=str(train), validation_file=str(validation), text_column="review", label_column="stars",
        labels=["negative", "neutral", "positive"],
        classification=ClassificationSettings(
            label_map={"1": "negative", "2": "negative", "3": "neutral", "4": "positive", "5": "positive"})))
    assert data.label_names == ["negative", "neutral", "positive"]
    assert data.train.labels == [0, 0, 1, 2, 2, 2, 0]
    assert data.validation is not None and data.validation.labels == [1, 2]  # "3" in csv == 3 in json


def test_labels_given_by_name_or_by_id_mean_the_same_class(tmp_path: Path) -> None:
    rows = [{"text": "a", "label": "positive"}, {"text": "b", "label": 0}, {"text": "c", "label": "1"},
            {"text": "d", "label": 0.0}]
    split = read_labeled_split(write_jsonl(tmp_path / "mixed.jsonl", rows), labels=None)
    assert split.label_names == ["0", "1", "positive"]  # without a label list, ids are just names
    data = load_labeled_data(section(train_file=str(tmp_path / "mixed.jsonl"), labels=["negative", "positive"]))
    assert data.train.labels == [1, 0, 1, 0]


def test_integer_labels_are_sorted_numerically(tmp_path: Path) -> None:
    rows = [{"text": f"t{i}", "label": label} for i, label in enumerate([10, 9, 2, 10])]
    split = read_labeled_split(write_jsonl(tmp_path / "ints.jsonl", rows))
    assert split.label_names == ["2", "9", "10"]
    assert split.labels == [2, 1, 0, 2]


def test_regression_labels_are_floats(tmp_path: Path) -> None:
    csv_path = write_csv(tmp_path / "sts.csv", [{"a": "x", "b": "y", "score": "4.25"}, {"a": "p", "b": "q",
                                                                                        "score": "0"}])
    split = read_labeled_split(csv_path, task_type="regression", columns=Columns("a", "b", "score"))
    assert split.labels == [4.25, 0.0]
    assert split.num_labels == 1 and split.label_names == []


def test_class_weights_need_one_weight_per_label(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "y"}])
    data = load_labeled_data(section(train_file=str(train), classification=ClassificationSettings(class_weights=[1.0, 3.0])))
    assert data.class_weights == [1.0, 3.0]
    with pytest.raises(ConfigError, match=r"class_weights has 3 values but there are 2 labels \(x, y\)"):
        load_labeled_data(section(train_file=str(train),
                                          classification=ClassificationSettings(class_weights=[1.0, 2.0, 3.0])))


def test_label_map_target_outside_the_label_list_is_a_config_error(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": 1}])
    with pytest.raises(ConfigError, match=r"label_map maps '1' to 'bad'.*not in finetune.labels"):
        load_labeled_data(section(train_file=str(train), labels=["good"],
                                  classification=ClassificationSettings(label_map={"1": "bad"})))


# ---------------------------------------------------------------------------------------------
# bad input: one line naming the file and the line


def test_missing_column_lists_the_columns_found(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "reviews.csv", [{"body": "nice", "label": "pos"}])
    with pytest.raises(DataError, match=r"reviews.csv:1: no column 'text' \(columns found: 'body', 'label'\); "
                                        r"set finetune.text_column"):
        read_labeled_split(path)


def test_csv_that_is_really_tab_separated_hints_at_the_delimiter(tmp_path: Path) -> None:
    path = write_text(tmp_path / "tabs.csv", "text\tlabel\nhello there\tgreeting\n")
    with pytest.raises(DataError, match=r"no column 'text'.*tab-separated.*finetune.delimiter"):
        read_labeled_split(path)
    assert read_labeled_split(path, delimiter="\t").texts == ["hello there"]


def test_row_split_into_too_many_fields_names_its_line(tmp_path: Path) -> None:
    path = write_text(tmp_path / "commas.csv", "text,label\nfine,a\nan unquoted, comma,b\n")
    with pytest.raises(DataError, match=r"commas.csv:3: 3 fields but the header has 2 \(text, label\).*comma"):
        read_labeled_split(path)


def test_line_numbers_count_records_that_span_lines(tmp_path: Path) -> None:
    path = write_text(tmp_path / "multiline.csv", 'text,label\n"two\nlines",a\n"  ",b\n')
    with pytest.raises(DataError, match=r"multiline.csv:4: empty text in column 'text'"):
        read_labeled_split(path)


def test_unknown_label_in_validation_data_names_file_line_and_label(tmp_path: Path) -> None:
    train = write_csv(tmp_path / "train.csv", [{"text": "a", "label": "cat"}, {"text": "b", "label": "dog"}])
    validation = write_csv(tmp_path / "dev.csv", [{"text": "c", "label": "dog"}, {"text": "d", "label": "bird"}])
    with pytest.raises(DataError, match=r"dev.csv:3: label 'bird' is not one of the 2 labels of the training "
                                        r"data \(cat, dog\).*finetune.classification.label_map"):
        load_labeled_data(section(train_file=str(train), validation_file=str(validation)))


def test_empty_text_names_the_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "ok", "label": "a"}, {"text": "   ", "label": "b"}])
    with pytest.raises(DataError, match=r"train.jsonl:2: empty text in column 'text'"):
        read_labeled_split(path)
    pairs = write_text(tmp_path / "pairs.tsv", "a\tb\tlabel\nx\ty\t1\nx\t\t0\n")
    with pytest.raises(DataError, match=r"pairs.tsv:3: empty text in column 'b'"):
        read_labeled_split(pairs, columns=Columns("a", "b"))


def test_missing_label_names_the_file_and_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "ok", "label": "a"}, {"text": "fine", "label": None}])
    with pytest.raises(DataError, match=r"train.jsonl:2: no label in column 'label'"):
        read_labeled_split(path)


def test_non_numeric_regression_label_names_the_file_and_line(tmp_path: Path) -> None:
    path = write_text(tmp_path / "scores.tsv", "text\tlabel\nfine\t3.5\ngood\tfour stars\n")
    with pytest.raises(DataError, match=r"scores.tsv:3: regression label 'four stars' in column 'label' is not a "
                                        r"number"):
        read_labeled_split(path, task_type="regression")


def test_non_utf8_bytes_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\nfine,a\ncaf\u00e9,b\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1.csv:3: not valid UTF-8 \(bytes e9\).*iconv"):
        read_labeled_split(path)


def test_invalid_json_line_is_named(tmp_path: Path) -> None:
    path = write_text(tmp_path / "broken.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": }\n')
    with pytest.raises(DataError, match=r"broken.jsonl:2: not valid JSON"):
        read_labeled_split(path)


def test_missing_file_and_unknown_extension_are_reported(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope.csv: no such file or directory.*hf:NAME"):
        read_labeled_split(tmp_path / "nope.csv")
    with pytest.raises(DataError, match=r"hf:.*could not load"):
        read_labeled_split(f"hf:{tmp_path / 'empty-repository'}")
    with pytest.raises(DataError, match=r"unknown file type '.xlsx'"):
        read_labeled_split(write_text(tmp_path / "sheet.xlsx", "x"))
    with pytest.raises(ConfigError, match=r"finetune.train_file is not set"):
        load_labeled_data(section())


# ---------------------------------------------------------------------------------------------
# tokenization and batches


def test_tokenization_matches_the_hugging_face_tokenizer_with_longest_first_truncation(minilm_dir: Path) -> None:
    from transformers import AutoTokenizer

    texts = ["a tangible and visible entity; an entity that can cast a shadow", "short one",
             "the quick brown fox jumps over the lazy dog again and again and again"]
    pairs = ["x", "a much longer second text that has to be cut down to fit", "the same length here as well ok"]
    split = LabeledSplit("pairs", "classification", texts, pairs, [0, 1, 0], ["no", "yes"])
    dataset = LabeledDataset(split, minilm_dir, max_length=16)
    reference = AutoTokenizer.from_pretrained(str(minilm_dir))
    for index, (text, pair) in enumerate(zip(texts, pairs, strict=True)):
        expected = reference(text, pair, truncation=True, max_length=16)
        assert dataset[index]["input_ids"].tolist() == expected["input_ids"]
        assert dataset[index]["token_type_ids"].tolist() == expected["token_type_ids"]
    assert dataset.lengths.max() == 16  # never padded, never longer than max_length
    assert dataset.label_names == ["no", "yes"]


def test_collate_unpadded_concatenates_sequences_with_no_padding(minilm_dir: Path) -> None:
    split = read_labeled_split(supersense_path("validation"))
    dataset = LabeledDataset(split, minilm_dir, max_length=32)
    examples = [dataset[i] for i in (0, 5, 7)]
    lengths = [len(e["input_ids"]) for e in examples]
    batch = collate_unpadded(examples)

    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert batch["max_seqlen"] == max(lengths) and isinstance(batch["max_seqlen"], int)
    assert batch["input_ids"].shape == (sum(lengths),) and batch["input_ids"].dtype == torch.long
    assert 0 not in batch["input_ids"].tolist()  # [PAD] (id 0) never appears
    assert batch["position_ids"].tolist() == [p for n in lengths for p in range(n)]
    assert batch["token_type_ids"].tolist() == [0] * sum(lengths)
    assert batch["labels"].tolist() == [split.labels[i] for i in (0, 5, 7)]  # type: ignore[index]
    assert batch["labels"].dtype == torch.long and batch["num_samples"] == 3
    starts, ends = batch["cu_seqlens"][:-1].long(), batch["cu_seqlens"][1:].long() - 1
    assert batch["input_ids"][starts].tolist() == [101] * 3  # every sequence starts with [CLS]
    assert batch["input_ids"][ends].tolist() == [102] * 3  # ... and ends with [SEP]


def test_collate_padded_pads_to_the_longest_example_or_a_fixed_length(minilm_dir: Path) -> None:
    split = LabeledSplit("sts", "regression", ["one two three four", "five"], ["six", "seven eight"], [4.5, 1.0], [])
    dataset = LabeledDataset(split, minilm_dir, max_length=32)
    examples = [dataset[0], dataset[1]]
    dynamic = collate_padded(examples, pad_token_id=dataset.pad_token_id)
    longest = int(dataset.lengths.max())
    assert dynamic["input_ids"].shape == (2, longest)
    assert dynamic["attention_mask"].sum().item() == dataset.num_tokens
    assert dynamic["input_ids"][dynamic["attention_mask"] == 0].tolist() == [dataset.pad_token_id] * (
        2 * longest - dataset.num_tokens)
    assert dynamic["token_type_ids"][1].tolist()[: len(examples[1]["input_ids"])] == [0, 0, 0, 1, 1, 1]
    assert dynamic["labels"].dtype == torch.float32 and dynamic["labels"].tolist() == [4.5, 1.0]
    fixed = collate_padded(examples, pad_token_id=dataset.pad_token_id, pad_to_length=32)
    assert fixed["input_ids"].shape == (2, 32) and fixed["attention_mask"].sum().item() == dataset.num_tokens


def test_prediction_input_is_read_without_labels(tmp_path: Path, minilm_dir: Path) -> None:
    path = write_jsonl(tmp_path / "inputs.jsonl", [{"text": "what is this"}, {"text": "and this"}])
    split = read_labeled_split(path, with_labels=False)
    assert split.labels is None
    batch = collate_unpadded([LabeledDataset(split, minilm_dir, max_length=16)[i] for i in range(2)])
    assert "labels" not in batch and batch["num_samples"] == 2


def test_labeled_rows_and_pretraining_inputs_read_hf_references_with_one_parser() -> None:
    from bertforge.data.records import parse_hub_reference
    from bertforge.data.sources import resolve_inputs

    assert parse_hub_reference("hf:glue:sst2@validation") == ("glue", "sst2", "validation")
    assert parse_hub_reference("hf:glue:sst2") == ("glue", "sst2", "train")
    # a local dataset repository may have ':' in its path; the split follows the last '@'
    assert parse_hub_reference("hf:./repos/my:data@test") == ("./repos/my:data", None, "test")
    assert parse_hub_reference("hf:~/a@b@c") == ("~/a@b", None, "c")
    with pytest.raises(DataError, match=r"'hf:@test' names no dataset; use hf:NAME\[:CONFIG\]\[@SPLIT\]"):
        parse_hub_reference("hf:@test")
    (source,) = resolve_inputs(["hf:./repos/my:data@test"])
    assert (source.url, source.hub_config, source.hub_split) == ("./repos/my:data", None, "test")
