"""Training a model we imported and the stock `transformers` model it came from, step for step.

`losses_step_for_step` runs the same AdamW steps with gradient clipping on both, from the same
weights, on the same padded batches (ours fed packed), and returns both loss curves: the losses
stay equal only if the forward, every gradient (a wrong one moves the next step's weights) and the
clipping norm (over every trained element, so a fused matrix must hold exactly HF's elements) are.
Any family x head joins by handing over its HF model (dropout off) and our import of it.

Each head's loss is its HF class's own (`labels=`), against ours computed the way the trainer does
(sums over the batch divided by what HF averages over); a bare encoder has no loss of its own, so
both get the mean squared distance of the real tokens' states to a fixed random target. A
multiple-choice head reads each batch's rows as questions of CHOICES candidates (HF: [questions,
choices, length]; ours: every candidate one packed sequence, `choice_counts`).
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.models.encoder import unpad_inputs

IGNORED = -100
CHOICES = 2  # candidates per question of a multiple-choice batch: its rows in consecutive pairs


def batch_labels(head: str, ids: torch.Tensor, mask: torch.Tensor, num_labels: int, hidden_size: int,
                 seed: int) -> torch.Tensor:
    """What each head is trained on, in HF's padded layout (-100: not a target)."""
    generator = torch.Generator().manual_seed(seed)
    if head == "ForMultipleChoice":
        return torch.randint(0, CHOICES, (ids.shape[0] // CHOICES,), generator=generator)
    if head == "ForSequenceClassification":
        return torch.randint(0, num_labels, (ids.shape[0],), generator=generator)
    if head == "ForTokenClassification":
        tags = torch.randint(0, num_labels, ids.shape, generator=generator)
        return torch.where(mask.bool(), tags, IGNORED)
    if head == "ForMaskedLM":  # ~20% of the real tokens, at least one per sequence
        chosen = (torch.rand(ids.shape, generator=generator) < 0.2) & mask.bool()
        chosen[:, 1] = True
        return torch.where(chosen, ids, IGNORED)
    return torch.randn(*ids.shape, hidden_size, generator=generator)  # a bare encoder's target states


def hf_loss(hf_model: nn.Module, head: str, ids: torch.Tensor, mask: torch.Tensor,
            labels: torch.Tensor) -> torch.Tensor:
    if head == "Model":
        states = hf_model(input_ids=ids, attention_mask=mask).last_hidden_state
        return (states[mask.bool()] - labels[mask.bool()]).pow(2).mean()
    if head == "ForMultipleChoice":
        ids, mask = ids.view(-1, CHOICES, ids.shape[1]), mask.view(-1, CHOICES, mask.shape[1])
    return hf_model(input_ids=ids, attention_mask=mask, labels=labels).loss


def our_loss(model: nn.Module, head: str, ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    packed = unpad_inputs(ids, mask)
    fields = {"input_ids": packed.input_ids, "cu_seqlens": packed.cu_seqlens, "max_seqlen": packed.max_seqlen}
    if head == "Model":
        return (model(**fields) - labels[mask.bool()]).pow(2).mean()
    if head == "ForSequenceClassification":
        return model(**fields, labels=labels).loss_sum / ids.shape[0]
    if head == "ForMultipleChoice":
        counts = torch.full((len(labels),), CHOICES)
        return model(**fields, choice_counts=counts, labels=labels).loss_sum / len(labels)
    targets = labels[mask.bool()]
    if head == "ForTokenClassification":
        return model(**fields, labels=targets).loss_sum / (targets != IGNORED).sum()
    positions = torch.nonzero(targets != IGNORED).squeeze(1)
    output = model(**fields, masked_positions=positions, masked_labels=targets[positions])
    return output.mlm_loss_sum / output.num_masked


def losses_step_for_step(hf_model: nn.Module, ours: nn.Module, head: str,
                         batches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float = 2e-3,
                         max_norm: float = 1.0) -> tuple[list[float], list[float]]:
    """(our losses, HF's losses), one per batch: each a step of AdamW (weight decay on every weight) after
    clipping the gradient norm to `max_norm`. `lr` is large so six steps move the weights well away."""
    config = hf_model.config
    models = (ours.train(), hf_model.train())
    # eps 1e-6, not torch's 1e-8: a gradient that is zero in exact arithmetic (the key bias's: softmax ignores a
    # shift shared by every key) is rounding noise of ~1e-8 on each side, which eps 1e-8 turns into a step of
    # about lr with the noise's sign; two correct implementations then drifted 1.1e-4 apart by step 2 on an
    # AMD EPYC CPU (2e-6 with eps 1e-6), where an Intel Xeon's kernels happened to round alike
    optimizers = [torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, eps=1e-6) for model in models]
    losses: tuple[list[float], list[float]] = ([], [])
    for step, (ids, mask) in enumerate(batches):
        labels = batch_labels(head, ids, mask, config.num_labels, config.hidden_size, seed=step)
        for index, (model, optimizer) in enumerate(zip(models, optimizers, strict=True)):
            compute = our_loss if index == 0 else hf_loss
            loss = compute(model, head, ids, mask, labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            optimizer.step()
            optimizer.zero_grad()
            losses[index].append(loss.item())
    return losses
