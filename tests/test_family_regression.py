"""Every family's `*ForSequenceClassification` with one output and `problem_type: regression` imports as a
bertforge regressor and exports back as one: the stock class's predictions and mean squared error, and
transformers reads the export as regression again. Tiny random models of each family, built by transformers
(`test_head_dropout.tiny_hf_model`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from test_head_dropout import FAMILIES, TOLERANCE, batch, tiny_hf_model

from bertforge.models.encoder import unpad_inputs
from bertforge.models.hf import export_hf, from_hf


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_regression_checkpoint_imports_and_exports_as_regression(tmp_path: Path, family: str) -> None:
    hf_model = tiny_hf_model(family, "ForSequenceClassification", num_labels=1, problem_type="regression")
    ours = from_hf(hf_model).eval()
    assert (ours.problem_type, ours.num_labels) == ("regression", 1)
    ids, mask = batch()
    targets = torch.linspace(-1.0, 2.0, ids.shape[0])
    packed = unpad_inputs(ids, mask)
    with torch.no_grad():
        theirs = hf_model(input_ids=ids, attention_mask=mask, labels=targets)
        got = ours(input_ids=packed.input_ids, cu_seqlens=packed.cu_seqlens, max_seqlen=packed.max_seqlen,
                   labels=targets)
    assert (got.logits - theirs.logits).abs().max() <= TOLERANCE
    assert float(got.loss_sum) / len(targets) == pytest.approx(float(theirs.loss), abs=TOLERANCE)  # MSE, as HF's
    result = export_hf(ours, None, tmp_path / "export")
    reloaded = transformers.AutoModelForSequenceClassification.from_pretrained(str(result.directory)).eval()
    assert (reloaded.config.problem_type, reloaded.config.num_labels) == ("regression", 1)
    with torch.no_grad():
        assert (reloaded(input_ids=ids, attention_mask=mask).logits - theirs.logits).abs().max() <= TOLERANCE
