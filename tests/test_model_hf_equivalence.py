"""Our encoder computes exactly what Hugging Face `transformers` computes (fp32, CPU).

Classic BERT is checked on the real all-MiniLM-L6-v2 weights; masked-LM heads and ModernBERT on
small random models. Random weights are drawn with a large std so attention is sharp and any
mismatch (a wrong window, a missing norm) shows up far above float noise.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
import transformers

from bertforge.data.bundled import supersense_lines, supersense_path
from bertforge.models import BertforgeForPreTraining, BertforgeForSequenceClassification, BertforgeModel
from bertforge.models.hf import export_hf, from_hf, load_hf_checkpoint

TOLERANCE = 1e-5

@pytest.fixture(scope="module")
def real_batch(minilm_dir: Path) -> dict[str, torch.Tensor]:
    """Real glosses of the bundled supersense set as sentence pairs of different lengths (padded)."""
    with gzip.open(supersense_path("validation"), "rt", encoding="utf-8") as rows:
        texts = [json.loads(line)["text"] for _, line in zip(range(6), rows, strict=False)]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    batch = tokenizer(texts[:3], [texts[3], texts[4][:20], texts[5][:5]], padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all()), "the batch must contain padding to test unpadding"
    return dict(batch)


def sharpen(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> None:
    """Random weights large enough that attention patterns matter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name.lower():
                parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator))
            else:
                parameter.copy_(std * torch.randn(parameter.shape, generator=generator))


def small_bert_mlm(nsp: bool = False) -> transformers.PreTrainedModel:
    config = transformers.BertConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=64, max_position_embeddings=64,
                                     attn_implementation="sdpa")
    model = (transformers.BertForPreTraining if nsp else transformers.BertForMaskedLM)(config)
    sharpen(model)
    return model.eval()


def small_modernbert(cls: type, **overrides: object) -> transformers.PreTrainedModel:
    values: dict[str, object] = dict(vocab_size=96, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=48, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                     cls_token_id=1, sep_token_id=2, local_attention=8,
                                     global_attn_every_n_layers=2, attn_implementation="sdpa")
    values.update(overrides)
    model = cls(transformers.ModernBertConfig(**values))
    sharpen(model)
    return model.eval()


def padded_ids(vocab_size: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (len(lengths), max(lengths)), generator=generator)
    mask = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def max_diff(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (ours - theirs).abs().max().item()


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_minilm_hidden_states_match_transformers_on_a_padded_batch_fed_unpadded(
        minilm_dir: Path, real_batch: dict[str, torch.Tensor], backend: str) -> None:
    hf_model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="sdpa").eval()
    ours = load_hf_checkpoint(minilm_dir)
    assert isinstance(ours, BertforgeModel)
    ours.config.attention_backend = backend
    mask = real_batch["attention_mask"].bool()
    with torch.no_grad():
        expected = hf_model(**real_batch).last_hidden_state[mask]
        got = ours.eval()(real_batch["input_ids"], attention_mask=real_batch["attention_mask"],
                          token_type_ids=real_batch["token_type_ids"])
    assert got.shape == expected.shape
    assert max_diff(got, expected) <= TOLERANCE


def test_minilm_sequence_classifier_logits_match_transformers(minilm_dir: Path,
                                                               real_batch: dict[str, torch.Tensor]) -> None:
    torch.manual_seed(7)  # the classifier head is freshly (deterministically) initialised
    hf_model = transformers.BertForSequenceClassification.from_pretrained(
        str(minilm_dir), num_labels=3, attn_implementation="sdpa").eval()
    ours = from_hf(hf_model).eval()
    assert isinstance(ours, BertforgeForSequenceClassification) and ours.num_labels == 3
    with torch.no_grad():
        expected = hf_model(**real_batch).logits
        got = ours(real_batch["input_ids"], attention_mask=real_batch["attention_mask"],
                   token_type_ids=real_batch["token_type_ids"]).logits
    assert max_diff(got, expected) <= TOLERANCE


def test_masked_lm_logits_match_transformers_and_project_only_the_masked_positions() -> None:
    hf_model = small_bert_mlm()
    ours = from_hf(hf_model).eval()
    assert isinstance(ours, BertforgeForPreTraining)
    ids, mask = padded_ids(96, [17, 9, 30])
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        everything = ours(ids, attention_mask=mask).mlm_logits
        masked_positions = torch.tensor([0, 5, 20, 26, 55])
        only_masked = ours(ids, attention_mask=mask, masked_positions=masked_positions).mlm_logits
    assert max_diff(everything, expected) <= TOLERANCE
    assert only_masked.shape == (5, 96)
    assert max_diff(only_masked, expected[masked_positions]) <= TOLERANCE


def test_pretraining_heads_match_transformers_next_sentence_logits() -> None:
    hf_model = small_bert_mlm(nsp=True)
    ours = from_hf(hf_model).eval()
    assert isinstance(ours, BertforgeForPreTraining) and ours.nsp
    ids, mask = padded_ids(96, [12, 20])
    types = (torch.arange(20)[None, :] >= 6).long() * mask
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        got = ours(ids, attention_mask=mask, token_type_ids=types)
    assert max_diff(got.nsp_logits, expected.seq_relationship_logits) <= TOLERANCE
    assert max_diff(got.mlm_logits, expected.prediction_logits[mask.bool()]) <= TOLERANCE


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
def test_modernbert_logits_match_transformers_with_local_and_global_layers(backend: str) -> None:
    hf_model = small_modernbert(transformers.ModernBertForMaskedLM)
    ours = from_hf(hf_model)
    assert ours.config.local_attention_window == 8 and ours.config.global_every_n == 2
    ours.config.attention_backend = backend
    ids, mask = padded_ids(96, [24, 15, 7])  # longer than the window: local layers differ from global ones
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits[mask.bool()]
        got = ours.eval()(ids, attention_mask=mask).mlm_logits
    assert max_diff(got, expected) <= TOLERANCE


def test_modernbert_sequence_classifier_with_mean_pooling_matches_transformers() -> None:
    hf_model = small_modernbert(transformers.ModernBertForSequenceClassification, num_labels=4,
                                classifier_pooling="mean")
    ours = from_hf(hf_model).eval()
    ids, mask = padded_ids(96, [19, 11, 4])
    with torch.no_grad():
        expected = hf_model(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    assert max_diff(got, expected) <= TOLERANCE


@pytest.mark.parametrize("make_hf_model", [small_bert_mlm, lambda: small_modernbert(transformers.ModernBertForMaskedLM)],
                         ids=["bert", "modernbert"])
def test_export_loads_in_stock_transformers_with_equal_logits(tmp_path: Path, minilm_dir: Path,
                                                              make_hf_model: object) -> None:
    ours = from_hf(make_hf_model()).eval()  # type: ignore[operator]
    result = export_hf(ours, minilm_dir, tmp_path / "export")
    assert result.format == "transformers"
    assert (result.directory / "tokenizer.json").is_file() and (result.directory / "vocab.txt").is_file()
    reloaded = transformers.AutoModelForMaskedLM.from_pretrained(str(result.directory)).eval()
    assert type(reloaded).__name__ == result.architecture
    ids, mask = padded_ids(96, [21, 8])
    with torch.no_grad():
        expected = ours(ids, attention_mask=mask).mlm_logits
        got = reloaded(input_ids=ids, attention_mask=mask).logits[mask.bool()]
    assert max_diff(got, expected) <= TOLERANCE


def test_classic_gradients_match_transformers() -> None:
    hf_model = small_bert_mlm()
    ours = from_hf(hf_model)
    ids, mask = padded_ids(96, [25, 13, 30])
    labels = torch.full_like(ids, -100)
    masked = torch.zeros_like(mask, dtype=torch.bool)
    masked[0, [1, 4, 9]] = masked[1, [2, 12]] = masked[2, [0, 17, 29]] = True
    labels[masked] = ids[masked]
    hf_model.zero_grad()
    hf_model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()

    masked_positions = torch.nonzero(masked[mask.bool()]).squeeze(1)
    output = ours.eval()(ids, attention_mask=mask, masked_positions=masked_positions,
                         masked_labels=ids[mask.bool()][masked_positions])
    (output.mlm_loss_sum / output.num_masked).backward()

    hf_grads = {name: p.grad for name, p in hf_model.named_parameters() if p.grad is not None}
    query_key_value = [hf_grads[f"bert.encoder.layer.0.attention.self.{n}.weight"] for n in ("query", "key", "value")]
    pairs = {
        "encoder.embeddings.word_embeddings.weight": hf_grads["bert.embeddings.word_embeddings.weight"],
        "encoder.embeddings.position_embeddings.weight": hf_grads["bert.embeddings.position_embeddings.weight"],
        "encoder.layers.0.attention.qkv.weight": torch.cat(query_key_value),
        "encoder.layers.1.mlp.input.weight": hf_grads["bert.encoder.layer.1.intermediate.dense.weight"],
        "encoder.layers.1.mlp_norm.bias": hf_grads["bert.encoder.layer.1.output.LayerNorm.bias"],
        "mlm_head.transform.dense.weight": hf_grads["cls.predictions.transform.dense.weight"],
        "mlm_head.decoder.bias": hf_grads["cls.predictions.bias"],
    }
    our_grads = dict(ours.named_parameters())
    for name, expected in pairs.items():
        got = our_grads[name].grad
        assert got is not None, name
        relative = ((got - expected).norm() / expected.norm()).item()
        assert relative <= 1e-4, f"{name}: relative gradient difference {relative:.2e}"


def test_minilm_classifier_training_steps_match_transformers(minilm_dir: Path) -> None:
    """Fine-tuning with the same start, batches and optimizer follows HF's loss curve (dropout off)."""
    from bertforge.models.loading import load_for_task
    from bertforge.train.optim import default_parameter_groups

    torch.manual_seed(3)
    no_dropout = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    ours = load_for_task(minilm_dir, "classification", num_labels=45, config_overrides=no_dropout).train()
    hf_model = transformers.BertForSequenceClassification.from_pretrained(
        str(minilm_dir), num_labels=45, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="sdpa").train()
    hf_model.classifier.load_state_dict(ours.head.classifier.state_dict())  # the only freshly drawn weights
    rows = [json.loads(line) for line in supersense_lines("train", 96)]
    labels = sorted({row["label"] for row in rows})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(minilm_dir))
    optimizers = [torch.optim.AdamW(default_parameter_groups(m, 0.01), lr=2e-4) for m in (ours, hf_model)]
    for step in range(6):
        batch_rows = rows[step * 16:(step + 1) * 16]
        batch = tokenizer([r["text"] for r in batch_rows], padding=True, return_tensors="pt")
        targets = torch.tensor([labels.index(r["label"]) for r in batch_rows])
        hf_loss = hf_model(**batch, labels=targets).loss
        our_loss = ours(batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"], labels=targets).loss_sum / len(batch_rows)
        assert abs(our_loss.item() - hf_loss.item()) <= 1e-4, step
        for model, loss, optimizer in zip((ours, hf_model), (our_loss, hf_loss), optimizers, strict=True):
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
