"""Hugging Face ELECTRA (`model_type: electra`): the discriminator, and the generator as a masked-LM model.

The encoder is BERT's, layer for layer and name for name. Its quirks: the embeddings have their own
width (`embedding_size`; electra-small: 128 against hidden 256), are summed and normalised at it,
and `embeddings_project` widens them to hidden_size (bertforge's `embedding_size` and
`embeddings.project`); no pooler; a sequence classifier of its own (`classifier.dense` + exact GELU
+ `classifier.out_proj` on [CLS]: `pooling: gelu_pooler`); a multiple-choice head whose
SequenceSummary drops out at its own rates (`summary_first_dropout` before its dense layer,
`summary_last_dropout` after it: bertforge's `choice_input_dropout` and `choice_dropout`); the
generator (`ElectraForMaskedLM`) maps back to the embeddings' width (`generator_predictions`: dense
+ GELU + norm) and decodes with the word embeddings. `ElectraForPreTraining` (the discriminator as
released, e.g. google/electra-base-discriminator) imports as its encoder: its replaced-token-detection
head (`discriminator_predictions`) has no bertforge counterpart and is left out, with a message.
An import remembers `model_type: electra` (`hf_model_type`), so an electra-base (embeddings as wide
as the encoder, no projection) exports as ELECTRA too, not as the BERT it equals.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families.bert import bert_config_values
from bertforge.models.families.bert import config_from_hf as bert_config_from_hf
from bertforge.models.families.bert import encoder_keys as bert_encoder_keys
from bertforge.models.families.family import BASE_SUFFIX, KeyPair, ModelFamily, common_unfit_reason, fill

if TYPE_CHECKING:
    import transformers

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
# the discriminator imports as its encoder: its replaced-token-detection head has no bertforge counterpart
IMPORTS_AS = {"ElectraForPreTraining": BASE_SUFFIX}
POOLED_CLASSES = ("ElectraForSequenceClassification", "ElectraForMultipleChoice")  # dense+GELU on [CLS]


def unfit_reason(config: EncoderConfig) -> str:
    if config.hf_model_type != "electra" and not config.projects_embeddings:
        return "ELECTRA holds models imported from it or with narrower embeddings (embedding_size)"
    reason = common_unfit_reason(config, "ELECTRA", ("learned", "gelu", "post", True), embedding_projection=True)
    if reason:
        return reason
    if config.type_vocab_size < 1 or config.position_offset:
        return "HF ELECTRA needs token-type embeddings and numbers positions from 0"
    return ""


def unfit_head(hf_class: str, model: Any) -> str:
    if hf_class == "ElectraModel" and model.pooler is not None:
        return "HF ElectraModel has no pooler"
    if hf_class == "ElectraForPreTraining":  # the discriminator, not BERT's masked LM + next-sentence prediction
        return "HF ELECTRA has no next-sentence-prediction head"
    if hf_class == "ElectraForMaskedLM" and model.config.activation != "gelu":
        return f"HF ElectraForMaskedLM's generator head applies exact GELU, not activation={model.config.activation}"
    if hf_class in POOLED_CLASSES and model.config.pooling != "gelu_pooler":
        return (f"HF {hf_class} always uses dense+GELU on [CLS] (pooling=gelu_pooler), "
                f"not pooling={model.config.pooling}")
    return ""


def config_from_hf(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    """BERT's mapping, plus the embeddings' width, ELECTRA's classifier head and its model_type."""
    summary = (hf.summary_type, hf.summary_use_proj, hf.summary_activation)
    if summary != SUMMARY:  # ElectraForMultipleChoice's head; the other classes never read these keys
        raise BertforgeError(f"{source}: summary_type/summary_use_proj/summary_activation are {summary}; bertforge "
                             f"imports ELECTRA checkpoints with transformers' defaults {SUMMARY} (dense+GELU on [CLS])")
    embedding_size = hf.embedding_size if hf.embedding_size != hf.hidden_size else None
    # ElectraClassificationHead drops out [CLS] before its dense layer as well as after it; the multiple-choice
    # SequenceSummary at its own two rates (summary_first_dropout: no ElectraConfig field, present only where a
    # config.json sets it)
    return dataclasses.replace(bert_config_from_hf(hf, source), embedding_size=embedding_size,
                               pooling="gelu_pooler", classifier_input_dropout=True,
                               choice_input_dropout=float(getattr(hf, "summary_first_dropout", None) or 0.0),
                               choice_dropout=float(hf.summary_last_dropout or 0.0), hf_model_type="electra")


def config_to_hf(config: EncoderConfig, common: dict[str, object],
                 special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers
    return transformers.ElectraConfig(
        embedding_size=config.embedding_width, type_vocab_size=config.type_vocab_size,
        classifier_dropout=config.classifier_dropout,
        # ElectraForMultipleChoice's SequenceSummary: dropout, dense, GELU, dropout
        summary_first_dropout=config.choice_input_dropout, summary_last_dropout=config.choice_dropout_rate,
        **bert_config_values(config, common))


def encoder_keys(config: EncoderConfig, pooler: bool) -> list[KeyPair]:
    pairs = bert_encoder_keys(config, False)
    if config.projects_embeddings:
        pairs += [fill(pair, kind=kind) for kind in ("weight", "bias") for pair in PROJECTION]
    return pairs


FAMILY = ModelFamily(
    name="electra", model_type="electra", hf_prefix="Electra", encoder_prefix="electra.", head_keys=HEADS,
    unfit_reason=unfit_reason, unfit_head=unfit_head, config_from_hf=config_from_hf, config_to_hf=config_to_hf,
    encoder_keys=encoder_keys, classifier_start="a new dense + GELU on [CLS] (ElectraClassificationHead)",
    imports_as=IMPORTS_AS,
)
