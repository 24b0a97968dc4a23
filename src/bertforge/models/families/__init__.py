"""The Hugging Face model families bertforge imports and exports, one adapter file each.

`models/hf.py` looks a family up here by `model_type` (import), by class name, or by an encoder's
switches (export); nothing else in bertforge branches on a family's name.
"""

from __future__ import annotations

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.families import bert, deberta, distilbert, electra, modernbert, mpnet, roberta
from bertforge.models.families.family import KeyPair, ModelFamily

# DeBERTa first: its relative attention may come with learned positions, which BERT's switches alone would fit
FAMILIES: dict[str, ModelFamily] = {family.name: family for family in (
    deberta.FAMILY, bert.FAMILY, modernbert.FAMILY, roberta.ROBERTA, roberta.XLM_ROBERTA, roberta.CAMEMBERT,
    distilbert.FAMILY, electra.FAMILY, mpnet.FAMILY)}

# every HF class bertforge imports -> its family
CLASS_FAMILY: dict[str, ModelFamily] = {name: family for family in FAMILIES.values() for name in family.head_keys}


def family_of_model_type(model_type: str, source: str) -> ModelFamily:
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return family
    raise BertforgeError(f"{source}: model_type {model_type!r} is not supported; bertforge imports Hugging Face "
                         f"{', '.join(f'`{f.model_type}`' for f in FAMILIES.values())} checkpoints")


def family_of_class(hf_class: str) -> ModelFamily:
    if hf_class not in CLASS_FAMILY:
        raise BertforgeError(f"cannot import a {hf_class}; supported: {', '.join(CLASS_FAMILY)}")
    return CLASS_FAMILY[hf_class]


def family_for_config(config: EncoderConfig) -> tuple[ModelFamily | None, str]:
    """The family whose stock classes hold an encoder with these switches, or (None, why none does)."""
    reasons = []
    for family in FAMILIES.values():
        reason = family.unfit_reason(config)
        if not reason:
            return family, ""
        reasons.append(reason)
    return None, "; ".join(reasons)


__all__ = ["CLASS_FAMILY", "FAMILIES", "KeyPair", "ModelFamily", "family_for_config", "family_of_class",
           "family_of_model_type"]
