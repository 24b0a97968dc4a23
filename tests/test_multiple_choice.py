"""Multiple choice, the fifth task kind: its reader, a model equal to transformers' BertForMultipleChoice both
ways, and a fine-tune whose final/ that class loads, scored by `bertforge evaluate` and `bertforge predict`.

The data is real text: supersense glosses (bundled) as contexts, four lexicographer-file names as the choices.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.finetuning import QUIET_RUN, TINY_MODEL, minilm_dir

from bertforge.cli import main
from bertforge.config import load_config
from bertforge.data.bundled import supersense_labels, supersense_lines
from bertforge.errors import ConfigError, DataError
from bertforge.models.config import EncoderConfig
from bertforge.tasks.multiple_choice import (
    BertforgeForMultipleChoice,
    ChoiceDataset,
    ChoiceSplit,
    collate_choices,
    read_choice_split,
)

TINY = EncoderConfig(vocab_size=30522, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                     hidden_dropout=0.0, attention_dropout=0.0)


def choice_rows(split: str, count: int) -> list[dict]:
    """Gloss -> which of four supersense names is its own (the others the next names in the sorted list)."""
    names = supersense_labels()
    rows = []
    for number, line in enumerate(supersense_lines(split, count)):
        row = json.loads(line)
        right = names.index(row["label"])
        candidates = [names[(right + step) % len(names)] for step in (1, 2, 3)]
        answer = number % 4
        rows.append({"id": f"{split}-{number}", "text": row["text"],
                     "choices": candidates[:answer] + [row["label"]] + candidates[answer:], "label": answer})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def choice_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("choice-data")
    return {split: write_jsonl(directory / f"{split}.jsonl", choice_rows(split, rows))
            for split, rows in (("train", 96), ("validation", 32), ("test", 32))}


@pytest.fixture(scope="module")
def trained_run(choice_files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT fine-tuned 12 steps on the choice files (MiniLM's tokenizer), through the Python API."""
    from bertforge.tasks.kinds import kind_named
    from bertforge.train.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("runs") / "choice"
    config = load_config(None, [f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", *QUIET_RUN,
                                *TINY_MODEL, f"model.tokenizer={minilm_dir()}", "finetune.task_type=multiple_choice",
                                f"finetune.train_file={choice_files['train']}",
                                f"finetune.validation_file={choice_files['validation']}",
                                f"finetune.test_file={choice_files['test']}", "finetune.max_length=48",
                                "train.max_steps=12", "train.micro_batch_size=8", "train.global_batch_size=8",
                                "train.eval_every=6", "train.best_metric=accuracy", "train.best_mode=max"])
    Trainer(config, kind_named("multiple_choice").task(config)).fit()
    return run_dir


def hf_padded(dataset: ChoiceDataset, indices: list[int]) -> dict[str, torch.Tensor]:
    """transformers' layout of the same questions: [questions, choices, longest pair], zero-padded."""
    examples = [dataset[i] for i in indices]
    longest = max(len(pair) for e in examples for pair in e["input_ids"])
    shape = (len(examples), len(examples[0]["input_ids"]), longest)
    ids, types, mask = torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long), torch.zeros(
        shape, dtype=torch.long)
    for q, example in enumerate(examples):
        for c, (pair, pair_types) in enumerate(zip(example["input_ids"], example["token_type_ids"], strict=True)):
            ids[q, c, :len(pair)] = torch.from_numpy(pair.astype("int64"))
            types[q, c, :len(pair)] = torch.from_numpy(pair_types.astype("int64"))
            mask[q, c, :len(pair)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def test_the_export_is_a_bert_for_multiple_choice_with_our_logits_and_imports_back(tmp_path: Path) -> None:
    import transformers

    from bertforge.models.hf import export_hf, load_hf_checkpoint

    torch.manual_seed(0)
    model = BertforgeForMultipleChoice(TINY).eval()
    dataset = ChoiceDataset(ChoiceSplit("memory", [r["text"] for r in choice_rows("test", 6)],
                                        [r["choices"] for r in choice_rows("test", 6)], None), minilm_dir(), 40)
    with torch.no_grad():
        ours = model(**{k: v for k, v in collate_choices([dataset[i] for i in range(6)]).items()
                        if k != "num_samples"}).logits
    result = export_hf(model, minilm_dir(), tmp_path / "export")
    assert (result.format, result.architecture) == ("transformers", "BertForMultipleChoice")
    hf = transformers.AutoModelForMultipleChoice.from_pretrained(str(tmp_path / "export")).eval()
    assert type(hf).__name__ == "BertForMultipleChoice"
    with torch.no_grad():
        theirs = hf(**hf_padded(dataset, list(range(6)))).logits
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()
    imported = load_hf_checkpoint(tmp_path / "export").eval()
    assert type(imported) is BertforgeForMultipleChoice
    with torch.no_grad():
        again = imported(**{k: v for k, v in collate_choices([dataset[i] for i in range(6)]).items()
                            if k != "num_samples"}).logits
    assert torch.allclose(ours, again, atol=1e-6)


def test_questions_with_different_choice_counts_share_a_batch_and_score_as_alone() -> None:
    torch.manual_seed(1)
    model = BertforgeForMultipleChoice(TINY).eval()
    split = ChoiceSplit("memory", ["a dog", "to run fast"], [["noun.animal", "verb.motion", "noun.food"],
                                                              ["verb.motion", "noun.act"]], [0, 0])
    dataset = ChoiceDataset(split, minilm_dir(), 32)
    batch = collate_choices([dataset[0], dataset[1]])
    assert batch["choice_counts"].tolist() == [3, 2]
    inputs = {k: v for k, v in batch.items() if k not in ("num_samples", "labels")}
    with torch.no_grad():
        together = model(**inputs, labels=batch["labels"])
        alone = [model(**{k: v for k, v in collate_choices([dataset[i]]).items() if k not in ("num_samples", "labels")})
                 .logits[0] for i in (0, 1)]
    assert torch.allclose(together.logits[0], alone[0], atol=1e-6)
    assert torch.allclose(together.logits[1, :2], alone[1], atol=1e-6) and together.logits[1, 2] == float("-inf")
    expected = sum(torch.nn.functional.cross_entropy(logits[None], torch.tensor([0])) for logits in alone)
    assert torch.allclose(together.loss_sum, expected, atol=1e-5)


def test_choices_come_from_a_list_column_or_one_column_per_choice(tmp_path: Path) -> None:
    csv = tmp_path / "swag.csv"
    csv.write_text("context,ending0,ending1,ending2,answer\nShe opened the door,and left,and flew,and sang,0\n",
                   encoding="utf-8")
    split = read_choice_split(csv, context_column="context", choice_columns=["ending0", "ending1", "ending2"],
                              label_column="answer")
    assert (split.contexts, split.choices, split.labels) == (["She opened the door"], [["and left", "and flew",
                                                                                         "and sang"]], [0])
    jsonl = write_jsonl(tmp_path / "rows.jsonl", [{"text": "a dog", "choices": ["animal", "act"], "label": 1}])
    assert read_choice_split(jsonl).choices == [["animal", "act"]]


@pytest.mark.parametrize(("row", "message"), [
    ({"text": "a dog", "choices": ["animal", "act"], "label": 2}, r"rows\.jsonl:1: the label in column 'label' is a "
                                                                   r"number \(2\); give the index of the right choice, 0 to 1"),
    ({"text": "a dog", "choices": "animal", "label": 0}, r"rows\.jsonl:1: column 'choices' holds a str .*"
                                                         r"finetune\.multiple_choice\.choice_columns"),
    ({"text": "a dog", "options": ["animal", "act"], "label": 0}, r"no column 'choices' .*set "
                                                                  r"finetune\.multiple_choice\.choice_columns"),
])
def test_a_bad_row_is_one_line_naming_the_file_line_and_setting(tmp_path: Path, row: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        read_choice_split(write_jsonl(tmp_path / "rows.jsonl", [row]))


def test_choice_columns_apply_to_multiple_choice_only() -> None:
    with pytest.raises(ConfigError, match=r"finetune\.multiple_choice\.choice_columns.*only applies to "
                                          r"finetune\.task_type=multiple_choice"):
        load_config(None, ["finetune.multiple_choice.choice_columns=[a,b]"])
    with pytest.raises(ConfigError, match=r"finetune\.text_pair_column.*does not read it"):
        load_config(None, ["finetune.task_type=multiple_choice", "finetune.text_pair_column=b"])


def test_a_fine_tune_exports_bert_for_multiple_choice_that_evaluate_and_predict_score(
        trained_run: Path, choice_files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((trained_run / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForMultipleChoice"]
    report = json.loads((trained_run / "test_results.json").read_text())
    assert report["task_type"] == "multiple_choice" and report["metrics"]["examples"] == 32
    assert main(["evaluate", str(trained_run), "--data", str(choice_files["test"]), "--split-name", "again",
                 "--out-dir", str(tmp_path)]) == 0
    again = json.loads((tmp_path / "again_results.json").read_text())
    assert again["metrics"]["accuracy"] == pytest.approx(report["metrics"]["accuracy"], abs=1e-6)
    capsys.readouterr()
    assert main(["predict", str(trained_run / "final"), "--input", str(choice_files["test"])]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 32 and rows[0]["id"] == "test-0"
    assert all(row["choice"] == row_in["choices"][row["choice_id"]] and len(row["probabilities"]) == 4
               for row, row_in in zip(rows, map(json.loads, choice_files["test"].read_text().splitlines()),
                                      strict=True))
    accuracy = sum(row["choice_id"] == json.loads(line)["label"]
                   for row, line in zip(rows, choice_files["test"].read_text().splitlines(), strict=True)) / 32
    assert accuracy == pytest.approx(report["metrics"]["accuracy"], abs=1e-6)


def test_predict_without_the_choices_says_to_give_a_file(trained_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(trained_run), "--text", "a small domesticated carnivore"]) == 2
    assert "multiple-choice model: give --input FILE" in capsys.readouterr().err
