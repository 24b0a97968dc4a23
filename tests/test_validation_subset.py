"""`data.validation_samples`: a seeded sample that stands for the whole validation split (stratified by class for
classification, by entity type for tagging), never the head of a file, and the report of the rows that chose the
run's checkpoint."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pytest
from helpers.finetuning import TINY_MODEL, finetune, minilm_dir

from bertforge.config import finetune_defaults, load_config
from bertforge.data.labels import load_labeled_data
from bertforge.data.validation_subset import rarest_entity_types, sample_rows
from bertforge.locate import resolve_data_file

REPO = Path(__file__).resolve().parents[1]
SHIPPED_RECIPES = sorted((REPO / "configs" / "finetune").glob("*.yaml")) + sorted(
    (REPO / "src" / "bertforge" / "recipes").glob("*.yaml"))


def class_sorted_rows(classes: int, per_class: int) -> list[str]:
    return [f"class{c}" for c in range(classes) for _ in range(per_class)]


def test_a_stratified_sample_of_a_class_sorted_file_covers_every_class_in_proportion() -> None:
    labels = class_sorted_rows(5, 10) + ["rare"] * 2
    rows = sample_rows(len(labels), 12, seed=7, strata=labels)
    counts = Counter(labels[row] for row in rows)
    assert len(rows) == 12 == len(set(rows)) and rows == sorted(rows)
    assert set(counts) == set(labels)  # the head (12 rows) would hold class0 and class1 only
    assert counts["rare"] == 1 and all(counts[f"class{c}"] in (2, 3) for c in range(5))


def test_the_sample_is_seeded_and_a_cap_at_or_above_the_split_keeps_every_row() -> None:
    labels = class_sorted_rows(4, 25)
    assert sample_rows(100, 20, 3, labels) == sample_rows(100, 20, 3, labels)
    assert sample_rows(100, 20, 3, labels) != sample_rows(100, 20, 4, labels)
    assert sample_rows(100, None, 3, labels) == sample_rows(100, 100, 3, labels) == list(range(100))
    plain = sample_rows(100, 10, 3)
    assert len(set(plain)) == 10 and plain != list(range(10))
    assert len({labels[row] for row in sample_rows(100, 3, 3, labels)}) == 3  # fewer rows than classes


def test_tagging_sentences_are_stratified_by_their_rarest_entity_type() -> None:
    names = ["O", "B-common", "I-common", "B-rare"]
    tags = [[0, 1, 2], [0, 1, 3], [0, 0], [1]]
    assert rarest_entity_types(tags, names) == ["common", "rare", None, "common"]


def capped_classification_recipes() -> list[Path]:
    """The shipped recipes whose validation split is a classification file cut to data.validation_samples
    (the tagging and pair recipes read data a script builds, and take their whole split)."""
    found = []
    for recipe in SHIPPED_RECIPES:
        config = load_config(str(recipe), [], base=finetune_defaults())
        if (config.data.validation_samples is not None and config.finetune.validation_file is not None
                and config.finetune.task_type == "classification"):
            found.append(recipe)
    return found


CAPPED_RECIPES = capped_classification_recipes()


def test_the_supersense_recipes_are_among_the_capped_ones() -> None:
    assert {"supersense-minilm.yaml", "supersense-tiny.yaml"} <= {recipe.name for recipe in CAPPED_RECIPES}


@pytest.mark.parametrize("recipe", CAPPED_RECIPES, ids=lambda path: path.name)
def test_shipped_recipes_validation_subsets_cover_every_class(recipe: Path) -> None:
    config = load_config(str(recipe), [], base=finetune_defaults())
    section, limit = config.finetune, config.data.validation_samples
    resolved = resolve_data_file(section.validation_file)
    data = load_labeled_data(dataclasses.replace(section, train_file=resolved, validation_file=resolved,
                                                 test_file=None))
    validation = data.validation
    assert validation is not None and validation.labels is not None
    rows = sample_rows(len(validation), limit, config.run.seed, validation.labels)
    assert {validation.labels[row] for row in rows} == set(validation.labels)
    assert len(set(validation.labels[:limit])) < len(set(validation.labels))  # the file's head would not


def test_the_run_reports_the_stratified_validation_subset_that_chose_its_checkpoint(tmp_path: Path) -> None:
    labels = ["alpha", "beta", "gamma", "delta"]
    texts = {"alpha": "a small cat sat", "beta": "a large dog ran", "gamma": "the river flowed", "delta": "stars shine"}

    def write(name: str, per_class: int) -> Path:  # sorted by class, as the bundled supersense splits are
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": f"{texts[label]} {i}", "label": label}) + "\n"
                                for label in labels for i in range(per_class)), encoding="utf-8")
        return path

    run_dir = tmp_path / "run"
    finetune(run_dir, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", f"finetune.train_file={write('train', 8)}",
             f"finetune.validation_file={write('validation', 20)}", f"finetune.test_file={write('test', 3)}",
             "finetune.max_length=16", "data.validation_samples=8", "train.micro_batch_size=8",
             "train.global_batch_size=8", "train.max_steps=2", "train.eval_every=1", "train.best_metric=accuracy")
    report = json.loads((run_dir / "validation_results.json").read_text())
    assert report["subset"] == {"rows": 8, "of": 80, "seed": 42, "stratified_by": "label"}
    assert report["metrics"]["examples"] == 8
    assert {entry["name"]: entry["support"] for entry in report["per_class"]} == dict.fromkeys(labels, 2)
    markdown = (run_dir / "validation_report.md").read_text()
    assert "8 of its 80 rows, a seeded sample stratified by label" in markdown and "| delta |" in markdown
    assert json.loads((run_dir / "test_results.json").read_text())["metrics"]["examples"] == 12
