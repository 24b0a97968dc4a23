"""With dropout on, every family's model spreads its logits as the stock `transformers` class does.

test_head_dropout.py shows the same masks at the same sites when both sides draw the same numbers
(HF's nn.Dropout pointed at ours, equal lengths). This file checks the rest of what a fine-tuning run
meets: HF's own `F.dropout` against our 16-bit CPU mask, on a batch of varied lengths that HF pads and
we pack. Both sides hold the same weights; over many train-mode draws, dropout is the only
randomness, so the logits' variance over draws and their mean must agree within sampling error.

What it catches (measured by patching bertforge): hidden dropout at 0.13 instead of 0.1 gives a
variance ratio of 1.30 (BERT), 1.31 (MPNet), 1.18 (DeBERTa-v2, at the band's edge); the embeddings
dropping out twice 1.76 (ELECTRA). It does not see a dropout without its keep scale in a post-norm
encoder (RoBERTa 0.94: each LayerNorm undoes the scale), nor attention dropout alone (off gives 0.98
on the tiny MPNet: attention over a few tokens of random weights carries little of the spread);
test_model_dropout.py and test_head_dropout.py check those directly. Null runs (the same weights,
other seeds) gave ratios 0.90-1.05 at 200 draws and 0.96-1.07 at 400, mean z^2 0.55-1.93.
"""

from __future__ import annotations

import pytest
import torch
from test_head_dropout import VOCAB, tiny_hf_model

from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import from_hf

LENGTHS = [5, 12, 9, 16, 7, 14]  # varied: HF's padded batch is not our packed one
DRAWS = 200
VARIANCE_RATIO_BAND = (0.85, 1.18)
MEAN_Z2_LIMIT = 4.0
ATTENTION_RATE = 0.1
# each family's attention dropout under its own name (the rest come from test_head_dropout.FAMILIES)
ATTENTION_DROPOUT = {"distilbert": {"attention_dropout": ATTENTION_RATE},
                     "modernbert": {"attention_dropout": ATTENTION_RATE, "embedding_dropout": ATTENTION_RATE}}
# the head's own rates at 0 where a family has them, so the encoder's dropouts carry the logits' spread (a
# classifier dropout of 0.3 would dominate it and hide an encoder at the wrong rate); MPNet's head runs at the
# hidden rate, as its class does
HEAD_DROPOUT_OFF = {"bert": {"classifier_dropout": 0.0}, "roberta": {"classifier_dropout": 0.0},
                    "distilbert": {"seq_classif_dropout": 0.0}, "electra": {"classifier_dropout": 0.0},
                    "deberta-v2": {"cls_dropout": 0.0, "pooler_dropout": 0.0},
                    "modernbert": {"classifier_dropout": 0.0}}
FAMILIES = ["bert", "roberta", "distilbert", "electra", "mpnet", "deberta-v2", "modernbert"]


def varied_length_batch(pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.full((len(LENGTHS), max(LENGTHS)), pad_id)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        ids[row, :length] = torch.randint(7, VOCAB, (length,), generator=generator)
        mask[row, :length] = 1
    return ids, mask


def train_mode_draws(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """[DRAWS, rows, labels] logits of ours and of the stock class (its own dropout), the same weights."""
    hf_model = tiny_hf_model(family, "ForSequenceClassification", **HEAD_DROPOUT_OFF.get(family, {}),
                             **ATTENTION_DROPOUT.get(family, {"attention_probs_dropout_prob": ATTENTION_RATE}))
    ours = from_hf(hf_model).train()
    hf_model.train()
    ids, mask = varied_length_batch(hf_model.config.pad_token_id or 0)
    packed = unpad_inputs(ids, mask)
    torch.manual_seed(0)
    with torch.no_grad():
        got = torch.stack([ours(input_ids=packed.input_ids, cu_seqlens=packed.cu_seqlens,
                                max_seqlen=packed.max_seqlen).logits for _ in range(DRAWS)])
        theirs = torch.stack([hf_model(input_ids=ids, attention_mask=mask).logits for _ in range(DRAWS)])
    return got, theirs


@pytest.mark.parametrize("family", FAMILIES)
def test_train_mode_logits_spread_and_centre_as_the_stock_class_with_its_own_dropout(family: str) -> None:
    got, theirs = train_mode_draws(family)
    assert got.var(0).min() > 0  # dropout is on: every logit moves from draw to draw
    variance_ratio = (got.var(0).sum() / theirs.var(0).sum()).item()
    assert VARIANCE_RATIO_BAND[0] < variance_ratio < VARIANCE_RATIO_BAND[1]
    z = (got.mean(0) - theirs.mean(0)) / ((got.var(0) + theirs.var(0)) / DRAWS).sqrt()
    assert z.pow(2).mean().item() < MEAN_Z2_LIMIT
