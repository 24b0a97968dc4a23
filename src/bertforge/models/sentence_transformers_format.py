"""sentence-transformers model directories: read their pooling rule, write an embedding model as one.

A sentence-transformers directory is a Hugging Face transformer directory plus a few small JSON
files that say what follows the transformer (sentence-transformers' `SentenceTransformer.save`):

    modules.json                 [Transformer (path ""), Pooling ("1_Pooling"), Normalize ("2_Normalize")]
    sentence_bert_config.json    {"max_seq_length": 128, "do_lower_case": false, "model_args": {...}}
    1_Pooling/config.json        {"word_embedding_dimension": 384, "pooling_mode_mean_tokens": true, ...}
    2_Normalize/                 (no settings)
    config.json, model.safetensors, tokenizer files: the transformer, as `transformers` saves it

We write the module names and pooling keys of sentence-transformers 2-5 (`sentence_transformers.
models.Pooling`, `pooling_mode_*_token(s)`), which every version since 2.x loads — 6.x included, which
reads them as legacy names — and read both those and 6.x's (`pooling_mode: "mean"`). Writing these
few files ourselves keeps sentence-transformers out of bertforge's run-time dependencies; the tests
load every export with the real library and compare its vectors with ours.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bertforge.console import log
from bertforge.models.embedding import BertforgeForEmbedding

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
# our pooling -> the legacy boolean key that selects it (the other keys are written as false)
POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
OTHER_POOLING_KEYS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
# sentence-transformers 6's `pooling_mode` names
POOLING_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last"}


@dataclass(frozen=True)
class SentenceTransformersSettings:
    """What follows the transformer in a sentence-transformers directory, as far as bertforge runs it."""

    pooling: str | None  # mean | cls | last; None = a pooling bertforge does not have (max, weighted mean, ...)
    pooling_description: str  # as the directory writes it, for messages
    normalize: bool
    max_seq_length: int | None
    other_modules: list[str] = field(default_factory=list)  # e.g. Dense: modules bertforge does not run

    def unsupported(self) -> str | None:
        """Why bertforge cannot compute this model's vectors exactly, or None."""
        if self.other_modules:
            return f"it has modules bertforge does not run ({', '.join(self.other_modules)})"
        if self.pooling is None:
            return f"its pooling ({self.pooling_description}) is not one of mean, cls or last token"
        return None


def _module_class(entry: dict) -> str:
    return str(entry.get("type", "")).rsplit(".", 1)[-1]


def _pooling_of(config: dict) -> tuple[str | None, str]:
    mode = config.get("pooling_mode")
    if isinstance(mode, str):  # sentence-transformers 6
        return POOLING_NAMES.get(mode), mode
    chosen = [key for key in (*POOLING_KEYS.values(), *OTHER_POOLING_KEYS) if config.get(key)]
    if len(chosen) == 1 and chosen[0] in POOLING_KEYS.values():
        return next(ours for ours, key in POOLING_KEYS.items() if key == chosen[0]), chosen[0]
    return None, " + ".join(chosen) or "none"


def read_sentence_transformers(directory: str | Path) -> SentenceTransformersSettings | None:
    """The settings of a sentence-transformers directory; None when `directory` is not one (no modules.json,
    or unreadable files: then it is loaded as the plain transformer it also is)."""
    directory = Path(directory)
    try:
        modules = json.loads((directory / MODULES_FILE).read_text(encoding="utf-8"))
        pooling_entry = next(m for m in modules if _module_class(m) == "Pooling")
        pooling_config = json.loads((directory / pooling_entry["path"] / "config.json").read_text(encoding="utf-8"))
        settings_path = directory / SETTINGS_FILE
        settings = json.loads(settings_path.read_text(encoding="utf-8")) if settings_path.is_file() else {}
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None
    pooling, description = _pooling_of(pooling_config)
    classes = [_module_class(m) for m in modules]
    other = [name for name in classes if name not in ("Transformer", "Pooling", "Normalize")]
    max_seq_length = settings.get("max_seq_length")
    return SentenceTransformersSettings(pooling, description, "Normalize" in classes,
                                        int(max_seq_length) if isinstance(max_seq_length, int) else None, other)


def write_sentence_transformers_files(directory: Path, hidden_size: int, pooling: str, normalize: bool,
                                      max_seq_length: int, model_args: dict[str, object] | None = None) -> None:
    """The files that make a transformer directory a sentence-transformers one; `model_args`: what its
    `AutoModel.from_pretrained` must be given to build the transformer as written (every version reads the key)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": POOLING_DIR, "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": NORMALIZE_DIR, "type": "sentence_transformers.models.Normalize"})
        (directory / NORMALIZE_DIR).mkdir()
    pooling_config: dict[str, object] = {"word_embedding_dimension": hidden_size}
    pooling_config |= {key: ours == pooling for ours, key in POOLING_KEYS.items()}
    pooling_config |= dict.fromkeys(OTHER_POOLING_KEYS, False)
    (directory / POOLING_DIR).mkdir()
    settings: dict[str, object] = {"max_seq_length": max_seq_length, "do_lower_case": False}
    if model_args:
        settings["model_args"] = model_args
    for path, content in ((directory / MODULES_FILE, modules), (directory / SETTINGS_FILE, settings),
                          (directory / POOLING_DIR / "config.json", pooling_config)):
        path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def export_sentence_transformers(model: BertforgeForEmbedding, tokenizer_dir: str | Path | None,
                                 out_dir: str | Path, max_seq_length: int | None = None):  # type: ignore[no-untyped-def]
    """Write `model` as a sentence-transformers directory that `SentenceTransformer(out_dir)` loads with no
    custom code; an encoder without a stock `transformers` class is written in bertforge's format instead.
    `max_seq_length` (default: the model's position limit, at most 512) is where both truncate."""
    from bertforge.models.families import family_of_class
    from bertforge.models.hf import ExportResult, hf_class_name, write_hf_model
    from bertforge.models.serialization import (
        copy_tokenizer_files,
        save_bertforge_model,
        write_directory_atomically,
    )
    from bertforge.special_tokens import special_token_ids

    out_dir = Path(out_dir)
    config = model.config
    hf_class, reason = hf_class_name(model.encoder)
    if hf_class is None:
        save_bertforge_model(model, out_dir, tokenizer_dir)
        message = (f"{reason}: no stock transformers class holds this encoder, so {out_dir} is in bertforge's own "
                   "format, not sentence-transformers' (`bertforge embed` reads it)")
        log.warning(message)
        return ExportResult(out_dir.resolve(), "bertforge", type(model).__name__, message)
    if max_seq_length is None:
        max_seq_length = min(512, config.max_sequence_length) if config.position == "learned" else 512
    special_tokens = special_token_ids(tokenizer_dir)
    # a model trained here has no BERT pooler (its vectors never use one): sentence-transformers must build the
    # BertModel without it too, or transformers reports the pooler "MISSING ... newly initialized" on every load
    model_args = family_of_class(hf_class).load_arguments(hf_class, model.pooler_module() is not None)

    def write(staging: Path) -> None:
        write_hf_model(model.encoder, special_tokens, staging)
        if tokenizer_dir is not None:
            copy_tokenizer_files(tokenizer_dir, staging)
        write_sentence_transformers_files(staging, config.hidden_size, config.pooling, model.normalize,
                                          max_seq_length, model_args)

    directory = write_directory_atomically(out_dir, write)
    message = (f"exported a sentence-transformers model ({hf_class} + {config.pooling} pooling"
               f"{' + Normalize' if model.normalize else ''}) to {directory}; load it with "
               "sentence_transformers.SentenceTransformer")
    if tokenizer_dir is None:
        message += " (no tokenizer given: add the tokenizer files before sharing)"
    log.info(message)
    return ExportResult(directory, "sentence-transformers", hf_class, message)
