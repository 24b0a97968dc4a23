"""One `EncoderConfig` for classic BERT and the modern variant, plus the named presets.

Classic BERT, Mosaic BERT, ModernBERT and the Cramming paper's model differ in a handful of
switches (positions, MLP, norm placement, biases, local attention); everything else — the
unpadded layout, the heads, the Hugging Face interop — is shared. Keeping the switches in one
flat dataclass means a preset is just a set of values and a YAML override can change any of them.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any, Protocol

from bertforge.errors import ConfigError
from bertforge.size_limits import check_model_fits

POSITIONS = ("learned", "rope", "alibi", "relative")
MLPS = ("gelu", "geglu")
NORMS = ("post", "pre")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
ATTENTION_BACKENDS = ("auto", "varlen", "flash", "sdpa", "eager")
POOLINGS = ("pooler", "relu_pooler", "gelu_pooler", "cls", "mean", "last")
HEAD_DROPOUT_RATES = ("classifier", "hidden")  # which rate a token classifier's or multiple-choice scorer's dropout takes
VOCAB_MULTIPLE = 64
SIZE_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
               "type_vocab_size", "local_attention_window", "global_every_n", "position_offset", "embedding_size",
               "relative_attention_buckets")


DISENTANGLED_TERMS = ("c2p", "p2c")


@dataclass(frozen=True)
class DisentangledAttention:
    """DeBERTa's relative-position attention (`models/disentangled_attention.py`), as its config.json names it."""

    terms: tuple[str, ...] = ("p2c", "c2p")  # pos_att_type: content-to-position and/or position-to-content scores
    position_buckets: int = 256  # log-bucketed relative distances (DeBERTa-v3: 256); 0 = distances as they are
    max_relative_positions: int = 512  # the farthest distance told apart (HF's -1 means max_position_embeddings)
    share_att_key: bool = True  # the relative embeddings go through the layer's own query/key projections (v3)
    norm_relative_embeddings: bool = True  # norm_rel_ebd = layer_norm: one LayerNorm over the relative table

    def __post_init__(self) -> None:
        object.__setattr__(self, "terms", tuple(self.terms))  # a JSON / YAML list read back
        if not self.terms or any(term not in DISENTANGLED_TERMS for term in self.terms):
            raise ConfigError(f"model `disentangled_attention.terms` is {list(self.terms)}; give c2p, p2c or both")
        if self.max_relative_positions < 1 or self.position_buckets < 0:
            raise ConfigError("model `disentangled_attention`: max_relative_positions must be at least 1 and "
                              "position_buckets 0 (none) or more")

    @property
    def span(self) -> int:
        """Relative distances each side that have their own embedding row (the table holds 2 * span rows)."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions


@dataclass
class EncoderConfig:
    vocab_size: int = 30528  # rows of the word embedding (padded to a multiple of 64 for fast matmuls)
    hidden_size: int = 768  # width of the residual stream
    num_layers: int = 12  # transformer layers
    num_heads: int = 12  # attention heads per layer
    intermediate_size: int = 3072  # MLP width (per half for geglu: the input projection is twice as wide)
    max_position_embeddings: int = 512  # longest sequence for learned positions (rope/alibi: a soft limit)
    type_vocab_size: int = 2  # token-type (segment) embeddings; 0 = none (ModernBERT, DistilBERT); 1 = every token type 0 (RoBERTa)
    position_offset: int = 0  # learned position of a sequence's first token (RoBERTa: padding_idx + 1 = 2)
    embedding_size: int | None = None  # width of the token embeddings where it differs from hidden_size (ELECTRA): a linear layer projects them to hidden_size; None = hidden_size
    relative_attention_buckets: int = 0  # MPNet's relative position bias: buckets of key-query offsets, one learned bias per bucket and head shared by all layers, added to the attention scores; 0 = none
    hidden_dropout: float = 0.1  # dropout on embeddings and on each sub-layer's output
    attention_dropout: float = 0.1  # dropout on attention probabilities
    classifier_dropout: float | None = None  # dropout before a sequence classifier; None = hidden_dropout
    classifier_input_dropout: bool = False  # the sequence classifier also drops out the pooled token before its dense layer, at classifier_dropout's rate: HF's RoBERTa, ELECTRA and MPNet classification heads run dropout, dense, activation, dropout, out_proj (BERT's pooler and DistilBERT's pre_classifier have no first dropout); the multiple-choice scorer's is choice_input_dropout
    token_classifier_dropout: str = "classifier"  # the token classifier's dropout rate: classifier (classifier_dropout, else hidden_dropout: HF BERT, RoBERTa, ELECTRA) | hidden (hidden_dropout whatever classifier_dropout is: HF DistilBERT, DeBERTa-v2, MPNet)
    pooler_dropout: float = 0.0  # dropout on the pooled token before the head's dense layer, at its own rate, in the sequence classifier and the multiple-choice scorer: DeBERTa's ContextPooler (pooler_dropout); 0 = none
    choice_input_dropout: float = 0.0  # the multiple-choice scorer also drops out the pooled token before its dense layer, at this rate: ELECTRA's summary_first_dropout; 0 = none
    choice_dropout: float | None = None  # the multiple-choice scorer's own dropout rate before its linear layer (ELECTRA's summary_last_dropout); None = the rate choice_classifier_dropout names
    choice_classifier_dropout: str = "classifier"  # the multiple-choice scorer's rate where choice_dropout is None: classifier (classifier_dropout, else hidden_dropout: HF BERT, DistilBERT, DeBERTa-v2, ModernBERT) | hidden (hidden_dropout whatever classifier_dropout is: HF RoBERTa, XLM-R, CamemBERT, MPNet, whose *ForMultipleChoice reads hidden_dropout_prob)
    norm_eps: float = 1e-12  # LayerNorm epsilon
    activation: str = "gelu"  # gelu (exact) | gelu_tanh | relu | silu — MLP and head activation
    position: str = "learned"  # learned | rope | alibi
    mlp: str = "gelu"  # gelu (dense, act, dense) | geglu (gated: act(x W) * (x V), then dense)
    norm: str = "post"  # post (BERT: norm after the residual add) | pre (norm before each sub-layer)
    bias: bool = True  # biases in the linear layers and norms of the encoder and heads
    local_attention_window: int | None = None  # sliding window (tokens, both sides together) of local layers
    global_every_n: int | None = None  # with a window: layers 0, n, 2n, ... attend globally; None = all local
    rope_theta: float = 10000.0  # RoPE base of global layers (ModernBERT: 160000)
    rope_theta_local: float = 10000.0  # RoPE base of local (sliding-window) layers
    tie_word_embeddings: bool = True  # the MLM decoder reuses the word-embedding matrix
    attention_backend: str = "auto"  # auto (varlen on GPUs, else sdpa) | varlen | flash | sdpa | eager
    pooling: str = "pooler"  # sequence head: pooler (BERT's tanh pooler on [CLS]) | relu_pooler (DistilBERT's pre_classifier: dense+ReLU on [CLS]) | gelu_pooler (ELECTRA's classifier.dense + exact GELU on [CLS]) | cls | mean | last (+ dense/act/norm); embeddings: cls | mean | last
    initializer_range: float = 0.02  # std of the truncated-normal initialisation
    hf_model_type: str | None = None  # the Hugging Face model_type imported from, where its graph is another's (xlm-roberta, camembert): export writes it back
    disentangled_attention: DisentangledAttention | None = None  # DeBERTa's c2p/p2c relative attention; with position=relative the only positions (v3)

    def __post_init__(self) -> None:
        if isinstance(self.disentangled_attention, dict):  # read back from config.json / a preset's asdict
            self.disentangled_attention = DisentangledAttention(**self.disentangled_attention)
        if (self.position == "relative" and self.disentangled_attention is None) or (
                self.disentangled_attention is not None and self.position not in ("learned", "relative")):
            raise ConfigError(f"model `position` is {self.position!r} and `disentangled_attention` is "
                              f"{'set' if self.disentangled_attention else 'unset'}: position=relative needs DeBERTa's "
                              "disentangled_attention, which takes position relative or learned (both) only")
        if self.disentangled_attention is not None and self.attention_backend in ("varlen", "flash"):
            raise ConfigError(f"model `attention_backend` is {self.attention_backend!r}, which has no relative-position "
                              "terms; DeBERTa's disentangled attention computes its own scores: leave it auto")
        for name, choices in (("position", POSITIONS), ("mlp", MLPS), ("norm", NORMS), ("activation", ACTIVATIONS),
                              ("attention_backend", ATTENTION_BACKENDS), ("pooling", POOLINGS),
                              ("token_classifier_dropout", HEAD_DROPOUT_RATES),
                              ("choice_classifier_dropout", HEAD_DROPOUT_RATES)):
            value = getattr(self, name)
            if value not in choices:
                raise ConfigError(f"model `{name}` is {value!r}; expected one of {', '.join(choices)}")
        for name in SIZE_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | None):
                raise ConfigError(f"model `{name}` is {value!r}; give a whole number")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model `{name}` is {getattr(self, name)}; it must be at least 1")
        if not 0 <= self.position_offset < self.max_position_embeddings:
            raise ConfigError(f"model `position_offset` is {self.position_offset}; give 0 (BERT) or the first learned "
                              f"position of a sequence (RoBERTa: 2), below max_position_embeddings")
        if self.embedding_size is not None and self.embedding_size < 1:
            raise ConfigError(f"model `embedding_size` is {self.embedding_size}; give the embeddings' width, or leave "
                              "it unset for hidden_size")
        buckets = self.relative_attention_buckets
        if buckets and (buckets < 4 or buckets % 2):
            raise ConfigError(f"model `relative_attention_buckets` is {self.relative_attention_buckets}; give an even "
                              "number of at least 4 (half for keys before the query, half after; MPNet: 32) or 0 "
                              "for none")
        if self.attention_backend in ("varlen", "flash") and self.relative_attention_buckets:
            raise ConfigError(f"model `attention_backend` is {self.attention_backend!r}, which takes no attention bias, "
                              "and `relative_attention_buckets` is set (MPNet's relative position bias); use auto or sdpa")
        if self.type_vocab_size < 0:
            raise ConfigError(f"model `type_vocab_size` is {self.type_vocab_size}; use 0 for no token types")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model `hidden_size` ({self.hidden_size}) is not a multiple of `num_heads` "
                              f"({self.num_heads}); change one of them")
        if self.position == "rope" and self.head_dim % 2:
            raise ConfigError(f"rope needs an even head size, got hidden_size/num_heads = {self.head_dim}; "
                              "change `hidden_size` or `num_heads`")
        if self.attention_backend == "varlen" and self.position == "alibi":
            raise ConfigError("model `attention_backend` is 'varlen', which has no ALiBi bias, and `position` is "
                              "alibi; use auto, flash (flash-attn package) or sdpa")
        if self.local_attention_window is not None and self.local_attention_window < 2:
            raise ConfigError(f"model `local_attention_window` is {self.local_attention_window}; give at least 2 "
                              "(tokens on both sides together) or leave it unset for global attention")
        if self.global_every_n is not None and self.global_every_n < 1:
            raise ConfigError(f"model `global_every_n` is {self.global_every_n}; it must be at least 1")
        for name in ("hidden_dropout", "attention_dropout", "classifier_dropout", "pooler_dropout", "choice_input_dropout",
                     "choice_dropout"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"model `{name}` is {value}; it must be in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def embedding_width(self) -> int:
        """The token embeddings' width (ELECTRA's `embedding_size`), which the MLM decoder shares."""
        return self.hidden_size if self.embedding_size is None else self.embedding_size

    @property
    def projects_embeddings(self) -> bool:
        return self.embedding_width != self.hidden_size

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the learned positions cover (RoBERTa's first `position_offset` rows are never used)."""
        return self.max_position_embeddings - self.position_offset

    @property
    def effective_classifier_dropout(self) -> float:
        return self.hidden_dropout if self.classifier_dropout is None else self.classifier_dropout

    @property
    def choice_dropout_rate(self) -> float:
        """The multiple-choice scorer's dropout before its linear layer."""
        if self.choice_dropout is not None:
            return self.choice_dropout
        return self.hidden_dropout if self.choice_classifier_dropout == "hidden" else self.effective_classifier_dropout

    @property
    def token_dropout(self) -> float:
        """The token classifier's dropout rate, as the family's HF *ForTokenClassification draws it."""
        return self.hidden_dropout if self.token_classifier_dropout == "hidden" else self.effective_classifier_dropout

    def is_global_layer(self, layer_index: int) -> bool:
        """ModernBERT's alternation: with a window, layers 0, n, 2n, ... still attend to the whole sequence."""
        if self.local_attention_window is None:
            return True
        return self.global_every_n is not None and layer_index % self.global_every_n == 0

    def layer_window(self, layer_index: int) -> int | None:
        """Tokens each side a query of this layer may see (None = the whole sequence)."""
        if self.is_global_layer(layer_index):
            return None
        assert self.local_attention_window is not None
        return self.local_attention_window // 2

    def layer_rope_theta(self, layer_index: int) -> float:
        return self.rope_theta if self.is_global_layer(layer_index) else self.rope_theta_local

    def parameter_count(self) -> int:
        """The parameters of the encoder with an MLM head, from the sizes alone (no tensor is made): what
        `bertforge.size_limits.check_model_fits` weighs before a model is built. A task head adds little."""
        hidden, inner, bias = self.hidden_size, self.intermediate_size, int(self.bias)
        norm = hidden * (1 + bias)
        positions = self.max_position_embeddings if self.position == "learned" else 0
        width = self.embedding_width
        embeddings = (self.vocab_size + positions + self.type_vocab_size) * width + width * (1 + bias)
        if self.projects_embeddings:
            embeddings += width * hidden + hidden
        embeddings += self.relative_attention_buckets * self.num_heads
        mlp_inner = inner * (2 if self.mlp == "geglu" else 1)
        layer = (3 * hidden * hidden + 3 * hidden * bias + hidden * hidden + hidden * bias  # attention
                 + hidden * mlp_inner + mlp_inner * bias + inner * hidden + hidden * bias + 2 * norm)
        mlm_head = (hidden * width + width * bias + width * (1 + bias)
                    + self.vocab_size * (bias + (not self.tie_word_embeddings) * width))
        relative = self.disentangled_attention
        if relative is not None:  # DeBERTa's relative table (+ its norm), and per-layer projections when not shared
            embeddings += 2 * relative.span * hidden + relative.norm_relative_embeddings * norm
            layer += (not relative.share_att_key) * len(relative.terms) * (hidden * hidden + hidden)
        return embeddings + self.num_layers * layer + mlm_head

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "model config") -> EncoderConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f"; did you mean `{close[0]}`?" if close else ""
                raise ConfigError(f"unknown encoder field `{key}` in {source}{hint}")
        try:
            config = cls(**values)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None
        check_model_fits(config.parameter_count(), config.num_layers, source)  # before any weight is allocated
        return config


def _preset(**values: Any) -> dict[str, Any]:
    return values


# Shapes from the papers; dropouts as each recipe pre-trains. Cramming uses scaled sinusoidal
# positions, which we approximate with learned ones (it trains at 128 tokens, where they behave alike).
PRESETS: dict[str, dict[str, Any]] = {
    "bert-tiny": _preset(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512),
    "bert-mini": _preset(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "bert-small": _preset(hidden_size=512, num_layers=4, num_heads=8, intermediate_size=2048),
    "bert-base": _preset(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
    "bert-large": _preset(hidden_size=1024, num_layers=24, num_heads=16, intermediate_size=4096),
    "mosaic-bert-base": _preset(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
                                position="alibi", mlp="geglu", attention_dropout=0.0),
    "modernbert-base": _preset(vocab_size=50368, hidden_size=768, num_layers=22, num_heads=12,
                               intermediate_size=1152, max_position_embeddings=8192, type_vocab_size=0,
                               hidden_dropout=0.0, attention_dropout=0.0, norm_eps=1e-5, position="rope",
                               mlp="geglu", norm="pre", bias=False, local_attention_window=128,
                               global_every_n=3, rope_theta=160000.0, rope_theta_local=10000.0,
                               pooling="cls"),
    "crammed-bert": _preset(vocab_size=32768, hidden_size=768, num_layers=16, num_heads=12,
                            intermediate_size=1536, max_position_embeddings=128, hidden_dropout=0.0,
                            attention_dropout=0.0, mlp="geglu", norm="pre", bias=False, pooling="cls"),
    # RoBERTa: BERT's graph, positions numbered after the pad id (<pad> is 1 in its tokenizer), one token type
    "roberta-base": _preset(vocab_size=50304, hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072,
                            max_position_embeddings=514, type_vocab_size=1, position_offset=2, norm_eps=1e-5,
                            classifier_input_dropout=True, choice_classifier_dropout="hidden"),
    "roberta-tiny": _preset(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512,
                            max_position_embeddings=514, type_vocab_size=1, position_offset=2, norm_eps=1e-5,
                            classifier_input_dropout=True, choice_classifier_dropout="hidden"),
    # DistilBERT (distilbert-base-multilingual-cased's shape): BERT's post-norm layers, no token types, no pooler, the
    # classifier on pre_classifier+ReLU; hf_model_type names the family its export is written as
    "distilbert-base-multilingual-cased": _preset(vocab_size=119547, hidden_size=768, num_layers=6, num_heads=12,
                                                  intermediate_size=3072, type_vocab_size=0, classifier_dropout=0.2,
                                                  pooling="relu_pooler", token_classifier_dropout="hidden",
                                                  hf_model_type="distilbert"),
    "distilbert-tiny": _preset(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512, type_vocab_size=0,
                               classifier_dropout=0.2, pooling="relu_pooler", token_classifier_dropout="hidden",
                               hf_model_type="distilbert"),
    # DeBERTa-v3: no absolute positions, disentangled attention over 256 log buckets, no token types
    "deberta-v3-small": _preset(vocab_size=128128, hidden_size=768, num_layers=6, num_heads=12, intermediate_size=3072,
                                type_vocab_size=0, norm_eps=1e-7, position="relative", pooling="gelu_pooler",
                                token_classifier_dropout="hidden", disentangled_attention=DisentangledAttention()),
    "deberta-v3-tiny": _preset(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512, type_vocab_size=0,
                               norm_eps=1e-7, position="relative", pooling="gelu_pooler",
                               token_classifier_dropout="hidden", disentangled_attention=DisentangledAttention()),
}


def preset_names() -> list[str]:
    return list(PRESETS)


def get_preset(name: str) -> EncoderConfig:
    """The named architecture as an `EncoderConfig` (a fresh copy each call)."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        raise ConfigError(f"unknown model preset {name!r} in config key `model.preset`{hint}; "
                          f"choose one of {', '.join(PRESETS)}")
    return EncoderConfig(**PRESETS[name])


def pad_vocab_size(vocab_size: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Round up so the vocabulary projection's matmul has a friendly shape; extra rows are never targets."""
    return -(-vocab_size // multiple) * multiple


OVERRIDABLE_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
                      "hidden_dropout", "attention_dropout", "norm_eps", "position", "mlp", "norm", "bias",
                      "local_attention_window", "global_every_n", "tie_word_embeddings", "attention_backend",
                      "pooling", "classifier_dropout")


class ModelSettings(Protocol):
    """What `encoder_config_from_section` reads of a config's `model:` section (`bertforge.config.ModelSection`):
    its preset and vocabulary size here, each of OVERRIDABLE_FIELDS by name. Stated as a protocol so that
    models/ needs nothing from the config layer above it."""

    preset: str
    vocab_size: int | None


def encoder_config_from_section(section: ModelSettings, vocab_size: int) -> EncoderConfig:
    """The preset of `model.preset`, then every non-None override of the section; vocab padded to x64.

    `vocab_size` is the tokenizer's; `model.vocab_size`, when set, wins over it.
    """
    values = dataclasses.asdict(get_preset(section.preset))
    for name in OVERRIDABLE_FIELDS:
        value = getattr(section, name)
        if value is not None:
            values[name] = value
    values["vocab_size"] = pad_vocab_size(section.vocab_size if section.vocab_size is not None else vocab_size)
    config = EncoderConfig(**values)
    check_model_fits(config.parameter_count(), config.num_layers,
                     f"the model of model.preset={section.preset} and the model.* keys")
    return config
