"""DeBERTa-v2/v3 (`model_type: deberta-v2`), every head, against real `transformers` (fp32, CPU).

Tiny random models built by `transformers` itself (hidden 32, 2 layers, weights drawn large so a wrong
bucket or a missing term shows far above float noise), in three shapes of the disentangled attention:
DeBERTa-v3's (256 log buckets, shared keys, normed relative table, no absolute positions), one whose
8 buckets put most distances of the batch in the log-spaced range (own position projections, absolute
positions as well, token types), and one without buckets with the c2p term alone. The batch's sequences
share rows in our packed layout, so a distance taken from the row instead of the sequence would show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from helpers.hf_step_parity import losses_step_for_step
from test_model_families import (
    assert_sentence_transformers_gives_our_vectors,
    family_tokenizer,
    hf_outputs,
    max_diff,
    our_outputs,
    padded_batch,
    sharpen,
)

from bertforge.errors import BertforgeError
from bertforge.models.config import DisentangledAttention
from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import export_hf, from_hf, hf_class_name

TOLERANCE = 1e-5
VOCAB = 96
HEADS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification"]
SHAPES = {
    "v3": dict(position_buckets=256, max_relative_positions=-1, share_att_key=True, norm_rel_ebd="layer_norm",
               position_biased_input=False, pos_att_type=["p2c", "c2p"], type_vocab_size=0),
    "log-buckets": dict(position_buckets=8, max_relative_positions=20, share_att_key=False, norm_rel_ebd="layer_norm",
                        position_biased_input=True, pos_att_type=["c2p", "p2c"], type_vocab_size=2),
    "no-buckets-c2p": dict(position_buckets=-1, max_relative_positions=-1, share_att_key=False, norm_rel_ebd="none",
                           position_biased_input=False, pos_att_type=["c2p"], type_vocab_size=0),
}


def tiny_deberta(head: str, shape: str = "v3", **overrides: object) -> transformers.PreTrainedModel:
    values: dict[str, object] = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, num_labels=3, relative_attention=True, legacy=False,
                                     max_position_embeddings=64, pad_token_id=0, layer_norm_eps=1e-7)
    values.update(SHAPES[shape])
    values.update(overrides)
    model = getattr(transformers, "DebertaV2" + head)(transformers.DebertaV2Config(**values))
    sharpen(model)
    return model.eval()


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("head", HEADS)
def test_packed_batch_gives_the_stock_class_padded_logits(head: str, shape: str) -> None:
    hf_model = tiny_deberta(head, shape)
    ours = from_hf(hf_model).eval()
    assert ours.config.disentangled_attention is not None
    ids, mask = padded_batch(0)
    expected = hf_outputs(hf_model, head, ids, mask)
    got = our_outputs(ours, head, ids, mask)
    assert got.shape == expected.shape
    assert max_diff(got, expected) <= TOLERANCE


def test_the_v3_shape_imports_as_relative_positions_only() -> None:
    ours = from_hf(tiny_deberta("Model"))
    assert ours.config.position == "relative" and ours.embeddings.position_embeddings is None
    assert ours.config.disentangled_attention == DisentangledAttention(
        terms=("p2c", "c2p"), position_buckets=256, max_relative_positions=64, share_att_key=True,
        norm_relative_embeddings=True)


@pytest.mark.parametrize("head", HEADS)
def test_export_loads_in_the_stock_class_with_equal_logits(tmp_path: Path, head: str) -> None:
    for shape in ("v3", "log-buckets"):
        hf_model = tiny_deberta(head, shape)
        ours = from_hf(hf_model).eval()
        assert hf_class_name(ours) == ("DebertaV2" + head, "")
        result = export_hf(ours, None, tmp_path / shape)
        assert (result.format, result.architecture) == ("transformers", "DebertaV2" + head)
        reloaded, loading = getattr(transformers, "DebertaV2" + head).from_pretrained(
            str(result.directory), output_loading_info=True)
        assert not loading["missing_keys"] and not loading["unexpected_keys"]
        assert reloaded.config.model_type == "deberta-v2"
        ids, mask = padded_batch(0)
        assert max_diff(hf_outputs(reloaded.eval(), head, ids, mask), hf_outputs(hf_model, head, ids, mask)) <= TOLERANCE


# ---------------------------------------------------------------------------------------------
# training: 6 AdamW steps with clipping, dropout off, the same losses as transformers step for step

@pytest.mark.parametrize("head", [*HEADS, "ForMultipleChoice"])
def test_six_adamw_steps_give_the_stock_class_losses_step_for_step(head: str) -> None:
    import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)

    hf_model = tiny_deberta(head, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = from_hf(hf_model)
    batch_lengths = [[17, 5, 30, 11], [9, 22], [30, 30, 3], [12, 7, 19, 25, 4], [28], [6, 14, 21]]
    if head == "ForMultipleChoice":  # questions of two candidates: an even number of rows
        batch_lengths = [[17, 5, 30, 11], [9, 22], [30, 30, 3, 8], [12, 7, 19, 25], [28, 6], [6, 14, 21, 10]]
    batches = [padded_batch(0, lengths, seed=step) for step, lengths in enumerate(batch_lengths)]
    our_losses, their_losses = losses_step_for_step(hf_model, ours, head, batches)
    assert len(our_losses) == 6 and their_losses[-1] != their_losses[0]
    for step, (mine, theirs) in enumerate(zip(our_losses, their_losses, strict=True)):
        assert abs(mine - theirs) <= 1e-5 * max(1.0, abs(theirs)), (step, our_losses, their_losses)


# ---------------------------------------------------------------------------------------------
# pipeline: the export with a tokenizer runs in transformers' pipeline and agrees with our model

@pytest.fixture(scope="module")
def tokenizer_source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A tiny WordPiece tokenizer with DeBERTa-v3's special tokens ([CLS] [SEP] [MASK] [PAD]), saved."""
    from bertforge.data.bundled import supersense_lines

    texts = [json.loads(line)["text"] for line in supersense_lines("train", 400)]
    directory = tmp_path_factory.mktemp("deberta-tokenizer")
    family_tokenizer("distilbert", texts).save_pretrained(str(directory))
    return directory, texts


@pytest.mark.parametrize("head", HEADS)
def test_the_export_runs_in_pipeline_as_our_model_does(tmp_path: Path, head: str,
                                                       tokenizer_source: tuple[Path, list[str]]) -> None:
    from bertforge.inference import fill_mask, load_model

    tokenizer_dir, texts = tokenizer_source
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ours = from_hf(tiny_deberta(head, vocab_size=len(tokenizer))).eval()
    exported = export_hf(ours, tokenizer_dir, tmp_path / "export").directory
    text = texts[7]
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    if head == "ForMaskedLM":
        masked = "a person who [MASK] the law"
        theirs = transformers.pipeline("fill-mask", model=str(exported), top_k=3)(masked)
        mine = fill_mask(load_model(str(exported)), masked, top_k=3)[0]
        assert [p.token for p in mine] == [p["token"] for p in theirs]
        assert [p.score for p in mine] == pytest.approx([p["score"] for p in theirs], abs=1e-5)
        return
    with torch.no_grad():
        output = ours(ids)
    if head == "Model":
        features = torch.tensor(transformers.pipeline("feature-extraction", model=str(exported))(text)[0])
        assert max_diff(features, output) <= TOLERANCE
    elif head == "ForSequenceClassification":
        theirs = transformers.pipeline("text-classification", model=str(exported))(text)[0]
        probabilities = output.logits.softmax(-1)[0]
        assert theirs["label"] == f"LABEL_{int(probabilities.argmax())}"
        assert theirs["score"] == pytest.approx(probabilities.max().item(), abs=1e-5)
    else:
        theirs = transformers.pipeline("token-classification", model=str(exported))(text)
        probabilities = output.logits.softmax(-1)[1:-1]  # the pipeline leaves out [CLS] and [SEP]
        assert [entity["score"] for entity in theirs] == pytest.approx(
            probabilities.max(-1).values.tolist(), abs=1e-5)


def test_an_embedding_model_exports_to_sentence_transformers_with_our_vectors(
        tmp_path: Path, tokenizer_source: tuple[Path, list[str]]) -> None:
    tokenizer_dir, _ = tokenizer_source
    vocab_size = len(transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    assert_sentence_transformers_gives_our_vectors(tiny_deberta("Model", vocab_size=vocab_size), tokenizer_dir, tmp_path)


# ---------------------------------------------------------------------------------------------
# what cannot be run exactly is refused in one line

@pytest.mark.parametrize(("overrides", "message"), [
    ({"conv_kernel_size": 3}, "`conv_kernel_size` = 3: the first layer's ConvLayer"),
    ({"relative_attention": False}, "`relative_attention` = False"),
    ({"pooler_hidden_size": 16}, "`pooler_hidden_size` = 16: transformers' ContextPooler runs only at hidden_size"),
])
def test_what_bertforge_cannot_run_exactly_is_refused_in_one_line(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(BertforgeError, match=message) as error:
        from_hf(tiny_deberta("Model", **overrides))
    assert "\n" not in str(error.value)


def test_an_encoder_with_mpnets_relative_bias_is_not_exported_as_deberta() -> None:
    """The families' common check: DeBERTa-v2 has no place for MPNet's bias, which an export would drop."""
    from bertforge.models.config import EncoderConfig
    from bertforge.models.families import family_for_config

    config = EncoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           max_position_embeddings=64, position="relative", pooling="gelu_pooler",
                           disentangled_attention=DisentangledAttention(terms=("c2p", "p2c"), position_buckets=8,
                                                                        max_relative_positions=16),
                           relative_attention_buckets=32)
    family, reason = family_for_config(config)
    assert family is None
    assert reason.startswith("HF DeBERTa-v2 has no relative position bias (MPNet's); ")


# ---------------------------------------------------------------------------------------------
# the deberta-v3 presets: pre-trained from scratch (MLM only, no token types), exported to the stock class

def test_deberta_v3_small_preset_has_the_checkpoint_shape() -> None:
    from bertforge.models.config import get_preset

    config = get_preset("deberta-v3-small")
    assert (config.hidden_size, config.num_layers, config.num_heads, config.type_vocab_size) == (768, 6, 12, 0)
    assert config.position == "relative" and config.disentangled_attention == DisentangledAttention()


def test_tiny_deberta_v3_pretrains_from_scratch_and_exports_to_the_stock_masked_lm(
        corpus_slice: Path, tokenizer_dir: Path, tmp_path: Path) -> None:
    from helpers.tiny_pretraining import train

    from bertforge.data.prepare import PrepareSettings, prepare_pretraining_data
    from bertforge.inference import load_model

    prepared = tmp_path / "mlm-only"
    prepare_pretraining_data([str(corpus_slice)], tokenizer_dir, prepared, PrepareSettings(nsp=False, split=(9, 1)),
                             workers=0, progress=False)
    run_dir = train(prepared, tmp_path / "runs" / "deberta", "model.preset=deberta-v3-tiny", "train.max_steps=4")
    final = run_dir / "final"
    stock = transformers.AutoModelForMaskedLM.from_pretrained(str(final)).eval()
    assert type(stock).__name__ == "DebertaV2ForMaskedLM" and stock.config.type_vocab_size == 0
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(final))
    encoded = tokenizer(["in the beginning god created the heaven and the earth"], return_tensors="pt")
    ours = load_model(str(run_dir)).model
    with torch.no_grad():
        expected = stock(input_ids=encoded["input_ids"]).logits[0]
        got = ours(encoded["input_ids"][0], masked_positions=torch.arange(encoded["input_ids"].shape[1])).mlm_logits
    assert max_diff(got, expected) <= TOLERANCE


def test_doctor_says_deberta_layers_take_the_explicit_disentangled_path() -> None:
    from bertforge.doctor import attention_report, resolve_precision
    from bertforge.models.attention_backends import available_kernels
    from bertforge.models.config import get_preset

    device = torch.device("cpu")
    report = attention_report(get_preset("deberta-v3-tiny"), device, resolve_precision("fp32", device, tf32=True),
                              available_kernels(device))
    assert [choice["backend"] for choice in report["auto"]] == ["disentangled"]
    assert "no varlen/flash kernel" in report["auto"][0]["reason"]


def test_multiple_choice_imports_and_exports_with_the_stock_class_logits(tmp_path: Path) -> None:
    from bertforge.tasks.multiple_choice import BertforgeForMultipleChoice

    hf_model = tiny_deberta("ForMultipleChoice")
    ours = from_hf(hf_model).eval()
    assert type(ours) is BertforgeForMultipleChoice
    ids, mask = padded_batch(0, [17, 5, 30, 11, 8, 23])  # 2 questions x 3 choices
    padded = {"input_ids": ids.view(2, 3, -1), "attention_mask": mask.view(2, 3, -1)}
    packed = unpad_inputs(ids, mask)
    with torch.no_grad():
        theirs = hf_model(**padded).logits
        mine = ours(packed.input_ids, cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen,
                    choice_counts=torch.tensor([3, 3])).logits
    assert max_diff(mine, theirs) <= TOLERANCE
    result = export_hf(ours, None, tmp_path / "export")
    assert result.architecture == "DebertaV2ForMultipleChoice"
    reloaded = transformers.AutoModelForMultipleChoice.from_pretrained(str(result.directory)).eval()
    with torch.no_grad():
        assert max_diff(reloaded(**padded).logits, theirs) <= TOLERANCE


def test_a_legacy_masked_lm_head_imports_as_transformers_loads_it_and_exports_in_todays_layout(tmp_path: Path) -> None:
    """`legacy: true` is DebertaV2Config's default: transformers builds BERT's `cls.predictions` head then, and a
    model saved so must fill masks with that head, not with a fresh one."""
    from bertforge.models.hf import load_hf_checkpoint

    hf_model = tiny_deberta("ForMaskedLM", legacy=True)
    assert hasattr(hf_model, "cls") and not hasattr(hf_model, "lm_predictions")
    ids, mask = padded_batch(0)
    expected = hf_outputs(hf_model, "ForMaskedLM", ids, mask)
    assert max_diff(our_outputs(from_hf(hf_model).eval(), "ForMaskedLM", ids, mask), expected) <= TOLERANCE
    hf_model.save_pretrained(str(tmp_path / "legacy"))
    ours = load_hf_checkpoint(tmp_path / "legacy").eval()  # the directory path `load_model` and `init_from` take
    assert max_diff(our_outputs(ours, "ForMaskedLM", ids, mask), expected) <= TOLERANCE
    exported = export_hf(ours, None, tmp_path / "export").directory
    assert json.loads((exported / "config.json").read_text())["legacy"] is False
    reloaded, loading = transformers.DebertaV2ForMaskedLM.from_pretrained(str(exported), output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"]
    assert max_diff(hf_outputs(reloaded.eval(), "ForMaskedLM", ids, mask), expected) <= TOLERANCE


def test_a_legacy_config_over_todays_head_keys_draws_a_new_head_as_transformers_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """microsoft's deberta-v3 checkpoints: no `legacy` key in config.json (so `legacy: true`, transformers' default)
    over weights named `lm_predictions.lm_head.*`. transformers builds the legacy `cls.predictions` head, leaves
    those weights unused and draws the head fresh: so must we, saying which weights were not used."""
    from bertforge.models import hf
    from bertforge.models.hf import load_hf_checkpoint

    source = tmp_path / "v3-style"
    tiny_deberta("ForMaskedLM", legacy=False).save_pretrained(str(source))
    config = json.loads((source / "config.json").read_text())
    del config["legacy"]
    (source / "config.json").write_text(json.dumps(config))
    torch.manual_seed(7)
    stock, loading = transformers.DebertaV2ForMaskedLM.from_pretrained(str(source), output_loading_info=True)
    unused = sorted(loading["unexpected_keys"])
    assert unused and all(key.startswith("lm_predictions.lm_head.") for key in unused)  # what transformers did
    warnings: list[str] = []
    monkeypatch.setattr(hf.log, "warning", lambda message, *args: warnings.append(message % args))
    torch.manual_seed(7)
    ours = load_hf_checkpoint(source).eval()
    ids, mask = padded_batch(0)
    assert max_diff(our_outputs(ours, "ForMaskedLM", ids, mask), hf_outputs(stock.eval(), "ForMaskedLM", ids, mask)) \
        <= TOLERANCE
    assert len(warnings) == 1 and "\n" not in warnings[0] and "legacy" in warnings[0]
    assert all(key in warnings[0] for key in unused)
