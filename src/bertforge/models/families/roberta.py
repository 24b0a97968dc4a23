"""Hugging Face RoBERTa (`model_type: roberta`), and XLM-RoBERTa and CamemBERT, the same graph under other names.

The encoder is BERT's, layer for layer and name for name (`families/bert.py`'s `encoder_keys`). Its quirks:
positions start after the padding id (`padding_idx + 1`, so roberta-base's 514 rows cover 512
tokens), which bertforge keeps as `position_offset` and adds to each packed sequence's own count;
one token type (the pair layout `<s> a </s></s> b </s>` has no segment ids); an MLM head
(`lm_head`) whose activation is exact GELU whatever `hidden_act` says; a classifier
(`classifier.dense` + tanh + `classifier.out_proj` on `<s>`) that is BERT's pooler and classifier
under other names, with no pooler in the encoder; a multiple-choice head that is BERT's (the encoder's
tanh pooler, dropout at `hidden_dropout_prob` whatever `classifier_dropout` says: `choice_classifier_dropout:
hidden`, a one-output linear layer). The three model types are three records
(`FAMILIES`): an import remembers its `model_type` (`hf_model_type`) so an export writes it back.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.bert import bert_config_values, encoder_keys
from bertforge.models.families.bert import config_from_hf as bert_config_from_hf
from bertforge.models.families.family import (
    BASE_SUFFIX,
    KeyPair,
    ModelFamily,
    build_with_optional_pooler,
    common_unfit_reason,
    load_with_optional_pooler,
)

if TYPE_CHECKING:
    import transformers

MLM_HEAD: tuple[KeyPair, ...] = (
    ("mlm_head.transform.dense.weight", "lm_head.dense.weight"),
    ("mlm_head.transform.dense.bias", "lm_head.dense.bias"),
    ("mlm_head.transform.norm.weight", "lm_head.layer_norm.weight"),
    ("mlm_head.transform.norm.bias", "lm_head.layer_norm.bias"),
    ("mlm_head.decoder.weight", "lm_head.decoder.weight"),
    ("mlm_head.decoder.bias", "lm_head.bias"),
    ("mlm_head.decoder.bias", "lm_head.decoder.bias"),  # the same bias, kept twice by transformers
)
SEQUENCE_HEAD: tuple[KeyPair, ...] = (
    ("head.pooler.dense.weight", "classifier.dense.weight"),
    ("head.pooler.dense.bias", "classifier.dense.bias"),
    ("head.classifier.weight", "classifier.out_proj.weight"),
    ("head.classifier.bias", "classifier.out_proj.bias"),
)
TOKEN_HEAD: tuple[KeyPair, ...] = (("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias"))
CHOICE_HEAD: tuple[KeyPair, ...] = (  # *ForMultipleChoice reads the encoder's own pooler, as BERT's does
    ("head.pooler.dense.weight", "roberta.pooler.dense.weight"),
    ("head.pooler.dense.bias", "roberta.pooler.dense.bias"),
    ("head.classifier.weight", "classifier.weight"),
    ("head.classifier.bias", "classifier.bias"),
)
POOLED_SUFFIXES = ("ForSequenceClassification", "ForMultipleChoice")  # dense + tanh on <s>


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    """BERT's mapping, plus where RoBERTa's positions start and which of the graph's three names it carries."""
    if hf.pad_token_id is None:
        raise BertforgeError(f"{source}: no pad_token_id in config.json; RoBERTa's positions start after it "
                             "(roberta-base: 1), so give it")
    # RobertaClassificationHead drops out <s> before its dense layer as well as after it; *ForMultipleChoice at
    # hidden_dropout_prob whatever classifier_dropout is, so a run's model.hidden_dropout is its rate too
    return dataclasses.replace(bert_config_from_hf(hf, source), position_offset=hf.pad_token_id + 1,
                               classifier_input_dropout=True, choice_classifier_dropout="hidden",
                               hf_model_type=hf.model_type)


def _family(model_type: str, prefix: str) -> ModelFamily:
    """The record of one of the three names of this graph: its model_type and class-name prefix."""
    heads = {prefix + BASE_SUFFIX: (), f"{prefix}ForMaskedLM": MLM_HEAD,
             f"{prefix}ForSequenceClassification": SEQUENCE_HEAD, f"{prefix}ForTokenClassification": TOKEN_HEAD,
             f"{prefix}ForMultipleChoice": CHOICE_HEAD}
    # an encoder remembers which name it was imported under; one made here (none recorded) is RoBERTa
    names = (None, model_type) if model_type == "roberta" else (model_type,)

    def unfit_reason(config: EncoderConfig) -> str:
        reason = common_unfit_reason(config, prefix, ("learned", "gelu", "post", True), model_types=names)
        if reason:
            return reason
        if config.position_offset < 1:
            return f"HF {prefix}'s positions start after the padding id (position_offset >= 1)"
        if config.type_vocab_size < 1:
            return f"HF {prefix} needs token-type embeddings (type_vocab_size >= 1)"
        return ""

    def unfit_head(hf_class: str, model: Any) -> str:
        if hf_class == f"{prefix}ForPreTraining":
            return f"HF {prefix} has no next-sentence-prediction head"
        if hf_class == f"{prefix}ForMaskedLM" and model.config.activation != "gelu":
            return f"HF {prefix}'s MLM head applies exact GELU, not activation={model.config.activation}"
        if hf_class in [prefix + suffix for suffix in POOLED_SUFFIXES] and model.config.pooling != "pooler":
            return f"HF {hf_class} always uses dense+tanh on <s>, not pooling={model.config.pooling}"
        return ""

    def config_to_hf(config: EncoderConfig, common: dict[str, object],
                     special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
        import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
        # HF numbers positions from its pad id: it must be the one the encoder was trained with
        values = common | {"pad_token_id": config.position_offset - 1}
        # the config class looked up when an export needs it: `transformers.RobertaConfig` read at import cost
        # a second of every command's start-up (transformers' lazy module indexes the family's package)
        return transformers.CONFIG_MAPPING[model_type](
            type_vocab_size=config.type_vocab_size, classifier_dropout=config.classifier_dropout,
            bos_token_id=special_tokens.get("cls"), eos_token_id=special_tokens.get("sep"),
            **bert_config_values(config, values))

    return ModelFamily(
        name=model_type, model_type=model_type, hf_prefix=prefix, encoder_prefix="roberta.", head_keys=heads,
        unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
        encoder_keys=encoder_keys, classifier_start=f"a new dense + tanh on <s> ({prefix}ClassificationHead)",
        build_hf_model=build_with_optional_pooler, load_arguments=load_with_optional_pooler,
    )


ROBERTA = _family("roberta", "Roberta")
XLM_ROBERTA = _family("xlm-roberta", "XLMRoberta")
CAMEMBERT = _family("camembert", "Camembert")
