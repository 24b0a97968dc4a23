"""What a Hugging Face model family adapter is (`ModelFamily`), and the helpers its files share.

A family is everything bertforge knows about one `transformers` architecture, in one place (as
torchtitan keeps a state-dict adapter per model): the `model_type` it imports, its config mapped
both ways, its weight names as tables, its heads (class name, weight names) and the quirks of
building its stock model. `models/hf.py` is generic code over these records; adding a family is
one file in this package plus its line in `FAMILIES` (`families/__init__.py`).

Weight names are data: `(our key, HF key)` pairs, or `(our key, (HF q, k, v))` where our fused
attention matrix is three HF matrices. Encoder tables are written as a bare encoder names them;
`{}` stands for a layer index and `{kind}` for weight|bias. Head tables are written in full, in
the For* class's own names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import transformers
from torch import nn

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig

KeyPair = tuple[str, str | tuple[str, str, str]]

# what a bertforge model is, for choosing its HF class: base | pretraining | classification | token_classification
# | multiple_choice (a family without a class for a kind answers (None, why) from `class_for`)
HEAD_KINDS = ("base", "pretraining", "classification", "token_classification", "multiple_choice")

HF_TO_OUR_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
OUR_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}


def activation_from_hf(name: str, source: str, key: str) -> str:
    if name not in HF_TO_OUR_ACTIVATION:
        raise BertforgeError(f"{source}: `{key}` = {name!r} is not supported; "
                             f"supported: {', '.join(HF_TO_OUR_ACTIVATION)}")
    return HF_TO_OUR_ACTIVATION[name]


def fill(pair: KeyPair, layer: int | str = "", kind: str = "") -> KeyPair:
    """A table's pair with its layer index (`{}`) and weight kind (`{kind}`) filled in."""
    ours, theirs = pair
    if isinstance(theirs, tuple):
        return ours.format(layer, kind=kind), tuple(name.format(layer, kind=kind) for name in theirs)  # type: ignore[return-value]
    return ours.format(layer, kind=kind), theirs.format(layer, kind=kind)


def prefixed(pair: KeyPair, ours_prefix: str, hf_prefix: str) -> KeyPair:
    ours, theirs = pair
    if isinstance(theirs, tuple):
        return ours_prefix + ours, tuple(hf_prefix + name for name in theirs)  # type: ignore[return-value]
    return ours_prefix + ours, hf_prefix + theirs


def layered_keys(config: EncoderConfig, encoder: tuple[KeyPair, ...], layer: tuple[KeyPair, ...],
                 pooler: tuple[KeyPair, ...] = ()) -> list[KeyPair]:
    """A BERT-shaped encoder's pairs: its embeddings', every layer's (each entry as weight and bias), its pooler's."""
    pairs = [fill(pair) for pair in encoder]
    pairs += [fill(pair, i, kind) for i in range(config.num_layers) for kind in ("weight", "bias") for pair in layer]
    return pairs + [fill(pair) for pair in pooler]


def build_with_optional_pooler(cls: type, config: transformers.PretrainedConfig, pooler: bool) -> nn.Module:
    # a bare *Model draws a pooler unless told not to; one bertforge's model lacks must not appear.
    # Its For* classes never take the option
    return cls(config, add_pooling_layer=pooler) if cls.__name__.endswith("Model") else cls(config)


def load_with_optional_pooler(hf_class: str, pooler: bool) -> dict[str, object]:
    # no config.json key says "no pooler": without this, from_pretrained draws one and reports it MISSING
    return {"add_pooling_layer": False} if hf_class.endswith("Model") and not pooler else {}


@dataclass(frozen=True)
class ModelFamily:
    """One Hugging Face family; each field is a plain value or function of the family's own file."""

    name: str  # how bertforge names it (bert, modernbert)
    model_type: str  # config.json's `model_type`
    encoder_prefix: str  # where its For* classes keep the encoder (`bert.`, `model.`)
    classes: dict[str, str]  # HF class -> the head kind it holds, for every class bertforge imports
    head_keys: dict[str, tuple[KeyPair, ...]]  # HF class -> its head's weights, in full
    # why an encoder's switches cannot be this family ("" when they can)
    unfit_reason: Callable[[EncoderConfig], str]
    # the HF class for a model of this family of a head kind, or (None, why): (kind, model) -> (class, reason)
    class_for: Callable[[str, Any], tuple[str | None, str]]
    # `transformers` config -> ours (source names the checkpoint in errors)
    config_from_hf: Callable[[transformers.PretrainedConfig, str], EncoderConfig]
    # ours -> `transformers` config: (encoder config, settings every class shares, special token ids)
    config_to_hf: Callable[[EncoderConfig, dict[str, object], dict[str, int]], transformers.PretrainedConfig]
    # (our key, HF key) of a bare encoder, layers filled in, in the bare layout; pooler: BERT's pooler too
    encoder_keys: Callable[[EncoderConfig, bool], list[KeyPair]]
    # the stock model: (class, config, pooler) -> module; a family whose base class takes options says so
    build_hf_model: Callable[[type, transformers.PretrainedConfig, bool], nn.Module] = (
        lambda cls, config, pooler: cls(config))
    # what `from_pretrained` must be told to build that same model from its directory: (class, pooler) -> kwargs
    load_arguments: Callable[[str, bool], dict[str, object]] = lambda hf_class, pooler: {}

    def key_pairs(self, config: EncoderConfig, hf_class: str, *, pooler: bool = False) -> list[KeyPair]:
        """Every (our key, HF key) of `hf_class` for this encoder, in that class's own layout."""
        encoder = self.encoder_keys(config, pooler)
        if self.classes[hf_class] != "base":  # a For* class keeps the encoder under a prefix, as our heads do
            encoder = [prefixed(pair, "encoder.", self.encoder_prefix) for pair in encoder]
        return encoder + list(self.head_keys[hf_class])

    def in_head_layout(self, pair: KeyPair) -> KeyPair:
        """A bare encoder's pair with the HF key as a For* class names it (how imports read a bare model)."""
        return prefixed(pair, "", self.encoder_prefix)

    def base_class(self) -> str:
        return next(name for name, kind in self.classes.items() if kind == "base")
