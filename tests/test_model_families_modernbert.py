"""ModernBERT's multiple-choice scorer against real `transformers` (fp32, CPU).

`ModernBertForMultipleChoice` is the sequence classifier's head with one output per candidate: the
classifier_pooling's state (cls or mean), ModernBertPredictionHead (dense, activation, norm),
dropout at `classifier_dropout`, a linear layer. Each test builds a tiny random model with
`transformers` itself (4 layers, an 8-token window with every second layer global, so candidates
longer than the window run local layers unlike global ones), imports it and checks our packed scores,
the export and six training steps against the stock class. The head's dropout masks in train mode are
checked with every other family's in `tests/test_head_dropout.py`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import transformers
from helpers.hf_step_parity import losses_step_for_step
from test_model_families import assert_choice_scores_and_export_match_the_stock_class, padded_batch, sharpen

import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)
from bertforge.models.hf import from_hf, hf_class_name

VOCAB = 96
CHOICES = 3
NO_DROPOUT = {"mlp_dropout": 0.0, "attention_dropout": 0.0, "embedding_dropout": 0.0, "classifier_dropout": 0.0}


def tiny_choice_model(pooling: str, **overrides: object) -> transformers.ModernBertForMultipleChoice:
    config = transformers.ModernBertConfig(**({
        "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 4, "num_attention_heads": 4,
        "intermediate_size": 48, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
        "sep_token_id": 2, "local_attention": 8, "global_attn_every_n_layers": 2, "classifier_pooling": pooling,
        "attn_implementation": "sdpa"} | overrides))
    model = transformers.ModernBertForMultipleChoice(config)
    sharpen(model)
    return model.eval()


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_multiple_choice_imports_and_exports_with_the_stock_class_scores(tmp_path: Path, pooling: str) -> None:
    hf_model = tiny_choice_model(pooling)
    ours = from_hf(hf_model).eval()
    assert type(ours).__name__ == "BertforgeForMultipleChoice" and ours.config.pooling == pooling
    lengths = [19, 4, 13, 6, 11, 2]  # two questions of CHOICES candidates, some longer than the window
    ids, mask = (tensor.view(2, CHOICES, -1) for tensor in padded_batch(0, lengths))
    assert_choice_scores_and_export_match_the_stock_class(ours, hf_model, ids, mask, "ModernBertForMultipleChoice",
                                                          tmp_path / "export")


def test_training_steps_follow_transformers_step_for_step() -> None:
    """Six AdamW steps with clipping, dropout off: HF's losses step for step (`helpers/hf_step_parity.py`)."""
    hf_model = tiny_choice_model("cls", **NO_DROPOUT)
    ours = from_hf(hf_model)
    batches = [padded_batch(0, [17, 5, 12, 9], seed=seed) for seed in range(6)]
    our_losses, hf_losses = losses_step_for_step(hf_model, ours, "ForMultipleChoice", batches)
    assert our_losses == pytest.approx(hf_losses, abs=1e-4)
    assert abs(our_losses[-1] - our_losses[0]) > 1e-2  # the steps moved the weights


@pytest.mark.parametrize("pooling", ["pooler", "last"])
def test_a_scorer_pooling_other_than_cls_or_mean_has_no_stock_class(pooling: str) -> None:
    """ModernBertForMultipleChoice pools with cls or mean only: another pooling is exported in bertforge's
    format, with the reason, rather than as a stock class that would score differently."""
    imported = from_hf(tiny_choice_model("cls"))
    model = type(imported)(dataclasses.replace(imported.config, pooling=pooling))
    assert hf_class_name(model) == (
        None, f"HF ModernBertForMultipleChoice pools with cls or mean, not pooling={pooling}")
