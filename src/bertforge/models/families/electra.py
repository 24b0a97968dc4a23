"""Hugging Face ELECTRA (`model_type: electra`): the discriminator, and the generator as a masked-LM model.

The encoder is BERT's, layer for layer and name for name. Its quirks: the embeddings have their own
width (`embedding_size`; electra-small: 128 against hidden 256), are summed and normalised at it,
and `embeddings_project` widens them to hidden_size (bertforge's `embedding_size` and
`embeddings.project`); no pooler; a sequence classifier of its own (`classifier.dense` + exact GELU
+ `classifier.out_proj` on [CLS]: `pooling: gelu_pooler`); the generator (`ElectraForMaskedLM`)
maps back to the embeddings' width (`generator_predictions`: dense + GELU + norm) and decodes with
the word embeddings. `ElectraForPreTraining` (the discriminator as released, e.g.
google/electra-base-discriminator) imports as its encoder: its replaced-token-detection head
(`discriminator_predictions`) has no bertforge counterpart and is left out, with a message.
An import remembers `model_type: electra` (`hf_model_type`), so an electra-base (embeddings as wide
as the encoder, no projection) exports as ELECTRA too, not as the BERT it equals.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import transformers

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.bert import config_from_hf as bert_config_from_hf
from bertforge.models.families.bert import encoder_keys as bert_encoder_keys
from bertforge.models.families.family import OUR_TO_HF_ACTIVATION, KeyPair, ModelFamily, fill

SUMMARY = ("first", True, "gelu")  # ElectraSequenceSummary's defaults: what gelu_pooler computes
PROJECTION: tuple[KeyPair, ...] = (("embeddings.project.{kind}", "embeddings_project.{kind}"),)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "ElectraModel": (),
    "ElectraForPreTraining": (),  # the discriminator's head is not imported (see the module docstring)
    "ElectraForMaskedLM": (
        ("mlm_head.transform.dense.weight", "generator_predictions.dense.weight"),
        ("mlm_head.transform.dense.bias", "generator_predictions.dense.bias"),
        ("mlm_head.transform.norm.weight", "generator_predictions.LayerNorm.weight"),
        ("mlm_head.transform.norm.bias", "generator_predictions.LayerNorm.bias"),
        ("mlm_head.decoder.weight", "generator_lm_head.weight"),
        ("mlm_head.decoder.bias", "generator_lm_head.bias")),
    "ElectraForSequenceClassification": (
        ("head.pooler.dense.weight", "classifier.dense.weight"),
        ("head.pooler.dense.bias", "classifier.dense.bias"),
        ("head.classifier.weight", "classifier.out_proj.weight"),
        ("head.classifier.bias", "classifier.out_proj.bias")),
    "ElectraForTokenClassification": (("classifier.weight", "classifier.weight"),
                                      ("classifier.bias", "classifier.bias")),
    # its sequence summary with transformers' defaults (first token, projection, GELU) is gelu_pooler's dense
    "ElectraForMultipleChoice": (
        ("head.pooler.dense.weight", "sequence_summary.summary.weight"),
        ("head.pooler.dense.bias", "sequence_summary.summary.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
}
# ElectraModel first: it is the class a bare encoder exports as
CLASSES = {"ElectraModel": "base", "ElectraForPreTraining": "base", "ElectraForMaskedLM": "pretraining",
           "ElectraForSequenceClassification": "classification",
           "ElectraForTokenClassification": "token_classification", "ElectraForMultipleChoice": "multiple_choice"}


def unfit_reason(config: EncoderConfig) -> str:
    if config.hf_model_type != "electra" and not config.projects_embeddings:
        return "ELECTRA holds models imported from it or with narrower embeddings (embedding_size)"
    if (config.position, config.mlp, config.norm, config.bias) != ("learned", "gelu", "post", True):
        return (f"position={config.position}, mlp={config.mlp}, norm={config.norm}, bias={config.bias} is not HF "
                "ELECTRA's learned/gelu/post/bias")
    if config.local_attention_window is not None or config.relative_attention_buckets:
        return "HF ELECTRA has no local attention and no relative position bias"
    if config.type_vocab_size < 1 or config.position_offset:
        return "HF ELECTRA needs token-type embeddings and numbers positions from 0"
    return ""


def class_for(kind: str, model: Any) -> tuple[str | None, str]:
    if kind == "base":
        if model.pooler is not None:
            return None, "HF ElectraModel has no pooler"
        return "ElectraModel", ""
    if kind == "pretraining":
        if model.nsp:
            return None, "HF ELECTRA has no next-sentence-prediction head"
        if model.config.activation != "gelu":
            return None, (f"HF ElectraForMaskedLM's generator head applies exact GELU, not "
                          f"activation={model.config.activation}")
        return "ElectraForMaskedLM", ""
    if kind == "token_classification":
        return "ElectraForTokenClassification", ""
    hf_class = "ElectraForMultipleChoice" if kind == "multiple_choice" else "ElectraForSequenceClassification"
    if model.config.pooling != "gelu_pooler":
        return None, (f"HF {hf_class} always uses dense+GELU on [CLS] (pooling=gelu_pooler), "
                      f"not pooling={model.config.pooling}")
    return hf_class, ""


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    """BERT's mapping, plus the embeddings' width, ELECTRA's classifier head and its model_type."""
    summary = (hf.summary_type, hf.summary_use_proj, hf.summary_activation)
    if summary != SUMMARY:  # ElectraForMultipleChoice's head; the other classes never read these keys
        raise BertforgeError(f"{source}: summary_type/summary_use_proj/summary_activation are {summary}; bertforge "
                             f"imports ELECTRA checkpoints with transformers' defaults {SUMMARY} (dense+GELU on [CLS])")
    embedding_size = hf.embedding_size if hf.embedding_size != hf.hidden_size else None
    return dataclasses.replace(bert_config_from_hf(hf, source), embedding_size=embedding_size,
                               pooling="gelu_pooler", hf_model_type="electra")


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    return transformers.ElectraConfig(
        vocab_size=config.vocab_size, embedding_size=config.embedding_width, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size, hidden_act=OUR_TO_HF_ACTIVATION[config.activation],
        hidden_dropout_prob=config.hidden_dropout, attention_probs_dropout_prob=config.attention_dropout,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
        layer_norm_eps=config.norm_eps, initializer_range=config.initializer_range,
        classifier_dropout=config.classifier_dropout,
        summary_last_dropout=config.effective_classifier_dropout, **common)  # ElectraForMultipleChoice's dropout


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    pairs = bert_encoder_keys(config, False)
    if config.projects_embeddings:
        pairs += [fill(pair, kind=kind) for kind in ("weight", "bias") for pair in PROJECTION]
    return pairs


FAMILY = ModelFamily(
    name="electra", model_type="electra", encoder_prefix="electra.", classes=CLASSES, head_keys=HEADS,
    unfit_reason=unfit_reason, class_for=class_for, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys,
)
