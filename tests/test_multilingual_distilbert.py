"""The multilingual DistilBERT workflow (issue 36 item 4) on Debian's translated man pages, at tiny sizes.

The task (scripts/build_parity_tasks.py `manpages-multilingual`: a page's description in en/de/fr/es/ja/zh
-> its manual section) is built from the installed pages; a cased WordPiece tokenizer is trained on its
train split by `bertforge tokenizer train`; a tiny `distilbert-tiny` is pre-trained on the same text and
exported as a transformers DistilBertForMaskedLM; fine-tuning it on 2 torchrun ranks equals one process
with the same global batch; the test report gives accuracy and the majority class per language.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.finetuning import QUIET_RUN, metrics_records
from helpers.scripts import load_repo_script
from safetensors.torch import load_file

from bertforge.cli import main
from bertforge.config import config_to_yaml, load_config
from bertforge.errors import ConfigError
from bertforge.models.config import get_preset

REPO_ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = ["de", "en", "es", "fr", "ja", "zh"]
# evenly spaced rows of each language per split: every language and most sections, in seconds
SLICE = {"train": 24, "validation": 6, "test": 12}
TINY_DISTILBERT = ["model.preset=distilbert-tiny", "model.hidden_size=32", "model.num_heads=2",
                   "model.intermediate_size=64", "model.num_layers=2"]
NO_DROPOUT = ["model.hidden_dropout=0", "model.attention_dropout=0", "model.classifier_dropout=0"]

bpt = load_repo_script("scripts/build_parity_tasks.py", "build_parity_tasks")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The whole task, built from this machine's man pages (`make sample-sources` installs them)."""
    missing = [f"manpages-{language}" for language, directory in (("de", "de"), ("fr", "fr"), ("es", "es"),
                                                                   ("ja", "ja"), ("zh", "zh_CN"))
               if not Path(f"/usr/share/man/{directory}/man1/chmod.1.gz").exists()]
    if missing:
        pytest.fail(f"translated man pages not installed: apt-get install -y {' '.join(missing)} (make sample-sources)")
    out = tmp_path_factory.mktemp("tasks")
    bpt.write_task(bpt.build_manpages_multilingual(), out)
    return out / "manpages-multilingual"


@pytest.fixture(scope="module")
def task_slice(task_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SLICE rows of each language per split, evenly spaced through the task's files."""
    out = tmp_path_factory.mktemp("slice")
    for split, per_language in SLICE.items():
        rows = _read_jsonl(task_dir / f"{split}.jsonl")
        kept = []
        for language in LANGUAGES:
            of_language = [row for row in rows if row["language"] == language]
            kept += bpt._evenly_spaced(of_language, per_language)
        (out / f"{split}.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept),
                                            encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(task_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bertforge tokenizer train --cased` on the task's whole train split (~1.2 MB of text in six languages)."""
    out = tmp_path_factory.mktemp("tokenizer") / "multilingual"
    assert main(["-q", "tokenizer", "train", "--cased", "--input", str(task_dir / "train.jsonl"), "--text-field", "text",
                 "--vocab-size", "4096", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def pretrained(task_slice: Path, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """distilbert-tiny pre-trained 2 steps on the slice's train text (`prepare pretrain`, `pretrain`)."""
    root = tmp_path_factory.mktemp("pretrain")
    assert main(["-q", "prepare", "pretrain", "--input", str(task_slice / "train.jsonl"), "--text-field", "text",
                 "--tokenizer", str(tokenizer_dir), "--out", str(root / "data"), "--seq-len", "64",
                 "--workers", "0"]) == 0
    assert main(["-q", "pretrain", str(REPO_ROOT / "configs/pretrain/multilingual-distilbert.yaml"), *TINY_DISTILBERT,
                 f"data.path={root / 'data'}", f"run.output_dir={root}", "run.name=pretrained", "train.max_steps=2",
                 "train.micro_batch_size=8", "train.global_batch_size=8", "data.validation_samples=4",
                 "data.num_workers=0", "log.progress=false", "log.tensorboard=false", "log.plots=false"]) == 0
    return root / "pretrained"


def finetune_overrides(task_slice: Path, pretrained: Path) -> list[str]:
    return [*QUIET_RUN, f"model.init_from={pretrained}", *NO_DROPOUT, "log.plots=false",
            f"finetune.train_file={task_slice / 'train.jsonl'}",
            f"finetune.validation_file={task_slice / 'validation.jsonl'}",
            f"finetune.test_file={task_slice / 'test.jsonl'}", "finetune.max_length=48", "optim.lr=1e-3",
            "train.micro_batch_size=16", "train.global_batch_size=32", "train.max_steps=4", "train.max_epochs=null",
            "train.log_every=1", "train.eval_every=100", "train.checkpoint_every=100"]


@pytest.fixture(scope="module")
def runs(task_slice: Path, pretrained: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The recipe fine-tuned from `pretrained` in one process and by `torchrun --nproc_per_node 2`, global batch 32."""
    root = tmp_path_factory.mktemp("finetune")
    env = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    found = {}
    for nproc in (1, 2):
        run_dir = root / f"ranks-{nproc}"
        config = root / f"{run_dir.name}.yaml"
        recipe = str(REPO_ROOT / "configs/finetune/multilingual-distilbert.yaml")
        config.write_text(config_to_yaml(load_config(recipe, [*finetune_overrides(task_slice, pretrained),
                                                              f"run.output_dir={root}", f"run.name={run_dir.name}"])))
        if nproc == 1:
            assert main(["-q", "finetune", str(config)]) == 0
        else:
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                   "-m", "bertforge.cli", "-q", "finetune", str(config)], cwd=REPO_ROOT, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        found[nproc] = run_dir
    return found


def test_the_task_holds_no_page_in_two_splits(task_dir: Path) -> None:
    pages = {split: {row["page"] for row in _read_jsonl(task_dir / f"{split}.jsonl")} for split in SLICE}
    assert pages["train"] and pages["validation"] and pages["test"]
    assert not pages["train"] & pages["test"] and not pages["train"] & pages["validation"]
    assert not pages["validation"] & pages["test"]


def test_the_tokenizer_encodes_cjk_accents_and_german_as_the_stock_multilingual_bert_tokenizer(
        task_dir: Path, tokenizer_dir: Path) -> None:
    """transformers' slow, reference BertTokenizer with bert-base-multilingual-cased's settings, on our vocab.txt."""
    from transformers import BertTokenizer

    from bertforge.data.tokenizer import load_tokenizer

    stock = BertTokenizer(vocab=str(tokenizer_dir / "vocab.txt"), do_lower_case=False, tokenize_chinese_chars=True,
                          strip_accents=None)
    ours = load_tokenizer(tokenizer_dir).tokenizer
    rows = _read_jsonl(task_dir / "test.jsonl")
    lines = {language: [row["text"] for row in rows if row["language"] == language][:15] for language in LANGUAGES}
    lines["accents"] = ["Ça coûte 5 € à Zürich, naïve café; ñandú, pingüino, Straße, Größe, ÅÆØ œuvre.",
                        "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ，全角　カタカナ　ﾊﾝｶｸ and  tabs\tand\u00a0spaces"]
    for language, texts in lines.items():
        assert texts, language
        for text in texts:
            assert ours.encode(text).ids == stock(text)["input_ids"], (language, text[:80])
    # what makes the equality worth checking: each CJK ideograph is a token of its own, case and accents are kept
    ideographs = [piece for piece in stock.tokenize(lines["zh"][0]) if re.fullmatch(r"(##)?[\u4e00-\u9fff]+", piece)]
    assert ideographs and all(len(piece) == 1 for piece in ideographs)
    assert "".join(piece.removeprefix("##") for piece in stock.tokenize("Größe Émile")) == "GrößeÉmile"


def test_the_presets_have_distilbert_multilingual_cased_shape_and_export_as_distilbert() -> None:
    from bertforge.models.families import family_for_config

    real = get_preset("distilbert-base-multilingual-cased")
    # the numbers of distilbert-base-multilingual-cased's config.json
    assert (real.vocab_size, real.num_layers, real.hidden_size, real.num_heads, real.intermediate_size,
            real.max_position_embeddings) == (119547, 6, 768, 12, 3072, 512)
    assert (real.type_vocab_size, real.pooling, real.classifier_dropout) == (0, "relu_pooler", 0.2)
    for name in ("distilbert-base-multilingual-cased", "distilbert-tiny"):
        family, reason = family_for_config(get_preset(name))
        assert family is not None and family.model_type == "distilbert", reason


def test_pretraining_exports_a_distilbert_masked_lm_that_transformers_runs(pretrained: Path) -> None:
    from transformers import AutoModelForMaskedLM, pipeline

    config = json.loads((pretrained / "final" / "config.json").read_text())
    assert config["model_type"] == "distilbert" and config["architectures"] == ["DistilBertForMaskedLM"]
    model = AutoModelForMaskedLM.from_pretrained(pretrained / "final")
    assert type(model).__name__ == "DistilBertForMaskedLM"
    fill = pipeline("fill-mask", model=str(pretrained / "final"), top_k=2)
    assert len(fill("Dieses Programm [MASK] Dateien.")) == 2


def test_two_ranks_fine_tune_like_one_process_with_the_same_global_batch(runs: dict[int, Path]) -> None:
    losses = {nproc: [record["loss"] for record in metrics_records(run_dir, "train")] for nproc, run_dir in runs.items()}
    assert len(losses[1]) == 4
    assert losses[2] == pytest.approx(losses[1], rel=1e-5, abs=1e-6)
    weights = {nproc: load_file(run_dir / "final" / "model.safetensors") for nproc, run_dir in runs.items()}
    assert weights[1].keys() == weights[2].keys()
    for key, tensor in weights[1].items():
        torch.testing.assert_close(weights[2][key], tensor, rtol=1e-4, atol=1e-5, msg=key)
    results = {nproc: json.loads((run_dir / "test_results.json").read_text()) for nproc, run_dir in runs.items()}
    assert results[2]["metrics"]["accuracy"] == pytest.approx(results[1]["metrics"]["accuracy"])
    assert results[2]["per_group"] == results[1]["per_group"]


def test_the_test_report_gives_accuracy_and_the_majority_class_per_language(
        runs: dict[int, Path], task_slice: Path) -> None:
    run_dir = runs[1]
    assert json.loads((run_dir / "final" / "config.json").read_text())["architectures"] == [
        "DistilBertForSequenceClassification"]
    results = json.loads((run_dir / "test_results.json").read_text())
    per_group = results["per_group"]
    assert per_group["column"] == "language"
    groups = {group["name"]: group for group in per_group["groups"]}
    assert list(groups) == [*LANGUAGES, "all"]
    rows = _read_jsonl(task_slice / "test.jsonl")
    for language in LANGUAGES:
        labels = Counter(row["label"] for row in rows if row["language"] == language)
        majority, count = max(sorted(labels.items(), key=lambda kv: int(kv[0])), key=lambda kv: kv[1])
        group = groups[language]
        assert (group["examples"], group["majority_class"]) == (SLICE["test"], majority), language
        assert group["majority_accuracy"] == pytest.approx(count / SLICE["test"])
        assert 0.0 <= group["accuracy"] <= 1.0
    total = sum(groups[language]["accuracy"] * groups[language]["examples"] for language in LANGUAGES)
    assert groups["all"]["accuracy"] == pytest.approx(results["metrics"]["accuracy"])
    assert groups["all"]["accuracy"] == pytest.approx(total / len(rows))
    report = (run_dir / "test_report.md").read_text()
    assert "## Per language" in report and "| ja |" in report


def test_a_missing_group_column_is_one_line_naming_the_file_and_the_key(
        task_slice: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["finetune", str(REPO_ROOT / "configs/finetune/multilingual-distilbert.yaml"),
                 *finetune_overrides(task_slice, pretrained), "finetune.classification.group_column=lang",
                 f"run.output_dir={tmp_path}", "run.name=no-column"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert f"{task_slice / 'train.jsonl'}:1: no column 'lang'" in err and "finetune.classification.group_column" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("task_type", ["regression", "token_classification"])
def test_a_group_column_is_refused_for_a_kind_that_does_not_read_it(task_type: str) -> None:
    with pytest.raises(ConfigError, match="finetune.classification.group_column` is set but only applies to "
                                          "finetune.task_type=classification"):
        load_config(None, [f"finetune.task_type={task_type}", "finetune.classification.group_column=language"])


def test_the_recipes_hub_name_starts_from_a_cached_distilbert(
        task_slice: Path, tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`model.init_from: distilbert/distilbert-base-multilingual-cased` as a user with it in the HF cache runs the
    recipe; here the cache holds a tiny random DistilBertForMaskedLM (transformers' own) under that name."""
    import shutil

    from huggingface_hub import constants
    from test_hub_names import fill_hub_cache
    from transformers import AutoModelForSequenceClassification, DistilBertConfig, DistilBertForMaskedLM

    from bertforge.data.tokenizer import load_tokenizer

    source = tmp_path / "hub-model"
    torch.manual_seed(0)
    DistilBertForMaskedLM(DistilBertConfig(vocab_size=load_tokenizer(tokenizer_dir).vocab_size, dim=32, n_layers=2,
                                           n_heads=2, hidden_dim=64)).save_pretrained(source)
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, source / file.name)
    cache = tmp_path / "hf-home" / "hub"
    fill_hub_cache(cache, "distilbert/distilbert-base-multilingual-cased", source)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    overrides = [item for item in finetune_overrides(task_slice, tmp_path) if not item.startswith("model.init_from=")]
    assert main(["-q", "finetune", str(REPO_ROOT / "configs/finetune/multilingual-distilbert.yaml"), *overrides,
                 "train.max_steps=2", f"run.output_dir={tmp_path / 'runs'}", "run.name=from-hub"]) == 0
    final = tmp_path / "runs" / "from-hub" / "final"
    model = AutoModelForSequenceClassification.from_pretrained(final)
    assert type(model).__name__ == "DistilBertForSequenceClassification" and model.config.dim == 32
    assert {group["name"] for group in json.loads((final.parent / "test_results.json").read_text())["per_group"][
        "groups"]} == {*LANGUAGES, "all"}
