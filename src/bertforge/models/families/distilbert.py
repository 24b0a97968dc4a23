"""Hugging Face DistilBERT (`model_type: distilbert`): BERT's post-norm layers under other names, no token types.

Its quirks: separate q_lin/k_lin/v_lin (fused into our one matrix, as BERT's); every LayerNorm's
epsilon fixed at 1e-12 whatever the config; no pooler in the encoder; a sequence classifier that
is `pre_classifier` + ReLU + dropout + `classifier` on [CLS] (`pooling: relu_pooler` here), with its
own dropout (`seq_classif_dropout`, bertforge's `classifier_dropout`), and the same head, one output per
candidate, in `DistilBertForMultipleChoice`. Sinusoidal positions
(`sinusoidal_pos_embds: true`: fixed, not trained) are refused: bertforge's positions are learned.
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

NORM_EPS = 1e-12  # modeling_distilbert.py builds every LayerNorm with it

ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
    ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
)
LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.{kind}", ("transformer.layer.{}.attention.q_lin.{kind}",
                                        "transformer.layer.{}.attention.k_lin.{kind}",
                                        "transformer.layer.{}.attention.v_lin.{kind}")),
    ("layers.{}.attention.output.{kind}", "transformer.layer.{}.attention.out_lin.{kind}"),
    ("layers.{}.attention_norm.{kind}", "transformer.layer.{}.sa_layer_norm.{kind}"),
    ("layers.{}.mlp.input.{kind}", "transformer.layer.{}.ffn.lin1.{kind}"),
    ("layers.{}.mlp.output.{kind}", "transformer.layer.{}.ffn.lin2.{kind}"),
    ("layers.{}.mlp_norm.{kind}", "transformer.layer.{}.output_layer_norm.{kind}"),
)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "DistilBertModel": (),
    "DistilBertForMaskedLM": (
        ("mlm_head.transform.dense.weight", "vocab_transform.weight"),
        ("mlm_head.transform.dense.bias", "vocab_transform.bias"),
        ("mlm_head.transform.norm.weight", "vocab_layer_norm.weight"),
        ("mlm_head.transform.norm.bias", "vocab_layer_norm.bias"),
        ("mlm_head.decoder.weight", "vocab_projector.weight"),
        ("mlm_head.decoder.bias", "vocab_projector.bias")),
    "DistilBertForSequenceClassification": (
        ("head.pooler.dense.weight", "pre_classifier.weight"),
        ("head.pooler.dense.bias", "pre_classifier.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
    # the sequence classifier's pre_classifier + ReLU, dropout and linear layer, one score per choice
    "DistilBertForMultipleChoice": (
        ("head.pooler.dense.weight", "pre_classifier.weight"),
        ("head.pooler.dense.bias", "pre_classifier.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
    "DistilBertForTokenClassification": (("classifier.weight", "classifier.weight"),
                                         ("classifier.bias", "classifier.bias")),
}

POOLED_CLASSES = ("DistilBertForSequenceClassification", "DistilBertForMultipleChoice")  # pre_classifier + ReLU


def unfit_reason(config: EncoderConfig) -> str:
    reason = common_unfit_reason(config, "DistilBERT", ("learned", "gelu", "post", True))
    if reason:
        return reason
    if config.type_vocab_size != 0 or config.position_offset:
        return "HF DistilBERT has no token types and numbers positions from 0 (type_vocab_size = position_offset = 0)"
    if config.norm_eps != NORM_EPS:
        return f"HF DistilBERT's norms use epsilon {NORM_EPS}, not norm_eps={config.norm_eps}"
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class == "DistilBertModel" and model.pooler is not None:
        return "HF DistilBertModel has no pooler"
    if hf_class == "DistilBertForPreTraining":
        return "HF DistilBERT has no next-sentence-prediction head"
    if hf_class in POOLED_CLASSES and model.config.pooling != "relu_pooler":
        return (f"HF {hf_class} always uses pre_classifier+ReLU on [CLS] (pooling=relu_pooler), "
                f"not pooling={model.config.pooling}")
    return ""


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    if getattr(hf, "sinusoidal_pos_embds", False):
        raise BertforgeError(f"{source}: sinusoidal_pos_embds is true (fixed sinusoidal positions); bertforge imports "
                             "DistilBERT checkpoints with learned positions only")
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.dim, num_layers=hf.n_layers, num_heads=hf.n_heads,
        intermediate_size=hf.hidden_dim, max_position_embeddings=hf.max_position_embeddings, type_vocab_size=0,
        hidden_dropout=float(hf.dropout), attention_dropout=float(hf.attention_dropout),
        classifier_dropout=float(hf.seq_classif_dropout), norm_eps=NORM_EPS,
        activation=activation_from_hf(hf.activation, source, "activation"), position="learned", mlp="gelu",
        norm="post", bias=True, tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        # DistilBertForTokenClassification drops out at `dropout`, not seq_classif_dropout
        pooling="relu_pooler", token_classifier_dropout="hidden", initializer_range=hf.initializer_range,
    )


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    return transformers.DistilBertConfig(
        vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=config.num_layers, n_heads=config.num_heads,
        hidden_dim=config.intermediate_size, activation=OUR_TO_HF_ACTIVATION[config.activation],
        dropout=config.hidden_dropout, attention_dropout=config.attention_dropout,
        seq_classif_dropout=config.effective_classifier_dropout,
        max_position_embeddings=config.max_position_embeddings, sinusoidal_pos_embds=False,
        initializer_range=config.initializer_range, **common)


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    pairs = [fill(pair) for pair in ENCODER]
    return pairs + [fill(pair, i, kind) for i in range(config.num_layers) for kind in ("weight", "bias")
                    for pair in LAYER]


FAMILY = ModelFamily(
    name="distilbert", model_type="distilbert", hf_prefix="DistilBert", encoder_prefix="distilbert.",
    head_keys=HEADS, unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf,
    config_to_hf=config_to_hf, encoder_keys=encoder_keys, classifier_start="a new pre_classifier + ReLU on [CLS]",
)
