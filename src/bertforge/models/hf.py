"""Hugging Face interop: import checkpoints of the supported families, export to stock `transformers` classes.

Generic code over the family adapters (`models/families/`: one file per family with its config
mapping both ways, weight-name tables, head tables and class-name prefix) and the head classes (each
says which HF class names hold it: `hf_suffixes`), so no kind or family is named here. An encoder whose switches
match a family's is exported as that family's stock class, so users can ship it with no custom
code; anything else (ALiBi, GLU with post-norm, ...) is exported in bertforge's own format with a
message saying so.

Export writes what `save_pretrained` of the stock model writes, without building that model: the tensors
under the class's names (each shared tensor once) in `model.safetensors`, and the family's `transformers` config
class writes config.json. Importing a model class costs about 1 s of CPU (torch._dynamo, scipy) in every process
that exports; tests/test_hf_export_files.py compares both ways for every family and head. `to_hf_model` still
builds the stock model for the ONNX export, which traces it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bertforge.console import log
from bertforge.errors import BertforgeError, ConfigError
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.config import EncoderConfig
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.models.encoder import BertforgeModel
from bertforge.models.families import (
    CLASS_FAMILY,
    FAMILIES,
    KeyPair,
    family_for_config,
    family_of_class,
    family_of_model_type,
)
from bertforge.models.for_pretraining import BertforgeForPreTraining
from bertforge.models.init import every_weight_loaded_next
from bertforge.models.serialization import (
    MODEL_CLASSES,
    copy_tokenizer_files,
    save_bertforge_model,
    untied_state_dict,
    write_directory_atomically,
)
from bertforge.models.token_classification import BertforgeForTokenClassification
from bertforge.size_limits import check_model_fits
from bertforge.special_tokens import special_token_ids

if TYPE_CHECKING:
    import transformers

BertforgeAny = (BertforgeModel | BertforgeForPreTraining | BertforgeForSequenceClassification
                | BertforgeForTokenClassification | BertforgeForEmbedding)


def hf_head_classes() -> list[type[BertforgeAny]]:
    """The bertforge model classes some HF class holds: those with `hf_suffixes` (a head living in a task kind's
    own module is among them once `bertforge.tasks.kinds` is imported)."""
    return [cls for cls in MODEL_CLASSES.values() if getattr(cls, "hf_suffixes", ())]  # type: ignore[misc]


def head_class_of(hf_class: str) -> type[BertforgeAny]:
    """The bertforge model class an HF class imports as by default (task="auto"), read from its name."""
    suffix = family_of_class(hf_class).head_suffix(hf_class)
    found = next((cls for cls in hf_head_classes() if suffix in cls.hf_suffixes), None)
    if found is None:
        raise BertforgeError(f"no bertforge model class holds a {hf_class} (one a task kind defines is known once "
                             "`bertforge.tasks.kinds` is imported)")
    return found


# ---------------------------------------------------------------------------------------------
# which stock class fits


def hf_family(config: EncoderConfig) -> tuple[str | None, str]:
    """(the family name | None, why not) for the encoder's switches."""
    family, reason = family_for_config(config)
    return (family.name if family is not None else None), reason


def hf_class_name(model: BertforgeAny) -> tuple[str | None, str]:
    """The stock `transformers` class that can hold `model` exactly, or (None, the reason)."""
    family, reason = family_for_config(model.config)
    if family is None:
        return None, reason
    return family.class_for(model)


# ---------------------------------------------------------------------------------------------
# weight names


def key_pairs(config: EncoderConfig, hf_class: str, *, pooler: bool = False) -> list[KeyPair]:
    """Every (our key, HF key) of `hf_class` for this encoder; `pooler`: a bare model's BERT pooler too."""
    return family_of_class(hf_class).key_pairs(config, hf_class, pooler=pooler)


# ---------------------------------------------------------------------------------------------
# configs


def encoder_config_from_hf(hf_config: transformers.PretrainedConfig, source: str) -> EncoderConfig:
    """Our switches for an HF config of a supported family; a clear error for what we cannot represent."""
    return family_of_model_type(hf_config.model_type, source).config_from_hf(hf_config, source)


def hf_config_for(model: BertforgeAny, hf_class: str,
                  special_tokens: dict[str, int]) -> transformers.PretrainedConfig:
    common: dict[str, object] = {"architectures": [hf_class], "tie_word_embeddings": model.config.tie_word_embeddings,
                                 "pad_token_id": special_tokens.get("pad", 0)}
    common |= model.hf_config_extras()
    return family_of_class(hf_class).config_to_hf(model.config, common, special_tokens)


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
    hf_state = in_head_layout(hf_class, hf_model.config, hf_model.state_dict())
    model = _model_for_state(hf_class, hf_model.config, hf_state, task, num_labels=num_labels,
                             problem_type=problem_type, label_names=label_names, nsp=nsp)
    load_converted_state(model, hf_state, _source_of(hf_class, hf_model.config))
    return model


def in_head_layout(hf_class: str, hf_config: transformers.PretrainedConfig,
                   hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF state dict in the For* layout: a bare model's has no `bert.`/`model.` prefix, so it gets one.
    (ElectraForPreTraining imports as a base too, but keeps its encoder under `electra.` as every For* class does.)
    Keys of an older layout the config selects get today's names (the family's `older_names`); keys already in
    today's layout are then not used, as transformers, which builds the older layout's class, uses none of them
    (microsoft's deberta-v3 checkpoints: `legacy` unset over `lm_predictions.*` weights) and draws that part fresh."""
    family = family_of_class(hf_class)
    if hf_class == family.base_class():
        hf_state = {family.encoder_prefix + key: value for key, value in hf_state.items()}
    renames = family.older_names(hf_config)
    if not renames:
        return hf_state
    todays = set(renames.values())
    unused = sorted(key for key in hf_state if key in todays)
    if unused:
        log.warning("%s: weights not used, as transformers does not use them: config.json selects the older layout "
                    "(legacy: true, transformers' default when unset), whose class has no such weights and draws "
                    "its own: %s", _source_of(hf_class, hf_config), ", ".join(unused))
    return {renames.get(key, key): value for key, value in hf_state.items() if key not in todays}


def _source_of(hf_class: str, hf_config: transformers.PretrainedConfig) -> str:
    return f"{hf_class} ({getattr(hf_config, '_name_or_path', '') or 'in memory'})"


def _model_for_state(hf_class: str, hf_config: transformers.PretrainedConfig, hf_state: dict[str, torch.Tensor],
                     task: str, *, num_labels: int | None, problem_type: str | None, label_names: list[str] | None,
                     nsp: bool | None) -> BertforgeAny:
    """The fresh bertforge model `from_hf` loads an HF class's state (For* layout) into."""
    config = encoder_config_from_hf(hf_config, _source_of(hf_class, hf_config))
    tasks = ("auto", *(cls.head_kind for cls in hf_head_classes()))
    if task not in tasks:
        raise BertforgeError(f"unknown task {task!r}; choose one of {', '.join(tasks)}")
    task = head_class_of(hf_class).head_kind if task == "auto" else task
    pooler = f"{family_of_class(hf_class).encoder_prefix}pooler.dense.weight" in hf_state
    return _new_model(config, hf_class, hf_config, task, num_labels=num_labels, problem_type=problem_type,
                      label_names=label_names, nsp=nsp, pooler=pooler)


def _holds_every_weight(model: BertforgeAny, hf_state: dict[str, torch.Tensor]) -> bool:
    """Whether `hf_state` has, under the names `model`'s class maps, every weight of `model` but its tied ones.

    A weight with two HF names is there under either: BERT's MLM bias is `cls.predictions.bias` and
    `cls.predictions.decoder.bias`, and `save_pretrained` (our export too) writes only the first. Requiring both sent
    every pre-trained MLM directory to `from_pretrained`, whose modeling module costs about 2.4 s of CPU."""
    ours = model.state_dict()
    _, tied = untied_state_dict(model)
    held: dict[str, bool] = {}
    for our_key, hf_key in _import_pairs(model):
        if our_key in ours and our_key not in tied:
            keys = hf_key if isinstance(hf_key, tuple) else (hf_key,)
            held[our_key] = held.get(our_key, False) or all(key in hf_state for key in keys)
    return all(held.values())


def _new_model(config: EncoderConfig, hf_class: str, hf_config: transformers.PretrainedConfig, task: str, *,
               num_labels: int | None, problem_type: str | None, label_names: list[str] | None,
               nsp: bool | None, pooler: bool) -> BertforgeAny:
    """A fresh model of `task`'s class with the head options the checkpoint implies where none is given: its
    label count and names, its problem type, whether it has an NSP head."""
    from bertforge.models.loading import model_for_head

    family = family_of_class(hf_class)
    if nsp is None:  # a checkpoint with an NSP head keeps it (BertForPreTraining); a masked-LM one has none
        nsp = any(key.startswith("nsp_head.") for key, _ in family.head_keys[hf_class])
    given = {"num_labels": num_labels, "problem_type": problem_type, "label_names": label_names}
    # what the checkpoint's own head says (a classifier's config.json names its labels), where the caller is silent
    options = head_class_of(hf_class).options_from_hf(hf_config) | {
        key: value for key, value in given.items() if value is not None}
    try:
        return model_for_head(task).for_head(config, source_pooler=pooler, nsp=nsp, **options)
    except ConfigError as error:
        raise BertforgeError(f"{hf_class} has no such head ({error}): give num_labels (or label names) for the "
                             "new head") from None


def _import_pairs(model: BertforgeAny) -> list[KeyPair]:
    """Key pairs in the For* layout (HF keys prefixed `bert.` / `model.`), for every weight `model` has.

    The class is the one the family exports this kind of model as; for a head no stock class holds
    exactly, the family's class of the same kind (the weights both have import, the rest starts fresh),
    or none (ModernBERT's token classifier: the encoder imports, the head starts fresh)."""
    family, reason = family_for_config(model.config)
    if family is None:
        raise BertforgeError(f"cannot map {type(model).__name__} to a Hugging Face family: {reason}")
    if model.encoder_model() is model:  # a bare encoder
        bare = family.encoder_keys(model.config, model.pooler_module() is not None)
        return [family.in_head_layout(pair) for pair in bare]
    hf_class, _ = family.class_for(model)
    if hf_class is None:  # no exact stock class: the family's class of the same head maps what it holds
        hf_class = next((name for name in family.head_keys if family.head_suffix(name) in model.hf_suffixes), None)
    if hf_class is None:
        return [family.in_head_layout(pair) for pair in family.encoder_keys(model.config, False)]
    return family.key_pairs(model.config, hf_class)


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
    encoder_fresh = [key for key in fresh if key.startswith("encoder.") or model.encoder_model() is model]
    if encoder_fresh:
        raise BertforgeError(f"{source}: the checkpoint lacks encoder weights {encoder_fresh[:3]}; "
                             "it is incomplete, or not the checkpoint its config.json describes")
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
    hf_class = next((name for name in architectures if name in CLASS_FAMILY), None)
    family = next((f for f in FAMILIES.values() if f.model_type == hf_config.get("model_type")), None)
    if hf_class is None and family is not None:  # no architectures listed: the family's bare encoder
        hf_class = family.base_class()
    if hf_class is None:
        raise BertforgeError(f"{config_path}: architectures {architectures} are not supported; bertforge imports "
                             f"{', '.join(CLASS_FAMILY)}")
    return hf_class


# config.json keys that size a BERT/ModernBERT model; a missing one takes transformers' default
HF_SIZE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings")
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def check_hf_checkpoint(directory: str | Path, hf_class: str) -> transformers.PretrainedConfig:
    """What `from_pretrained` would allocate and unpickle, checked before it runs; returns the config it read.

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
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers

    # the family's config class, not `getattr(transformers, hf_class).config_class`: that imports the modeling module
    config_class = transformers.CONFIG_MAPPING[family_of_class(hf_class).model_type]
    hf_config = config_class.from_pretrained(str(directory), local_files_only=True)
    if hf_config.hidden_size % hf_config.num_attention_heads:
        raise BertforgeError(f"{config_path}: `hidden_size` ({hf_config.hidden_size}) is not a multiple of "
                             f"`num_attention_heads` ({hf_config.num_attention_heads}); fix one of them")
    estimate = family_of_class(hf_class).config_from_hf(hf_config, str(config_path))  # sizes only, nothing built
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
    return hf_config


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
    hf_config = check_hf_checkpoint(directory, hf_class)
    model = _load_named_as_hf_class(directory, hf_class, hf_config, task, num_labels=num_labels,
                                    problem_type=problem_type, label_names=label_names, nsp=nsp)
    if model is not None:
        return model
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers

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
        family = family_of_class(hf_class)
        owner = hf_model if hf_class == family.base_class() else getattr(
            hf_model, family.encoder_prefix.rstrip("."), None)
        if owner is not None:
            owner.pooler = None
    return from_hf(hf_model, task, num_labels=num_labels, problem_type=problem_type, label_names=label_names,
                   nsp=nsp)


def _load_named_as_hf_class(directory: str | Path, hf_class: str, hf_config: transformers.PretrainedConfig, task: str,
                            *, num_labels: int | None, problem_type: str | None, label_names: list[str] | None,
                            nsp: bool | None) -> BertforgeAny | None:
    """The model read straight from a single model.safetensors that names every weight as `hf_class` does, or None
    (the global RNG as it was) for `from_pretrained` to load it: a sharded file, older names it would rename, a
    weight it would draw fresh.

    `from_pretrained` would hand over the very same tensors, and importing a `transformers` model class costs
    2-4 s of start-up on these cores (its modeling module imports torch._dynamo): most of `bertforge embed
    all-MiniLM-L6-v2`'s start-up before this path."""
    path = Path(directory) / SAFE_WEIGHTS[0]
    if not path.is_file():
        return None
    hf_config._name_or_path = str(directory)  # as `from_pretrained` names it (the errors and logs say so)
    hf_state = in_head_layout(hf_class, hf_config, load_file(str(path)))
    rng = torch.get_rng_state()
    with every_weight_loaded_next():  # loaded only when the file holds every weight (else built again, drawn)
        model = _model_for_state(hf_class, hf_config, hf_state, task, num_labels=num_labels,
                                 problem_type=problem_type, label_names=label_names, nsp=nsp)
    if not _holds_every_weight(model, hf_state):
        torch.set_rng_state(rng)  # the fallback builds the model again: the same draws as if this had not run
        return None
    load_converted_state(model, hf_state, _source_of(hf_class, hf_config))
    return model


# ---------------------------------------------------------------------------------------------
# export


@dataclass(frozen=True)
class ExportResult:
    directory: Path
    format: str  # "transformers" | "bertforge"
    architecture: str  # the HF class, or our model class for the bertforge format
    message: str


def _exported_class(model: BertforgeAny) -> tuple[str, bool]:
    """(the stock class `model` exports as, whether that is a bare model with BERT's pooler); raises if none fits."""
    hf_class, reason = hf_class_name(model)
    if hf_class is None:
        raise BertforgeError(f"no stock transformers class for this model: {reason}")
    return hf_class, model.encoder_model() is model and model.pooler_module() is not None


def _hf_named_tensors(model: BertforgeAny, hf_class: str, pooler: bool) -> list[tuple[str, torch.Tensor]]:
    """(HF key, our tensor) for every weight of `hf_class`, in the key tables' order; our fused q/k/v in three."""
    ours = model.state_dict()
    named: list[tuple[str, torch.Tensor]] = []
    for our_key, hf_key in key_pairs(model.config, hf_class, pooler=pooler):
        if our_key not in ours:
            continue
        if isinstance(hf_key, tuple):
            named += zip(hf_key, ours[our_key].chunk(3, dim=0), strict=True)
        else:
            named.append((hf_key, ours[our_key]))
    return named


def hf_state_dict(model: BertforgeAny) -> dict[str, torch.Tensor]:
    """What `save_pretrained` of the stock class writes for `model`: the weights under the class's names, in
    torch's default dtype (the stock model's). With `tie_word_embeddings` each shared tensor is written once, under
    the first name the key tables give it: transformers then ties the MLM decoder to the word embeddings and the
    decoder's bias to the head's, and keeps only the names the tables list first. Without it, transformers ties
    neither, and every name is written (our one MLM bias under both of BERT's names)."""
    hf_class, pooler = _exported_class(model)
    dtype = torch.get_default_dtype()
    tensors: dict[str, torch.Tensor] = {}
    written: set[tuple[int, int, tuple[int, ...]]] = set()
    for hf_key, tensor in _hf_named_tensors(model, hf_class, pooler):
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if model.config.tie_word_embeddings and tensor.numel() and identity in written:
            continue
        written.add(identity)
        # a copy of its own: safetensors refuses views that share storage (the three slices of q/k/v)
        tensors[hf_key] = tensor.detach().to(device="cpu", dtype=dtype if tensor.is_floating_point() else None,
                                             copy=True).contiguous()
    return tensors


# save_pretrained's default `max_shard_size`: a model larger than this is left to it, to write in shards
SINGLE_FILE_LIMIT_BYTES = 50 * 10**9


def write_hf_model(model: BertforgeAny, special_tokens: dict[str, int], directory: Path) -> str:
    """Write `model.safetensors` and `config.json` of the stock class into `directory`, as `save_pretrained` of
    that class's model would; returns the class name."""
    hf_class, _ = _exported_class(model)
    if sum(tensor.numel() for tensor in model.parameters()) * torch.get_default_dtype().itemsize > SINGLE_FILE_LIMIT_BYTES:
        to_hf_model(model, special_tokens).save_pretrained(str(directory))
        return hf_class
    tensors = hf_state_dict(model)
    hf_config = hf_config_for(model, hf_class, special_tokens)
    hf_config.dtype = str(torch.get_default_dtype()).removeprefix("torch.")  # save_pretrained records the weights'
    save_file(tensors, str(directory / SAFE_WEIGHTS[0]), metadata={"format": "pt"})
    hf_config.save_pretrained(str(directory))
    return hf_class


def to_hf_model(model: BertforgeAny, special_tokens: dict[str, int] | None = None) -> nn.Module:
    """The equivalent stock `transformers` model (raises if there is none; see `hf_class_name`)."""
    hf_class, pooler = _exported_class(model)
    import transformers  # here, not at the top: loading a bertforge model must not pay for importing transformers

    hf_config = hf_config_for(model, hf_class, special_tokens or {})
    hf_model = family_of_class(hf_class).build_hf_model(getattr(transformers, hf_class), hf_config, pooler)
    converted = dict(_hf_named_tensors(model, hf_class, pooler))
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
    special_tokens = special_token_ids(tokenizer_dir)

    def write(staging: Path) -> None:
        write_hf_model(model, special_tokens, staging)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, staging)

    directory = write_directory_atomically(out_dir, write)
    message = f"exported {hf_class} to {directory}; load it with transformers' AutoModel classes"
    if tokenizer_dir is None:
        message += " (no tokenizer given: add the tokenizer files before sharing)"
    log.info(message)
    return ExportResult(directory, "transformers", hf_class, message)
