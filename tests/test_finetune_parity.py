"""Whole fine-tuning runs match Hugging Face `Trainer` when every source of randomness is shared.

The quality-parity benchmark (`benchmarks/parity.py`) removes each difference between the two
trainers — initial weights, batch order, dropout, schedule arithmetic — and compares whole runs. This keeps that equality as a specification of `bertforge finetune`'s loop:
its sampler, learning-rate schedule, loss normalisation, clipping, weight-decay groups and fused
AdamW must follow `Trainer` step for step, and the trained models must predict the same labels.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.data.bundled import supersense_labels, supersense_lines

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def parity():  # type: ignore[no-untyped-def]
    from benchmarks import parity as benchmark

    return benchmark


def small_task(parity, train_rows: int, test_rows: int):  # type: ignore[no-untyped-def]
    train = [json.loads(line) for line in supersense_lines("train", train_rows)]
    test = [json.loads(line) for line in supersense_lines("test", test_rows)]
    return parity.TaskData("supersense", "classification", train, test, supersense_labels(), False)


def test_a_whole_matched_run_follows_hf_trainer_step_for_step_and_predicts_the_same(
        parity, minilm_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # 80 rows: 2 full batches and a smaller last one of 16 per epoch, which both train on (HF
    # Trainer always did; bertforge dropped it until the parity study measured that at -0.5 points)
    task = small_task(parity, 80, 64)
    # a learning rate other than the benchmark's default (`--lr`, as the MPNet runs use): both sides must take it
    ours, theirs = parity.run_pair(tmp_path, minilm_dir, task, seed=5, epochs=2,
                                   matching=parity.Matching.everything(), index=0, lr=1e-4)
    assert len(ours.step_losses) == len(theirs.step_losses) == 6
    for step, (a, b) in enumerate(zip(ours.step_losses, theirs.step_losses, strict=True)):
        assert abs(a - b) <= 1e-4, f"step {step}: bertforge {a:.6f} vs HF {b:.6f}"
    assert ours.step_losses[-1] < ours.step_losses[0]
    assert (ours.predictions == theirs.predictions).all()


def test_long_texts_and_pairs_are_encoded_exactly_as_the_transformers_tokenizer_does(minilm_dir: Path) -> None:
    """Truncation, [SEP] placement and segment ids for texts longer than max_length and for pairs
    (one long side, or both): the ids HF `Trainer` would be fed, token for token."""
    import gzip

    import transformers

    from bertforge.data.bundled import corpus_path
    from bertforge.data.labeled import bert_tokenizer

    documents = gzip.decompress(corpus_path().read_bytes()).decode("utf-8").split("\n\n")[:40]
    chapters = [document.replace("\n", " ") for document in documents]  # hundreds of tokens each
    verses = [document.split("\n")[0] for document in documents]
    glosses = [json.loads(line)["text"] for line in supersense_lines("test", 40)]
    hf = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    ours = bert_tokenizer(minilm_dir, 128)
    cases = {"long single texts": (chapters, None), "long first, short second": (chapters, glosses),
             "short first, long second": (verses, chapters), "both long": (chapters, chapters[::-1]),
             "short pairs": (glosses, verses)}
    for name, (first, second) in cases.items():
        expected = hf(first, second, truncation=True, max_length=128)
        encoded = ours.encode_batch(first if second is None else list(zip(first, second, strict=True)))
        assert [e.ids for e in encoded] == expected["input_ids"], name
        assert [e.type_ids for e in encoded] == expected["token_type_ids"], name
    assert max(len(ids) for ids in hf(chapters, truncation=True, max_length=128)["input_ids"]) == 128
