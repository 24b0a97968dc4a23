"""One way from a model reference to a model: resolve it to a model directory, load, adapt to the task.

`load_model_directory` builds the model a directory holds (bertforge's format, or a Hugging Face
BERT/ModernBERT directory converted on load). `load_for_task` starts a model for a task from any
reference `bertforge.locate.resolve_model` understands (`model.init_from` of `pretrain` and
`finetune`): the encoder weights always carry over; a head carries over when the source has one of
the same shape (BERT's pooler, shared by NSP and the classifier, too), as `transformers`'
`from_pretrained` does; anything else starts fresh.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bertforge.config import ModelSection
from bertforge.errors import ConfigError
from bertforge.locate import resolve_model
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.config import EncoderConfig
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.models.encoder import BertforgeModel
from bertforge.models.for_pretraining import BertforgeForPreTraining
from bertforge.models.heads import Pooler
from bertforge.models.hf import BertforgeAny, load_hf_checkpoint
from bertforge.models.serialization import is_bertforge_model_dir, load_bertforge_model
from bertforge.models.token_classification import BertforgeForTokenClassification

TASKS = ("base", "pretraining", "classification", "token_classification", "embedding")
# The model fields a run may set when it starts from a saved model: they change no weight's shape.
# (Every other `model.*` field comes from the saved model.)
RUNTIME_FIELDS = ("hidden_dropout", "attention_dropout", "classifier_dropout", "attention_backend", "pooling")


def runtime_overrides(section: ModelSection) -> dict[str, object]:
    """The RUNTIME_FIELDS a config's `model:` section sets (None = keep the saved model's)."""
    values = {name: getattr(section, name) for name in RUNTIME_FIELDS}
    return {name: value for name, value in values.items() if value is not None}


def load_model_directory(path: Path) -> BertforgeAny:
    """The model a bertforge or Hugging Face model directory holds, as it was saved."""
    if is_bertforge_model_dir(path):
        return load_bertforge_model(path)
    return load_hf_checkpoint(path)


def load_for_task(reference: str | Path, task: str, *, nsp: bool = False, num_labels: int | None = None,
                  problem_type: str = "classification", label_names: list[str] | None = None,
                  config_overrides: dict[str, object] | None = None, normalize: bool = False) -> BertforgeAny:
    """A model for `task` (base | pretraining | classification | token_classification | embedding) initialised
    from the model `reference` names (`num_labels`/`label_names` size a classifier's head; `problem_type` and
    `nsp` apply to sequence classification and pre-training only, `normalize` to embeddings)."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    location = resolve_model(reference)
    source = load_model_directory(location.path)
    overrides = dict(config_overrides or {})
    if task == "embedding" and "pooling" not in overrides:
        overrides["pooling"] = embedding_pooling(source, location.path)
    config = _with_overrides(source.config, overrides, str(location.path))
    target: BertforgeAny
    if task == "embedding":
        target = BertforgeForEmbedding(config, normalize=normalize)
    elif task == "base":
        target = BertforgeModel(config, pooler=_pooler(source) is not None)
    elif task == "pretraining":
        target = BertforgeForPreTraining(config, nsp=nsp)
    elif task == "token_classification":
        if not label_names and num_labels is None:
            raise ConfigError("a token classifier needs its tags: set finetune.labels or let them be read from the "
                              "train file")
        target = BertforgeForTokenClassification(config, num_labels or len(label_names or []), label_names)
    else:
        if problem_type == "classification" and num_labels is None:
            num_labels = len(label_names) if label_names else None
        if num_labels is None and problem_type == "classification":
            raise ConfigError("a classifier needs its labels: set finetune.labels or let them be read from the "
                              "train file")
        target = BertforgeForSequenceClassification(config, num_labels or 1, problem_type, label_names)
    _transfer(source, target)
    return target


def embedding_pooling(source: BertforgeAny, path: Path) -> str:
    """How a model's token states become one vector when nothing says otherwise: an embedding model's own
    pooling, a sentence-transformers directory's (its 1_Pooling/config.json), else the token mean."""
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    if isinstance(source, BertforgeForEmbedding):
        return source.config.pooling
    settings = read_sentence_transformers(path)
    if settings is None:
        return "mean"
    problem = settings.unsupported()
    if problem is not None:
        raise ConfigError(f"{path} is a sentence-transformers model bertforge cannot reproduce: {problem}; set "
                          "model.pooling (mean, cls or last) to start from its transformer alone")
    assert settings.pooling is not None
    return settings.pooling


def as_embedding_model(source: BertforgeAny, path: Path) -> BertforgeForEmbedding:
    """The embedding model `source` (loaded from `path`) is: itself when it is one; else its encoder with the
    pooling and Normalize of a sentence-transformers directory, or the token mean."""
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    if isinstance(source, BertforgeForEmbedding):
        return source
    settings = read_sentence_transformers(path)
    config = dataclasses.replace(source.config, pooling=embedding_pooling(source, path))
    target = BertforgeForEmbedding(config, normalize=settings is not None and settings.normalize,
                                   pooler=_pooler(source) is not None)
    _transfer(source, target)
    return target


def _with_overrides(config: EncoderConfig, overrides: dict[str, object], source: str) -> EncoderConfig:
    unknown = [key for key in overrides if key not in RUNTIME_FIELDS]
    if unknown:
        raise ConfigError(f"{', '.join(unknown)} cannot change when starting from {source} (the weights fix them); "
                          f"only {', '.join(RUNTIME_FIELDS)} can")
    return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]


def _encoder(model: BertforgeAny) -> BertforgeModel:
    return model if isinstance(model, BertforgeModel) else model.encoder


def _pooler(model: BertforgeAny) -> Pooler | None:
    if isinstance(model, BertforgeForPreTraining):
        return model.nsp_head.pooler if model.nsp_head is not None else None
    if isinstance(model, BertforgeForSequenceClassification):
        return model.head.pooler
    if isinstance(model, BertforgeForTokenClassification):
        return None  # BertForTokenClassification has no pooler
    if isinstance(model, BertforgeForEmbedding):
        return model.encoder.pooler  # kept from the source for export only; the vectors do not use it
    return model.pooler


def _transfer(source: BertforgeAny, target: BertforgeAny) -> None:
    encoder_state = {key: value for key, value in _encoder(source).state_dict().items()
                     if not key.startswith("pooler.")}  # a bare encoder's pooler is transferred as a pooler below
    _encoder(target).load_state_dict(encoder_state, strict=_encoder(target).pooler is None)
    source_pooler, target_pooler = _pooler(source), _pooler(target)
    if source_pooler is not None and target_pooler is not None:
        target_pooler.load_state_dict(source_pooler.state_dict())
    if isinstance(source, BertforgeForPreTraining) and isinstance(target, BertforgeForPreTraining):
        target.mlm_head.load_state_dict(source.mlm_head.state_dict())
        if source.nsp_head is not None and target.nsp_head is not None:
            target.nsp_head.load_state_dict(source.nsp_head.state_dict())
    if (isinstance(source, BertforgeForSequenceClassification)
            and isinstance(target, BertforgeForSequenceClassification)
            and source.head_arguments() == target.head_arguments() and source.config.pooling == target.config.pooling):
        target.head.load_state_dict(source.head.state_dict())
    if (isinstance(source, BertforgeForTokenClassification) and isinstance(target, BertforgeForTokenClassification)
            and source.head_arguments() == target.head_arguments()):
        target.classifier.load_state_dict(source.classifier.state_dict())
