"""One way from a model directory to a model: load it, adapt it to the task.

`load_model_directory` builds the model a directory holds (bertforge's format, or a Hugging Face
directory converted on load). `load_for_task` starts a model for a task from a model directory (what
`bertforge.locate.resolve_model` turns a run directory, checkpoint or model name into, for
`model.init_from` of `pretrain` and `finetune`): the encoder weights always carry over; a head carries
over when the source has one of the same shape (BERT's pooler, shared by NSP and the classifier, too),
as `transformers`' `from_pretrained` does; anything else starts fresh.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bertforge.errors import BertforgeError, ConfigError
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.config import EncoderConfig
from bertforge.models.embedding import BertforgeForEmbedding, embedding_pooling
from bertforge.models.encoder import BertforgeModel
from bertforge.models.families import family_of_model_type
from bertforge.models.for_pretraining import BertforgeForPreTraining
from bertforge.models.hf import BertforgeAny, load_hf_checkpoint
from bertforge.models.init import every_weight_loaded_next, weights_from_checkpoint
from bertforge.models.serialization import MODEL_CLASSES, is_bertforge_model_dir, load_bertforge_model
from bertforge.models.token_classification import BertforgeForTokenClassification

# the heads models/ holds itself; a task kind whose model class lives in its own module (a `SavableModel`
# subclass) registers it by being imported (`bertforge.tasks.kinds` imports every kind)
OWN_MODEL_CLASSES = (BertforgeModel, BertforgeForPreTraining, BertforgeForSequenceClassification,
                     BertforgeForTokenClassification, BertforgeForEmbedding)


def model_for_head(head_kind: str) -> type[BertforgeAny]:
    """The model class of a `head_kind` (what `load_for_task` and the HF importer build): a lookup over the
    registered model classes, not a branch per kind."""
    classes = {cls.head_kind: cls for cls in (*OWN_MODEL_CLASSES, *MODEL_CLASSES.values())
               if getattr(cls, "head_kind", "")}
    if head_kind not in classes:
        raise ConfigError(f"unknown task {head_kind!r}; choose one of {', '.join(classes)} (a task kind's model "
                          "class is known once `bertforge.tasks.kinds` is imported)")
    return classes[head_kind]  # type: ignore[return-value]

# The model fields a run may set when it starts from a saved model: they change no weight's shape.
# (Every other `model.*` field comes from the saved model.)
RUNTIME_FIELDS = ("hidden_dropout", "attention_dropout", "classifier_dropout", "attention_backend", "pooling")


def runtime_overrides(section: object) -> dict[str, object]:
    """The RUNTIME_FIELDS a config's `model:` section (`bertforge.config.ModelSection`, read by attribute) sets
    (None = keep the saved model's)."""
    values = {name: getattr(section, name) for name in RUNTIME_FIELDS}
    return {name: value for name, value in values.items() if value is not None}


def load_model_directory(path: Path) -> BertforgeAny:
    """The model a bertforge or Hugging Face model directory holds, as it was saved."""
    if is_bertforge_model_dir(path):
        return load_bertforge_model(path)
    if not (path / "config.json").is_file():
        raise BertforgeError(f"{path} is not a model directory (it holds neither bertforge_model.json nor "
                             "config.json); a run directory, checkpoint or model name is resolved to one by "
                             "bertforge.locate.resolve_model(reference).path")
    return load_hf_checkpoint(path)


def load_for_task(model_dir: str | Path, task: str, *, config_overrides: dict[str, object] | None = None,
                  **head_options: object) -> BertforgeAny:
    """A model for `task` (a `head_kind`: base | pretraining | classification | token_classification | embedding)
    initialised from the model directory `model_dir`. `head_options` are the head's: `num_labels`/`label_names`
    size a classifier's head, `problem_type` (sequence classification), `nsp` (pre-training), `normalize`
    (embeddings); a head ignores the others."""
    path = Path(model_dir)
    return adapt_for_task(load_model_directory(path), path, task, config_overrides=config_overrides, **head_options)


def adapt_for_task(source: BertforgeAny, path: Path, task: str, *, config_overrides: dict[str, object] | None = None,
                   **head_options: object) -> BertforgeAny:
    """`load_for_task` for a model already loaded from `path` (`load_model_directory`): a caller that looks at what
    the checkpoint holds before adapting it (whether it carries a trained pooler) reads it once."""
    model_class = model_for_head(task)
    overrides = model_class.source_overrides(source, path, dict(config_overrides or {}))
    config = _with_overrides(source.config, overrides, str(path))
    target = model_class.for_head(config, source_pooler=source.pooler_module() is not None, **head_options)
    _transfer(source, target)
    return target


def as_embedding_model(source: BertforgeAny, path: Path) -> BertforgeForEmbedding:
    """The embedding model `source` (loaded from `path`) is: itself when it is one; else its encoder with the
    pooling and Normalize of a sentence-transformers directory, or the token mean."""
    from bertforge.models.sentence_transformers_format import read_sentence_transformers

    if isinstance(source, BertforgeForEmbedding):
        return source
    settings = read_sentence_transformers(path)
    config = dataclasses.replace(source.config, pooling=embedding_pooling(source, path))
    with weights_from_checkpoint(), every_weight_loaded_next():  # every weight comes from `source`: it has no other
        target = BertforgeForEmbedding(config, normalize=settings is not None and settings.normalize,
                                       pooler=source.pooler_module() is not None)
    _transfer(source, target)
    return target


def _with_overrides(config: EncoderConfig, overrides: dict[str, object], source: str) -> EncoderConfig:
    unknown = [key for key in overrides if key not in RUNTIME_FIELDS]
    if unknown:
        raise ConfigError(f"{', '.join(unknown)} cannot change when starting from {source} (the weights fix them); "
                          f"only {', '.join(RUNTIME_FIELDS)} can")
    if overrides.get("classifier_dropout") is not None and config.hf_model_type:
        family = family_of_model_type(config.hf_model_type, source)
        if not family.reads_classifier_dropout:
            raise ConfigError(f"model.classifier_dropout cannot be set for {source}: {family.hf_prefix}'s heads drop out at "
                              "hidden_dropout_prob (its config has no classifier rate, so the export could not keep "
                              "it); set model.hidden_dropout instead")
    # the rate the run asks of its classifier wins over a multiple-choice scorer's own (ELECTRA's summary_last_dropout,
    # which the export writes back); a scorer that follows hidden_dropout (RoBERTa's, MPNet's) keeps following it
    if "classifier_dropout" in overrides:
        overrides = {"choice_dropout": None, **overrides}
    return dataclasses.replace(config, **overrides)  # type: ignore[arg-type]


def _transfer(source: BertforgeAny, target: BertforgeAny) -> None:
    """The encoder always; BERT's pooler when both keep one (shared by NSP and the classifier); the head when
    the target's class says it is the same head (`copy_head_from`)."""
    source_encoder, target_encoder = source.encoder_model(), target.encoder_model()
    encoder_state = {key: value for key, value in source_encoder.state_dict().items()
                     if not key.startswith("pooler.")}  # a bare encoder's pooler is transferred as a pooler below
    target_encoder.load_state_dict(encoder_state, strict=target_encoder.pooler is None)
    source_pooler, target_pooler = source.pooler_module(), target.pooler_module()
    if source_pooler is not None and target_pooler is not None:
        target_pooler.load_state_dict(source_pooler.state_dict())
    target.copy_head_from(source)
