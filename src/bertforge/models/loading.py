"""Start a model for a task from any saved encoder: `model.init_from` in one call.

Fine-tuning starts from a pre-training run (bertforge format) or from a Hugging Face checkpoint;
pre-training can continue from either. The encoder weights always carry over; a head carries over
when the source has one of the same shape (BERT's pooler, shared by NSP and the classifier, too),
as `transformers`' `from_pretrained` does; anything else starts fresh.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bertforge.errors import BertforgeError, ConfigError
from bertforge.models.classification import BertforgeForSequenceClassification
from bertforge.models.config import EncoderConfig
from bertforge.models.encoder import BertforgeModel
from bertforge.models.heads import Pooler
from bertforge.models.hf import BertforgeAny, hf_architecture, load_hf_checkpoint
from bertforge.models.pretraining import BertforgeForPreTraining
from bertforge.models.serialization import is_bertforge_model_dir, load_bertforge_model

TASKS = ("base", "pretraining", "classification")
# Fields that may differ from the saved model's: they change no weight shape of the encoder.
RUNTIME_FIELDS = ("hidden_dropout", "attention_dropout", "classifier_dropout", "attention_backend", "pooling")


def load_for_task(path: str | Path, task: str, *, nsp: bool = False, num_labels: int | None = None,
                  problem_type: str = "classification", label_names: list[str] | None = None,
                  config_overrides: dict[str, object] | None = None) -> BertforgeAny:
    """A model for `task` (base | pretraining | classification) initialised from the encoder at `path`."""
    if task not in TASKS:
        raise ConfigError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    path = Path(path)
    if is_bertforge_model_dir(path):
        source: BertforgeAny = load_bertforge_model(path)
    elif (path / "config.json").is_file():
        source = _load_hf_source(path, task)
    else:
        raise BertforgeError(f"{path} is neither a bertforge model directory (bertforge_model.json) nor a Hugging "
                             "Face one (config.json); check `model.init_from`")
    config = _with_overrides(source.config, config_overrides or {}, str(path))
    target: BertforgeAny
    if task == "base":
        target = BertforgeModel(config)
    elif task == "pretraining":
        target = BertforgeForPreTraining(config, nsp=nsp)
    else:
        if problem_type == "classification" and num_labels is None:
            num_labels = len(label_names) if label_names else None
        if num_labels is None and problem_type == "classification":
            raise ConfigError("a classifier needs its labels: set finetune.labels or let them be read from the "
                              "train file")
        target = BertforgeForSequenceClassification(config, num_labels or 1, problem_type, label_names)
    _transfer(source, target)
    return target


def _load_hf_source(path: Path, task: str) -> BertforgeAny:
    """A bare HF `BertModel` (all-MiniLM-L6-v2 is one) still holds BERT's pooler, and `transformers`'
    `BertForSequenceClassification.from_pretrained` starts from it; read it through a throwaway
    one-output head so a classifier starts from the same pooler instead of a fresh one."""
    if task == "classification" and hf_architecture(path) == "BertModel":
        return load_hf_checkpoint(path, "classification", num_labels=1, problem_type="regression")
    return load_hf_checkpoint(path)


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
    return None


def _transfer(source: BertforgeAny, target: BertforgeAny) -> None:
    _encoder(target).load_state_dict(_encoder(source).state_dict())
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
