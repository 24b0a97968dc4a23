"""The inference engine (`bertforge.engine`): length-sorted token-budget batches, tokenized on a thread, give
every kind the results one text at a time gives, in input order; long texts, truncation, parquet and errors."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers.finetuning import minilm_dir
from helpers.models import MINILM_TINY_LENGTH, minilm_sized_config

from bertforge import engine
from bertforge.cli import main
from bertforge.data.labels import LabeledSplit
from bertforge.embed import Embedder, embed_run
from bertforge.engine import EngineSettings
from bertforge.errors import BertforgeError
from bertforge.inference import fill_masks, load_model, read_inputs
from bertforge.models import BertforgeForPreTraining, save_bertforge_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.tasks.classify import prediction_rows
from bertforge.tasks.multiple_choice import BertforgeForMultipleChoice, ChoiceSplit, choice_rows
from bertforge.tasks.tagging import entity_rows

MAX_LENGTH = MINILM_TINY_LENGTH
ONE_AT_A_TIME = EngineSettings(batch_size=1)
SMALL_BUDGET = EngineSettings(max_batch_tokens=48)  # several batches, and the long texts alone in theirs
LONG = ("the gradual decline in the quality of the soil of a region that is brought about by the removal of its "
        "covering vegetation by wind and by water over a long period of time and the loss of its nutrients")



@pytest.fixture(scope="module")
def texts() -> list[str]:
    """Real glosses of very different lengths, shuffled, two over the models' length."""
    glosses = read_inputs("bundled:supersense/test").texts[:40]
    mixed = [*glosses, LONG, LONG + " " + LONG, "a", "to run"]
    random.Random(0).shuffle(mixed)
    return mixed


@pytest.fixture(scope="module")
def over_length(texts: list[str]) -> int:
    """How many of the texts the tokenizer itself, untruncated, makes longer than MAX_LENGTH with [CLS] and [SEP]."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return sum(len(encoding.ids) > MAX_LENGTH for encoding in tokenizer.encode_batch(texts))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random model of each kind with the MiniLM vocabulary, saved as bertforge directories."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("engine-models")
    built = {"classification": BertforgeForSequenceClassification(minilm_sized_config(), 3, "classification",
                                                                  ["noun.act", "noun.animal", "verb.motion"]),
             "regression": BertforgeForSequenceClassification(minilm_sized_config(), 1, "regression"),
             "tagging": BertforgeForTokenClassification(minilm_sized_config(), 3, ["O", "B-X", "I-X"]),
             "choice": BertforgeForMultipleChoice(minilm_sized_config()),
             "embedding": BertforgeForEmbedding(minilm_sized_config(pooling="mean")),
             "mlm": BertforgeForPreTraining(minilm_sized_config())}
    return {name: save_bertforge_model(model.eval(), root / name, minilm_dir()) for name, model in built.items()}


def test_classification_in_budget_batches_equals_one_text_at_a_time_in_input_order(models: dict[str, Path],
                                                                                  texts: list[str],
                                                                                  over_length: int) -> None:
    loaded = load_model(models["classification"])
    split = read_inputs(_txt(texts, models["classification"].parent / "texts.txt"))
    alone = prediction_rows(loaded, split, ONE_AT_A_TIME)
    each = [prediction_rows(loaded, LabeledSplit.unlabeled("one", [text])).rows[0] for text in texts]  # no sorting
    batched = prediction_rows(loaded, split, SMALL_BUDGET)
    default = prediction_rows(loaded, split)
    for rows in (batched, default, alone):
        assert [row["text"] for row in rows.rows] == texts
        for ours, single in zip(rows.rows, each, strict=True):
            assert ours["label"] == single["label"]
            assert ours["probabilities"] == pytest.approx(single["probabilities"], abs=1e-5)
    assert batched.truncated == alone.truncated == over_length >= 2  # LONG and LONG twice at least: counted


def test_regression_pairs_in_budget_batches_equal_one_pair_at_a_time(models: dict[str, Path],
                                                                     texts: list[str]) -> None:
    loaded = load_model(models["regression"])
    split = read_inputs(_txt(texts, models["regression"].parent / "texts.txt"))
    split.text_pairs = list(reversed(split.texts))
    alone = prediction_rows(loaded, split, ONE_AT_A_TIME).rows
    batched = prediction_rows(loaded, split, SMALL_BUDGET).rows
    assert [row["text_pair"] for row in batched] == list(reversed(texts))
    assert [row["score"] for row in batched] == pytest.approx([row["score"] for row in alone], abs=1e-5)


def test_tagging_in_budget_batches_equals_one_text_at_a_time(models: dict[str, Path], texts: list[str],
                                                            over_length: int) -> None:
    loaded = load_model(models["tagging"])
    alone = entity_rows(loaded, texts, ONE_AT_A_TIME)
    batched = entity_rows(loaded, texts, SMALL_BUDGET)
    assert batched.truncated == over_length and [row["text"] for row in batched.rows] == texts
    assert sum(len(row["entities"]) for row in batched.rows) > 0  # random weights still tag something
    for ours, single in zip(batched.rows, alone.rows, strict=True):
        assert [(e["entity_group"], e["start"], e["end"]) for e in ours["entities"]] == [
            (e["entity_group"], e["start"], e["end"]) for e in single["entities"]]
        assert [e["score"] for e in ours["entities"]] == pytest.approx([e["score"] for e in single["entities"]],
                                                                       abs=1e-5)


def test_vectors_in_budget_batches_equal_one_text_at_a_time(models: dict[str, Path], texts: list[str],
                                                            over_length: int) -> None:
    embedder = Embedder(load_model(models["embedding"]).model, minilm_dir(), MAX_LENGTH, "tiny")
    alone = np.concatenate([embed_run(embedder, [text]).vectors for text in texts])  # nothing to sort or batch
    batched = embed_run(embedder, texts, SMALL_BUDGET)
    assert batched.truncated == over_length
    assert np.abs(batched.vectors - alone).max() <= 1e-5
    shuffled = list(reversed(texts))  # row i is text i whatever order the texts come in
    assert np.abs(embed_run(embedder, shuffled).vectors[::-1] - alone).max() <= 1e-5


def test_multiple_choice_in_budget_batches_equals_one_question_at_a_time(models: dict[str, Path],
                                                                         texts: list[str]) -> None:
    loaded = load_model(models["choice"])
    choices = [[texts[(i + k) % len(texts)] for k in range(1 + i % 4)] for i in range(len(texts))]
    split = ChoiceSplit("memory", texts, choices, None)
    alone = choice_rows(loaded.model, split, minilm_dir(), MAX_LENGTH, ONE_AT_A_TIME).rows
    batched = choice_rows(loaded.model, split, minilm_dir(), MAX_LENGTH, SMALL_BUDGET).rows
    for ours, single, candidates in zip(batched, alone, choices, strict=True):
        assert len(ours["probabilities"]) == len(candidates) and ours["choice_id"] == single["choice_id"]
        assert ours["probabilities"] == pytest.approx(single["probabilities"], abs=1e-5)


def test_fill_mask_in_budget_batches_equals_one_text_at_a_time(models: dict[str, Path], texts: list[str]) -> None:
    loaded = load_model(models["mlm"])
    masked = [text.replace(" ", " [MASK] ", 1) if " " in text else f"{text} [MASK]" for text in texts]
    alone = fill_masks(loaded, masked, 3, ONE_AT_A_TIME)
    batched = fill_masks(loaded, masked, 3, SMALL_BUDGET)
    for ours, single in zip(batched, alone, strict=True):
        assert [[p.token for p in mask] for mask in ours] == [[p.token for p in mask] for mask in single]
        assert [p.score for mask in ours for p in mask] == pytest.approx(
            [p.score for mask in single for p in mask], abs=1e-5)


def test_a_budget_smaller_than_one_text_runs_that_text_alone(models: dict[str, Path], texts: list[str]) -> None:
    loaded = load_model(models["classification"])
    split = read_inputs(_txt(texts, models["classification"].parent / "texts.txt"))
    tiny = prediction_rows(loaded, split, EngineSettings(max_batch_tokens=1)).rows
    alone = prediction_rows(loaded, split, ONE_AT_A_TIME).rows
    assert [row["score"] for row in tiny] == pytest.approx([row["score"] for row in alone], abs=1e-5)


def test_predict_writes_parquet_with_ids_and_counts_truncated_texts(models: dict[str, Path], texts: list[str],
                                                                    over_length: int, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "texts.jsonl"
    data.write_text("".join(json.dumps({"id": f"g{i}", "text": text}) + "\n" for i, text in enumerate(texts)))
    model = str(models["classification"])
    assert main(["predict", model, "--input", str(data), "--out", str(tmp_path / "p.jsonl")]) == 0
    assert main(["predict", model, "--input", str(data), "--out", str(tmp_path / "p.parquet"),
                 "--max-batch-tokens", "64"]) == 0
    assert f"({over_length} truncated at 40 tokens)" in " ".join(capsys.readouterr().err.split())
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "p.parquet").to_pylist()
    assert [row["id"] for row in table] == [row["id"] for row in lines] == [f"g{i}" for i in range(len(texts))]
    assert [row["label"] for row in table] == [row["label"] for row in lines]
    assert [row["probabilities"]["noun.animal"] for row in table] == pytest.approx(
        [row["probabilities"]["noun.animal"] for row in lines], abs=1e-5)


def test_a_tokenizer_error_is_one_line_and_the_thread_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "ENCODE_CHUNK", 2)  # the bad input lands in a later chunk, the thread ahead
    workload = engine.text_workload(minilm_dir(), MAX_LENGTH, engine.rows_of)
    items = ["a text", "another text", "a third", ("one", "pair", "too many"), "more", "and more"]
    with pytest.raises(BertforgeError, match="tokenizing the inputs failed") as caught:
        engine.run(items, workload, lambda batch: torch.zeros(batch["num_samples"], 1), EngineSettings(batch_size=1))
    assert "\n" not in str(caught.value)
    assert not [thread for thread in threading.enumerate() if thread.name == "bertforge-tokenizer"]


def test_a_model_error_stops_the_tokenizer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "ENCODE_CHUNK", 1)
    monkeypatch.setattr(engine, "QUEUE_CHUNKS", 1)  # the thread is blocked on a full queue when the model fails

    def failing(batch: dict) -> torch.Tensor:
        raise RuntimeError("the model failed")

    workload = engine.text_workload(minilm_dir(), MAX_LENGTH, engine.rows_of)
    with pytest.raises(RuntimeError, match="the model failed"):
        engine.run([f"text {i}" for i in range(20)], workload, failing, EngineSettings(batch_size=1))
    assert not [thread for thread in threading.enumerate() if thread.name == "bertforge-tokenizer"]


def test_bad_engine_settings_and_an_empty_line_are_one_line_errors(models: dict[str, Path], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "texts.txt"
    data.write_text("a text\n\nanother\n")
    model = str(models["classification"])
    assert main(["predict", model, "--input", str(data)]) == 2
    assert f"{data}:2: empty line" in capsys.readouterr().err
    data.write_text("a text\n")
    assert main(["predict", model, "--input", str(data), "--max-batch-tokens", "0"]) == 2
    assert "--max-batch-tokens is 0; give at least 1" in capsys.readouterr().err


def _txt(texts: list[str], path: Path) -> Path:
    path.write_text("\n".join(texts) + "\n")
    return path


def test_the_cli_default_budget_is_the_engines() -> None:
    from bertforge.commands import predict

    assert predict.DEFAULT_MAX_BATCH_TOKENS == engine.DEFAULT_MAX_BATCH_TOKENS
    assert predict.DEFAULT_BATCH_SIZE == engine.DEFAULT_BATCH_SIZE


def test_evaluate_through_the_engine_equals_the_training_evaluation(models: dict[str, Path], texts: list[str],
                                                                     tmp_path: Path) -> None:
    """The training-time evaluations batch the file in order, without the engine: the reference."""
    from bertforge.data.aligned import TaggedDataset
    from bertforge.data.labeled import LabeledDataset
    from bertforge.data.labels import LabelSet, read_labeled_split
    from bertforge.data.pairs import PairSplit
    from bertforge.data.tagged import read_tagged_split
    from bertforge.tasks.classify import evaluate_file
    from bertforge.tasks.embedding import evaluate_pairs, evaluate_pairs_file
    from bertforge.tasks.evaluation import evaluate_dataset
    from bertforge.tasks.multiple_choice import ChoiceDataset, evaluate_choice_split, evaluate_choices
    from bertforge.tasks.tagging import evaluate_tagged, evaluate_tagged_file

    def same(ours: dict[str, float], theirs: dict[str, float]) -> None:
        assert ours.keys() == theirs.keys()
        assert list(ours.values()) == pytest.approx(list(theirs.values()), abs=1e-5)

    names = ["noun.act", "noun.animal", "verb.motion"]
    labeled = tmp_path / "labeled.jsonl"
    labeled.write_text("".join(json.dumps({"text": text, "label": names[i % 3], "tokens": text.split(),
                                           "tags": [("O", "B-X", "I-X")[(i + k) % 3] for k in range(len(text.split()))],
                                           "positive": texts[-1 - i]}) + "\n" for i, text in enumerate(texts)))
    loaded = load_model(models["classification"])
    split = read_labeled_split(labeled, labels=LabelSet(names), split="evaluation")
    same(evaluate_file(loaded, labeled, settings=SMALL_BUDGET).metrics,
         evaluate_dataset(loaded.model, LabeledDataset(split, minilm_dir(), MAX_LENGTH), "evaluation", 7).metrics)

    loaded = load_model(models["tagging"])
    tagged = read_tagged_split(labeled, ["O", "B-X", "I-X"], tokens_column="tokens", tags_column="tags")
    same(evaluate_tagged_file(loaded, labeled, settings=SMALL_BUDGET).metrics,
         evaluate_tagged(loaded.model, TaggedDataset(tagged, minilm_dir(), MAX_LENGTH), "evaluation", 7).metrics)

    loaded = load_model(models["choice"])
    choices = ChoiceSplit("memory", texts, [[texts[(i + k) % len(texts)] for k in range(2 + i % 3)]
                                            for i in range(len(texts))], [i % 2 for i in range(len(texts))])
    same(evaluate_choice_split(loaded.model, choices, minilm_dir(), MAX_LENGTH, "evaluation", SMALL_BUDGET).metrics,
         evaluate_choices(loaded.model, ChoiceDataset(choices, minilm_dir(), MAX_LENGTH), "evaluation", 7).metrics)

    loaded = load_model(models["embedding"])
    pairs = PairSplit(str(labeled), texts, list(reversed(texts)))
    same(evaluate_pairs_file(loaded, loaded.model, labeled, text_pair_column="positive", batch_size=7,
                             settings=SMALL_BUDGET).metrics,
         evaluate_pairs(loaded.model, pairs, minilm_dir(), MAX_LENGTH, "evaluation", "mnrl", 20.0, 7).metrics)


def test_a_tokenizer_file_is_read_once_per_length_and_again_when_it_changes(tmp_path: Path) -> None:
    """A server or a Ray actor runs the engine once per batch; reading tokenizer.json each time cost 0.1 s a call."""
    import shutil

    from tokenizers import Tokenizer

    directory = tmp_path / "tokenizer"
    shutil.copytree(minilm_dir(), directory, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "*.onnx"))
    before = engine._configured_tokenizer.cache_info()
    first = engine.text_encoder(directory, 16)(["a zyxqvwort word"])[0]["input_ids"].tolist()
    assert engine.text_encoder(directory, 16)(["a zyxqvwort word"])[0]["input_ids"].tolist() == first
    after = engine._configured_tokenizer.cache_info()
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)
    # the same file replaced (here: "zyxqvwort", several pieces, becomes one new token) is read again, not served stale
    original = Tokenizer.from_file(str(directory / "tokenizer.json"))
    original.add_tokens(["zyxqvwort"])
    original.save(str(directory / "tokenizer.json"))
    changed = engine.text_encoder(directory, 16)(["a zyxqvwort word"])[0]["input_ids"].tolist()
    assert changed != first and len(changed) < len(first)
