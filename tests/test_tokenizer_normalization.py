"""`bertforge tokenizer train --normalize arabic | arabic-diacritics | tatweel` and `--strip-accents/--keep-accents`:
what each does to Arabic, that the choice is saved in tokenizer.json so AutoTokenizer gives our ids, and that it is
shown. BERT's own accent stripping (the uncased default) is checked too: it removes harakat but also the hamza."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from bertforge.cli import main
from bertforge.commands.tokenizer import NORMALIZATION_NAMES
from bertforge.data.normalization import NAMES, describe
from bertforge.data.tokenizer import load_tokenizer

# interface messages as Debian's Arabic catalogs write them, some vocalised, one stretched with tatweel
SENTENCES = [
    "تعذّر فتح الملف المطلوب", "تعذر حفظ الملف في المجلد", "يُضبط لون الخلفية تلقائياً عند الفتح",
    "لون الخلفية تلقائيا", "مرحـــبا بك في البرنامج", "مرحبا بك في المحرر", "سأل المستخدم عن كلمة السر",
    "سال الماء على الأرض", "أضِف حساباً جديداً إلى القائمة", "أضف حسابا جديدا", "مؤتمر الفيديو بدأ الآن",
    "إلغاء العملية الحالية", "آمن الاتصال بالخادم", "الكتابُ في المكتبة", "الكتاب في المكتبة",
]
# (vocalised or stretched, bare): harakat (shadda, tanwin fath, damma, kasra), tatweel
DIACRITICS = [("تعذّر", "تعذر"), ("تلقائياً", "تلقائيا"), ("الكتابُ", "الكتاب"), ("أضِف", "أضف")]
TATWEEL = [("مرحـــبا", "مرحبا"), ("الكـتاب", "الكتاب")]
HAMZA = [("سأل", "سال"), ("مؤتمر", "موتمر"), ("آمن", "امن"), ("إلغاء", "الغاء")]  # different words
VOCAB = {"wordpiece": 200, "bpe": 400, "unigram": 200}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("arabic") / "messages.txt"
    path.write_text("\n\n".join(SENTENCES * 4) + "\n", encoding="utf-8")
    return path


def train(corpus: Path, out: Path, model: str, *flags: str) -> Path:
    assert main(["-q", "tokenizer", "train", "--model", model, "--input", str(corpus), "--vocab-size",
                 str(VOCAB[model]), *flags, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module", params=list(VOCAB))
def normalized(request: pytest.FixtureRequest, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train(corpus, tmp_path_factory.mktemp(request.param) / "tok", request.param, "--normalize", "arabic")


@pytest.fixture(scope="module", params=list(VOCAB))
def unnormalized(request: pytest.FixtureRequest, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    flags = ["--keep-accents"] if request.param == "wordpiece" else []  # BPE and Unigram keep them anyway
    return train(corpus, tmp_path_factory.mktemp(request.param) / "tok", request.param, *flags)


def ids(tokenizer_dir: Path, text: str) -> list[int]:
    return load_tokenizer(tokenizer_dir).tokenizer.encode(text, add_special_tokens=False).ids


def test_normalize_arabic_gives_a_word_with_harakat_or_tatweel_the_ids_of_the_bare_word(normalized: Path) -> None:
    for marked, bare in DIACRITICS + TATWEEL:
        assert ids(normalized, marked) == ids(normalized, bare), marked
    for with_hamza, without in HAMZA:  # a letter, not a mark: kept
        assert ids(normalized, with_hamza) != ids(normalized, without), with_hamza


def test_without_normalize_harakat_and_tatweel_change_the_ids(unnormalized: Path) -> None:
    for marked, bare in DIACRITICS + TATWEEL:
        assert ids(unnormalized, marked) != ids(unnormalized, bare), marked


def test_autotokenizer_loads_the_saved_directory_and_gives_our_ids(normalized: Path) -> None:
    ours = load_tokenizer(normalized).tokenizer
    theirs = AutoTokenizer.from_pretrained(str(normalized))
    texts = [*SENTENCES, " ".join(marked for marked, _ in DIACRITICS + TATWEEL)]
    assert [e.ids for e in ours.encode_batch(texts)] == theirs(texts)["input_ids"]
    pair = ours.encode(texts[0], texts[-1])
    encoded = theirs(texts[0], texts[-1])
    assert pair.ids == encoded["input_ids"]
    if "token_type_ids" in encoded:  # BERT's pair layout (WordPiece); RoBERTa and XLM-R have no token types
        assert pair.type_ids == encoded["token_type_ids"] and 1 in pair.type_ids


def test_each_removal_alone_removes_only_its_characters(corpus: Path, tmp_path: Path) -> None:
    tatweel = train(corpus, tmp_path / "tatweel", "wordpiece", "--normalize", "tatweel")
    assert all(ids(tatweel, a) == ids(tatweel, b) for a, b in TATWEEL)
    assert all(ids(tatweel, a) != ids(tatweel, b) for a, b in DIACRITICS)
    diacritics = train(corpus, tmp_path / "diacritics", "wordpiece", "--normalize", "arabic-diacritics")
    assert all(ids(diacritics, a) == ids(diacritics, b) for a, b in DIACRITICS)
    assert all(ids(diacritics, a) != ids(diacritics, b) for a, b in TATWEEL)


def test_berts_accent_stripping_the_uncased_default_also_drops_the_hamza(corpus: Path, tmp_path: Path) -> None:
    default = train(corpus, tmp_path / "default", "wordpiece")
    normalizer = load_tokenizer(default).tokenizer.normalizer
    assert normalizer.normalize_str("سأل مؤتمر آمن إلغاء") == "سال موتمر امن الغاء"
    assert all(ids(default, a) == ids(default, b) for a, b in DIACRITICS + HAMZA)
    assert all(ids(default, a) != ids(default, b) for a, b in TATWEEL)  # tatweel is no combining mark


def test_training_warns_where_the_uncased_default_strips_a_hamza(corpus: Path, caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from bertforge.console import log
    from bertforge.data.tokenizer import train_wordpiece

    monkeypatch.setattr(log, "handlers", [caplog.handler])  # the CLI's logger does not propagate: read it here
    texts = corpus.read_text(encoding="utf-8").split("\n\n")
    train_wordpiece(texts, vocab_size=200)
    hamzas = sum(text.count(letter) for text in texts for letter in "أإآؤئ")
    assert f"removes the hamza or madda of {hamzas} Arabic letters" in caplog.text
    caplog.clear()
    train_wordpiece(texts, vocab_size=200, normalize=("arabic-diacritics", "tatweel"), strip_accents=False)
    train_wordpiece(texts, vocab_size=200, lowercase=False)
    train_wordpiece(["the accents of café are stripped"] * 4, vocab_size=200)  # no Arabic: nothing to say
    assert "hamza" not in caplog.text


def test_lower_casing_leaves_arabic_as_it_is_when_accents_are_kept(corpus: Path, tmp_path: Path) -> None:
    uncased = train(corpus, tmp_path / "uncased", "wordpiece", "--uncased", "--keep-accents")
    cased = train(corpus, tmp_path / "cased", "wordpiece", "--cased")
    assert load_tokenizer(uncased).tokenizer.get_vocab() == load_tokenizer(cased).tokenizer.get_vocab()
    for text in SENTENCES:
        assert ids(uncased, text) == ids(cased, text)


def test_the_choice_is_saved_and_shown(corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenizer", "train", "--input", str(corpus), "--vocab-size", "200", "--normalize", "arabic",
                 "--out", str(tmp_path / "tok")]) == 0
    shown = "uncased, accents kept, Arabic diacritics removed, tatweel removed"
    assert shown in " ".join(capsys.readouterr().err.split())
    assert describe(load_tokenizer(tmp_path / "tok").tokenizer) == shown
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["tokenizer_class"], config["do_lower_case"], config["strip_accents"]) == (
        "PreTrainedTokenizerFast", True, False)  # BertTokenizerFast would rebuild the normalizer without the removal
    assert main(["-q", "tokenizer", "train", "--input", str(corpus), "--vocab-size", "200", "--strip-accents",
                 "--normalize", "tatweel", "--out", str(tmp_path / "stripped")]) == 0
    assert describe(load_tokenizer(tmp_path / "stripped").tokenizer) == "uncased, accents stripped, tatweel removed"


def test_without_normalize_the_saved_files_name_berts_class_as_before(unnormalized: Path) -> None:
    config = json.loads((unnormalized / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] != "PreTrainedTokenizerFast" and "model_input_names" not in config


def test_strip_accents_is_refused_where_the_model_keeps_accents(corpus: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenizer", "train", "--model", "bpe", "--strip-accents", "--input", str(corpus),
                 "--out", str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err
    assert "--strip-accents is WordPiece's" in err and "Traceback" not in err
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


def test_the_command_offers_the_normalisations_the_registry_holds() -> None:
    assert NORMALIZATION_NAMES == NAMES
