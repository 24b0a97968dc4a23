"""The study's inputs: the corpus file, the tokenizer and bertforge's prepared dataset, HF's group_texts blocks,
arm d's recipe and the downstream tasks."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common.corpora import (
    corpus_documents,
    debian_docs_corpus,
    tech_dictionaries_corpus,
    write_mixed_corpus,
)
from benchmarks.common.hf_arms import hf_training_dataset
from benchmarks.common.mlm import SEQ_LEN, VOCAB_SIZE
from benchmarks.common.tasks import load_task, tasks_dir
from benchmarks.ttq.settings import DOWNSTREAM_TASKS, SHAPE_KEYS

CORPORA = ("bundled", "debian-docs", "mixed", "tech-dictionaries")
# in a corpus's work directory: the study's WordPiece tokenizer, and its training documents as run_mlm.py groups them
TOKENIZER_DIR, GROUP_TEXTS_DIR = "tokenizer", "hf-group-texts"
# The mixed corpus: debian-docs documents for two thirds of its bytes, the whole bundled corpus for the
# other third. Each single corpus covers the text of one downstream task (debian-docs the manpages'
# technical prose, bundled the supersense glosses), and on each the budget recipe beat HF on that task
# and trailed on the other; the mix covers both, in a corpus small enough (36.7 MB, 8.6M tokens) that both
# arms' 40 minutes see every document at least once (1.0 and 2.1 epochs measured).
MIXED_DEBIAN_DOCS_SHARE = 2 / 3


def corpus_file(name: str, work: Path) -> Path:
    """The corpus text file (the mixed one is written under `work` once, tech-dictionaries into the cache); a
    missing debian-docs corpus or dictd database ends the program with the command that builds or installs it."""
    from bertforge.data.bundled import corpus_path

    if name == "bundled":
        return corpus_path()
    if name == "tech-dictionaries":  # neither downstream task's text: FOLDOC, Jargon File, V.E.R.A. (Debian's dictd)
        return tech_dictionaries_corpus()
    path = debian_docs_corpus()
    if name == "debian-docs":
        return path
    mixed = work / "corpus.txt"
    if not mixed.is_file():
        write_mixed_corpus(path, corpus_path(), MIXED_DEBIAN_DOCS_SHARE, mixed)
    return mixed


def prepare_corpus(corpus: Path, work: Path) -> tuple[Path, Path, dict[str, Any]]:
    """`pretrain_vs_hf.prepare_inputs` for any corpus file: the tokenizer and the packed dataset (reused when present)."""
    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.data.tokenizer import train_tokenizer_from_inputs

    tokenizer_dir, data_dir = work / TOKENIZER_DIR, work / f"data-{SEQ_LEN}"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        train_tokenizer_from_inputs([str(corpus)], tokenizer_dir, vocab_size=VOCAB_SIZE)
    manifest = prepare_pretraining_data([str(corpus)], tokenizer_dir, data_dir,
                                        PrepareSettings(seq_len=SEQ_LEN, split=(980.0, 20.0)), workers=2,
                                        progress=False)
    return tokenizer_dir, data_dir, manifest


def group_texts_dataset(work: Path, tokenizer_dir: Path, corpus: Path, manifest: dict[str, Any]) -> Path:
    """The training documents as `run_mlm.py` feeds them (`pretrain_vs_hf.hf_training_dataset`), saved once
    per prepared dataset (its `cache_key` covers the corpus, the tokenizer and the split)."""
    from transformers import AutoTokenizer

    target = work / GROUP_TEXTS_DIR
    stamp = target / "bertforge_cache_key.txt"
    if stamp.is_file() and stamp.read_text(encoding="utf-8") == manifest["cache_key"]:
        return target
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.model_max_length = 1 << 30  # run_mlm tokenizes whole documents; silence the length warning
    train_documents = manifest["splits"]["train"]["documents"]
    dataset = hf_training_dataset("hf-group-texts", corpus_documents(corpus)[:train_documents], tokenizer)
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    dataset.save_to_disk(str(staging))
    (staging / stamp.name).write_text(manifest["cache_key"], encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def check_recipe(recipe: Path, model: str) -> None:
    """Arm d's recipe must exist, keep the benchmark's model shape and its 128-token samples."""
    from bertforge.config import Config, load_config

    if not recipe.is_file():
        raise SystemExit(f"error: arm d trains the budget recipe {recipe}, which does not exist yet; write it, give "
                         "another with --recipe PATH, or leave arm d out (--arms a,b,c)")
    config, default = load_config(recipe), Config()
    if config.model.preset not in (default.model.preset, model):
        raise SystemExit(f"error: {recipe} sets model.preset={config.model.preset} but the other arms train {model}; "
                         f"run the benchmark with --model {config.model.preset} so that all arms share one shape")
    changed = [key for key in SHAPE_KEYS if getattr(config.model, key) != getattr(default.model, key)]
    if changed:
        raise SystemExit(f"error: {recipe} changes the model's shape (model.{', model.'.join(changed)}); every arm "
                         f"trains the {model} preset, which the HF arms build as BertForMaskedLM: remove those keys")
    if config.data.seq_len != SEQ_LEN:
        raise SystemExit(f"error: {recipe} sets data.seq_len={config.data.seq_len}; the benchmark prepares "
                         f"{SEQ_LEN}-token samples for every arm (shorter phases go in data.seq_len_schedule)")


def recipe_fingerprint(recipe: Path) -> str:
    """sha256 of the recipe as loaded (its `extends` chain resolved): arm d's results are tied to it."""
    from bertforge.config import load_config

    return hashlib.sha256(json.dumps(asdict(load_config(recipe)), sort_keys=True).encode()).hexdigest()


def downstream_tasks(rows: dict[str, tuple[int, int]]) -> list[Any]:
    """The fine-tuning tasks (`load_task`); a missing manpages task ends the program with its command."""
    if not (tasks_dir() / "manpages" / "task.json").is_file():
        print(f"error: the manpages task is not built ({tasks_dir() / 'manpages'} is missing); build it with "
              "`python scripts/build_parity_tasks.py --tasks manpages`", file=sys.stderr)
        raise SystemExit(2)
    return [load_task(name, *rows[name]) for name in DOWNSTREAM_TASKS]
