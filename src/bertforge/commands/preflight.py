"""Input checks a command runs before it imports torch, transformers or the trainer.

Those imports cost about 2.5 s of CPU; a typo in a path should be refused in a fraction of that. Each
check here calls the very function that refuses the input later in the run, so the line a user reads is
the one the full run gives, and it calls it only where that costs next to nothing: a plain local path
that does not exist, or a prepared dataset's small manifest. Remote URLs, hub names and existing inputs
are left to the run (checking them here would read or download them twice).
"""

from __future__ import annotations

from pathlib import Path

from bertforge.config import FinetuneSection
from bertforge.data.records import HUB_PREFIX, read_records
from bertforge.locate import BUNDLED_PREFIX, HUB_NAME, PACKAGED_MODELS, resolve_data_file, resolve_model
from bertforge.storage import is_remote


def refuse_missing_data_file(reference: str | Path | None) -> None:
    """A labeled or text input (`finetune.train_file`, `--input`, `--data`) that names no file: `read_records`'
    "no such file or directory" line. `~` and `bundled:` names are resolved as the readers resolve them."""
    if reference is None or is_remote(str(reference)) or str(reference).startswith(HUB_PREFIX):
        return
    text = resolve_data_file(str(reference))  # an unknown bundled name is refused here, as in the run
    if text is None or "@" in text or Path(text).exists():  # DIR@SPLIT is a saved dataset's split: the run's
        return
    if Path(text).suffix == ".txt":  # one text per line: `embed.read_texts` and evaluate's kinds word their own
        return
    read_records(text)  # raises for a path that does not exist


def refuse_missing_finetune_files(section: FinetuneSection) -> None:
    """`finetune.train_file`, `validation_file` and `test_file`, in the order the task resolves them."""
    for reference in (section.train_file, section.validation_file, section.test_file):
        if reference is not None and str(reference).startswith(BUNDLED_PREFIX):
            resolve_data_file(reference)
    for reference in (section.train_file, section.validation_file, section.test_file):
        refuse_missing_data_file(reference)


def refuse_missing_prepared_dataset(path: str | None) -> None:
    """`data.path` of a pre-training run: a local directory without the manifest `bertforge prepare` writes
    is refused by the manifest reader, as the run would refuse it."""
    if path is None or is_remote(path):
        return
    from bertforge.data.shards import read_manifest

    read_manifest(path)


def refuse_missing_model(reference: str | Path) -> None:
    """MODEL given as a local path that does not exist: `locate.resolve_model`'s line. A hub name or an
    installed model package is resolved by the run (it may download)."""
    text = str(reference)
    if text in PACKAGED_MODELS or Path(text).expanduser().exists() or HUB_NAME.match(text):
        return
    resolve_model(reference)  # raises: no such file or directory
