"""Presets, config-section overrides and validation of the encoder configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertforge.config import ModelSection, load_config
from bertforge.errors import BertforgeError, ConfigError
from bertforge.models import BertforgeForPreTraining, EncoderConfig, encoder_config_from_section, get_preset
from bertforge.models.config import PRESETS


def test_every_preset_builds_a_valid_config_with_the_papers_shapes() -> None:
    assert set(PRESETS) == {"bert-tiny", "bert-mini", "bert-small", "bert-base", "bert-large", "mosaic-bert-base",
                            "modernbert-base", "crammed-bert", "roberta-base", "roberta-tiny",
                            "deberta-v3-small", "deberta-v3-tiny", "distilbert-base-multilingual-cased",
                            "distilbert-tiny"}
    base = get_preset("bert-base")
    assert (base.hidden_size, base.num_layers, base.num_heads, base.intermediate_size) == (768, 12, 12, 3072)
    assert (base.position, base.mlp, base.norm, base.bias) == ("learned", "gelu", "post", True)
    assert get_preset("mosaic-bert-base").position == "alibi"
    modern = get_preset("modernbert-base")
    assert (modern.position, modern.mlp, modern.norm, modern.bias) == ("rope", "geglu", "pre", False)
    assert [modern.is_global_layer(i) for i in range(6)] == [True, False, False, True, False, False]
    assert modern.layer_window(1) == 64 and modern.layer_window(0) is None
    assert (modern.layer_rope_theta(0), modern.layer_rope_theta(1)) == (160000.0, 10000.0)
    assert get_preset("crammed-bert").num_layers == 16
    roberta = get_preset("roberta-base")  # positions after the pad id 1: 514 rows for 512 tokens
    assert (roberta.position_offset, roberta.max_sequence_length, roberta.type_vocab_size) == (2, 512, 1)


def test_presets_are_fresh_copies() -> None:
    get_preset("bert-tiny").hidden_size = 1
    assert get_preset("bert-tiny").hidden_size == 128


def test_unknown_preset_names_the_closest_and_lists_all() -> None:
    with pytest.raises(ConfigError, match=r"unknown model preset 'bert-bas'.*did you mean `bert-base`.*crammed-bert"):
        get_preset("bert-bas")


def test_section_overrides_the_preset_and_pads_the_tokenizer_vocabulary() -> None:
    section = ModelSection(preset="bert-base", hidden_size=256, num_heads=4, position="alibi", bias=False)
    config = encoder_config_from_section(section, vocab_size=30522)
    assert config.vocab_size == 30528  # padded to a multiple of 64
    assert (config.hidden_size, config.num_heads, config.position, config.bias) == (256, 4, "alibi", False)
    assert config.num_layers == 12  # untouched fields keep the preset's value


def test_section_from_yaml_overrides_reaches_the_encoder(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text("model:\n  preset: bert-mini\n  num_layers: 2\n  vocab_size: 100\n", encoding="utf-8")
    config = encoder_config_from_section(load_config(path, ["model.norm=pre"]).model, vocab_size=30522)
    assert (config.num_layers, config.norm, config.vocab_size, config.hidden_size) == (2, "pre", 128, 256)


def test_inconsistent_shapes_are_rejected_with_the_key_to_change() -> None:
    with pytest.raises(ConfigError, match="`hidden_size` .* not a multiple of `num_heads`"):
        EncoderConfig(hidden_size=100, num_heads=3)
    with pytest.raises(ConfigError, match="position"):
        EncoderConfig(position="sinusoidal")
    with pytest.raises(ConfigError, match="unknown encoder field `hiden_size`.*did you mean `hidden_size`"):
        EncoderConfig.from_dict({"hiden_size": 64})


def test_a_model_rejects_sequences_longer_than_its_learned_positions() -> None:
    model = BertforgeForPreTraining(EncoderConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2,
                                                  intermediate_size=32, max_position_embeddings=8))
    with pytest.raises(BertforgeError, match="exceeds the model's 8 learned positions"):
        model(torch.zeros(10, dtype=torch.long))
