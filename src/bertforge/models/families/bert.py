"""Hugging Face BERT (`model_type: bert`): learned positions, GELU MLP, post-norm, biases.

Its quirks: separate query/key/value matrices, which bertforge keeps fused in one (one matmul);
the MLM decoder's bias stored twice (`cls.predictions.bias` and the decoder's own); a tanh pooler
on [CLS] that the sequence classifier always uses and a bare `BertModel` may lack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.family import (
    OUR_TO_HF_ACTIVATION,
    KeyPair,
    ModelFamily,
    activation_from_hf,
    build_with_optional_pooler,
    common_unfit_reason,
    layered_keys,
    load_with_optional_pooler,
)

if TYPE_CHECKING:
    import transformers

ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
    ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
)
LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.{kind}", ("encoder.layer.{}.attention.self.query.{kind}",
                                        "encoder.layer.{}.attention.self.key.{kind}",
                                        "encoder.layer.{}.attention.self.value.{kind}")),
    ("layers.{}.attention.output.{kind}", "encoder.layer.{}.attention.output.dense.{kind}"),
    ("layers.{}.attention_norm.{kind}", "encoder.layer.{}.attention.output.LayerNorm.{kind}"),
    ("layers.{}.mlp.input.{kind}", "encoder.layer.{}.intermediate.dense.{kind}"),
    ("layers.{}.mlp.output.{kind}", "encoder.layer.{}.output.dense.{kind}"),
    ("layers.{}.mlp_norm.{kind}", "encoder.layer.{}.output.LayerNorm.{kind}"),
)
POOLER: tuple[KeyPair, ...] = (("pooler.dense.weight", "pooler.dense.weight"),
                               ("pooler.dense.bias", "pooler.dense.bias"))
MLM_HEAD: tuple[KeyPair, ...] = (
    ("mlm_head.transform.dense.weight", "cls.predictions.transform.dense.weight"),
    ("mlm_head.transform.dense.bias", "cls.predictions.transform.dense.bias"),
    ("mlm_head.transform.norm.weight", "cls.predictions.transform.LayerNorm.weight"),
    ("mlm_head.transform.norm.bias", "cls.predictions.transform.LayerNorm.bias"),
    ("mlm_head.decoder.weight", "cls.predictions.decoder.weight"),
    ("mlm_head.decoder.bias", "cls.predictions.bias"),
    ("mlm_head.decoder.bias", "cls.predictions.decoder.bias"),  # the same bias, kept twice by transformers
)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "BertModel": (),
    "BertForMaskedLM": MLM_HEAD,
    "BertForPreTraining": MLM_HEAD + (
        ("nsp_head.pooler.dense.weight", "bert.pooler.dense.weight"),
        ("nsp_head.pooler.dense.bias", "bert.pooler.dense.bias"),
        ("nsp_head.classifier.weight", "cls.seq_relationship.weight"),
        ("nsp_head.classifier.bias", "cls.seq_relationship.bias")),
    "BertForSequenceClassification": (
        ("head.pooler.dense.weight", "bert.pooler.dense.weight"),
        ("head.pooler.dense.bias", "bert.pooler.dense.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
    "BertForTokenClassification": (("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")),
    "BertForMultipleChoice": (  # the sequence classifier's pooler and linear layer, one score per choice
        ("head.pooler.dense.weight", "bert.pooler.dense.weight"),
        ("head.pooler.dense.bias", "bert.pooler.dense.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
}
POOLED_CLASSES = ("BertForSequenceClassification", "BertForMultipleChoice")  # their head reads the tanh pooler


def unfit_reason(config: EncoderConfig) -> str:
    reason = common_unfit_reason(config, "BERT", ("learned", "gelu", "post", True), model_types=(None, "bert"))
    if reason:
        return reason
    if config.type_vocab_size < 1:
        return "HF BERT needs token-type embeddings (type_vocab_size >= 1)"
    if config.position_offset:
        return "HF BERT numbers positions from 0 (position_offset = 0)"
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class in POOLED_CLASSES and model.config.pooling != "pooler":
        return f"HF {hf_class} always uses the tanh pooler, not pooling={model.config.pooling}"
    return ""


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    position_type = getattr(hf, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise BertforgeError(f"{source}: position_embedding_type={position_type!r} is not supported; "
                             "bertforge imports checkpoints with absolute (learned) positions")
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, intermediate_size=hf.intermediate_size,
        max_position_embeddings=hf.max_position_embeddings, type_vocab_size=hf.type_vocab_size,
        hidden_dropout=hf.hidden_dropout_prob, attention_dropout=hf.attention_probs_dropout_prob,
        classifier_dropout=getattr(hf, "classifier_dropout", None), norm_eps=hf.layer_norm_eps,
        activation=activation_from_hf(hf.hidden_act, source, "hidden_act"), position="learned", mlp="gelu",
        norm="post", bias=True, tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        pooling="pooler", initializer_range=hf.initializer_range,
    )


def bert_config_values(config: EncoderConfig, common: dict[str, object]) -> dict[str, object]:
    """The keyword arguments of a `transformers` config in BERT's names, which the families built on BERT's
    layers (RoBERTa, ELECTRA, MPNet, DeBERTa-v2) take too, with the settings every class shares (`common`)."""
    return {"vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size, "hidden_act": OUR_TO_HF_ACTIVATION[config.activation],
            "hidden_dropout_prob": config.hidden_dropout, "attention_probs_dropout_prob": config.attention_dropout,
            "max_position_embeddings": config.max_position_embeddings, "layer_norm_eps": config.norm_eps,
            "initializer_range": config.initializer_range} | common


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    return transformers.BertConfig(type_vocab_size=config.type_vocab_size,
                                   classifier_dropout=config.classifier_dropout, **bert_config_values(config, common))


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    return layered_keys(config, ENCODER, LAYER, POOLER if pooler else ())


FAMILY = ModelFamily(
    name="bert", model_type="bert", hf_prefix="Bert", encoder_prefix="bert.", head_keys=HEADS,
    unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys, classifier_start="BERT's pooler (dense + tanh on [CLS], as pre-training left it)",
    build_hf_model=build_with_optional_pooler, load_arguments=load_with_optional_pooler,
)
