"""Every fine-tuning head starts from one draw (`models/init.init_head`): a plain normal of std
initializer_range as `transformers` draws it, not BERT's truncated normal (which the encoder keeps)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from scipy import stats
from torch import nn

from bertforge.models import BertforgeForSequenceClassification, BertforgeForTokenClassification
from bertforge.tasks.multiple_choice import BertforgeForMultipleChoice
from tests.helpers.models import tiny_config

STD = 0.02
# hidden 256 x 64 labels: 16,384 weights per classifier, about 745 beyond 2 std when plain normal
CONFIG = tiny_config(hidden_size=256, num_layers=1, num_heads=4, intermediate_size=64, initializer_range=STD)
HEADS = {
    "sequence classification, BERT's pooler": lambda: BertforgeForSequenceClassification(CONFIG, 64).head,
    "sequence classification, [CLS] + transform": lambda: BertforgeForSequenceClassification(
        dataclasses.replace(CONFIG, pooling="cls"), 64).head,
    "regression, mean pooling": lambda: BertforgeForSequenceClassification(
        dataclasses.replace(CONFIG, pooling="mean"), 1, problem_type="regression").head,
    "token classification": lambda: BertforgeForTokenClassification(CONFIG, 64).classifier,
    "multiple choice": lambda: BertforgeForMultipleChoice(CONFIG).head,
}


@pytest.mark.parametrize("head", list(HEADS))
def test_every_fine_tuning_head_is_drawn_plain_normal(head: str) -> None:
    torch.manual_seed(0)
    module = HEADS[head]()
    linears = [child for child in module.modules() if isinstance(child, nn.Linear)]
    assert linears
    for linear in linears:
        weights = linear.weight.detach().flatten().numpy()
        # a truncated draw has 12% less spread and nothing beyond 2 std: both checks fail on it
        assert weights.std() == pytest.approx(STD, rel=0.05 if weights.size > 10_000 else 0.15)
        beyond = (abs(weights) > 2 * STD).mean()
        assert beyond == pytest.approx(0.0455, abs=0.01 if weights.size > 10_000 else 0.03)
        assert stats.kstest(weights, "norm", args=(0.0, STD)).pvalue > 0.001
        assert linear.bias is None or torch.count_nonzero(linear.bias) == 0
    for norm in (child for child in module.modules() if isinstance(child, nn.LayerNorm)):
        assert torch.equal(norm.weight, torch.ones_like(norm.weight))


def test_the_encoder_under_a_head_keeps_berts_truncated_draw() -> None:
    torch.manual_seed(0)
    query_key_value = BertforgeForSequenceClassification(CONFIG, 64).encoder.layers[0].attention.qkv.weight
    assert query_key_value.abs().max().item() <= 2 * STD
