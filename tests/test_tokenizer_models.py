"""Byte-level BPE (RoBERTa's) and Unigram (XLM-R's) tokenizers: trained, loaded by transformers, and used by every
command: prepare pretrain, masking, pre-training a RoBERTa-shaped model that AutoModelForMaskedLM and the fill-mask
pipeline run, fill-mask, finetune, predict, evaluate and embed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from bertforge.cli import main
from bertforge.data.labeled import bert_tokenizer
from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
from bertforge.data.sentences import split_sentences, tokenize_documents
from bertforge.data.tokenizer import load_tokenizer, train_tokenizer_from_inputs

MODELS = ("bpe", "unigram")
HF_CLASS = {"bpe": "RobertaTokenizer", "unigram": "XLMRobertaTokenizer"}
ROBERTA_IDS = {"cls": 0, "pad": 1, "sep": 2, "unk": 3, "mask": 4}  # <s> <pad> </s> <unk> <mask>, fairseq's order
TINY_ROBERTA = ["model.preset=roberta-tiny", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128"]
QUIET = ["data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false"]
TEXTS = ["And God said, Let there be light: and there was light.", "the <mask> of the law",
         "  naïve café, 東京 and \u00a0 odd   spacing\n", "first sentence. Second one! third?"]


@pytest.fixture(scope="module")
def small_corpus(corpus_slice: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 KJV chapters and 100 WordNet glosses of `corpus_slice` (~200 kB): Unigram's training takes seconds."""
    documents = corpus_slice.read_text(encoding="utf-8").rstrip("\n").split("\n\n")
    path = tmp_path_factory.mktemp("corpus") / "small.txt"
    path.write_text("\n\n".join(documents[:40] + documents[-100:]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=MODELS)
def trained(request: pytest.FixtureRequest, small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp(request.param) / "tokenizer"
    train_tokenizer_from_inputs([str(small_corpus)], out, model=request.param, vocab_size=1000)
    return out


def kind_of(tokenizer_dir: Path) -> str:
    return tokenizer_dir.parent.name.rstrip("0123456789")


def test_each_model_saves_hf_files_with_robertas_specials_first_and_a_vocab_that_is_a_multiple_of_64(
        trained: Path) -> None:
    assert {p.name for p in trained.iterdir()} == {"tokenizer.json", "tokenizer_config.json",
                                                   "special_tokens_map.json"}  # no BERT vocab.txt
    loaded = load_tokenizer(trained)
    assert loaded.vocab_size % 64 == 0 and 1000 <= loaded.vocab_size < 1064
    assert loaded.ids == ROBERTA_IDS
    assert loaded.special_tokens == {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"}


def test_autotokenizer_builds_the_familys_class_and_encodes_as_bertforge_does(trained: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(str(trained))
    assert type(hf).__name__ == HF_CLASS[kind_of(trained)]
    ours = bert_tokenizer(trained, 512)
    for text in TEXTS:
        assert ours.encode(text).ids == hf(text)["input_ids"], text
    pair = ours.encode(TEXTS[0], TEXTS[3])
    assert pair.ids == hf(TEXTS[0], TEXTS[3])["input_ids"]
    assert pair.ids.count(2) == 3 and set(pair.type_ids) == {0}  # <s> a </s></s> b </s>, no token types
    masked = hf.convert_ids_to_tokens(hf(TEXTS[1])["input_ids"])
    assert masked[2] == "<mask>" and masked[3] in ("Ġof", "▁of")  # <mask> takes the space before it, as RoBERTa's


def test_training_twice_writes_byte_identical_files(trained: Path, small_corpus: Path, tmp_path: Path) -> None:
    # a fresh process: the Unigram trainer's float sums and its put-back characters follow hash-map order
    assert main(["-q", "tokenizer", "train", "--model", kind_of(trained), "--input", str(small_corpus),
                 "--vocab-size", "1000", "--out", str(tmp_path / "again")]) == 0
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (tmp_path / "again" / name).read_bytes() == (trained / name).read_bytes(), name


@pytest.mark.parametrize(("flags", "message"), [
    (["--model", "bpe", "--uncased"], "--uncased is WordPiece's: --model bpe keeps case"),
    (["--model", "unigram", "--min-frequency", "3"], "--min-frequency counts the pairs WordPiece and BPE merge")])
def test_a_flag_the_model_cannot_honour_is_refused(flags: list[str], message: str, small_corpus: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenizer", "train", *flags, "--input", str(small_corpus), "--out", str(tmp_path / "tok")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "tok" / "tokenizer.json").exists()


def test_prepared_documents_hold_the_ids_of_the_whole_text_and_its_sentence_ends(trained: Path) -> None:
    # the sentence mark is the tokenizer's </s>, and the space after it stays with the next word (Ġword / ▁word)
    loaded = load_tokenizer(trained)
    text = "In the beginning God created the heaven. And the earth was without form! Darkness was upon the deep."
    documents = tokenize_documents([text], loaded.tokenizer, sep_id=loaded.sep_id, drop_ids=[loaded.cls_id],
                                   dtype=np.dtype(np.uint16))
    assert documents.tokens.tolist() == loaded.tokenizer.encode(text, add_special_tokens=False).ids
    assert len(documents.sentence_lengths) == len(split_sentences(text)) == 3


@pytest.fixture(scope="module")
def prepared(trained: Path, small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data") / kind_of(trained)
    prepare_pretraining_data([str(small_corpus)], trained, out, PrepareSettings(seq_len=64, split=(900.0, 100.0)),
                             workers=1)
    return out


def test_masking_never_masks_s_or_pad_and_fills_in_the_tokenizers_mask(prepared: Path) -> None:
    from bertforge.data.masking import MaskingSettings
    from bertforge.data.pretraining_loader import build_eval_loader
    from bertforge.data.shards import PretokenizedDataset

    dataset = PretokenizedDataset(prepared, "validation")
    assert dataset[0][0] == ROBERTA_IDS["cls"] and dataset[0][-1] == ROBERTA_IDS["sep"]
    loader = build_eval_loader(dataset, micro_batch_size=32, masking=MaskingSettings(mask_prob=0.5, seed=3))
    batches = list(loader)
    labels = torch.cat([b["masked_labels"] for b in batches])
    assert labels.numel() > 500
    assert not set(labels.tolist()) & {ROBERTA_IDS["cls"], ROBERTA_IDS["sep"], ROBERTA_IDS["pad"]}
    masked = torch.cat([b["input_ids"][b["masked_positions"]] for b in batches])
    assert (masked == ROBERTA_IDS["mask"]).float().mean() > 0.7  # 80% become <mask>


@pytest.fixture(scope="module")
def pretrained_roberta(prepared: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny RoBERTa shape pre-trained from scratch on the module's prepared data: with the byte-level BPE as
    RoBERTa, with the Unigram as XLM-R (a SentencePiece vocabulary, `▁` word starts, the same special ids)."""
    from bertforge.config import load_config
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("runs") / f"roberta-{prepared.name}"
    config = load_config(None, [*TINY_ROBERTA, *QUIET, f"data.path={prepared}", "data.seq_len=64",
                                f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "train.max_steps=6",
                                "train.micro_batch_size=16", "train.global_batch_size=16", "optim.lr=3e-3",
                                "schedule.warmup=2", "train.eval_every=6"])
    Trainer(config, PretrainTask(config)).fit()
    return run_dir


@pytest.mark.parametrize("trained", MODELS, indirect=True)
def test_a_roberta_pretrained_from_scratch_loads_in_automodelformaskedlm_and_the_fill_mask_pipeline(
        pretrained_roberta: Path) -> None:
    from bertforge.inference import fill_mask, load_model

    final = pretrained_roberta / "final"
    config = json.loads((final / "config.json").read_text())
    assert (config["model_type"], config["pad_token_id"], config["type_vocab_size"]) == ("roberta", 1, 1)
    stock = transformers.AutoModelForMaskedLM.from_pretrained(str(final)).eval()
    assert type(stock).__name__ == "RobertaForMaskedLM"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(final))
    encoded = tokenizer(["In the beginning God created the <mask>.", "And the <mask> was"], padding=True,
                        return_tensors="pt")
    ours = load_model(str(final)).model
    lengths = encoded["attention_mask"].sum(1)
    with torch.no_grad():
        theirs = stock(**encoded).logits
        for row, length in enumerate(lengths.tolist()):
            ids = encoded["input_ids"][row, :length]
            positions = torch.arange(length)
            mine = ours(input_ids=ids, token_type_ids=torch.zeros_like(ids), masked_positions=positions).mlm_logits
            assert (mine - theirs[row, :length]).abs().max() < 1e-4
    text = "And God said, Let there be <mask>."
    pipeline = transformers.pipeline("fill-mask", model=str(final), top_k=3)(text)
    assert len(pipeline) == 3 and all("<mask>" not in p["sequence"] for p in pipeline)
    mine = fill_mask(load_model(str(final)), text, top_k=3)[0]
    assert [p.token for p in mine] == [p["token"] for p in pipeline]


@pytest.mark.parametrize("trained", MODELS, indirect=True)
def test_fill_mask_cli_takes_mask_and_the_bert_spelling(pretrained_roberta: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for spelling in ("<mask>", "[MASK]"):
        capsys.readouterr()
        assert main(["-q", "fill-mask", str(pretrained_roberta), f"And God said, Let there be {spelling}.",
                     "--top-k", "2", "--json"]) == 0
        results = json.loads(capsys.readouterr().out)
        assert len(results) == 1 and len(results[0]) == 2


def test_finetune_predict_evaluate_and_embed_run_with_the_tokenizer(trained: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from helpers.finetuning import supersense_files

    run_dir = tmp_path / "runs" / "classify"
    files = supersense_files(tmp_path / "data", train=32, validation=8, test=8)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("finetune: {task_type: classification}\n", encoding="utf-8")
    assert main(["-q", "finetune", str(recipe), *TINY_ROBERTA, *QUIET, *files, f"model.tokenizer={trained}",
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "train.max_steps=2",
                 "train.micro_batch_size=16", "train.global_batch_size=16", "finetune.max_length=40"]) == 0
    stock = transformers.AutoModelForSequenceClassification.from_pretrained(str(run_dir / "final"))
    assert type(stock).__name__ == "RobertaForSequenceClassification"
    capsys.readouterr()
    assert main(["-q", "predict", str(run_dir), "--text", "a person who reads the law"]) == 0
    assert "label" in json.loads(capsys.readouterr().out.splitlines()[0])
    test_file = files[2].split("=", 1)[1]
    assert main(["-q", "evaluate", str(run_dir), "--data", test_file]) == 0
    texts = tmp_path / "texts.txt"
    texts.write_text("the law\nthe light\n", encoding="utf-8")
    assert main(["-q", "embed", str(run_dir / "final"), "--input", str(texts), "--out", str(tmp_path / "v.npy")]) == 0
    assert np.load(tmp_path / "v.npy").shape == (2, 64)


def test_a_roberta_preset_refuses_a_tokenizer_whose_pad_is_not_id_1(prepared_corpus: Path, tmp_path: Path) -> None:
    # the export's pad_token_id is position_offset - 1, and transformers numbers positions after that id
    from bertforge.config import load_config
    from bertforge.errors import ConfigError
    from bertforge.tasks.pretrain import PretrainTask
    from bertforge.train.trainer import Trainer

    config = load_config(None, [*TINY_ROBERTA, *QUIET, f"data.path={prepared_corpus}", f"run.output_dir={tmp_path}",
                                "train.max_steps=1"])
    with pytest.raises(ConfigError, match=r"numbers positions after the pad id 1, as RoBERTa does, but the pad token "
                                          r".* is id 0; train the tokenizer with `bertforge tokenizer train --model bpe`"):
        Trainer(config, PretrainTask(config)).fit()


def test_tagged_words_are_encoded_as_in_running_text(trained: Path) -> None:
    # byte-level BPE: a pre-split word alone has no space before it, so without one added it would be encoded as a
    # text's first word (`the`, not `Ġthe`), unlike the text the model is pre-trained and predicts on
    from bertforge.data.aligned import TaggedDataset
    from bertforge.data.tagged import TaggedSplit

    words = ["And", "the", "earth", "was", "without", "form", ",", "and", "void"]
    dataset = TaggedDataset(TaggedSplit("words", [words], [[0] * len(words)], ["O"]), trained, 64)
    running = bert_tokenizer(trained, 64).encode(" " + " ".join(words))
    assert dataset.token_ids.tolist() == running.ids
    assert len(dataset.word_starts) == len(words)
