"""Hugging Face ModernBERT (`model_type: modernbert`): RoPE, GeGLU, pre-norm, no biases, no token types,
alternating local (sliding-window) and global attention.

Its quirks: the first layer has no attention norm (the embeddings' norm precedes it); a final
norm after the last layer; one `bias` switch and one activation for the whole model; the global
layers are every n-th from layer 0; the sequence classifier and the multiple-choice scorer pool
with cls or mean through a dense + norm head, then dropout at `classifier_dropout`.
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
    common_unfit_reason,
    fill,
)

if TYPE_CHECKING:
    import transformers

ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.tok_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.norm.weight"),
    ("final_norm.weight", "final_norm.weight"),
)
LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.weight", "layers.{}.attn.Wqkv.weight"),
    ("layers.{}.attention.output.weight", "layers.{}.attn.Wo.weight"),
    ("layers.{}.mlp.input.weight", "layers.{}.mlp.Wi.weight"),
    ("layers.{}.mlp.output.weight", "layers.{}.mlp.Wo.weight"),
    ("layers.{}.mlp_norm.weight", "layers.{}.mlp_norm.weight"),
)
# layer 0 has no attention norm: the embeddings' norm precedes it
LAYER_AFTER_FIRST: tuple[KeyPair, ...] = (("layers.{}.attention_norm.weight", "layers.{}.attn_norm.weight"),)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "ModernBertModel": (),
    "ModernBertForMaskedLM": (
        ("mlm_head.transform.dense.weight", "head.dense.weight"),
        ("mlm_head.transform.norm.weight", "head.norm.weight"),
        ("mlm_head.decoder.weight", "decoder.weight"),
        ("mlm_head.decoder.bias", "decoder.bias")),
}
# ModernBertPredictionHead (dense, activation, norm) on the classifier_pooling's state, dropout, then the linear
# layer: the sequence classifier's, and the multiple-choice scorer's with one output per candidate
POOLED_HEAD: tuple[KeyPair, ...] = (
    ("head.transform.dense.weight", "head.dense.weight"),
    ("head.transform.norm.weight", "head.norm.weight"),
    ("head.classifier.weight", "classifier.weight"),
    ("head.classifier.bias", "classifier.bias"))
HEADS |= {"ModernBertForSequenceClassification": POOLED_HEAD, "ModernBertForMultipleChoice": POOLED_HEAD}
POOLED_CLASSES = ("ModernBertForSequenceClassification", "ModernBertForMultipleChoice")


def unfit_reason(config: EncoderConfig) -> str:
    reason = common_unfit_reason(config, "ModernBERT", ("rope", "geglu", "pre", False), local_attention=True)
    if reason:
        return reason
    if config.type_vocab_size != 0:
        return "HF ModernBERT has no token-type embeddings (needs type_vocab_size = 0)"
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class == "ModernBertModel" and model.pooler is not None:
        return "HF ModernBertModel has no BERT pooler"
    if hf_class == "ModernBertForPreTraining":
        return "HF ModernBERT has no next-sentence-prediction head"
    if hf_class == "ModernBertForTokenClassification":  # not mapped: bertforge's tagger is one linear layer
        return "HF ModernBertForTokenClassification has a dense+norm head before its classifier"
    if hf_class in POOLED_CLASSES and model.config.pooling not in ("cls", "mean"):
        return f"HF {hf_class} pools with cls or mean, not pooling={model.config.pooling}"
    return ""


def _global_every_n(layer_types: list[str], source: str) -> tuple[bool, int | None]:
    """(any local layer, n) such that layer i is global iff i % n == 0."""
    is_global = [kind == "full_attention" for kind in layer_types]
    if all(is_global):
        return False, None
    if not any(is_global):
        return True, None
    for n in range(1, len(is_global) + 1):
        if all(flag == (i % n == 0) for i, flag in enumerate(is_global)):
            return True, n
    raise BertforgeError(f"{source}: layer_types {layer_types} is not 'every n-th layer global, starting at 0'; "
                         "bertforge cannot represent this alternation")


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    biases = {name: getattr(hf, name) for name in ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias")}
    if len(set(biases.values())) != 1:
        raise BertforgeError(f"{source}: mixed bias settings {biases}; bertforge has one `bias` switch for all")
    activation = activation_from_hf(hf.hidden_activation, source, "hidden_activation")
    if activation_from_hf(hf.classifier_activation, source, "classifier_activation") != activation:
        raise BertforgeError(f"{source}: classifier_activation differs from hidden_activation; "
                             "bertforge uses one activation for both")
    rope = hf.rope_parameters
    for kind in ("full_attention", "sliding_attention"):
        if rope[kind].get("rope_type", "default") != "default":
            raise BertforgeError(f"{source}: rope_type {rope[kind]['rope_type']!r} ({kind}) is not supported; "
                                 "only the default RoPE")
    has_local, every_n = _global_every_n(list(hf.layer_types), source)
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, intermediate_size=hf.intermediate_size,
        max_position_embeddings=hf.max_position_embeddings, type_vocab_size=0,
        hidden_dropout=float(hf.mlp_dropout), attention_dropout=float(hf.attention_dropout),
        classifier_dropout=float(hf.classifier_dropout), norm_eps=hf.norm_eps, activation=activation,
        position="rope", mlp="geglu", norm="pre", bias=biases["attention_bias"],
        local_attention_window=hf.local_attention if has_local else None, global_every_n=every_n,
        rope_theta=float(rope["full_attention"]["rope_theta"]),
        rope_theta_local=float(rope["sliding_attention"]["rope_theta"]),
        tie_word_embeddings=bool(hf.tie_word_embeddings), pooling=hf.classifier_pooling,
        initializer_range=hf.initializer_range,
    )


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    activation = OUR_TO_HF_ACTIVATION[config.activation]
    layer_types = ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                   for i in range(config.num_layers)]
    return transformers.ModernBertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
        hidden_activation=activation, classifier_activation=activation,
        max_position_embeddings=config.max_position_embeddings, initializer_range=config.initializer_range,
        norm_eps=config.norm_eps, norm_bias=False, attention_bias=False, mlp_bias=False, classifier_bias=False,
        decoder_bias=True, attention_dropout=config.attention_dropout, embedding_dropout=config.hidden_dropout,
        mlp_dropout=config.hidden_dropout, classifier_dropout=config.effective_classifier_dropout,
        classifier_pooling=config.pooling if config.pooling in ("cls", "mean") else "cls",
        layer_types=layer_types, local_attention=config.local_attention_window or 128,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
                         "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_theta_local}},
        bos_token_id=special_tokens.get("cls"), cls_token_id=special_tokens.get("cls"),
        eos_token_id=special_tokens.get("sep"), sep_token_id=special_tokens.get("sep"), **common)


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    pairs = [fill(pair) for pair in ENCODER]
    for i in range(config.num_layers):
        pairs += [fill(pair, i) for pair in LAYER + (LAYER_AFTER_FIRST if i > 0 else ())]
    return pairs


FAMILY = ModelFamily(
    name="modernbert", model_type="modernbert", hf_prefix="ModernBert", encoder_prefix="model.", head_keys=HEADS,
    unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys,
    classifier_start="a new dense + activation + norm (ModernBertPredictionHead) on its classifier_pooling's state",
)
