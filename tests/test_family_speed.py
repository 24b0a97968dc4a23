"""benchmarks/family_speed.py's setup: every family's initial model is the family's stock sequence classifier, the
same model for both arms (bertforge's import scores the family's own tokenizer's ids as transformers does), and
each arm runs a real optimizer step from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from benchmarks.common.tasks import load_task
from benchmarks.family_speed import (
    FAMILIES,
    SHAPES,
    run_bertforge,
    run_hf,
    save_initial_model,
    train_tokenizers,
)
from bertforge.data.bundled import supersense_lines

STOCK_PREFIX = {"bert": "Bert", "distilbert": "DistilBert", "roberta": "Roberta", "xlm-roberta": "XLMRoberta",
                "electra": "Electra", "deberta-v3": "DebertaV2", "mpnet": "MPNet", "modernbert": "ModernBert"}
TEXTS = ["a person who flies an aircraft", "the act of moving something from one place to another"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path], object]:
    workdir = tmp_path_factory.mktemp("family-speed")
    texts = [json.loads(line)["text"] for line in supersense_lines("train", 400)]
    tokenizers = train_tokenizers(workdir, texts, {setup.tokenizer for setup in FAMILIES.values()}, 512)
    return workdir, tokenizers, load_task("supersense", 32, 1)


def test_every_family_of_the_table_has_a_setup() -> None:
    assert set(FAMILIES) == set(STOCK_PREFIX)
    assert "disentangled" in FAMILIES["deberta-v3"].bertforge_attention  # the table says DeBERTa's path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_both_arms_start_from_the_familys_stock_classifier_with_equal_logits(family: str, setup: tuple) -> None:
    from bertforge.inference import load_model

    workdir, tokenizers, task = setup
    source = save_initial_model(family, tokenizers[FAMILIES[family].tokenizer], SHAPES["tiny"], task,
                                workdir / f"init-{family}")
    stock = transformers.AutoModelForSequenceClassification.from_pretrained(str(source)).eval()
    assert type(stock).__name__ == f"{STOCK_PREFIX[family]}ForSequenceClassification"
    assert stock.config.num_labels == len(task.labels)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    assert stock.config.pad_token_id == tokenizer.pad_token_id  # RoBERTa's positions count from it
    if family == "mpnet":  # transformers counts MPNet's positions from id 1 whatever the config says
        assert tokenizer.pad_token_id == 1
    ours = load_model(str(source)).model.eval()
    for text in TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            assert (ours(ids).logits - stock(input_ids=ids).logits).abs().max().item() <= 1e-5, text


def test_each_arm_runs_an_optimizer_step_of_deberta(setup: tuple) -> None:
    """One family suffices for the arms' plumbing: DeBERTa-v3's, the one whose attention takes its own path."""
    workdir, tokenizers, task = setup
    family = "deberta-v3"
    source = workdir / f"init-{family}"
    if not source.is_dir():
        save_initial_model(family, tokenizers[FAMILIES[family].tokenizer], SHAPES["tiny"], task, source)
    ours = run_bertforge(workdir, task, source, epochs=1, max_steps=1)
    theirs = run_hf(workdir, task, source, epochs=1, max_steps=1)
    assert (ours.steps, theirs.steps) == (1, 1)
    assert ours.seconds > 0 and theirs.seconds > 0
    # bertforge computes the real tokens only; HF's collator pads the batch to its longest
    assert 0 < ours.positions < theirs.positions
