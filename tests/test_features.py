"""`benchmarks.common.features`: the measures on matrices whose answer is known, and on a real encoder
(all-MiniLM-L6-v2) beside a copy whose last layer maps every token to one vector."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from benchmarks.common.features import (
    attention_entropy,
    common_share,
    effective_rank,
    feature_report,
    mean_cosine,
    uniform_entropy,
)

TEXTS = ["a large bird that swims", "move quickly on foot", "the act of writing a program", "a green vegetable",
         "of or relating to the sea", "a unit of electric charge", "feel sad about a loss", "in a careful manner"]


def test_the_measures_on_known_matrices() -> None:
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(2000, 4, generator=generator)
    assert 3.9 < effective_rank(spread) <= 4.0
    line = torch.randn(50, 1, generator=generator) * torch.tensor([[1.0, 2.0, 3.0]])
    assert effective_rank(line) == pytest.approx(1.0, abs=1e-6)
    same = torch.tensor([[1.0, 2.0, 3.0]]).repeat(10, 1)
    assert common_share(same) == pytest.approx(1.0) and mean_cosine(same) == pytest.approx(1.0)
    assert common_share(torch.cat([same, -same])) == pytest.approx(0.0)
    assert mean_cosine(torch.eye(5)) == pytest.approx(0.0)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    uniform = mask[:, None, None, :].float().expand(2, 3, 4, 4) / mask.sum(dim=1)[:, None, None, None]
    expected = (4 * math.log(4) + 2 * math.log(2)) / 6  # over the 6 real queries
    assert attention_entropy(uniform, mask) == pytest.approx(expected) == uniform_entropy(mask)
    assert attention_entropy(torch.eye(4).expand(2, 3, 4, 4), mask) == pytest.approx(0.0)


@pytest.fixture(scope="module")
def collapsed_minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """all-MiniLM-L6-v2 with its last layer's output LayerNorm gain set to 0: every token's last state is its bias."""
    from transformers import BertModel

    out = tmp_path_factory.mktemp("collapsed")
    model = BertModel.from_pretrained(str(minilm_dir))
    with torch.no_grad():
        model.encoder.layer[-1].output.LayerNorm.weight.zero_()
    model.save_pretrained(str(out))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (minilm_dir / name).is_file():
            shutil.copy(minilm_dir / name, out / name)
    return out


def test_a_real_encoder_tells_texts_apart_and_a_collapsed_one_does_not(minilm_dir: Path,
                                                                       collapsed_minilm: Path) -> None:
    real = feature_report(str(minilm_dir), TEXTS, batch_size=3)
    assert [layer["layer"] for layer in real["layers"]] == list(range(7)) and real["texts"] == len(TEXTS)
    assert real["layers"][0]["attention_entropy"] is None
    assert all(0 < layer["attention_entropy"] < real["uniform_entropy"] for layer in real["layers"][1:])
    assert real["layers"][-1]["common_share"] < 0.9 and real["mean_pooled"]["mean_cosine"] < 0.9
    assert real["cls"]["effective_rank"] > 3
    collapsed = feature_report(str(collapsed_minilm), TEXTS)
    last = collapsed["layers"][-1]
    assert last["common_share"] == pytest.approx(1.0) and collapsed["cls"]["mean_cosine"] == pytest.approx(1.0)
    assert collapsed["layers"][-2] == pytest.approx(real["layers"][-2])  # the layers before are the same model's
