"""RoBERTa, XLM-RoBERTa, CamemBERT and DistilBERT, every head, against real `transformers` (fp32, CPU).

Each test builds a tiny random model of the family with `transformers` itself (hidden 32, 2 layers),
imports it, and feeds our encoder a packed batch of sequences of different lengths: the logits must
equal what the stock class computes on the same sequences padded, and the export must load in that
stock class with equal logits. Weights are drawn large (`sharpen`) so a wrong position or a missing
norm shows far above float noise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.errors import BertforgeError
from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import export_hf, from_hf, hf_class_name
from bertforge.models.token_classification import BertforgeForTokenClassification

TOLERANCE = 1e-5
VOCAB = 96
LENGTHS = [17, 5, 30, 11]  # varied, so packed sequences start at many offsets

# model_type -> (config class, class-name prefix, settings beyond the shared tiny ones)
FAMILIES = {
    "roberta": (transformers.RobertaConfig, "Roberta", {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                                                       "type_vocab_size": 1, "max_position_embeddings": 66}),
    "xlm-roberta": (transformers.XLMRobertaConfig, "XLMRoberta",
                    {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "type_vocab_size": 1,
                     "max_position_embeddings": 66}),
    "camembert": (transformers.CamembertConfig, "Camembert",
                  {"pad_token_id": 1, "bos_token_id": 5, "eos_token_id": 6, "type_vocab_size": 2,
                   "max_position_embeddings": 66}),
    "distilbert": (transformers.DistilBertConfig, "DistilBert",
                   {"pad_token_id": 0, "dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48}),
}
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
CASES = [(family, head) for family in FAMILIES for head in HEADS]
CASE_IDS = [f"{family}-{head}" for family, head in CASES]


def sharpen(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower():
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))


def tiny_hf_model(family: str, head: str, **overrides: object) -> transformers.PreTrainedModel:
    config_class, prefix, settings = FAMILIES[family]
    values: dict[str, object] = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, num_labels=3, attn_implementation="sdpa")
    values.update(settings)
    values.update(overrides)
    model = getattr(transformers, prefix + head)(config_class(**values))
    sharpen(model)
    return model.eval()


def padded_batch(pad_id: int, lengths: list[int] = LENGTHS, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (never a special id below 7) padded with the family's pad id, and the attention mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, VOCAB, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    return torch.where(mask.bool(), ids, pad_id), mask


def hf_outputs(hf_model: transformers.PreTrainedModel, head: str, ids: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
    """What the stock class computes, the real tokens' rows only (per sequence for a sequence classifier)."""
    with torch.no_grad():
        output = hf_model(input_ids=ids, attention_mask=mask)
    if head == "Model":
        return output.last_hidden_state[mask.bool()]
    return output.logits if head == "ForSequenceClassification" else output.logits[mask.bool()]


def our_outputs(model: torch.nn.Module, head: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Our model on the packed layout: the real tokens back to back, `cu_seqlens`, positions derived per sequence."""
    packed = unpad_inputs(ids, mask)
    with torch.no_grad():
        output = model(input_ids=packed.input_ids, cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen)
    if head == "Model":
        return output
    return output.mlm_logits if head == "ForMaskedLM" else output.logits


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (ours - theirs).abs().max().item()


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_packed_batch_gives_the_stock_class_padded_logits(family: str, head: str) -> None:
    hf_model = tiny_hf_model(family, head)
    ours = from_hf(hf_model).eval()
    ids, mask = padded_batch(hf_model.config.pad_token_id)
    expected = hf_outputs(hf_model, head, ids, mask)
    got = our_outputs(ours, head, ids, mask)
    assert got.shape == expected.shape
    assert max_diff(got, expected) <= TOLERANCE


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_export_loads_in_the_stock_class_with_equal_logits(tmp_path: Path, family: str, head: str) -> None:
    _, prefix, _ = FAMILIES[family]
    hf_model = tiny_hf_model(family, head)
    ours = from_hf(hf_model).eval()
    assert hf_class_name(ours) == (prefix + head, "")
    result = export_hf(ours, None, tmp_path / "export")
    assert (result.format, result.architecture) == ("transformers", prefix + head)
    reloaded, loading = getattr(transformers, prefix + head).from_pretrained(
        str(result.directory), output_loading_info=True, attn_implementation="sdpa")
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert reloaded.config.model_type == family
    ids, mask = padded_batch(reloaded.config.pad_token_id)
    assert max_diff(hf_outputs(reloaded.eval(), head, ids, mask), hf_outputs(hf_model, head, ids, mask)) <= TOLERANCE


STEP_CASES = CASES + [(family, "ForMultipleChoice") for family in FAMILIES]


@pytest.mark.parametrize(("family", "head"), STEP_CASES, ids=[f"{family}-{head}" for family, head in STEP_CASES])
def test_training_steps_follow_transformers_step_for_step(family: str, head: str) -> None:
    """Six AdamW steps with clipping, dropout off: HF's losses step for step (`helpers/hf_step_parity.py`)."""
    from helpers.hf_step_parity import losses_step_for_step

    import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)

    no_dropout = ({"dropout": 0.0, "attention_dropout": 0.0, "seq_classif_dropout": 0.0} if family == "distilbert"
                  else {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0})
    hf_model = tiny_hf_model(family, head, **no_dropout)
    ours = from_hf(hf_model)
    batches = [padded_batch(hf_model.config.pad_token_id, seed=seed) for seed in range(6)]
    our_losses, hf_losses = losses_step_for_step(hf_model, ours, head, batches)
    assert our_losses == pytest.approx(hf_losses, abs=1e-4)
    assert abs(our_losses[-1] - our_losses[0]) > 1e-2  # the steps moved the weights


def test_roberta_positions_start_after_the_padding_id_in_every_packed_sequence() -> None:
    ours = from_hf(tiny_hf_model("roberta", "Model"))
    assert ours.config.position_offset == 2 and ours.config.max_sequence_length == 64
    position_rows = ours.embeddings.position_embeddings.weight
    with torch.no_grad():  # rows 0 and 1 (before the offset) must never be read
        position_rows[:2] = float("nan")
    ids, mask = padded_batch(1, [64, 3])
    assert torch.isfinite(our_outputs(ours.eval(), "Model", ids, mask)).all()
    with pytest.raises(BertforgeError, match="exceeds the model's 64 learned positions"):
        our_outputs(ours, "Model", *padded_batch(1, [65]))


def test_roberta_token_types_are_one_row_whatever_ids_arrive() -> None:
    hf_model = tiny_hf_model("roberta", "ForSequenceClassification")
    ours = from_hf(hf_model).eval()
    ids, mask = padded_batch(1)
    packed = unpad_inputs(ids, mask, token_type_ids=torch.ones_like(ids))  # a BERT-style pair's segment ids
    with torch.no_grad():
        got = ours(input_ids=packed.input_ids, cu_seqlens=packed.cu_seqlens, token_type_ids=packed.token_type_ids)
    assert max_diff(got.logits, hf_outputs(hf_model, "ForSequenceClassification", ids, mask)) <= TOLERANCE


def test_an_xlm_roberta_import_exports_as_xlm_roberta_not_roberta(tmp_path: Path) -> None:
    ours = from_hf(tiny_hf_model("xlm-roberta", "ForMaskedLM"))
    assert ours.config.hf_model_type == "xlm-roberta"
    result = export_hf(ours, None, tmp_path / "export")
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(str(result.directory))
    assert type(reloaded).__name__ == "XLMRobertaForMaskedLM"


def test_distilbert_classifier_is_pre_classifier_relu_classifier() -> None:
    ours = from_hf(tiny_hf_model("distilbert", "ForSequenceClassification"))
    assert ours.config.pooling == "relu_pooler" and ours.config.type_vocab_size == 0
    assert ours.config.classifier_dropout == pytest.approx(0.2)  # seq_classif_dropout
    assert ours.encoder.pooler is None


def test_distilbert_with_sinusoidal_positions_is_refused_in_one_line() -> None:
    with pytest.raises(BertforgeError, match="sinusoidal_pos_embds is true") as error:
        from_hf(tiny_hf_model("distilbert", "Model", sinusoidal_pos_embds=True))
    assert "\n" not in str(error.value)


def test_a_distilbert_token_classifier_keeps_its_labels_through_export(tmp_path: Path) -> None:
    hf_model = tiny_hf_model("distilbert", "ForTokenClassification",
                             id2label={0: "O", 1: "B-X", 2: "I-X"}, label2id={"O": 0, "B-X": 1, "I-X": 2})
    ours = from_hf(hf_model)
    assert isinstance(ours, BertforgeForTokenClassification) and ours.label_names == ["O", "B-X", "I-X"]
    result = export_hf(ours, None, tmp_path / "export")
    assert transformers.AutoConfig.from_pretrained(str(result.directory)).id2label[1] == "B-X"


# ---------------------------------------------------------------------------------------------
# `bertforge finetune` from a saved tiny Hugging Face directory with the family's own tokenizer

ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # roberta-base's ids 0-4
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def family_tokenizer(family: str, texts: list[str]) -> transformers.PreTrainedTokenizerFast:
    """A tiny tokenizer the family's way: RoBERTa's byte-level BPE with `<s> a </s></s> b </s>`, or WordPiece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if family == "distilbert":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=300, special_tokens=BERT_SPECIALS))
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        tokenizer.decoder = decoders.WordPiece()
        roles = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"), BERT_SPECIALS,
                         strict=True))
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.train_from_iterator(texts, trainers.BpeTrainer(
            vocab_size=300, special_tokens=ROBERTA_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
        tokenizer.decoder = decoders.ByteLevel()
        roles = {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                 "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>"}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **roles)


@pytest.mark.parametrize("family", ["roberta", "xlm-roberta", "distilbert"])
def test_finetune_starts_from_a_saved_tiny_hf_directory_of_the_family(tmp_path: Path, family: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from helpers.finetuning import supersense_files

    from bertforge.cli import main
    from bertforge.data.bundled import supersense_lines
    from bertforge.data.labeled import bert_tokenizer
    from bertforge.inference import load_model

    texts = [json.loads(line)["text"] for line in supersense_lines("train", 400)]
    tokenizer = family_tokenizer(family, texts)
    source = tmp_path / f"tiny-{family}"
    hf_model = tiny_hf_model(family, "ForMaskedLM", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    hf_model.save_pretrained(str(source))
    tokenizer.save_pretrained(str(source))
    run_dir = tmp_path / "runs" / family
    recipe = tmp_path / "from-tiny.yaml"
    recipe.write_text(f"model: {{init_from: {source}}}\n", encoding="utf-8")
    # `bertforge finetune` in this process: what is tested is the model it writes, not the process
    code = main(["finetune", str(recipe),
                 *supersense_files(tmp_path / "data", train=64, validation=16, test=16),
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "train.max_steps=3",
                 "train.micro_batch_size=16", "train.global_batch_size=16", "finetune.max_length=40",
                 "data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false"])
    assert code == 0, capsys.readouterr().err[-3000:]
    _, prefix, _ = FAMILIES[family]
    final = run_dir / "final"
    stock = transformers.AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    assert type(stock).__name__ == f"{prefix}ForSequenceClassification"
    # our input layout is the tokenizer's own, and the stock class scores it as our model does
    stock_tokenizer = transformers.AutoTokenizer.from_pretrained(str(final))
    sentence = texts[3]
    expected_ids = stock_tokenizer(sentence)["input_ids"]
    assert bert_tokenizer(final, 40).encode(sentence).ids == expected_ids[:40]
    pair = bert_tokenizer(final, 200).encode(texts[4], texts[5])  # `<s> a </s></s> b </s>` for RoBERTa's kind
    assert pair.ids == stock_tokenizer(texts[4], texts[5])["input_ids"]
    assert set(pair.type_ids) == ({0, 1} if family == "distilbert" else {0})
    ours = load_model(str(final)).model
    ids = torch.tensor([expected_ids[:40]])
    with torch.no_grad():
        assert max_diff(ours(ids).logits, stock(input_ids=ids).logits) <= TOLERANCE


def test_fill_mask_reads_roberta_mask_token_and_agrees_with_the_pipeline(tmp_path: Path) -> None:
    from bertforge.data.bundled import supersense_lines
    from bertforge.inference import fill_mask, load_model
    from bertforge.model_card import mask_token

    tokenizer = family_tokenizer("roberta", [json.loads(line)["text"] for line in supersense_lines("train", 400)])
    source = tmp_path / "tiny-roberta-mlm"
    tiny_hf_model("roberta", "ForMaskedLM", vocab_size=len(tokenizer)).save_pretrained(str(source))
    tokenizer.save_pretrained(str(source))
    assert mask_token(source) == "<mask>"
    text = "a person who<mask> the law"
    ours = fill_mask(load_model(str(source)), text, top_k=3)[0]
    theirs = transformers.pipeline("fill-mask", model=str(source), top_k=3)(text)
    assert [p.token for p in ours] == [p["token"] for p in theirs]
    assert [p.score for p in ours] == pytest.approx([p["score"] for p in theirs], abs=1e-5)


# ---------------------------------------------------------------------------------------------
# multiple choice: RoBERTa's kind reads the encoder's tanh pooler (as BERT's), DistilBERT's its pre_classifier + ReLU

CHOICES = 3


@pytest.mark.parametrize("family", list(FAMILIES))
def test_multiple_choice_imports_and_exports_with_the_stock_class_scores(tmp_path: Path, family: str) -> None:
    import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)

    prefix = FAMILIES[family][1]
    hf_model = tiny_hf_model(family, "ForMultipleChoice")
    ours = from_hf(hf_model).eval()
    assert type(ours).__name__ == "BertforgeForMultipleChoice"
    lengths = [9, 4, 13, 6, 11, 2]  # two questions of CHOICES candidates
    ids, mask = (tensor.view(2, CHOICES, -1) for tensor in padded_batch(hf_model.config.pad_token_id, lengths))
    assert_choice_scores_and_export_match_the_stock_class(ours, hf_model, ids, mask, f"{prefix}ForMultipleChoice",
                                                          tmp_path / "export")


def assert_choice_scores_and_export_match_the_stock_class(ours: torch.nn.Module, hf_model: torch.nn.Module,
                                                          ids: torch.Tensor, mask: torch.Tensor, hf_class: str,
                                                          export_dir: Path) -> None:
    """Our multiple-choice scores on the packed candidates ([questions, choices, length] padded `ids`) equal the
    stock model's; the export is `hf_class`, loads with no key missing or left over and scores the same."""
    packed = unpad_inputs(ids.flatten(0, 1), mask.flatten(0, 1))
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits
        got = ours(input_ids=packed.input_ids, cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen,
                   choice_counts=torch.full((ids.shape[0],), ids.shape[1])).logits
    assert max_diff(got, expected) <= TOLERANCE
    result = export_hf(ours, None, export_dir)
    assert (result.format, result.architecture) == ("transformers", hf_class)
    reloaded, loading = transformers.AutoModelForMultipleChoice.from_pretrained(
        str(result.directory), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    with torch.no_grad():
        assert max_diff(reloaded.eval()(input_ids=ids, attention_mask=mask).logits, expected) <= TOLERANCE


# ---------------------------------------------------------------------------------------------
# the exports in transformers' pipelines and in sentence-transformers

PIPELINES = {"Model": "feature-extraction", "ForMaskedLM": "fill-mask", "ForSequenceClassification": "text-classification",
             "ForTokenClassification": "token-classification"}
TAGS = ["O", "B-X", "I-X"]


@pytest.fixture(scope="module")
def saved_tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's tiny tokenizer (`family_tokenizer`), trained once and saved."""
    from bertforge.data.bundled import supersense_lines

    texts = [json.loads(line)["text"] for line in supersense_lines("train", 400)]
    saved = {}
    for family in FAMILIES:
        saved[family] = tmp_path_factory.mktemp(f"tokenizer-{family}")
        family_tokenizer(family, texts).save_pretrained(str(saved[family]))
    return saved


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_the_export_runs_in_pipeline_as_our_model_scores(tmp_path: Path, family: str, head: str,
                                                         saved_tokenizers: dict[str, Path]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(saved_tokenizers[family]))
    ours = from_hf(tiny_hf_model(family, head, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                 id2label=dict(enumerate(TAGS)), label2id={tag: i for i, tag in enumerate(TAGS)}))
    result = export_hf(ours.eval(), saved_tokenizers[family], tmp_path / "export")
    run = transformers.pipeline(PIPELINES[head], model=str(result.directory))
    text = f"a person who {tokenizer.mask_token} the law" if head == "ForMaskedLM" else "a person who knows the laws"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        output = ours(ids)
    if head == "Model":
        assert max_diff(torch.tensor(run(text)[0]), output) <= TOLERANCE
    elif head == "ForMaskedLM":
        best = output.mlm_logits[ids[0].tolist().index(tokenizer.mask_token_id)].softmax(-1).topk(3)
        predictions = run(text, top_k=3)
        assert [p["token"] for p in predictions] == best.indices.tolist()
        assert [p["score"] for p in predictions] == pytest.approx(best.values.tolist(), abs=1e-5)
    elif head == "ForSequenceClassification":
        scores = {row["label"]: row["score"] for row in run(text, top_k=None)}
        assert [scores[tag] for tag in TAGS] == pytest.approx(output.logits[0].softmax(-1).tolist(), abs=1e-5)
    else:
        words = run(text, aggregation_strategy="none", ignore_labels=[])
        tags = output.logits.argmax(-1)[1:-1]  # without <s> / [CLS] and the separator
        assert [row["entity"] for row in words] == [TAGS[int(tag)] for tag in tags]
        assert [row["score"] for row in words] == pytest.approx(
            output.logits.softmax(-1).max(-1).values[1:-1].tolist(), abs=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_embedding_model_exports_to_sentence_transformers_with_our_vectors(tmp_path: Path, family: str,
                                                                            saved_tokenizers: dict[str, Path]) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(saved_tokenizers[family]))
    hf_model = tiny_hf_model(family, "Model", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    assert_sentence_transformers_gives_our_vectors(hf_model, saved_tokenizers[family], tmp_path)


def assert_sentence_transformers_gives_our_vectors(hf_model: transformers.PreTrainedModel, tokenizer_dir: Path,
                                                   tmp_path: Path) -> None:
    """The bare `hf_model`, saved and started as an embedding model (the token mean), exported as a
    sentence-transformers directory: the real library loads it as the family's class and embeds as we do."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bertforge.embed import embed_texts, load_embedder
    from bertforge.engine import EngineSettings
    from bertforge.models.loading import load_for_task
    from bertforge.models.sentence_transformers_format import export_sentence_transformers

    hf_model.save_pretrained(str(tmp_path / "source"))
    embedder = load_for_task(tmp_path / "source", "embedding").eval()
    result = export_sentence_transformers(embedder, tokenizer_dir, tmp_path / "st", max_seq_length=24)
    assert (result.format, result.architecture) == ("sentence-transformers", type(hf_model).__name__)
    texts = ["a person who knows the laws", "the law", "an act of the people who make laws and keep them"]
    theirs = sentence_transformers.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(texts)
    ours = embed_texts(load_embedder(tmp_path / "st"), texts, EngineSettings(batch_size=2))
    assert abs(ours - theirs).max() <= TOLERANCE
