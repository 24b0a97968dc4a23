"""bertforge's own model directory: `model.safetensors` + `bertforge_model.json` (+ tokenizer files).

Every architecture the encoder supports can be saved this way (Hugging Face has stock classes for
only two of them), and it round-trips bit for bit: every checkpoint holds one (`step-N/model/`),
and a run's `final/` is one when no stock `transformers` class fits. Tied weights are stored once
and re-tied by the model's constructor on load. Directories are written under a temporary name and
renamed into place, so a crash never leaves a half-written model.

The model classes register themselves here by inheriting `SavableModel`; this module imports none
of them, so the IO layer does not depend on the models built on it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertforge import __version__
from bertforge.disk import disk_write
from bertforge.errors import BertforgeError
from bertforge.models.config import EncoderConfig
from bertforge.models.init import every_weight_loaded_next

CONFIG_NAME = "bertforge_model.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT_NAME = "bertforge-model"
FORMAT_VERSION = 1
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                   "added_tokens.json")

ModelT = TypeVar("ModelT", bound=torch.nn.Module)

# What a truncated or corrupt weights file raises: safetensors' SafetensorError, torch.load's
# RuntimeError from its zip reader, EOFError/UnpicklingError from pickle. RuntimeError and ValueError
# are also what a bug raises, so a caller that must tell the two apart checks the message for one of
# CORRUPT_FILE_MARKS (a model handed to inference); a checkpoint's loader treats any of them as unreadable.
DAMAGED_WEIGHTS_ERRORS: tuple[type[BaseException], ...] = (
    SafetensorError, EOFError, pickle.UnpicklingError, RuntimeError, ValueError)
CORRUPT_FILE_MARKS = ("deserializing header", "incomplete metadata", "PytorchStreamReader", "zip archive",
                      "invalid load key", "file not fully covered", "MetadataIncompleteBuffer")


# the classes a model directory can hold, by name: filled by `SavableModel.__init_subclass__`
MODEL_CLASSES: dict[str, type[torch.nn.Module]] = {}


class SavableModel:
    """`save_pretrained(dir)` / `from_pretrained(dir)` for the bertforge models; subclassing registers
    the class under its name (wrappers made at run time, e.g. FSDP2's, are not registered).

    Each model class also says, in one place, what the loader and the HF exporter need to know about
    its head (so they look it up instead of branching on the class): `head_kind` (the key of
    `loading.model_for_head`), `hf_suffixes` (the HF classes that hold it, by name), `for_head` (a fresh model
    of this kind on an encoder config), `options_from_hf`, `pooler_module`, `copy_head_from`, `hf_config_extras`
    and `output_name`.
    """

    head_kind: ClassVar[str] = ""  # base | pretraining | classification | token_classification | embedding | ...
    # how transformers ends the names of the classes holding this head, after the family's prefix (Bert +
    # ForTokenClassification); the first is the one it exports as. Empty: no HF class holds it
    hf_suffixes: ClassVar[tuple[str, ...]] = ()
    output_name: ClassVar[str] = "logits"  # the stock transformers output field that matches ours (ONNX export)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("bertforge.") and issubclass(cls, torch.nn.Module):
            MODEL_CLASSES[cls.__name__] = cls

    def save_pretrained(self, directory: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
        assert isinstance(self, torch.nn.Module)
        return save_bertforge_model(self, directory, tokenizer_dir)

    @classmethod
    def from_pretrained(cls: type[ModelT], directory: str | Path) -> ModelT:
        return load_bertforge_model(directory, expected_class=cls)

    @classmethod
    def for_head(cls, config: EncoderConfig, **options: Any) -> Any:
        """A fresh model of this kind on `config`; `options` are the head's (labels, nsp, normalize, ...),
        and a class ignores the options of other kinds."""
        raise NotImplementedError

    @classmethod
    def options_from_hf(cls, hf_config: Any) -> dict[str, object]:
        """The `for_head` options a Hugging Face checkpoint of one of this head's classes implies (its labels);
        an import takes them where the caller gives none."""
        return {}

    def hf_suffix(self) -> str | None:
        """The suffix of the HF class this model exports as (None: no HF class holds this head)."""
        return self.hf_suffixes[0] if self.hf_suffixes else None

    @classmethod
    def source_overrides(cls, source: Any, path: Path, overrides: dict[str, object]) -> dict[str, object]:
        """The encoder settings a model of this kind takes from the model it starts from (`load_for_task`)."""
        return overrides

    def encoder_model(self) -> Any:
        """The bare encoder inside (the encoder itself for `BertforgeModel`)."""
        return self.encoder  # type: ignore[attr-defined]

    def pooler_module(self) -> torch.nn.Module | None:
        """BERT's tanh pooler, where this model keeps one (carried from model to model by `load_for_task`)."""
        return None

    def copy_head_from(self, source: Any) -> None:
        """Take `source`'s head when it is the same head (same class, same shape); else keep the fresh one."""
        if type(source) is type(self) and source.head_arguments() == self.head_arguments():  # type: ignore[attr-defined]
            self._copy_own_head(source)

    def _copy_own_head(self, source: Any) -> None:
        """Copy the head weights of a model of this same class and shape."""

    def hf_config_extras(self) -> dict[str, object]:
        """What this head adds to a Hugging Face config.json (label names, problem type)."""
        return {}


def is_bertforge_model_dir(path: str | Path) -> bool:
    return (Path(path) / CONFIG_NAME).is_file()


def untied_state_dict(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The state dict with each shared tensor once, and {dropped key: key it is tied to}."""
    tensors: dict[str, torch.Tensor] = {}
    tied: dict[str, str] = {}
    owner_of_storage: dict[tuple[int, int], str] = {}
    for key, tensor in model.state_dict().items():
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if identity in owner_of_storage and tensor.numel() > 0:
            tied[key] = owner_of_storage[identity]
            continue
        owner_of_storage[identity] = key
        tensors[key] = tensor.detach().contiguous().cpu()
    return tensors, tied


def save_bertforge_model(model: torch.nn.Module, directory: str | Path,
                         tokenizer_dir: str | Path | None = None) -> Path:
    """Write `model` (any bertforge model class) to `directory`, atomically; returns the directory."""
    class_name = type(model).__name__
    if class_name not in MODEL_CLASSES:
        raise TypeError(f"{class_name} is not a bertforge model class")
    tensors, tied = untied_state_dict(model)
    description = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "bertforge_version": __version__,
        "model_class": class_name,
        "head_arguments": model.head_arguments(),  # type: ignore[operator]
        "encoder_config": model.config.to_dict(),  # type: ignore[union-attr,operator]
        "tied_weights": tied,
    }

    def write(staging: Path) -> None:
        save_file(tensors, str(staging / WEIGHTS_NAME), metadata={"format": "pt"})
        (staging / CONFIG_NAME).write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8")
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, staging)

    return write_directory_atomically(Path(directory), write)


def load_bertforge_model(directory: str | Path, expected_class: type[ModelT] | None = None,
                         map_location: str | torch.device = "cpu") -> ModelT:
    """Rebuild the model saved by `save_bertforge_model` (weights identical to the saved ones)."""
    directory = Path(directory)
    description = read_model_description(directory)
    class_name = description.get("model_class")
    if class_name not in MODEL_CLASSES:
        raise BertforgeError(f"{directory / CONFIG_NAME}: unknown model_class {class_name!r}; "
                             f"expected one of {', '.join(MODEL_CLASSES)} (saved by a newer bertforge?)")
    cls = MODEL_CLASSES[class_name]
    if expected_class is not None and cls is not expected_class:
        raise BertforgeError(f"{directory} holds a {class_name}, not a {expected_class.__name__}; "
                             "load it with load_bertforge_model() or bertforge.models.load_for_task()")
    config = EncoderConfig.from_dict(description["encoder_config"], source=str(directory / CONFIG_NAME))
    with every_weight_loaded_next():  # `_load_weights` fills every weight or refuses the directory
        model = cls(config, **description.get("head_arguments", {}))
    _load_weights(model, directory, description.get("tied_weights", {}), map_location)
    return model  # type: ignore[return-value]


def load_weights_into(model: torch.nn.Module, directory: Path, map_location: str | torch.device = "cpu") -> None:
    """Copy the weights of the model directory `directory` into `model` (of the class it holds), exactly:
    a checkpoint's `model/` is what an exact resume reads."""
    _load_weights(model, directory, read_model_description(directory).get("tied_weights", {}), map_location)


def _load_weights(model: torch.nn.Module, directory: Path, tied: dict[str, str],
                  map_location: str | torch.device) -> None:
    weights_path = directory / WEIGHTS_NAME
    if not weights_path.is_file():
        raise BertforgeError(f"{weights_path} is missing; the model directory is incomplete, save it again")
    missing, unexpected = model.load_state_dict(load_file(str(weights_path), device=str(map_location)), strict=False)
    state = model.state_dict()
    # a weight stored once for two names must be one tensor again: one the model does not tie was never read
    untied = [key for key, owner in tied.items()
              if key in state and owner in state and state[key].data_ptr() != state[owner].data_ptr()]
    missing = [key for key in missing if key not in tied] + untied
    if missing or unexpected:
        raise BertforgeError(f"{weights_path} does not match its {CONFIG_NAME}: missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}; the directory was modified or is corrupt")


def read_model_description(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_NAME
    if not path.is_file():
        raise BertforgeError(f"{directory} is not a bertforge model directory (no {CONFIG_NAME}); for a "
                             "Hugging Face directory use bertforge.models.load_hf_checkpoint")
    try:
        description = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise BertforgeError(f"{path}:{error.lineno}: not valid JSON ({error.msg}); restore the file") from None
    if description.get("format") != FORMAT_NAME or description.get("format_version", 0) > FORMAT_VERSION:
        raise BertforgeError(f"{path}: format {description.get('format')!r} version "
                             f"{description.get('format_version')!r} is not readable by bertforge {__version__}; "
                             "upgrade bertforge")
    return description


def copy_tokenizer_files(tokenizer_dir: str | Path, destination: Path) -> list[str]:
    """Copy the Hugging Face tokenizer files that exist in `tokenizer_dir`; returns their names."""
    source = Path(tokenizer_dir)
    present = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not present:
        raise BertforgeError(f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {source}; "
                             "point to the tokenizer directory of the data or of the model")
    for name in present:
        shutil.copyfile(source / name, destination / name)
    return present


def write_directory_atomically(directory: Path, write: Callable[[Path], None]) -> Path:
    """Call `write(staging_dir)`, then move the staging directory to `directory` (replacing it)."""
    directory = directory.resolve()
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        with disk_write(directory, f"run the same command again ({directory} was left as it was)"):
            write(staging)
        if directory.exists():
            retired = directory.parent / f".{directory.name}.old-{os.getpid()}"
            shutil.rmtree(retired, ignore_errors=True)
            directory.rename(retired)
            staging.rename(directory)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory
