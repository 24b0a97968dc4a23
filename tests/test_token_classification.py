"""Token classification: sub-word alignment, the row-only head, seqeval metrics, a real fine-tune of
all-MiniLM-L6-v2 on WordNet supersense tagging, and its export run by transformers' own pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.finetuning import QUIET_RUN, TINY_MODEL, metrics_records, minilm_dir

from bertforge.cli import main
from bertforge.config import config_to_yaml, load_config
from bertforge.data.aligned import TaggedDataset, collate_tagged, first_pieces
from bertforge.data.tagged import TaggedSplit
from bertforge.tasks.entity_metrics import entity_metrics, per_type_report
from bertforge.tasks.tagging import TokenClassificationTask
from bertforge.train.trainer import Trainer

TAGS = ["O", "B-noun.animal", "I-noun.animal", "B-verb.motion"]


def split_of(words: list[list[str]], tags: list[list[str]] | None) -> TaggedSplit:
    ids = None if tags is None else [[TAGS.index(t) for t in sentence] for sentence in tags]
    return TaggedSplit(source="in memory", words=words, tags=ids, tag_names=TAGS)


def test_each_word_is_labeled_on_its_first_sub_word_only() -> None:
    sentence = ["The", "unaffable", "wolfhounds", "galloped", "."]
    dataset = TaggedDataset(split_of([sentence], [["O", "B-noun.animal", "I-noun.animal", "B-verb.motion", "O"]]),
                            minilm_dir(), max_length=32)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    example = dataset[0]
    pieces = [tokenizer.id_to_token(int(i)) for i in example["input_ids"]]
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert len(pieces) > len(sentence) + 2  # some words are several pieces
    # the first piece of each word, in word order; continuation pieces ("##...") are never labeled
    assert [pieces[p] for p in example["word_starts"]][:2] == ["the", tokenizer.id_to_token(
        tokenizer.encode("unaffable", add_special_tokens=False).ids[0])]
    assert not any(pieces[p].startswith("##") for p in example["word_starts"])
    assert len(example["word_starts"]) == len(sentence)
    assert example["tags"].tolist() == [0, 1, 2, 3, 0]


def test_words_beyond_max_length_are_counted_and_left_unlabeled() -> None:
    words = [["a", "b", "c", "d", "e", "f", "g", "h"], ["dog"]]
    dataset = TaggedDataset(split_of(words, [["O"] * 8, ["B-noun.animal"]]), minilm_dir(), max_length=6)
    assert dataset.words_of(0) == 4 and dataset.words_of(1) == 1  # [CLS] a b c d [SEP]
    assert dataset.words_cut == 4
    assert dataset[1]["tags"].tolist() == [1]


def test_first_pieces_skips_special_tokens_and_continuations() -> None:
    assert first_pieces([None, 0, 0, 1, 2, 2, 2, None]).tolist() == [1, 3, 4]


def test_a_batch_names_every_word_start_as_a_row_of_the_unpadded_tokens() -> None:
    dataset = TaggedDataset(split_of([["wolves", "run"], ["a", "dog", "galloped"]],
                                     [["B-noun.animal", "B-verb.motion"], ["O", "B-noun.animal", "B-verb.motion"]]),
                            minilm_dir(), max_length=32)
    batch = collate_tagged([dataset[0], dataset[1]])
    assert batch["words_per_sample"] == [2, 3]
    starts = batch["cu_seqlens"][:-1].long()
    expected = torch.cat([starts[0] + torch.from_numpy(dataset[0]["word_starts"]),
                          starts[1] + torch.from_numpy(dataset[1]["word_starts"])])
    assert torch.equal(batch["rows"], expected)
    assert batch["labels"].tolist() == [1, 3, 0, 1, 3]


def test_the_head_on_rows_equals_the_full_output_at_those_rows() -> None:
    from bertforge.models import BertforgeForTokenClassification
    from bertforge.models.config import get_preset

    torch.manual_seed(0)
    config = get_preset("bert-tiny")
    model = BertforgeForTokenClassification(config, num_labels=4, label_names=TAGS).eval()
    ids = torch.randint(5, config.vocab_size, (23,))
    cu = torch.tensor([0, 9, 23], dtype=torch.int32)
    rows = torch.tensor([1, 2, 5, 10, 11, 20])
    labels = torch.tensor([0, 1, -100, 3, 2, 0])
    full = model(ids, cu_seqlens=cu, max_seqlen=14).logits
    some = model(ids, cu_seqlens=cu, max_seqlen=14, rows=rows, labels=labels)
    torch.testing.assert_close(some.logits, full[rows], rtol=1e-5, atol=1e-5)
    expected = torch.nn.functional.cross_entropy(full[rows], labels, ignore_index=-100, reduction="sum")
    torch.testing.assert_close(some.loss_sum, expected, rtol=1e-5, atol=1e-5)
    assert int(some.correct) == int((full[rows].argmax(-1) == labels)[labels != -100].sum())


def test_a_fresh_tagging_head_is_drawn_as_transformers_draws_it() -> None:
    """The classifier starts from `BertForTokenClassification`'s distribution: a plain normal of std
    initializer_range (BERT's truncated draw, cut at 2 std, trained worse on supersense tagging)."""
    import transformers
    from scipy import stats

    from bertforge.models import BertforgeForTokenClassification
    from bertforge.models.config import get_preset

    torch.manual_seed(0)
    config = get_preset("bert-small")  # hidden 512 x 89 tags: 45,568 weights
    ours = BertforgeForTokenClassification(config, num_labels=89).classifier
    theirs = transformers.BertForTokenClassification(transformers.BertConfig(
        hidden_size=512, num_hidden_layers=1, num_attention_heads=8, intermediate_size=64, vocab_size=64,
        num_labels=89, initializer_range=config.initializer_range)).classifier
    ours_weights, their_weights = (layer.weight.detach().flatten().numpy() for layer in (ours, theirs))
    assert stats.ks_2samp(ours_weights, their_weights).pvalue > 0.01
    limit = 2 * config.initializer_range
    assert (np.abs(ours_weights) > limit).mean() == pytest.approx((np.abs(their_weights) > limit).mean(), abs=0.005)
    assert torch.count_nonzero(ours.bias) == 0


def test_entity_metrics_match_a_hand_checked_case() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    # gold entities: PER(0-1), LOC(3), ORG(0); predicted: PER(0-1), ORG(3), ORG(0): 2 of 3 right each way
    metrics = entity_metrics(gold, predicted)
    assert metrics["precision"] == pytest.approx(2 / 3) and metrics["recall"] == pytest.approx(2 / 3)
    assert metrics["f1"] == pytest.approx(2 / 3)
    assert metrics["accuracy"] == pytest.approx(5 / 6)
    # a span cut short is a miss, not a partial hit
    assert entity_metrics([["B-PER", "I-PER"]], [["B-PER", "O"]])["f1"] == 0.0
    reports = {r.name: r for r in per_type_report(gold, predicted)}
    assert (reports["LOC"].recall, reports["ORG"].precision, reports["PER"].f1) == (0.0, 0.5, 1.0)


# ---------------------------------------------------------------------------------------------
# a real fine-tune


@pytest.fixture(scope="module")
def tagging_data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """finetune.* overrides: slices of the real supersense-tagging task, with the task's whole tag list."""
    from helpers.parity_slices import parity_task_slices

    # a slice of the train split lacks some of the tags that validation and test have
    files, tags = parity_task_slices("supersense-tagging", tmp_path_factory.mktemp("tagging-data"),
                                     {"train": 640, "validation": 64, "test": 96})
    assert tags is not None
    return ["finetune.task_type=token_classification", f"finetune.train_file={files['train']}",
            f"finetune.validation_file={files['validation']}", f"finetune.test_file={files['test']}",
            f"finetune.labels=[{','.join(tags)}]"]


@pytest.fixture(scope="module")
def tagger_run(tagging_data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tagging")
    (root / "test.jsonl").write_text(Path(tagging_data[3].split("=", 1)[1]).read_text())
    config = load_config(None, [
        f"run.output_dir={root}", "run.name=tagger", *QUIET_RUN, "model.init_from=all-MiniLM-L6-v2", *tagging_data,
        "finetune.max_length=64", "optim.lr=3e-4", "optim.betas=[0.9,0.999]", "optim.eps=1e-8",
        "schedule.name=linear", "schedule.warmup=0.1", "train.micro_batch_size=32", "train.global_batch_size=32",
        "train.max_epochs=1", "train.eval_every=10", "train.checkpoint_every=10", "train.best_metric=f1",
        "train.best_mode=max"])
    result = Trainer(config, TokenClassificationTask(config)).fit()
    assert result.exit_code == 0
    return root / "tagger"


def test_minilm_learns_supersense_tagging_and_reports_seqeval_metrics(tagger_run: Path) -> None:
    report = json.loads((tagger_run / "test_results.json").read_text())
    assert report["task_type"] == "token_classification"
    metrics = report["metrics"]
    assert set(metrics) >= {"precision", "recall", "f1", "accuracy", "loss"}
    # 20 steps are far from converged (entities emerge after ~100 steps: docs/guide.md), but the head has
    # learned the tag prior: every word's tag right as often as tagging all words O
    gold = [json.loads(line)["tags"] for line in (tagger_run.parent / "test.jsonl").read_text().splitlines()]
    outside = sum(tag == "O" for tags in gold for tag in tags) / sum(len(tags) for tags in gold)
    assert metrics["accuracy"] >= outside - 0.01
    assert metrics["examples"] == 96
    losses = [r["loss"] for r in metrics_records(tagger_run, "train")]
    assert losses[-1] < losses[0]
    assert {"f1", "precision", "recall"} <= set(metrics_records(tagger_run, "validation")[-1])
    config = json.loads((tagger_run / "final" / "config.json").read_text())
    assert config["architectures"] == ["BertForTokenClassification"]
    assert "O" in config["label2id"] and len(config["id2label"]) == 89  # finetune.labels: the task's 89 tags


def test_the_export_runs_in_transformers_pipeline_with_the_entities_of_bertforge_predict(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from bertforge.models.hf import export_hf
    from bertforge.models.loading import load_for_task

    # MiniLM with a random, confident head: many entities of many types, so every span and score is compared
    torch.manual_seed(3)
    model = load_for_task(minilm_dir(), "token_classification", label_names=TAGS)
    with torch.no_grad():
        model.classifier.weight.mul_(40.0)
    export_hf(model, minilm_dir(), tmp_path / "tagger")
    texts = ["The dog barked at the mailman while the cat slept.",
             "She ran quickly to the old oak-tree near the river's bank!",
             "Wolves hunt in packs during the long winter nights, unaffably."]
    source = tmp_path / "texts.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    out = tmp_path / "entities.jsonl"
    assert main(["predict", str(tmp_path / "tagger"), "--input", str(source), "--out", str(out)]) == 0
    ours = [json.loads(line) for line in out.read_text().splitlines()]
    tagger = transformers.pipeline("token-classification", model=str(tmp_path / "tagger"),
                                   aggregation_strategy="first", device="cpu")
    assert sum(len(row["entities"]) for row in ours) >= 6
    for row, theirs in zip(ours, tagger(texts), strict=True):
        assert [(e["entity_group"], e["start"], e["end"]) for e in row["entities"]] == \
            [(e["entity_group"], e["start"], e["end"]) for e in theirs]
        for a, b in zip(row["entities"], theirs, strict=True):
            assert a["score"] == pytest.approx(float(b["score"]), abs=1e-4)
            assert a["word"] == row["text"][a["start"]:a["end"]]


def test_a_checkpoint_of_the_tagger_loads_as_a_tagger_and_continues_with_its_head(tagger_run: Path) -> None:
    from bertforge.models import BertforgeForTokenClassification
    from bertforge.models.loading import load_for_task, load_model_directory

    checkpoint = sorted((tagger_run / "checkpoints").glob("step-*"))[-1]
    saved = load_model_directory(checkpoint / "model")
    assert isinstance(saved, BertforgeForTokenClassification)
    again = load_for_task(checkpoint / "model", "token_classification", label_names=saved.label_names)
    torch.testing.assert_close(again.classifier.weight, saved.classifier.weight)
    exported = load_model_directory(tagger_run / "final")  # the HF export, imported back
    assert isinstance(exported, BertforgeForTokenClassification)
    assert exported.label_names == saved.label_names
    assert np.isfinite(exported.classifier.weight.detach().numpy()).all()


def test_two_ranks_tag_like_one_process(tagging_data: list[str], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun with 2 ranks: the labeled-word loss units are summed over ranks, so each step is one process's.
    (The one process runs the same command through `main` in this process, and torchrun's launcher runs in it too
    (`helpers.torchrun`): a second interpreter only added start-up; the two ranks are processes either way.)"""
    from helpers.torchrun import torchrun_in_this_process

    overrides = [*QUIET_RUN, *TINY_MODEL, f"model.tokenizer={minilm_dir()}", "model.hidden_dropout=0",
                 "model.attention_dropout=0", "model.classifier_dropout=0", *tagging_data, "finetune.max_length=64",
                 "optim.lr=1e-3", "train.micro_batch_size=16", "train.global_batch_size=32", "train.max_steps=4",
                 "train.log_every=1", "train.eval_every=100", "train.checkpoint_every=100"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the ranks' environment
    runs = {}
    for nproc in (1, 2):
        run_dir = tmp_path / f"ranks-{nproc}"
        config = tmp_path / f"{run_dir.name}.yaml"
        config.write_text(config_to_yaml(load_config(None, [*overrides, f"run.output_dir={tmp_path}",
                                                            f"run.name={run_dir.name}"])))
        if nproc == 1:
            assert main(["-q", "finetune", str(config)]) == 0
        else:
            torchrun_in_this_process("--standalone", f"--nproc_per_node={nproc}", "-m", "bertforge.cli", "-q",
                                     "finetune", str(config))
        runs[nproc] = [r["loss"] for r in metrics_records(run_dir, "train")]
    assert len(runs[1]) == 4
    assert runs[2] == pytest.approx(runs[1], rel=1e-5, abs=1e-6)


def test_evaluate_scores_a_tagger_on_a_conll_file_and_names_the_line_of_an_unknown_tag(
        tagger_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [json.loads(line) for line in (tagger_run.parent / "test.jsonl").read_text().splitlines()][:20]
    conll = tmp_path / "test.conll"
    conll.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(r["tokens"], r["tags"], strict=True)) + "\n"
                             for r in rows), encoding="utf-8")
    out = tmp_path / "report"
    assert main(["evaluate", str(tagger_run), "--data", str(conll), "--split-name", "held", "--out-dir", str(out)]) == 0
    report = json.loads((out / "held_results.json").read_text())
    assert report["metrics"]["examples"] == 20 and {"f1", "precision", "recall", "accuracy"} <= set(report["metrics"])
    assert report["per_class"] and "per entity type" in capsys.readouterr().out
    conll.write_text("The\tO\ndog\tB-noun.dragon\n\n", encoding="utf-8")
    assert main(["evaluate", str(tagger_run), "--data", str(conll)]) == 2
    error = capsys.readouterr().err
    assert f"{conll}:2" in error and "B-noun.dragon" in error


class _SigtermDuringStep(TokenClassificationTask):
    """The tagger, sending itself SIGTERM in the forward pass of training micro-batch `at` (1-based)."""

    at = 0
    calls = 0

    def forward_step(self, batch, model):  # type: ignore[no-untyped-def]
        import os
        import signal

        _SigtermDuringStep.calls += 1
        if model.training and _SigtermDuringStep.calls == _SigtermDuringStep.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().forward_step(batch, model)


def test_a_tagger_stopped_by_sigterm_resumes_to_the_uninterrupted_runs_weights_bit_for_bit(
        tagging_data: list[str], tmp_path: Path) -> None:
    """Dropout on, 2 micro-batches a step, a linear schedule: the resumed run replays the same order, masks and
    learning rates, so its final weights and its logged losses are the uninterrupted run's exactly."""
    from safetensors.torch import load_file

    def config(name: str):  # type: ignore[no-untyped-def]
        return load_config(None, [f"run.output_dir={tmp_path}", f"run.name={name}", *QUIET_RUN, *TINY_MODEL,
                                  f"model.tokenizer={minilm_dir()}", *tagging_data, "finetune.max_length=64",
                                  "optim.lr=1e-3", "schedule.name=linear", "schedule.warmup=2",
                                  "train.micro_batch_size=16", "train.global_batch_size=32", "train.max_steps=6",
                                  "train.log_every=1", "train.eval_every=100", "train.checkpoint_every=100"])

    whole = Trainer(config("whole"), TokenClassificationTask(config("whole"))).fit()
    _SigtermDuringStep.at, _SigtermDuringStep.calls = 2 * 3 + 1, 0  # the first micro-batch of step 4
    stopped = Trainer(config("stopped"), _SigtermDuringStep(config("stopped"))).fit()
    assert stopped.stopped_by == "signal" and stopped.state.step == 4
    resumed = Trainer(config("stopped"), TokenClassificationTask(config("stopped"))).fit()
    assert resumed.stopped_by == "budget" and resumed.state.step == whole.state.step == 6
    ours, reference = (load_file(run.run_dir / "final" / "model.safetensors") for run in (resumed, whole))
    assert ours.keys() == reference.keys()
    for name in reference:
        assert torch.equal(ours[name], reference[name]), name
    assert [r["loss"] for r in metrics_records(tmp_path / "stopped", "train")] == \
        [r["loss"] for r in metrics_records(tmp_path / "whole", "train")]


def test_the_minilm_tagger_follows_hf_token_classification_step_for_step(tagging_data: list[str]) -> None:
    """Dropout off, the same classifier weights, the same sentences: bertforge's tagger (its own unpadded data
    path, the head on first sub-words only) and transformers' `BertForTokenClassification` fed as `run_ner.py`
    feeds it (`is_split_into_words`, -100 off first pieces, `DataCollatorForTokenClassification`) see the same
    tokens and labels and give the same loss at each of 6 AdamW steps with clipping."""
    import transformers

    from bertforge.batch import model_inputs
    from bertforge.models.loading import load_for_task
    from bertforge.train.optim import default_parameter_groups

    overrides = dict(item.split("=", 1) for item in tagging_data)
    rows = [json.loads(line) for line in Path(overrides["finetune.train_file"]).read_text().splitlines()[:48]]
    tags = overrides["finetune.labels"].strip("[]").split(",")
    torch.manual_seed(3)
    ours = load_for_task(minilm_dir(), "token_classification", label_names=tags,
                         config_overrides={"hidden_dropout": 0.0, "attention_dropout": 0.0}).train()
    hf_model = transformers.BertForTokenClassification.from_pretrained(
        str(minilm_dir()), num_labels=len(tags), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa").train()
    hf_model.classifier.load_state_dict(ours.classifier.state_dict())  # the only freshly drawn weights
    dataset = TaggedDataset(TaggedSplit("slice", [r["tokens"] for r in rows],
                                        [[tags.index(t) for t in r["tags"]] for r in rows], tags), minilm_dir(), 128)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()))
    collator = transformers.DataCollatorForTokenClassification(tokenizer)
    optimizers = [torch.optim.AdamW(default_parameter_groups(m, 0.01), lr=5e-4) for m in (ours, hf_model)]
    for step in range(6):
        sentences = range(step * 8, (step + 1) * 8)  # 8 sentences a step: padding differs in every batch
        batch = collate_tagged([dataset[i] for i in sentences])
        encoded = tokenizer([rows[i]["tokens"] for i in sentences], is_split_into_words=True)
        features = []
        for index, i in enumerate(sentences):
            word_ids = encoded.word_ids(batch_index=index)
            labels = [-100 if word is None or word == previous else tags.index(rows[i]["tags"][word])
                      for previous, word in zip([None, *word_ids[:-1]], word_ids, strict=True)]
            features.append({key: encoded[key][index] for key in ("input_ids", "attention_mask", "token_type_ids")}
                            | {"labels": labels})
        hf_batch = collator(features)
        assert torch.equal(hf_batch["input_ids"][hf_batch["attention_mask"].bool()], batch["input_ids"].long())
        assert torch.equal(hf_batch["labels"][hf_batch["labels"] != -100], batch["labels"])
        hf_loss = hf_model(**hf_batch).loss
        our_loss = ours(**model_inputs(batch, extra=("rows",)), labels=batch["labels"]).loss_sum / batch["rows"].numel()
        assert our_loss.item() == pytest.approx(hf_loss.item(), abs=1e-4), step
        for model, loss, optimizer in zip((ours, hf_model), (our_loss, hf_loss), optimizers, strict=True):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
