"""What a Hugging Face model family adapter is (`ModelFamily`), and the helpers its files share.

A family is everything bertforge knows about one `transformers` architecture, in one place (as
torchtitan keeps a state-dict adapter per model): the `model_type` it imports, its config mapped
both ways, its weight names as tables, its HF class-name prefix and the quirks of building its stock
model. `models/hf.py` is generic code over these records; adding a family is one file in this
package plus its line in `FAMILIES` (`families/__init__.py`).

A family names no task kind: transformers names a class by family prefix + head suffix
(`Bert` + `ForTokenClassification`), and each bertforge head class says which suffixes it is
(`hf_suffixes`), so the head an HF class holds is read from its name. A family lists the classes it
maps (its head tables) and its exceptions: a class that imports as another head (`imports_as`), and
why one of its classes cannot hold a given model (`unfit_head`: BERT's pooled heads need the tanh pooler).

Weight names are data: `(our key, HF key)` pairs, or `(our key, (HF q, k, v))` where our fused
attention matrix is three HF matrices. Encoder tables are written as a bare encoder names them;
`{}` stands for a layer index and `{kind}` for weight|bias. Head tables are written in full, in
the For* class's own names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig

if TYPE_CHECKING:
    import transformers

KeyPair = tuple[str, str | tuple[str, str, str]]

# transformers' name of every family's bare encoder: prefix + "Model" (BertModel); its other classes keep the
# encoder under `encoder_prefix`
BASE_SUFFIX = "Model"

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


def common_unfit_reason(config: EncoderConfig, title: str, switches: tuple[str | None, str, str, bool], *,
                        model_types: tuple[str | None, ...] = (), local_attention: bool = False,
                        embedding_projection: bool = False, relative_bias: bool = False) -> str:
    """The lines every family checks, as users read them ("" when none applies), for a family's `unfit_reason`
    to compose with its own: the encoder was imported as another family (`model_types`: the `hf_model_type`s
    it takes, None for a model made here; empty: any); its position/mlp/norm/bias are not `switches`
    (position None: any); it uses local attention, ELECTRA's embedding projection or MPNet's relative position
    bias where HF `title` has none (the flags say which of them the family has)."""
    if model_types and config.hf_model_type not in model_types:
        wanted = next(name for name in model_types if name is not None)
        return f"the model was imported as {config.hf_model_type or 'no Hugging Face type'}, not {wanted}"
    position, mlp, norm, bias = switches
    wanted_switches = [(name, value) for name, value in
                       (("position", position), ("mlp", mlp), ("norm", norm), ("bias", bias)) if value is not None]
    if any(getattr(config, name) != value for name, value in wanted_switches):
        actual = ", ".join(f"{name}={getattr(config, name)}" for name, _ in wanted_switches)
        expected = "/".join(("bias" if value else "no bias") if name == "bias" else str(value)
                            for name, value in wanted_switches)
        return f"{actual} is not HF {title}'s {expected}"
    if config.local_attention_window is not None and not local_attention:
        return f"HF {title} has no local (sliding-window) attention"
    uses_projection = config.projects_embeddings and not embedding_projection
    uses_bias = bool(config.relative_attention_buckets) and not relative_bias
    if (uses_projection or uses_bias) and not (embedding_projection or relative_bias):
        return f"HF {title} has no embedding projection (ELECTRA's) and no relative position bias (MPNet's)"
    if uses_projection:
        return f"HF {title} has no embedding projection (ELECTRA's)"
    if uses_bias:
        return f"HF {title} has no relative position bias (MPNet's)"
    return ""


@dataclass(frozen=True)
class ModelFamily:
    """One Hugging Face family; each field is a plain value or function of the family's own file."""

    name: str  # how bertforge names it (bert, modernbert)
    model_type: str  # config.json's `model_type`
    hf_prefix: str  # its classes' names: prefix + a head's suffix (`Bert` + `ForMaskedLM`)
    encoder_prefix: str  # where its For* classes keep the encoder (`bert.`, `model.`)
    # HF class -> its head's weights, in full: every class bertforge imports and exports, and only those
    head_keys: dict[str, tuple[KeyPair, ...]]
    # why an encoder's switches cannot be this family ("" when they can)
    unfit_reason: Callable[[EncoderConfig], str]
    # why this family's HF class (named whether or not the family maps it) cannot hold this bertforge model exactly
    # ("" when nothing of the family's own stands in the way): (HF class, model) -> reason
    unfit_head: Callable[[str, Any], str]
    # `transformers` config -> ours (source names the checkpoint in errors)
    config_from_hf: Callable[[transformers.PretrainedConfig, str], EncoderConfig]
    # ours -> `transformers` config: (encoder config, settings every class shares, special token ids)
    config_to_hf: Callable[[EncoderConfig, dict[str, object], dict[str, int]], transformers.PretrainedConfig]
    # (our key, HF key) of a bare encoder, layers filled in, in the bare layout; pooler: BERT's pooler too
    encoder_keys: Callable[[EncoderConfig, bool], list[KeyPair]]
    # what the family's *ForSequenceClassification reads a sentence from, as a user reads it ("BERT's pooler
    # (dense + tanh on [CLS])"): named where that is not the pooling a checkpoint was trained with
    classifier_start: str
    # the stock model: (class, config, pooler) -> module; a family whose base class takes options says so
    build_hf_model: Callable[[type, transformers.PretrainedConfig, bool], nn.Module] = (
        lambda cls, config, pooler: cls(config))
    # what `from_pretrained` must be told to build that same model from its directory: (class, pooler) -> kwargs
    load_arguments: Callable[[str, bool], dict[str, object]] = lambda hf_class, pooler: {}
    # an HF class that imports as the head of another suffix than its name's (ELECTRA's discriminator: an encoder)
    imports_as: dict[str, str] = field(default_factory=dict)
    # a checkpoint saved in an older layout of the family's classes: (its config) -> {its HF key: the key the head
    # tables name}, applied to its state dict before import (DeBERTa-v2's `legacy` masked-LM head); keys already
    # named as the tables name them are then unused, as in transformers' older class
    older_names: Callable[[transformers.PretrainedConfig], dict[str, str]] = lambda hf_config: {}
    # False where the family's config has no classifier rate its heads read (MPNet's heads drop out at
    # hidden_dropout_prob): a run's model.classifier_dropout would train a rate the export cannot keep, so it is refused
    reads_classifier_dropout: bool = True

    def base_class(self) -> str:
        return self.hf_prefix + BASE_SUFFIX

    def head_suffix(self, hf_class: str) -> str:
        """The suffix of the bertforge head `hf_class` imports as (`ForMaskedLM`), from its name."""
        return self.imports_as.get(hf_class, hf_class.removeprefix(self.hf_prefix))

    def class_for(self, model: Any) -> tuple[str | None, str]:
        """The HF class of this family that holds the bertforge `model` exactly, or (None, why none does): the
        class named by the suffix the model exports as (`model.hf_suffix()`), if the family maps it as that head."""
        suffix = model.hf_suffix()
        hf_class = self.hf_prefix + suffix if suffix is not None else None
        reason = self.unfit_head(hf_class, model) if hf_class is not None else ""
        if reason:
            return None, reason
        if hf_class is None or hf_class not in self.head_keys or self.head_suffix(hf_class) != suffix:
            return None, f"bertforge knows no HF {self.name} class for a {model.head_kind.replace('_', '-')} head"
        return hf_class, ""

    def key_pairs(self, config: EncoderConfig, hf_class: str, *, pooler: bool = False) -> list[KeyPair]:
        """Every (our key, HF key) of `hf_class` for this encoder, in that class's own layout."""
        encoder = self.encoder_keys(config, pooler)
        if hf_class != self.base_class():  # a For* class keeps the encoder under a prefix, as our heads do
            encoder = [prefixed(pair, "encoder.", self.encoder_prefix) for pair in encoder]
        return encoder + list(self.head_keys[hf_class])

    def in_head_layout(self, pair: KeyPair) -> KeyPair:
        """A bare encoder's pair with the HF key as a For* class names it (how imports read a bare model)."""
        return prefixed(pair, "", self.encoder_prefix)
