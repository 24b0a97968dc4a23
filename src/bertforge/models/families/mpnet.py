"""Hugging Face MPNet (`model_type: mpnet`): BERT's post-norm layers with a relative position bias, no token types.

Its quirks: separate q/k/v/o matrices per layer (`attention.attn.*`, fused into our one qkv);
learned absolute positions that start after the padding id as RoBERTa's do, except that MPNet's
padding id is fixed at 1 whatever the config says (`position_offset` 2); and a relative position
bias (`encoder.relative_attention_bias`: T5-style buckets of key-query offsets, one table shared by
every layer) added to the attention scores (bertforge's `relative_attention_buckets`,
`models/relative_position.py`). transformers always buckets offsets into 32 whatever
`relative_attention_num_buckets` says, so other values are refused. The MLM head (`lm_head`) and the
sequence classifier (`classifier.dense` + tanh + `classifier.out_proj` on `<s>`) are RoBERTa's.
all-mpnet-base-v2 is an `MPNetModel` with mean pooling (sentence-transformers).

No FlashAttention kernel takes a learned bias: MPNet's layers run SDPA over rows with the
block-diagonal mask folded into the bias, or eager per sequence (`bertforge doctor` says which).
"""

from __future__ import annotations

from typing import Any

import transformers

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.family import (
    OUR_TO_HF_ACTIVATION,
    KeyPair,
    ModelFamily,
    activation_from_hf,
    build_with_optional_pooler,
    layered_keys,
    load_with_optional_pooler,
)
from bertforge.models.families.roberta import MLM_HEAD, SEQUENCE_HEAD, TOKEN_HEAD

PADDING_IDX = 1  # modeling_mpnet.py's MPNetEmbeddings hard-codes it
BUCKETS = 32  # MPNetEncoder.compute_position_bias's fixed num_buckets

ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
    ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
    ("relative_position_bias.embedding.weight", "encoder.relative_attention_bias.weight"),
)
LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.{kind}", ("encoder.layer.{}.attention.attn.q.{kind}",
                                        "encoder.layer.{}.attention.attn.k.{kind}",
                                        "encoder.layer.{}.attention.attn.v.{kind}")),
    ("layers.{}.attention.output.{kind}", "encoder.layer.{}.attention.attn.o.{kind}"),
    ("layers.{}.attention_norm.{kind}", "encoder.layer.{}.attention.LayerNorm.{kind}"),
    ("layers.{}.mlp.input.{kind}", "encoder.layer.{}.intermediate.dense.{kind}"),
    ("layers.{}.mlp.output.{kind}", "encoder.layer.{}.output.dense.{kind}"),
    ("layers.{}.mlp_norm.{kind}", "encoder.layer.{}.output.LayerNorm.{kind}"),
)
POOLER: tuple[KeyPair, ...] = (("pooler.dense.weight", "pooler.dense.weight"),
                               ("pooler.dense.bias", "pooler.dense.bias"))
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "MPNetModel": (), "MPNetForMaskedLM": MLM_HEAD, "MPNetForSequenceClassification": SEQUENCE_HEAD,
    "MPNetForTokenClassification": TOKEN_HEAD,
    # BERT's way: the encoder's tanh pooler, dropout, one score per choice
    "MPNetForMultipleChoice": (("head.pooler.dense.weight", "mpnet.pooler.dense.weight"),
                               ("head.pooler.dense.bias", "mpnet.pooler.dense.bias"),
                               ("head.classifier.weight", "classifier.weight"),
                               ("head.classifier.bias", "classifier.bias"))}
CLASSES = {"MPNetModel": "base", "MPNetForMaskedLM": "pretraining",
           "MPNetForSequenceClassification": "classification", "MPNetForTokenClassification": "token_classification",
           "MPNetForMultipleChoice": "multiple_choice"}


def unfit_reason(config: EncoderConfig) -> str:
    if config.relative_attention_buckets != BUCKETS:
        return f"HF MPNet has a relative position bias of {BUCKETS} buckets (relative_attention_buckets = {BUCKETS})"
    if config.hf_model_type not in (None, "mpnet"):
        return f"the model was imported as {config.hf_model_type}, not mpnet"
    if (config.position, config.mlp, config.norm, config.bias) != ("learned", "gelu", "post", True):
        return (f"position={config.position}, mlp={config.mlp}, norm={config.norm}, bias={config.bias} is not HF "
                "MPNet's learned/gelu/post/bias")
    if config.local_attention_window is not None or config.projects_embeddings:
        return "HF MPNet has no local attention and no embedding projection"
    if config.type_vocab_size != 0 or config.position_offset != PADDING_IDX + 1:
        return (f"HF MPNet has no token types and numbers positions from {PADDING_IDX + 1} (type_vocab_size = 0, "
                f"position_offset = {PADDING_IDX + 1})")
    return ""


def class_for(kind: str, model: Any) -> tuple[str | None, str]:
    if kind == "base":
        return "MPNetModel", ""
    if kind == "pretraining":
        if model.nsp:
            return None, "HF MPNet has no next-sentence-prediction head"
        if model.config.activation != "gelu":
            return None, f"HF MPNet's MLM head applies exact GELU, not activation={model.config.activation}"
        return "MPNetForMaskedLM", ""
    if kind == "token_classification":
        return "MPNetForTokenClassification", ""
    hf_class = "MPNetForMultipleChoice" if kind == "multiple_choice" else "MPNetForSequenceClassification"
    if model.config.pooling != "pooler":
        return None, f"HF {hf_class} always uses dense+tanh on <s>, not pooling={model.config.pooling}"
    return hf_class, ""


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    if hf.relative_attention_num_buckets != BUCKETS:
        raise BertforgeError(f"{source}: relative_attention_num_buckets is {hf.relative_attention_num_buckets}; "
                             f"transformers' MPNet buckets offsets into {BUCKETS} whatever it says, so only "
                             f"{BUCKETS} is imported")
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, intermediate_size=hf.intermediate_size,
        max_position_embeddings=hf.max_position_embeddings, type_vocab_size=0, position_offset=PADDING_IDX + 1,
        relative_attention_buckets=BUCKETS, hidden_dropout=hf.hidden_dropout_prob,
        attention_dropout=hf.attention_probs_dropout_prob, norm_eps=hf.layer_norm_eps,
        activation=activation_from_hf(hf.hidden_act, source, "hidden_act"), position="learned", mlp="gelu",
        norm="post", bias=True, tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        pooling="pooler", initializer_range=hf.initializer_range, hf_model_type="mpnet",
    )


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    return transformers.MPNetConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
        hidden_act=OUR_TO_HF_ACTIVATION[config.activation], hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        max_position_embeddings=config.max_position_embeddings, layer_norm_eps=config.norm_eps,
        initializer_range=config.initializer_range, relative_attention_num_buckets=BUCKETS,
        bos_token_id=special_tokens.get("cls"), eos_token_id=special_tokens.get("sep"), **common)


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    return layered_keys(config, ENCODER, LAYER, POOLER if pooler else ())


FAMILY = ModelFamily(
    name="mpnet", model_type="mpnet", encoder_prefix="mpnet.", classes=CLASSES, head_keys=HEADS,
    unfit_reason=unfit_reason, class_for=class_for, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys, build_hf_model=build_with_optional_pooler, load_arguments=load_with_optional_pooler,
)
