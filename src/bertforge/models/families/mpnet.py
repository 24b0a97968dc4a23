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

from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.bert import bert_config_values
from bertforge.models.families.family import (
    KeyPair,
    ModelFamily,
    activation_from_hf,
    build_with_optional_pooler,
    common_unfit_reason,
    layered_keys,
    load_with_optional_pooler,
)
from bertforge.models.families.roberta import MLM_HEAD, SEQUENCE_HEAD, TOKEN_HEAD

if TYPE_CHECKING:
    import transformers

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
POOLED_CLASSES = ("MPNetForSequenceClassification", "MPNetForMultipleChoice")  # dense+tanh on <s>


def unfit_reason(config: EncoderConfig) -> str:
    if config.relative_attention_buckets != BUCKETS:
        return f"HF MPNet has a relative position bias of {BUCKETS} buckets (relative_attention_buckets = {BUCKETS})"
    reason = common_unfit_reason(config, "MPNet", ("learned", "gelu", "post", True), model_types=(None, "mpnet"),
                                 relative_bias=True)
    if reason:
        return reason
    if config.type_vocab_size != 0 or config.position_offset != PADDING_IDX + 1:
        return (f"HF MPNet has no token types and numbers positions from {PADDING_IDX + 1} (type_vocab_size = 0, "
                f"position_offset = {PADDING_IDX + 1})")
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class == "MPNetForPreTraining":
        return "HF MPNet has no next-sentence-prediction head"
    if hf_class == "MPNetForMaskedLM" and model.config.activation != "gelu":
        return f"HF MPNet's MLM head applies exact GELU, not activation={model.config.activation}"
    if hf_class in POOLED_CLASSES and model.config.pooling != "pooler":
        return f"HF {hf_class} always uses dense+tanh on <s>, not pooling={model.config.pooling}"
    return ""


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
        # MPNetClassificationHead: dropout, dense, tanh, dropout, out_proj; every MPNet head drops out at
        # hidden_dropout_prob (MPNetConfig has no classifier_dropout), so a run's model.hidden_dropout moves them
        pooling="pooler", classifier_input_dropout=True, token_classifier_dropout="hidden",
        choice_classifier_dropout="hidden",
        initializer_range=hf.initializer_range, hf_model_type="mpnet",
    )


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    return transformers.MPNetConfig(
        relative_attention_num_buckets=BUCKETS, bos_token_id=special_tokens.get("cls"),
        eos_token_id=special_tokens.get("sep"), **bert_config_values(config, common))


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    return layered_keys(config, ENCODER, LAYER, POOLER if pooler else ())


FAMILY = ModelFamily(
    name="mpnet", model_type="mpnet", hf_prefix="MPNet", encoder_prefix="mpnet.", head_keys=HEADS,
    unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys, classifier_start="a new dense + tanh on <s> (MPNetClassificationHead)",
    build_hf_model=build_with_optional_pooler, load_arguments=load_with_optional_pooler, reads_classifier_dropout=False,
)
