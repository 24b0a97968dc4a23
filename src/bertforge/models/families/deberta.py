"""Hugging Face DeBERTa-v2 (`model_type: deberta-v2`, which every DeBERTa-v3 checkpoint uses).

BERT's post-norm layers with disentangled attention (`models/disentangled_attention.py`): content-to-
position and position-to-content scores from one relative-distance table for the whole encoder
(`encoder.rel_embeddings`, normed when `norm_rel_ebd` says layer_norm), log-bucketed distances
(`position_buckets`, up to `max_relative_positions`), the scale 1/sqrt(head_dim x (1 + terms)); with
`position_biased_input: false` (v2 and v3) no absolute positions at all. Its quirks here:

- separate query_proj/key_proj/value_proj, fused into our one matrix; with `share_att_key` (v3) the
  relative table goes through them too, else through per-layer pos_key_proj / pos_query_proj;
- the masked-LM head is transformers' `lm_predictions.lm_head` (dense, activation, LayerNorm, the word
  embeddings as decoder, a bias) with `legacy: false` — the layout DeBERTa-v3 checkpoints are saved in.
  The enhanced mask decoder is what transformers runs of it: that head on the last layer (its `z_steps`
  re-run of the last layer is 0). A `legacy: true` config (DebertaV2Config's default, so every model
  transformers built without saying) names the same dense, LayerNorm and bias BERT's way
  (`cls.predictions.*`, the decoder tied to the word embeddings): imported under those names, as
  transformers loads it, and weights under today's names left unused with a warning, as transformers
  leaves them (microsoft's deberta-v3 checkpoints: `legacy` unset over `lm_predictions.*`, so the head
  starts fresh); exports are written `legacy: false`;
- the sequence classifier and the multiple-choice scorer are `pooler.dense` + `pooler_hidden_act` on the
  first token (ContextPooler), then `classifier`: gelu/relu/tanh are our gelu_pooler/relu_pooler/pooler;
  the ContextPooler drops out the first token before its dense layer at `pooler_dropout` (our
  `pooler_dropout`), and both heads drop out its output at `cls_dropout`;
- refused in one line, as bertforge cannot run them exactly: the ConvLayer (`conv_kernel_size`, unused
  by v3-small/base), `relative_attention: false`, an `embedding_size` other than hidden_size; and a
  `pooler_hidden_size` other than hidden_size, which transformers' own ContextPooler cannot run either
  (its dense is pooler_hidden_size wide and reads the hidden_size-wide first token).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.models.config import DisentangledAttention, EncoderConfig
from bertforge.models.families.bert import bert_config_values
from bertforge.models.families.family import (
    KeyPair,
    ModelFamily,
    activation_from_hf,
    common_unfit_reason,
    fill,
)

if TYPE_CHECKING:
    import transformers

EMBEDDINGS: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
    ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
)
POSITIONS: tuple[KeyPair, ...] = (("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),)
TOKEN_TYPES: tuple[KeyPair, ...] = (
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),)
RELATIVE_TABLE: tuple[KeyPair, ...] = (("relative_embeddings.embeddings.weight", "encoder.rel_embeddings.weight"),)
RELATIVE_NORM: tuple[KeyPair, ...] = (("relative_embeddings.norm.{kind}", "encoder.LayerNorm.{kind}"),)
LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.{kind}", ("encoder.layer.{}.attention.self.query_proj.{kind}",
                                        "encoder.layer.{}.attention.self.key_proj.{kind}",
                                        "encoder.layer.{}.attention.self.value_proj.{kind}")),
    ("layers.{}.attention.output.{kind}", "encoder.layer.{}.attention.output.dense.{kind}"),
    ("layers.{}.attention_norm.{kind}", "encoder.layer.{}.attention.output.LayerNorm.{kind}"),
    ("layers.{}.mlp.input.{kind}", "encoder.layer.{}.intermediate.dense.{kind}"),
    ("layers.{}.mlp.output.{kind}", "encoder.layer.{}.output.dense.{kind}"),
    ("layers.{}.mlp_norm.{kind}", "encoder.layer.{}.output.LayerNorm.{kind}"),
)
POSITION_KEY: tuple[KeyPair, ...] = (("layers.{}.attention.position_key.{kind}",
                                      "encoder.layer.{}.attention.self.pos_key_proj.{kind}"),)
POSITION_QUERY: tuple[KeyPair, ...] = (("layers.{}.attention.position_query.{kind}",
                                        "encoder.layer.{}.attention.self.pos_query_proj.{kind}"),)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "DebertaV2Model": (),
    "DebertaV2ForMaskedLM": (  # the decoder is the word-embedding matrix itself: no weight of its own
        ("mlm_head.transform.dense.weight", "lm_predictions.lm_head.dense.weight"),
        ("mlm_head.transform.dense.bias", "lm_predictions.lm_head.dense.bias"),
        ("mlm_head.transform.norm.weight", "lm_predictions.lm_head.LayerNorm.weight"),
        ("mlm_head.transform.norm.bias", "lm_predictions.lm_head.LayerNorm.bias"),
        ("mlm_head.decoder.bias", "lm_predictions.lm_head.bias")),
    "DebertaV2ForSequenceClassification": (
        ("head.pooler.dense.weight", "pooler.dense.weight"),
        ("head.pooler.dense.bias", "pooler.dense.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
    "DebertaV2ForTokenClassification": (("classifier.weight", "classifier.weight"),
                                        ("classifier.bias", "classifier.bias")),
    "DebertaV2ForMultipleChoice": (  # the sequence classifier's pooler and linear layer, one score per choice
        ("head.pooler.dense.weight", "pooler.dense.weight"),
        ("head.pooler.dense.bias", "pooler.dense.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
}
# transformers' `legacy: true` masked-LM head: its key -> the key of the head above (its decoder is tied: no weight)
LEGACY_MLM_HEAD = {
    "cls.predictions.transform.dense.weight": "lm_predictions.lm_head.dense.weight",
    "cls.predictions.transform.dense.bias": "lm_predictions.lm_head.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "lm_predictions.lm_head.LayerNorm.weight",
    "cls.predictions.transform.LayerNorm.bias": "lm_predictions.lm_head.LayerNorm.bias",
    "cls.predictions.bias": "lm_predictions.lm_head.bias",
}
POOLED_CLASSES = ("DebertaV2ForSequenceClassification", "DebertaV2ForMultipleChoice")  # their head: the ContextPooler
# the ContextPooler's pooler_hidden_act -> our pooling of the same dense + activation on the first token
POOLER_ACTIVATION_TO_POOLING = {"gelu": "gelu_pooler", "relu": "relu_pooler", "tanh": "pooler"}
POOLING_TO_POOLER_ACTIVATION = {pooling: act for act, pooling in POOLER_ACTIVATION_TO_POOLING.items()}


def unfit_reason(config: EncoderConfig) -> str:
    if config.disentangled_attention is None:
        return "HF DeBERTa-v2 attends with relative positions (disentangled_attention)"
    # its positions are learned, relative or both; an embedding projection gets its own line below
    reason = common_unfit_reason(config, "DeBERTa-v2", (None, "gelu", "post", True), embedding_projection=True)
    if reason:
        return reason
    if config.position_offset:
        return "HF DeBERTa-v2 numbers positions from 0 (position_offset = 0)"
    if config.projects_embeddings:
        return "bertforge exports DeBERTa-v2 with embeddings as wide as the encoder (no embedding_size)"
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class == "DebertaV2Model" and model.pooler is not None:
        return "HF DebertaV2Model has no pooler"
    if hf_class == "DebertaV2ForPreTraining":
        return "HF DeBERTa-v2 has no next-sentence-prediction head"
    if hf_class == "DebertaV2ForMaskedLM" and not model.config.tie_word_embeddings:
        return "HF DebertaV2ForMaskedLM decodes with the word embeddings (tie_word_embeddings true)"
    if hf_class in POOLED_CLASSES and model.config.pooling not in POOLING_TO_POOLER_ACTIVATION:
        return (f"HF {hf_class} pools with dense + activation on the first token "
                f"(pooling {', '.join(POOLING_TO_POOLER_ACTIVATION)}), not pooling={model.config.pooling}")
    return ""


def _refuse(source: str, key: str, value: object, why: str) -> BertforgeError:
    return BertforgeError(f"{source}: `{key}` = {value!r}: {why}")


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    if not getattr(hf, "relative_attention", False):
        raise _refuse(source, "relative_attention", False, "bertforge imports DeBERTa-v2/v3 with relative "
                      "(disentangled) attention only, as every released checkpoint has it")
    if (getattr(hf, "conv_kernel_size", 0) or 0) > 0:
        raise _refuse(source, "conv_kernel_size", hf.conv_kernel_size, "the first layer's ConvLayer "
                      "(DeBERTa-v2 xlarge and larger) is not supported; DeBERTa-v3 small/base/large have none")
    embedding_size = getattr(hf, "embedding_size", None)
    if embedding_size not in (None, hf.hidden_size):
        raise _refuse(source, "embedding_size", embedding_size, "embeddings narrower than hidden_size are not "
                      "supported for DeBERTa-v2")
    pooler_size = getattr(hf, "pooler_hidden_size", hf.hidden_size)
    if pooler_size != hf.hidden_size:
        raise _refuse(source, "pooler_hidden_size", pooler_size,
                      f"transformers' ContextPooler runs only at hidden_size ({hf.hidden_size}): its dense layer "
                      "reads the first token's hidden state; set it to hidden_size")
    pooler_act = getattr(hf, "pooler_hidden_act", "gelu")
    if pooler_act not in POOLER_ACTIVATION_TO_POOLING:
        raise _refuse(source, "pooler_hidden_act", pooler_act,
                      f"supported: {', '.join(POOLER_ACTIVATION_TO_POOLING)}")
    terms = [term.strip() for term in (hf.pos_att_type or [])]
    if not terms or any(term not in ("c2p", "p2c") for term in terms):
        raise _refuse(source, "pos_att_type", hf.pos_att_type, "give c2p, p2c or both (DeBERTa-v3: p2c|c2p)")
    max_relative = hf.max_relative_positions if hf.max_relative_positions >= 1 else hf.max_position_embeddings
    buckets = getattr(hf, "position_buckets", -1) or -1
    norms = [name.strip() for name in (getattr(hf, "norm_rel_ebd", None) or "none").lower().split("|")]
    disentangled = DisentangledAttention(
        terms=tuple(terms), position_buckets=max(buckets, 0), max_relative_positions=max_relative,
        share_att_key=bool(getattr(hf, "share_att_key", False)), norm_relative_embeddings="layer_norm" in norms)
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, intermediate_size=hf.intermediate_size,
        max_position_embeddings=hf.max_position_embeddings, type_vocab_size=hf.type_vocab_size,
        hidden_dropout=float(hf.hidden_dropout_prob), attention_dropout=float(hf.attention_probs_dropout_prob),
        classifier_dropout=getattr(hf, "cls_dropout", None), norm_eps=hf.layer_norm_eps,
        activation=activation_from_hf(hf.hidden_act, source, "hidden_act"),
        position="learned" if getattr(hf, "position_biased_input", True) else "relative", mlp="gelu", norm="post",
        bias=True, tie_word_embeddings=True if not getattr(hf, "legacy", True) else bool(hf.tie_word_embeddings),
        pooling=POOLER_ACTIVATION_TO_POOLING[pooler_act], initializer_range=hf.initializer_range,
        # DebertaV2ForTokenClassification drops out at hidden_dropout_prob, not cls_dropout
        token_classifier_dropout="hidden", pooler_dropout=float(getattr(hf, "pooler_dropout", None) or 0.0),
        disentangled_attention=disentangled,
    )


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    relative = config.disentangled_attention
    assert relative is not None
    return transformers.DebertaV2Config(
        type_vocab_size=config.type_vocab_size, relative_attention=True, position_biased_input=config.position == "learned",
        pos_att_type="|".join(relative.terms), position_buckets=relative.position_buckets or -1,
        max_relative_positions=relative.max_relative_positions, share_att_key=relative.share_att_key,
        norm_rel_ebd="layer_norm" if relative.norm_relative_embeddings else "none",
        pooler_hidden_size=config.hidden_size, pooler_dropout=config.pooler_dropout,
        pooler_hidden_act=POOLING_TO_POOLER_ACTIVATION.get(config.pooling, "gelu"),
        cls_dropout=config.classifier_dropout, legacy=False, **bert_config_values(config, common))


def older_names(hf_config: transformers.PretrainedConfig) -> dict[str, str]:
    return LEGACY_MLM_HEAD if getattr(hf_config, "legacy", True) else {}


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    relative = config.disentangled_attention
    assert relative is not None
    table = list(EMBEDDINGS) + (list(POSITIONS) if config.position == "learned" else [])
    table += list(TOKEN_TYPES) if config.type_vocab_size > 0 else []
    pairs = [fill(pair) for pair in table + list(RELATIVE_TABLE)]
    if relative.norm_relative_embeddings:
        pairs += [fill(pair, kind=kind) for kind in ("weight", "bias") for pair in RELATIVE_NORM]
    layer = list(LAYER)
    if not relative.share_att_key:
        layer += (list(POSITION_KEY) if "c2p" in relative.terms else []) + (
            list(POSITION_QUERY) if "p2c" in relative.terms else [])
    return pairs + [fill(pair, i, kind) for i in range(config.num_layers) for kind in ("weight", "bias")
                    for pair in layer]


FAMILY = ModelFamily(
    name="deberta-v2", model_type="deberta-v2", hf_prefix="DebertaV2", encoder_prefix="deberta.", head_keys=HEADS,
    unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys, classifier_start="a new ContextPooler (dense + activation on [CLS])",
    older_names=older_names,
)
