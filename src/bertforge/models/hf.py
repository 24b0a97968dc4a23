"""Hugging Face interop: import BERT / ModernBERT checkpoints, export to stock `transformers` classes.

Two of our architectures have a stock class, so users can ship them with no custom code:
classic BERT (learned positions, GELU MLP, post-norm, biases) -> `Bert*`, and
rope + geglu + pre-norm + no biases, without token types -> `ModernBert*`. The weights map one to
one except BERT's separate query/key/value, which we keep fused in one matrix (one matmul) and
split or concatenate here. Anything else (ALiBi, GLU with post-norm, ...) is exported in
bertforge's own format with a message saying so.

Export builds the `transformers` model, loads the converted weights into it strictly and lets
`save_pretrained` write the directory, so what we write is exactly what `from_pretrained` reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from bertforge.console import log
from bertforge.errors import BertforgeError
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel
from bertforge.models.for_pretraining import BertforgeForPreTraining
from bertforge.models.serialization import (
    copy_tokenizer_files,
    save_bertforge_model,
    untied_state_dict,
    write_directory_atomically,
)
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.size_limits import check_model_fits

BertforgeAny = (BertforgeModel | BertforgeForPreTraining | BertforgeForSequenceClassification
                | BertforgeForTokenClassification)
TASKS = ("auto", "base", "pretraining", "classification", "token_classification")

HF_TO_OUR_ACTIVATION = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                        "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
OUR_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "silu": "silu"}

# HF class -> the task it is imported as by default (task="auto")
IMPORTABLE_CLASSES = {
    "BertModel": "base", "BertForMaskedLM": "pretraining", "BertForPreTraining": "pretraining",
    "BertForSequenceClassification": "classification", "BertForTokenClassification": "token_classification",
    "ModernBertModel": "base", "ModernBertForMaskedLM": "pretraining",
    "ModernBertForSequenceClassification": "classification",
}

# ---------------------------------------------------------------------------------------------
# which stock class fits


def hf_family(config: EncoderConfig) -> tuple[str | None, str]:
    """("bert" | "modernbert" | None, why not) for the encoder's switches."""
    switches = (config.position, config.mlp, config.norm, config.bias)
    if switches == ("learned", "gelu", "post", True):
        if config.local_attention_window is not None:
            return None, "HF BERT has no local (sliding-window) attention"
        if config.type_vocab_size < 1:
            return None, "HF BERT needs token-type embeddings (type_vocab_size >= 1)"
        return "bert", ""
    if switches == ("rope", "geglu", "pre", False):
        if config.type_vocab_size != 0:
            return None, "HF ModernBERT has no token-type embeddings (needs type_vocab_size = 0)"
        return "modernbert", ""
    return None, (f"position={config.position}, mlp={config.mlp}, norm={config.norm}, bias={config.bias} "
                  "matches neither HF BERT (learned/gelu/post/bias) nor HF ModernBERT (rope/geglu/pre/no bias)")


def hf_class_name(model: BertforgeAny) -> tuple[str | None, str]:
    """The stock `transformers` class that can hold `model` exactly, or (None, the reason)."""
    family, reason = hf_family(model.config)
    if family is None:
        return None, reason
    prefix = "Bert" if family == "bert" else "ModernBert"
    if isinstance(model, BertforgeModel):
        if model.pooler is not None and family == "modernbert":
            return None, "HF ModernBertModel has no BERT pooler"
        return f"{prefix}Model", ""
    if isinstance(model, BertforgeForPreTraining):
        if model.nsp:
            if family == "modernbert":
                return None, "HF ModernBERT has no next-sentence-prediction head"
            return "BertForPreTraining", ""
        return f"{prefix}ForMaskedLM", ""
    if isinstance(model, BertforgeForTokenClassification):
        if family == "modernbert":
            return None, "HF ModernBertForTokenClassification has a dense+norm head before its classifier"
        return "BertForTokenClassification", ""
    pooling = model.config.pooling
    if family == "bert" and pooling != "pooler":
        return None, f"HF BertForSequenceClassification always uses the tanh pooler, not pooling={pooling}"
    if family == "modernbert" and pooling == "last":
        return None, "HF ModernBertForSequenceClassification pools with cls or mean, not the last token"
    if family == "modernbert" and pooling == "pooler":
        return None, "HF ModernBertForSequenceClassification pools with cls or mean, not BERT's tanh pooler"
    return f"{prefix}ForSequenceClassification", ""


# ---------------------------------------------------------------------------------------------
# weight names


# (our key, HF key or the HF query/key/value keys our fused matrix concatenates)
KeyPair = tuple[str, str | tuple[str, str, str]]

# The weight names, as data. In the encoder tables `{}` is the layer index and `{kind}` weight|bias;
# keys are as a bare `BertModel` / our `BertforgeModel` name them. A model with a head puts the
# encoder under a prefix (ENCODER_PREFIXES: ours, HF's); head keys are written in full.
BERT_ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.LayerNorm.weight"),
    ("embeddings.norm.bias", "embeddings.LayerNorm.bias"),
)
BERT_LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.{kind}", ("encoder.layer.{}.attention.self.query.{kind}",
                                        "encoder.layer.{}.attention.self.key.{kind}",
                                        "encoder.layer.{}.attention.self.value.{kind}")),
    ("layers.{}.attention.output.{kind}", "encoder.layer.{}.attention.output.dense.{kind}"),
    ("layers.{}.attention_norm.{kind}", "encoder.layer.{}.attention.output.LayerNorm.{kind}"),
    ("layers.{}.mlp.input.{kind}", "encoder.layer.{}.intermediate.dense.{kind}"),
    ("layers.{}.mlp.output.{kind}", "encoder.layer.{}.output.dense.{kind}"),
    ("layers.{}.mlp_norm.{kind}", "encoder.layer.{}.output.LayerNorm.{kind}"),
)
BERT_POOLER: tuple[KeyPair, ...] = (("pooler.dense.weight", "pooler.dense.weight"),
                                    ("pooler.dense.bias", "pooler.dense.bias"))
BERT_MLM_HEAD: tuple[KeyPair, ...] = (
    ("mlm_head.transform.dense.weight", "cls.predictions.transform.dense.weight"),
    ("mlm_head.transform.dense.bias", "cls.predictions.transform.dense.bias"),
    ("mlm_head.transform.norm.weight", "cls.predictions.transform.LayerNorm.weight"),
    ("mlm_head.transform.norm.bias", "cls.predictions.transform.LayerNorm.bias"),
    ("mlm_head.decoder.weight", "cls.predictions.decoder.weight"),
    ("mlm_head.decoder.bias", "cls.predictions.bias"),
)
MODERNBERT_ENCODER: tuple[KeyPair, ...] = (
    ("embeddings.word_embeddings.weight", "embeddings.tok_embeddings.weight"),
    ("embeddings.norm.weight", "embeddings.norm.weight"),
    ("final_norm.weight", "final_norm.weight"),
)
MODERNBERT_LAYER: tuple[KeyPair, ...] = (
    ("layers.{}.attention.qkv.weight", "layers.{}.attn.Wqkv.weight"),
    ("layers.{}.attention.output.weight", "layers.{}.attn.Wo.weight"),
    ("layers.{}.mlp.input.weight", "layers.{}.mlp.Wi.weight"),
    ("layers.{}.mlp.output.weight", "layers.{}.mlp.Wo.weight"),
    ("layers.{}.mlp_norm.weight", "layers.{}.mlp_norm.weight"),
)
# layer 0 has no attention norm: the embeddings' norm precedes it
MODERNBERT_LAYER_AFTER_FIRST: tuple[KeyPair, ...] = (("layers.{}.attention_norm.weight", "layers.{}.attn_norm.weight"),)
HEADS: dict[str, tuple[KeyPair, ...]] = {
    "BertModel": (),
    "BertForMaskedLM": BERT_MLM_HEAD,
    "BertForPreTraining": BERT_MLM_HEAD + (
        ("nsp_head.pooler.dense.weight", "bert.pooler.dense.weight"),
        ("nsp_head.pooler.dense.bias", "bert.pooler.dense.bias"),
        ("nsp_head.classifier.weight", "cls.seq_relationship.weight"),
        ("nsp_head.classifier.bias", "cls.seq_relationship.bias")),
    "BertForSequenceClassification": (
        ("head.pooler.dense.weight", "bert.pooler.dense.weight"),
        ("head.pooler.dense.bias", "bert.pooler.dense.bias"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
    "BertForTokenClassification": (("classifier.weight", "classifier.weight"), ("classifier.bias", "classifier.bias")),
    "ModernBertModel": (),
    "ModernBertForMaskedLM": (
        ("mlm_head.transform.dense.weight", "head.dense.weight"),
        ("mlm_head.transform.norm.weight", "head.norm.weight"),
        ("mlm_head.decoder.weight", "decoder.weight"),
        ("mlm_head.decoder.bias", "decoder.bias")),
    "ModernBertForSequenceClassification": (
        ("head.transform.dense.weight", "head.dense.weight"),
        ("head.transform.norm.weight", "head.norm.weight"),
        ("head.classifier.weight", "classifier.weight"),
        ("head.classifier.bias", "classifier.bias")),
}
ENCODER_PREFIXES = {name: ("", "") if name.endswith("Model") else
                    ("encoder.", "model." if name.startswith("ModernBert") else "bert.") for name in HEADS}


def _filled(pair: KeyPair, prefixes: tuple[str, str], layer: int | str = "", kind: str = "") -> KeyPair:
    ours, theirs = pair
    if isinstance(theirs, tuple):
        filled = tuple(prefixes[1] + name.format(layer, kind=kind) for name in theirs)
        return prefixes[0] + ours.format(layer, kind=kind), filled  # type: ignore[return-value]
    return prefixes[0] + ours.format(layer, kind=kind), prefixes[1] + theirs.format(layer, kind=kind)


def key_pairs(config: EncoderConfig, hf_class: str, *, pooler: bool = False) -> list[KeyPair]:
    """Every (our key, HF key) of `hf_class` for this encoder; `pooler`: a bare model's BERT pooler too."""
    prefixes = ENCODER_PREFIXES[hf_class]
    if hf_class.startswith("ModernBert"):
        pairs = [_filled(pair, prefixes) for pair in MODERNBERT_ENCODER]
        for i in range(config.num_layers):
            layer = MODERNBERT_LAYER + (MODERNBERT_LAYER_AFTER_FIRST if i > 0 else ())
            pairs += [_filled(pair, prefixes, i) for pair in layer]
    else:
        pairs = [_filled(pair, prefixes) for pair in BERT_ENCODER]
        pairs += [_filled(pair, prefixes, i, kind) for i in range(config.num_layers) for kind in ("weight", "bias")
                  for pair in BERT_LAYER]
        if pooler:
            pairs += [_filled(pair, prefixes) for pair in BERT_POOLER]
    return pairs + list(HEADS[hf_class])


# ---------------------------------------------------------------------------------------------
# configs


def encoder_config_from_hf(hf_config: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    """Our switches for an HF BERT or ModernBERT config; a clear error for what we cannot represent."""
    model_type = hf_config.model_type
    if model_type == "bert":
        return _config_from_bert(hf_config, source)
    if model_type == "modernbert":
        return _config_from_modernbert(hf_config, source)
    raise BertforgeError(f"{source}: model_type {model_type!r} is not supported; bertforge imports "
                         "Hugging Face `bert` and `modernbert` checkpoints")


def _activation(name: str, source: str, key: str) -> str:
    if name not in HF_TO_OUR_ACTIVATION:
        raise BertforgeError(f"{source}: `{key}` = {name!r} is not supported; "
                             f"supported: {', '.join(HF_TO_OUR_ACTIVATION)}")
    return HF_TO_OUR_ACTIVATION[name]


def _config_from_bert(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    position_type = getattr(hf, "position_embedding_type", "absolute")
    if position_type != "absolute":
        raise BertforgeError(f"{source}: position_embedding_type={position_type!r} is not supported; "
                             "bertforge imports BERT checkpoints with absolute (learned) positions")
    return EncoderConfig(
        vocab_size=hf.vocab_size, hidden_size=hf.hidden_size, num_layers=hf.num_hidden_layers,
        num_heads=hf.num_attention_heads, intermediate_size=hf.intermediate_size,
        max_position_embeddings=hf.max_position_embeddings, type_vocab_size=hf.type_vocab_size,
        hidden_dropout=hf.hidden_dropout_prob, attention_dropout=hf.attention_probs_dropout_prob,
        classifier_dropout=getattr(hf, "classifier_dropout", None), norm_eps=hf.layer_norm_eps,
        activation=_activation(hf.hidden_act, source, "hidden_act"), position="learned", mlp="gelu",
        norm="post", bias=True, tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
        pooling="pooler", initializer_range=hf.initializer_range,
    )


def _global_every_n(layer_types: list[str], source: str) -> tuple[bool, int | None]:
    """(any local layer, n) such that layer i is global iff i % n == 0."""
    is_global = [kind == "full_attention" for kind in layer_types]
    if all(is_global):
        return False, None
    if not any(is_global):
        return True, None
    count = len(is_global)
    for n in range(1, count + 1):
        if all(flag == (i % n == 0) for i, flag in enumerate(is_global)):
            return True, n
    raise BertforgeError(f"{source}: layer_types {layer_types} is not 'every n-th layer global, starting at 0'; "
                         "bertforge cannot represent this alternation")


def _config_from_modernbert(hf: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    biases = {name: getattr(hf, name) for name in ("attention_bias", "mlp_bias", "norm_bias", "classifier_bias")}
    if len(set(biases.values())) != 1:
        raise BertforgeError(f"{source}: mixed bias settings {biases}; bertforge has one `bias` switch for all")
    activation = _activation(hf.hidden_activation, source, "hidden_activation")
    if _activation(hf.classifier_activation, source, "classifier_activation") != activation:
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


def hf_config_for(model: BertforgeAny, hf_class: str,
                  special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    config = model.config
    common: dict[str, object] = {"architectures": [hf_class], "tie_word_embeddings": config.tie_word_embeddings,
                                 "pad_token_id": special_tokens.get("pad", 0)}
    if isinstance(model, BertforgeForSequenceClassification | BertforgeForTokenClassification):
        names = model.label_names or [f"LABEL_{i}" for i in range(model.num_labels)]
        common["id2label"] = dict(enumerate(names))
        common["label2id"] = {name: i for i, name in enumerate(names)}
    if isinstance(model, BertforgeForSequenceClassification):
        common["problem_type"] = ("regression" if model.problem_type == "regression"
                                  else "single_label_classification")
    activation = OUR_TO_HF_ACTIVATION[config.activation]
    if hf_class.startswith("Bert"):
        return transformers.BertConfig(
            vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads, intermediate_size=config.intermediate_size,
            hidden_act=activation, hidden_dropout_prob=config.hidden_dropout,
            attention_probs_dropout_prob=config.attention_dropout,
            max_position_embeddings=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
            layer_norm_eps=config.norm_eps, initializer_range=config.initializer_range,
            classifier_dropout=config.classifier_dropout, **common)
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


# ---------------------------------------------------------------------------------------------
# import


def from_hf(hf_model: nn.Module, task: str = "auto", *, num_labels: int | None = None,
            problem_type: str | None = None, label_names: list[str] | None = None,
            nsp: bool | None = None) -> BertforgeAny:
    """Convert an in-memory `transformers` BERT / ModernBERT model (any supported class) to ours.

    task: auto (the class's own task) | base | pretraining | classification. Weights the source
    does not have (e.g. an MLM head from a bare `BertModel`) keep their fresh initialisation;
    they are listed at info level.
    """
    hf_class = type(hf_model).__name__
    if hf_class not in IMPORTABLE_CLASSES:
        raise BertforgeError(f"cannot import a {hf_class}; supported: {', '.join(IMPORTABLE_CLASSES)}")
    hf_config = hf_model.config
    source = f"{hf_class} ({getattr(hf_config, '_name_or_path', '') or 'in memory'})"
    config = encoder_config_from_hf(hf_config, source)
    if task not in TASKS:
        raise BertforgeError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    task = IMPORTABLE_CLASSES[hf_class] if task == "auto" else task
    hf_state = hf_model.state_dict()
    # A bare BertModel/ModernBertModel has no `bert.`/`model.` prefix; read it in the For* layout.
    if hf_class in ("BertModel", "ModernBertModel"):
        hf_state = {("bert." if hf_class == "BertModel" else "model.") + key: value for key, value in hf_state.items()}
    model = _new_model(config, hf_class, hf_config, task, num_labels=num_labels, problem_type=problem_type,
                       label_names=label_names, nsp=nsp, pooler="bert.pooler.dense.weight" in hf_state)
    load_converted_state(model, hf_state, source)
    return model


def _new_model(config: EncoderConfig, hf_class: str, hf_config: transformers.PretrainedConfig, task: str, *,
               num_labels: int | None, problem_type: str | None, label_names: list[str] | None,
               nsp: bool | None, pooler: bool) -> BertforgeAny:
    if task == "base":
        return BertforgeModel(config, pooler=pooler)
    if task == "pretraining":
        return BertforgeForPreTraining(config, nsp=hf_class == "BertForPreTraining" if nsp is None else nsp)
    if hf_class.endswith("ForTokenClassification") or hf_class.endswith("ForSequenceClassification"):
        if num_labels is None:
            num_labels = hf_config.num_labels
        if label_names is None:
            names = [hf_config.id2label[i] for i in range(hf_config.num_labels)]
            label_names = None if names == [f"LABEL_{i}" for i in range(len(names))] else names
    if task == "token_classification":
        if num_labels is None:
            raise BertforgeError(f"{hf_class} has no token classifier: give num_labels (or tag names) for the new head")
        return BertforgeForTokenClassification(config, num_labels, label_names)
    if hf_class.endswith("ForSequenceClassification"):
        hf_problem = getattr(hf_config, "problem_type", None)
        if problem_type is None:
            problem_type = "regression" if hf_problem == "regression" or hf_config.num_labels == 1 else "classification"
    if num_labels is None and problem_type != "regression":
        raise BertforgeError(f"{hf_class} has no classifier: give num_labels (or label names) for the new head")
    return BertforgeForSequenceClassification(config, num_labels or 1, problem_type or "classification", label_names)


def _import_pairs(model: BertforgeAny) -> list[KeyPair]:
    """Key pairs in the For* layout (HF keys prefixed `bert.` / `model.`), for every weight `model` has."""
    bert = hf_family(model.config)[0] == "bert"
    if isinstance(model, BertforgeModel):
        bare = key_pairs(model.config, "BertModel" if bert else "ModernBertModel", pooler=model.pooler is not None)
        prefix = "bert." if bert else "model."
        return [(ours, tuple(prefix + key for key in theirs) if isinstance(theirs, tuple) else prefix + theirs)
                for ours, theirs in bare]  # type: ignore[misc]
    if isinstance(model, BertforgeForPreTraining):
        return key_pairs(model.config, "BertForPreTraining" if bert else "ModernBertForMaskedLM")
    if isinstance(model, BertforgeForTokenClassification):
        return key_pairs(model.config, "BertForTokenClassification")
    return key_pairs(model.config, "BertForSequenceClassification" if bert else "ModernBertForSequenceClassification")


def load_converted_state(model: BertforgeAny, hf_state: dict[str, torch.Tensor], source: str) -> None:
    """Copy the weights of an HF state dict (For* key layout) into `model`; heads it lacks stay fresh."""
    ours = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    for our_key, hf_key in _import_pairs(model):
        if our_key not in ours:
            continue
        if isinstance(hf_key, tuple):
            if all(k in hf_state for k in hf_key):
                converted[our_key] = torch.cat([hf_state[k] for k in hf_key], dim=0)
        elif hf_key in hf_state:
            converted[our_key] = hf_state[hf_key]
    for key, tensor in converted.items():
        if ours[key].shape != tensor.shape:
            raise BertforgeError(f"{source}: weight for {key} has shape {tuple(tensor.shape)}, expected "
                                 f"{tuple(ours[key].shape)}; the checkpoint does not match its config.json")
    _, tied = untied_state_dict(model)
    model.load_state_dict(converted, strict=False)
    fresh = [key for key in ours if key not in converted and key not in tied]
    encoder_fresh = [key for key in fresh if key.startswith("encoder.") or isinstance(model, BertforgeModel)]
    if encoder_fresh:
        raise BertforgeError(f"{source}: the checkpoint lacks encoder weights {encoder_fresh[:3]}; "
                             "it is incomplete or not a BERT/ModernBERT checkpoint")
    if fresh:
        log.info("initialised from scratch (not in %s): %s", source, ", ".join(fresh))


def read_hf_config(directory: str | Path) -> dict[str, Any]:
    """A Hugging Face directory's config.json, as the JSON object it holds."""
    config_path = Path(directory) / "config.json"
    if not config_path.is_file():
        raise BertforgeError(f"{directory} has no config.json; give a Hugging Face model directory")
    try:
        hf_config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{config_path}:{error.lineno}: not valid JSON ({error.msg})") from None
    if not isinstance(hf_config, dict):
        raise BertforgeError(f"{config_path}: expected a JSON object of settings, got {type(hf_config).__name__}")
    return hf_config


def hf_architecture(directory: str | Path) -> str:
    """The importable `transformers` class a Hugging Face directory holds (from its config.json)."""
    config_path = Path(directory) / "config.json"
    hf_config = read_hf_config(directory)
    architectures = hf_config.get("architectures") or []
    hf_class = next((name for name in architectures if name in IMPORTABLE_CLASSES), None)
    if hf_class is None:
        hf_class = {"bert": "BertModel", "modernbert": "ModernBertModel"}.get(hf_config.get("model_type") or "")
    if hf_class is None:
        raise BertforgeError(f"{config_path}: architectures {architectures} are not supported; bertforge imports "
                             f"{', '.join(IMPORTABLE_CLASSES)}")
    return hf_class


# config.json keys that size a BERT/ModernBERT model; a missing one takes transformers' default
HF_SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def check_hf_checkpoint(directory: str | Path, hf_class: str) -> None:
    """What `from_pretrained` would allocate and unpickle, checked before it runs.

    Sizes: each a whole number (transformers' own validation error is not one line), the model within
    `bertforge.size_limits` (a config.json with a million layers would otherwise grow memory for
    minutes). Weights: safetensors only; a pickle (`pytorch_model.bin`) can run code when it is
    loaded, and nothing bertforge reads may (`use_safetensors=True` makes transformers agree).
    """
    directory = Path(directory)
    config_path = directory / "config.json"
    values = read_hf_config(directory)
    for key in (*HF_SIZE_KEYS, "type_vocab_size"):
        value = values.get(key, 1)
        least = 0 if key == "type_vocab_size" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BertforgeError(f"{config_path}: `{key}` is {value!r}; give a whole number of at least {least}")
    hf_config = getattr(transformers, hf_class).config_class.from_pretrained(str(directory), local_files_only=True)
    if hf_config.hidden_size % hf_config.num_attention_heads:
        raise BertforgeError(f"{config_path}: `hidden_size` ({hf_config.hidden_size}) is not a multiple of "
                             f"`num_attention_heads` ({hf_config.num_attention_heads}); fix one of them")
    estimate = EncoderConfig(
        vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size, num_layers=hf_config.num_hidden_layers,
        num_heads=hf_config.num_attention_heads, intermediate_size=hf_config.intermediate_size,
        max_position_embeddings=hf_config.max_position_embeddings,
        type_vocab_size=getattr(hf_config, "type_vocab_size", 0), mlp="geglu" if hf_class.startswith("Modern") else "gelu")
    check_model_fits(estimate.parameter_count(), estimate.num_layers, str(config_path), "num_hidden_layers")
    if not any((directory / name).is_file() for name in SAFE_WEIGHTS):
        pickled = next((name for name in PICKLED_WEIGHTS if (directory / name).is_file()), None)
        if pickled is not None:
            raise BertforgeError(
                f"{directory / pickled}: weights in pickle format, which can run code when loaded, so bertforge does "
                "not read them; if you trust where they came from, convert them to model.safetensors once, e.g. "
                f"`python -c \"import transformers; transformers.{hf_class}.from_pretrained('{directory}')"
                f".save_pretrained('{directory}')\"`, or download the model's model.safetensors")
        raise BertforgeError(f"{directory}: no model.safetensors beside config.json; the directory is incomplete, copy "
                             "or download the weights as well")


def sentence_transformers_pooling(directory: str | Path) -> str | None:
    """`mean`, `cls` or `last` when `directory` is a sentence-transformers model trained with that pooling.

    Such checkpoints (all-MiniLM-L6-v2 is one) are trained on the mean of the token states or on
    [CLS], so the BERT pooler they still carry is left over from before and untrained for the task.
    """
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    settings = read_sentence_transformers(directory)
    return settings.pooling if settings is not None else None


def load_hf_checkpoint(directory: str | Path, task: str = "auto", *, num_labels: int | None = None,
                       problem_type: str | None = None, label_names: list[str] | None = None,
                       nsp: bool | None = None) -> BertforgeAny:
    """Load a Hugging Face BERT/ModernBERT directory (e.g. all-MiniLM-L6-v2) into a bertforge model, offline."""
    hf_class = hf_architecture(directory)
    check_hf_checkpoint(directory, hf_class)
    try:
        hf_model, loading = getattr(transformers, hf_class).from_pretrained(
            str(directory), local_files_only=True, output_loading_info=True, use_safetensors=True)
    except RuntimeError as error:
        if "mismatched_sizes" not in str(error) and "size mismatch" not in str(error):
            raise
        raise BertforgeError(f"{directory}: the weights in model.safetensors do not have the sizes its config.json "
                             "gives; restore the config.json that came with the weights") from None
    if any(key.endswith("pooler.dense.weight") for key in loading["missing_keys"]):
        # transformers drew a pooler the checkpoint does not have: import none rather than that draw
        owner = hf_model if hf_class == "BertModel" else getattr(hf_model, "bert", None)
        if owner is not None:
            owner.pooler = None
    return from_hf(hf_model, task, num_labels=num_labels, problem_type=problem_type, label_names=label_names,
                   nsp=nsp)


# ---------------------------------------------------------------------------------------------
# export


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    format: str  # "transformers" | "bertforge"
    architecture: str  # the HF class, or our model class for the bertforge format
    message: str


def special_token_ids(tokenizer_dir: str | Path | None) -> dict[str, int]:
    """[PAD]/[CLS]/[SEP] ids from a WordPiece tokenizer directory (tokenizer.json or vocab.txt)."""
    if tokenizer_dir is None:
        return {}
    directory = Path(tokenizer_dir)
    vocabulary: dict[str, int] = {}
    if (directory / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        vocabulary = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab()
    elif (directory / "vocab.txt").is_file():
        lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
        vocabulary = {token: index for index, token in enumerate(lines)}
    names = {"pad": "[PAD]", "cls": "[CLS]", "sep": "[SEP]"}
    return {name: vocabulary[token] for name, token in names.items() if token in vocabulary}


def to_hf_model(model: BertforgeAny, special_tokens: dict[str, int] | None = None) -> nn.Module:
    """The equivalent stock `transformers` model (raises if there is none; see `hf_class_name`)."""
    hf_class, reason = hf_class_name(model)
    if hf_class is None:
        raise BertforgeError(f"no stock transformers class for this model: {reason}")
    hf_config = hf_config_for(model, hf_class, special_tokens or {})
    cls = getattr(transformers, hf_class)
    pooler = isinstance(model, BertforgeModel) and model.pooler is not None
    hf_model = cls(hf_config, add_pooling_layer=pooler) if hf_class == "BertModel" else cls(hf_config)
    ours = model.state_dict()
    converted: dict[str, torch.Tensor] = {}
    for our_key, hf_key in key_pairs(model.config, hf_class, pooler=pooler):
        if our_key not in ours:
            continue
        if isinstance(hf_key, tuple):
            for key, part in zip(hf_key, ours[our_key].chunk(3, dim=0), strict=True):
                converted[key] = part
        else:
            converted[hf_key] = ours[our_key]
    if hf_class in ("BertForMaskedLM", "BertForPreTraining"):
        converted["cls.predictions.decoder.bias"] = ours["mlm_head.decoder.bias"]
    _, hf_tied = untied_state_dict(hf_model)
    missing, unexpected = hf_model.load_state_dict(converted, strict=False)
    missing = [key for key in missing if key not in hf_tied]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping to {hf_class} is incomplete: missing {missing}, unexpected {unexpected}")
    return hf_model


def export_hf(model: BertforgeAny, tokenizer_dir: str | Path | None, out_dir: str | Path) -> ExportResult:
    """Write `model` so stock `transformers` loads it (`AutoModelFor*.from_pretrained(out_dir)`), with the
    tokenizer files; architectures without a stock class are written in bertforge's format instead."""
    out_dir = Path(out_dir)
    hf_class, reason = hf_class_name(model)
    if hf_class is None:
        save_bertforge_model(model, out_dir, tokenizer_dir)
        message = (f"{reason}: no stock transformers class can load this model, so {out_dir} is in bertforge's "
                   "own format (load it with bertforge.models.load_bertforge_model)")
        log.warning(message)
        return ExportResult(out_dir.resolve(), "bertforge", type(model).__name__, message)
    hf_model = to_hf_model(model, special_token_ids(tokenizer_dir))

    def write(staging: Path) -> None:
        hf_model.save_pretrained(str(staging))
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, staging)

    directory = write_directory_atomically(out_dir, write)
    message = f"exported {hf_class} to {directory}; load it with transformers' AutoModel classes"
    if tokenizer_dir is None:
        message += " (no tokenizer given: add the tokenizer files before sharing)"
    log.info(message)
    return ExportResult(directory, "transformers", hf_class, message)
