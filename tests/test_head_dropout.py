"""Every family's classifier heads drop out where, and at the rate, its stock `transformers` class does.

In train mode the heads' dropout masks are random draws, so the only way two heads give the same
logits is to draw the same masks: the same number of dropouts, in the same order, on tensors of the
same shapes, at the same rates. Each test builds a tiny random model of the family with
`transformers`, imports it, and runs both in train mode with the encoders in eval mode (so the
head's dropouts are the only draws), under the same torch seed. HF's `nn.Dropout` is pointed at
bertforge's CPU dropout (`models/dropout.py`: the distribution of `F.dropout` from a cheaper mask),
so the same draws give the same masks. Rates are chosen apart (hidden 0.1, classifier 0.3, a head's own
0.2 and 0.25) so a head that takes the wrong one fails too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

import bertforge.tasks.kinds  # noqa: F401  (registers the multiple-choice model class with the importer)
from bertforge.models.dropout import dropout
from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import from_hf, to_hf_model
from bertforge.models.serialization import CONFIG_NAME, load_bertforge_model, save_bertforge_model

TOLERANCE = 1e-5
VOCAB = 96
HIDDEN_RATE, CLASSIFIER_RATE = 0.1, 0.3
FIRST_RATE, LAST_RATE = 0.2, 0.25  # a head's own rates, where its family names them apart from the two above
SHARED = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
              num_labels=3, max_position_embeddings=64, attention_probs_dropout_prob=0.0)

# family -> (config class, class-name prefix, its settings: the two dropout rates under the family's own names)
FAMILIES: dict[str, tuple[type, str, dict[str, object]]] = {
    "bert": (transformers.BertConfig, "Bert", {"hidden_dropout_prob": HIDDEN_RATE,
                                               "classifier_dropout": CLASSIFIER_RATE}),
    "roberta": (transformers.RobertaConfig, "Roberta", {"hidden_dropout_prob": HIDDEN_RATE, "pad_token_id": 1,
                                                        "classifier_dropout": CLASSIFIER_RATE, "type_vocab_size": 1}),
    "xlm-roberta": (transformers.XLMRobertaConfig, "XLMRoberta",
                    {"hidden_dropout_prob": HIDDEN_RATE, "pad_token_id": 1, "classifier_dropout": CLASSIFIER_RATE,
                     "type_vocab_size": 1}),
    "camembert": (transformers.CamembertConfig, "Camembert",
                  {"hidden_dropout_prob": HIDDEN_RATE, "pad_token_id": 1, "classifier_dropout": CLASSIFIER_RATE}),
    "distilbert": (transformers.DistilBertConfig, "DistilBert",
                   {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48, "dropout": HIDDEN_RATE,
                    "attention_dropout": 0.0, "seq_classif_dropout": CLASSIFIER_RATE}),
    # ElectraForMultipleChoice's SequenceSummary drops out before and after its dense layer at rates of its own
    "electra": (transformers.ElectraConfig, "Electra",
                {"hidden_dropout_prob": HIDDEN_RATE, "classifier_dropout": CLASSIFIER_RATE,
                 "summary_first_dropout": FIRST_RATE, "summary_last_dropout": LAST_RATE, "embedding_size": 24}),
    # MPNetConfig has no classifier_dropout: every MPNet head drops out at hidden_dropout_prob
    "mpnet": (transformers.MPNetConfig, "MPNet", {"hidden_dropout_prob": HIDDEN_RATE, "pad_token_id": 1,
                                                  "attn_implementation": "eager"}),
    # the ContextPooler (both pooled heads) drops out the first token at pooler_dropout before its dense layer
    "deberta-v2": (transformers.DebertaV2Config, "DebertaV2",
                   {"hidden_dropout_prob": HIDDEN_RATE, "cls_dropout": CLASSIFIER_RATE, "pooler_dropout": FIRST_RATE,
                    "relative_attention": True,
                    "legacy": False, "position_buckets": 256, "max_relative_positions": -1, "share_att_key": True,
                    "norm_rel_ebd": "layer_norm", "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
                    "type_vocab_size": 0, "pad_token_id": 0, "layer_norm_eps": 1e-7}),
    "modernbert": (transformers.ModernBertConfig, "ModernBert",
                   {"classifier_dropout": CLASSIFIER_RATE, "mlp_dropout": HIDDEN_RATE, "pad_token_id": 0,
                    "attention_dropout": 0.0, "embedding_dropout": 0.0}),
}
# every head class bertforge imports with a dropout in its head
CASES = [(family, head) for family, head in [
    *((f, h) for f in FAMILIES for h in ("ForSequenceClassification", "ForTokenClassification")
      if f != "modernbert"),
    ("modernbert", "ForSequenceClassification"),
    *((f, "ForMultipleChoice") for f in FAMILIES),
]]
CASE_IDS = [f"{family}-{head}" for family, head in CASES]
LENGTHS = [12, 12, 12, 12, 12, 12]  # equal: a token head's padded [batch, length] mask is our packed one
CHOICES = 3


@pytest.fixture(autouse=True)
def hf_dropout_draws_as_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """HF's nn.Dropout with bertforge's CPU mask: the same generator calls for the same shape and rate."""
    monkeypatch.setattr(torch.nn.Dropout, "forward", lambda self, x: dropout(x, self.p, self.training))


def tiny_hf_model(family: str, head: str, **overrides: object) -> transformers.PreTrainedModel:
    config_class, prefix, settings = FAMILIES[family]
    values = SHARED | settings | overrides
    if family == "distilbert":  # its own names for the shared sizes
        values = {k: v for k, v in values.items()
                  if k not in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                               "attention_probs_dropout_prob")}
    torch.manual_seed(0)
    return getattr(transformers, prefix + head)(config_class(**values)).eval()


def head_only_in_train_mode(model: torch.nn.Module, encoder: torch.nn.Module) -> None:
    model.train()
    encoder.eval()  # the encoder's dropouts draw nothing: the head's are the only draws


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(7, VOCAB, (len(LENGTHS), max(LENGTHS)), generator=generator)
    return ids, torch.ones_like(ids)


def train_mode_logits(family: str, head: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(HF's logits, ours, ours in eval mode) on one batch, both heads in train mode from `seed`."""
    hf_model = tiny_hf_model(family, head)
    theirs = hf_train_mode_logits(hf_model, head, seed)
    return theirs, *our_train_mode_logits(from_hf(hf_model), head, seed)


def our_train_mode_logits(ours: torch.nn.Module, head: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(our logits on `batch()` with the head in train mode from `seed`, the same in eval mode)."""
    head_only_in_train_mode(ours, ours.encoder)
    ids, mask = batch()
    packed = unpad_inputs(ids, mask)
    our_inputs = {"input_ids": packed.input_ids, "cu_seqlens": packed.cu_seqlens, "max_seqlen": packed.max_seqlen}
    if head == "ForMultipleChoice":
        our_inputs["choice_counts"] = torch.full((len(LENGTHS) // CHOICES,), CHOICES)
    with torch.no_grad():
        torch.manual_seed(seed)
        got = ours(**our_inputs).logits
        ours.eval()
        without_dropout = ours(**our_inputs).logits
    return got, without_dropout


def hf_train_mode_logits(hf_model: transformers.PreTrainedModel, head: str, seed: int) -> torch.Tensor:
    """A stock model's logits on `batch()`, its head in train mode from `seed` (token logits flattened, as ours)."""
    head_only_in_train_mode(hf_model, hf_model.base_model)
    ids, mask = batch()
    if head == "ForMultipleChoice":
        ids, mask = ids.view(-1, CHOICES, ids.shape[1]), mask.view(-1, CHOICES, ids.shape[1])
    with torch.no_grad():
        torch.manual_seed(seed)
        logits = hf_model(input_ids=ids, attention_mask=mask).logits
    return logits.flatten(0, 1) if head == "ForTokenClassification" else logits


@pytest.mark.parametrize(("family", "head"), CASES, ids=CASE_IDS)
def test_head_draws_the_stock_class_dropout_masks_in_train_mode(family: str, head: str) -> None:
    theirs, ours, without_dropout = train_mode_logits(family, head, seed=3)
    assert ours.shape == theirs.shape
    assert (ours - without_dropout).abs().max() > 1e-3  # the head's dropout did drop something
    assert (ours - theirs).abs().max() <= TOLERANCE


# the heads whose family names their own dropout rates (ELECTRA's multiple-choice SequenceSummary, DeBERTa's
# ContextPooler): set apart from the defaults in FAMILIES, so a head that ignores them fails the test above
OWN_RATE_CASES = [("electra", "ForMultipleChoice"), ("deberta-v2", "ForSequenceClassification"),
                  ("deberta-v2", "ForMultipleChoice")]


@pytest.mark.parametrize(("family", "head"), OWN_RATE_CASES, ids=[f"{f}-{h}" for f, h in OWN_RATE_CASES])
def test_an_export_keeps_the_heads_own_dropout_rates(family: str, head: str) -> None:
    """The stock class our export builds draws the imported checkpoint's masks: its config.json keeps the rates."""
    hf_model = tiny_hf_model(family, head)
    exported = to_hf_model(from_hf(hf_model))
    names = ("summary_first_dropout", "summary_last_dropout") if family == "electra" else ("pooler_dropout",)
    assert {name: getattr(exported.config, name) for name in names} == {
        name: getattr(hf_model.config, name) for name in names}
    assert (hf_train_mode_logits(exported, head, seed=3) - hf_train_mode_logits(hf_model, head, seed=3)
            ).abs().max() <= TOLERANCE


def test_a_runs_classifier_dropout_is_the_multiple_choice_scorers_rate_too(tmp_path: Path) -> None:
    """model.classifier_dropout set by a fine-tuning run wins over ELECTRA's summary_last_dropout (the export writes
    it back as that), as it wins over the classifier rate of every family whose scorer reads one."""
    from bertforge.models.loading import load_for_task

    tiny_hf_model("electra", "ForMultipleChoice").save_pretrained(tmp_path)
    assert load_for_task(tmp_path, "multiple_choice").head.dropout.p == LAST_RATE
    assert load_for_task(tmp_path, "multiple_choice",
                         config_overrides={"classifier_dropout": 0.05}).head.dropout.p == 0.05


# the families whose *ForMultipleChoice drops out at hidden_dropout_prob whatever classifier_dropout says
HIDDEN_RATE_CHOICE_FAMILIES = ("roberta", "xlm-roberta", "camembert", "mpnet")


@pytest.mark.parametrize("family", HIDDEN_RATE_CHOICE_FAMILIES)
def test_a_runs_hidden_dropout_moves_the_multiple_choice_rate_where_the_stock_class_reads_it(
        family: str, tmp_path: Path) -> None:
    """A fine-tuning run's model.hidden_dropout is the scorer's rate, its model.classifier_dropout is not (as the
    stock class reads config.json), and the export draws the masks the run trained with."""
    from bertforge.models.loading import load_for_task

    tiny_hf_model(family, "ForMultipleChoice").save_pretrained(tmp_path)
    run_rate = 0.2  # apart from the checkpoint's HIDDEN_RATE and the run's classifier rate
    # MPNet has no classifier rate to set (test_mpnet_refuses_a_classifier_dropout_its_export_could_not_keep)
    classifier = {} if family == "mpnet" else {"classifier_dropout": 0.05}
    ours = load_for_task(tmp_path, "multiple_choice", config_overrides={"hidden_dropout": run_rate, **classifier})
    assert ours.head.dropout.p == run_rate
    exported = to_hf_model(ours)
    assert exported.config.hidden_dropout_prob == run_rate
    got, without_dropout = our_train_mode_logits(ours, "ForMultipleChoice", seed=3)
    assert (got - without_dropout).abs().max() > 1e-3
    assert (got - hf_train_mode_logits(exported, "ForMultipleChoice", seed=3)).abs().max() <= TOLERANCE


@pytest.mark.parametrize("head", ["ForSequenceClassification", "ForTokenClassification", "ForMultipleChoice"])
def test_mpnet_refuses_a_classifier_dropout_its_export_could_not_keep(head: str, tmp_path: Path) -> None:
    """MPNetConfig has no classifier rate (every MPNet head drops out at hidden_dropout_prob): a run's
    model.classifier_dropout would train a rate the exported model forgets, so it is refused, naming the key to use."""
    from bertforge.errors import ConfigError
    from bertforge.models.loading import load_for_task

    tiny_hf_model("mpnet", head).save_pretrained(tmp_path)
    kind = {"ForSequenceClassification": "classification", "ForTokenClassification": "token_classification",
            "ForMultipleChoice": "multiple_choice"}[head]
    options = {"num_labels": 3} if kind != "multiple_choice" else {}
    with pytest.raises(ConfigError, match="model.classifier_dropout cannot be set .* set model.hidden_dropout instead"):
        load_for_task(tmp_path, kind, config_overrides={"classifier_dropout": 0.05}, **options)
    kept = load_for_task(tmp_path, kind, config_overrides={"hidden_dropout": 0.2}, **options)
    assert to_hf_model(kept).config.hidden_dropout_prob == 0.2


def test_the_families_that_drop_out_the_first_token_twice_say_so_in_their_config() -> None:
    """RoBERTa's, ELECTRA's and MPNet's classification heads: dropout, dense, activation, dropout, out_proj."""
    twice = {name for name in FAMILIES
             if from_hf(tiny_hf_model(name, "ForSequenceClassification")).config.classifier_input_dropout}
    assert twice == {"roberta", "xlm-roberta", "camembert", "electra", "mpnet"}


# the head-dropout fields of EncoderConfig, which a bertforge_model.json written before them lacks
HEAD_DROPOUT_FIELDS = ("classifier_input_dropout", "token_classifier_dropout", "pooler_dropout",
                       "choice_input_dropout", "choice_dropout", "choice_classifier_dropout")


def saved_the_old_way(model: torch.nn.Module, directory: Path) -> torch.nn.Module:
    """`model` saved, its description rewritten as bertforge wrote it before the fields existed, and loaded."""
    save_bertforge_model(model, directory)
    description = json.loads((directory / CONFIG_NAME).read_text())
    for name in HEAD_DROPOUT_FIELDS:
        del description["encoder_config"][name]
    (directory / CONFIG_NAME).write_text(json.dumps(description))
    return load_bertforge_model(directory)


def test_a_model_saved_before_the_head_dropout_fields_drops_out_as_it_was_trained(tmp_path: Path) -> None:
    """Then every head was BERT's: one dropout, after the pooler, at the classifier's rate (token heads too), so
    an old RoBERTa classifier keeps that, not the second dropout a RoBERTa imported today draws as HF does."""
    imported = from_hf(tiny_hf_model("roberta", "ForSequenceClassification"))
    old = saved_the_old_way(imported, tmp_path / "roberta")
    packed = unpad_inputs(*batch())
    inputs = {"input_ids": packed.input_ids, "cu_seqlens": packed.cu_seqlens, "max_seqlen": packed.max_seqlen}
    with torch.no_grad():
        first_tokens = old.encoder.eval().encode(packed, old.head.input_rows(packed.cu_seqlens))
        torch.manual_seed(3)
        as_trained = old.head.classifier(dropout(old.head.pooler(first_tokens), CLASSIFIER_RATE))
        logits = {}
        for name, model in (("old", old), ("imported", imported)):
            head_only_in_train_mode(model, model.encoder)
            torch.manual_seed(3)
            logits[name] = model(**inputs).logits
    assert (logits["old"] - as_trained).abs().max() <= TOLERANCE
    assert (logits["imported"] - as_trained).abs().max() > 1e-3  # today's import draws twice: the case differs

    tagger = saved_the_old_way(from_hf(tiny_hf_model("distilbert", "ForTokenClassification")), tmp_path / "tagger")
    assert tagger.dropout.p == CLASSIFIER_RATE  # today's DistilBERT import: HIDDEN_RATE
    chooser = saved_the_old_way(from_hf(tiny_hf_model("electra", "ForMultipleChoice")), tmp_path / "chooser")
    assert (chooser.head.input_dropout, chooser.head.dropout.p) == (None, CLASSIFIER_RATE)


def test_a_whole_mpnet_in_train_mode_draws_every_dropout_mask_transformers_does() -> None:
    """Embeddings, attention probabilities (with the relative bias), each sub-layer and the head: one unpadded
    sequence, so each of HF's padded tensors has the shape of our packed one and the same draws give the same masks
    (MPNet's attention drops out through its nn.Dropout, which the fixture points at ours)."""
    config = transformers.MPNetConfig(**(SHARED | {"hidden_dropout_prob": HIDDEN_RATE, "pad_token_id": 1,
                                                   "attention_probs_dropout_prob": HIDDEN_RATE,
                                                   "attn_implementation": "eager"}))
    torch.manual_seed(0)
    hf_model = transformers.MPNetForTokenClassification(config)
    ours = from_hf(hf_model)
    hf_model.train()
    ours.train()
    ids = torch.randint(7, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    packed = unpad_inputs(ids, torch.ones_like(ids))
    inputs = {"input_ids": packed.input_ids, "cu_seqlens": packed.cu_seqlens, "max_seqlen": packed.max_seqlen}
    with torch.no_grad():
        torch.manual_seed(5)
        theirs = hf_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.flatten(0, 1)
        torch.manual_seed(5)
        got = ours(**inputs).logits
        without_dropout = ours.eval()(**inputs).logits
    assert (got - without_dropout).abs().max() > 1e-2
    assert (got - theirs).abs().max() <= TOLERANCE
