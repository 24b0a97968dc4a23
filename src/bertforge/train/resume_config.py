"""What a resumed run may change in its config, and the record of each segment's config.

A resume is exact only if the data, its order, the batch geometry, the model and the optimizer's
kind are those the checkpoint was trained with; changing one silently would make a run that is
neither the old one nor a new one. Budgets, cadences, the learning rate and logging may change
between segments (a longer run, a lower lr after a spike): they are logged. Anything else is an
error unless `run.resume=force`, which records the change. `config.yaml` stays the first
segment's config; each resumed segment whose config differs is kept as `config-resume-N.yaml`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bertforge.config import Config, config_to_yaml, read_yaml, upgrade_saved_tree
from bertforge.console import log
from bertforge.errors import ConfigError
from bertforge.run_directory import RunDirectory

# keys (or whole sections, ending in ".") a resumed segment may change without breaking exact resume
MAY_CHANGE = ("run.resume", "run.device", "run.output_dir", "optim.lr", "optim.clip_grad_norm",
              "train.max_steps", "train.max_epochs", "train.max_tokens", "train.max_time_minutes",
              "train.eval_every", "train.log_every", "train.checkpoint_every", "train.keep_last",
              "train.keep_optimizer_state",
              "train.early_stopping_patience", "train.nan_policy", "train.max_skipped_steps", "train.best_metric",
              "train.best_mode", "train.average_last_k",
              "data.num_workers", "data.validation_samples", "data.verify_checksums", "data.cache_dir",
              "finetune.validation_file", "finetune.test_file", "dist.activation_checkpointing", "dist.compile",
              "log.", "glue.")  # glue.* chooses the jobs of `bertforge glue`, not how one of them trains
SHOWN_CHANGES = 6


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        return {key: value for name, child in tree.items() for key, value in flatten(child, f"{prefix}{name}.").items()}
    return {prefix[:-1]: tree}


def may_change(key: str) -> bool:
    return any(key == allowed or (allowed.endswith(".") and key.startswith(allowed)) for allowed in MAY_CHANGE)


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`key: (saved, current)` for every dotted key whose value differs (a key only one side has included)."""
    missing = object()
    return {key: (saved.get(key, missing), current.get(key, missing)) for key in sorted(saved.keys() | current.keys())
            if saved.get(key, missing) != current.get(key, missing)}


def _show(changes: dict[str, tuple[Any, Any]]) -> str:
    shown = [f"{key}: {old!r} -> {new!r}" for key, (old, new) in list(changes.items())[:SHOWN_CHANGES]]
    more = len(changes) - SHOWN_CHANGES
    return "; ".join(shown) + (f" and {more} more" if more > 0 else "")


def check_resumed_config(run_dir: Path, config: Config, *, write: bool) -> None:
    """Compare `config` with the run's saved segments; raise on a change that breaks exact resume
    (unless run.resume=force), log the others, and keep this segment's config when it differs.
    A run directory without `config.yaml` has nothing to compare with."""
    run = RunDirectory(run_dir)
    segments = run.config_segments()
    if not segments[0].is_file():
        return
    saved = flatten(upgrade_saved_tree(read_yaml(segments[-1])))
    current = flatten(OmegaConf.to_container(OmegaConf.structured(config)))
    changes = {key: values for key, values in config_changes(saved, current).items() if key != "run.resume"}
    if not changes:
        return
    breaking = {key: values for key, values in changes.items() if not may_change(key)}
    if breaking and config.run.resume != "force":
        raise ConfigError(f"resuming {run_dir} with a config that breaks exact resume ({_show(breaking)}); restore "
                          "those keys, start a new run.name, or set run.resume=force to continue anyway")
    record = run.resume_config_file(len(segments))
    (log.warning if breaking else log.info)(f"resumed with config changes ({_show(changes)}); recorded in {record.name}")
    if write:
        record.write_text(config_to_yaml(config), encoding="utf-8")
