"""The encoder (classic BERT and the modern variant), its heads, and Hugging Face interop."""

from __future__ import annotations

from bertforge.models.classification import BertforgeForSequenceClassification, SequenceClassifierOutput
from bertforge.models.config import EncoderConfig, encoder_config_from_section, get_preset, preset_names
from bertforge.models.embedding import BertforgeForEmbedding
from bertforge.models.encoder import BertforgeModel, PackedInputs, pack_inputs, pad_tokens, unpad_inputs
from bertforge.models.for_pretraining import BertforgeForPreTraining, PreTrainingOutput
from bertforge.models.init import init_weights
from bertforge.models.serialization import is_bertforge_model_dir, load_bertforge_model, save_bertforge_model
from bertforge.models.token_classification import BertforgeForTokenClassification, TokenClassifierOutput

# These need `transformers` (about a second to import): loaded on first use only.
_LAZY = {"export_hf": "bertforge.models.hf", "from_hf": "bertforge.models.hf",
         "load_hf_checkpoint": "bertforge.models.hf", "load_for_task": "bertforge.models.loading"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'bertforge.models' has no attribute {name!r}")


__all__ = [
    "BertforgeForEmbedding",
    "BertforgeForPreTraining",
    "BertforgeForSequenceClassification",
    "BertforgeForTokenClassification",
    "BertforgeModel",
    "EncoderConfig",
    "PackedInputs",
    "PreTrainingOutput",
    "SequenceClassifierOutput",
    "TokenClassifierOutput",
    "encoder_config_from_section",
    "export_hf",
    "from_hf",
    "get_preset",
    "init_weights",
    "is_bertforge_model_dir",
    "load_bertforge_model",
    "load_for_task",
    "load_hf_checkpoint",
    "pack_inputs",
    "pad_tokens",
    "preset_names",
    "save_bertforge_model",
    "unpad_inputs",
]
