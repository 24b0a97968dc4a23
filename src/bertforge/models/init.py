"""Weight initialisation (the optimizer's weight-decay groups are `train.optim.default_parameter_groups`).

BERT's recipe: truncated normal (std 0.02, cut at two std), zero biases, unit norms. Deep pre-norm
stacks add every layer's output onto the residual stream unnormalised, so its variance grows with
depth; like GPT-2 and ModernBERT we shrink the std of the projections that write into the residual
stream (attention output, MLP output) by sqrt(2 · layers). Post-norm (classic BERT) renormalises
after every add and keeps the plain std.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bertforge.models.config import EncoderConfig

RESIDUAL_OUTPUT_SUFFIXES = ("attention.output", "mlp.output")
CUTOFF_STDS = 2.0

_draws_skipped = False


@contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Build models whose weights a checkpoint replaces next, without BERT's draw (`init_weights` does nothing).

    Loading for inference built MiniLM twice (the checkpoint's class, then the embedding model it becomes),
    each draw 0.5-1.5 s of `bertforge embed`'s start-up on these cores. Only where the global RNG's later draws
    do not matter: training builds its fresh head after loading the encoder, from the same seed as before. A
    weight the checkpoint lacks keeps torch's default draw instead (a head absent from it predicts noise either way).
    """
    global _draws_skipped
    previous, _draws_skipped = _draws_skipped, True
    try:
        yield
    finally:
        _draws_skipped = previous


# torch's own draws in the constructors of the layers models are built of (Linear: kaiming uniform weight and
# uniform bias; Embedding: normal)
TORCH_DEFAULT_DRAWS = ("kaiming_uniform_", "uniform_", "normal_")


@contextmanager
def every_weight_loaded_next() -> Iterator[None]:
    """Inside `weights_from_checkpoint`, for a caller that loads every weight of the models built here next and
    refuses a source lacking one: skip torch's own default draws as well; each weight keeps the memory
    `torch.empty` gave it until the load. They were 0.17 s of the 0.23 s `load_model` of MiniLM took.

    Outside `weights_from_checkpoint` nothing changes: there the draws feed the global RNG stream that a fresh
    head's initialisation follows (`load_for_task`), and skipping them would change that head."""
    if not _draws_skipped:
        yield
        return
    originals = {name: getattr(nn.init, name) for name in TORCH_DEFAULT_DRAWS}
    try:
        for name in TORCH_DEFAULT_DRAWS:
            setattr(nn.init, name, _left_as_allocated)
        yield
    finally:
        for name, function in originals.items():
            setattr(nn.init, name, function)


def _left_as_allocated(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    return tensor


def truncated_normal_(weight: torch.Tensor, std: float, generator: torch.Generator | None = None) -> None:
    """A normal draw with every value beyond CUTOFF_STDS redrawn until inside: the truncated normal.

    Why not `nn.init.trunc_normal_`: in torch 2.13 it redraws the *whole* tensor until no value is
    out of range (about 5 full draws for a 30k-word embedding, 4.6% out each time), 1.5 s for
    MiniLM's embedding on 2 cores against 0.15 s here; every model built paid it, loaded or not.
    """
    limit = CUTOFF_STDS * std
    flat = weight.view(-1)
    flat.normal_(0.0, std, generator=generator)
    outside = (flat.abs() > limit).nonzero().squeeze(1)
    while outside.numel():
        flat[outside] = flat.new_empty(outside.numel()).normal_(0.0, std, generator=generator)
        outside = outside[flat[outside].abs() > limit]


@torch.no_grad()
def init_weights(module: nn.Module, config: EncoderConfig) -> None:
    """Initialise every Linear, Embedding and LayerNorm inside `module` (unless under `weights_from_checkpoint`)."""
    if _draws_skipped:
        return
    residual_std = config.initializer_range / math.sqrt(2.0 * config.num_layers)
    for name, child in module.named_modules():
        if isinstance(child, nn.Linear):
            scaled = config.norm == "pre" and name.endswith(RESIDUAL_OUTPUT_SUFFIXES)
            truncated_normal_(child.weight, residual_std if scaled else config.initializer_range)
            if child.bias is not None:
                nn.init.zeros_(child.bias)
        elif isinstance(child, nn.Embedding):
            truncated_normal_(child.weight, config.initializer_range)
        elif isinstance(child, nn.LayerNorm):
            nn.init.ones_(child.weight)
            if child.bias is not None:
                nn.init.zeros_(child.bias)


@torch.no_grad()
def init_head(head: nn.Module, config: EncoderConfig) -> None:
    """The one rule for every fine-tuning head (sequence classification and regression, tagging, and any
    kind's head): each Linear a plain normal of std `initializer_range`, not truncated, zero biases,
    unit norms; as `transformers` draws them (`BertPreTrainedModel._init_weights`). Pre-training heads
    and the encoder keep BERT's truncated recipe (`init_weights`): a loaded encoder and pooler replace
    that draw anyway, and the head is what a fine-tune starts fresh.

    Why not BERT's truncated draw, cut at two std (12% less spread), measured head by head (raw
    results and commands: docs/benchmarks.md, parity and token classification sections):
    - tagging (all-MiniLM-L6-v2, supersense, 89 tags, lr 5e-4, 250 steps, dropout off): lower training
      loss on every one of 6 seeds, 0.868 against 0.925 (HF `Trainer` 0.856), entity F1 38.3 against 37.2;
    - sequence classification (`benchmarks/parity.py --bertforge-head-init`, 2026-11-27): supersense
      1,000/1,000, 10 seeds paired, normal - truncated -0.18 points [-2.28, +1.92], 5 seeds up and 5
      down, against HF +0.69 [-1.29, +2.68]; manpages 1,000/387, 2 seeds, +7.2 and +3.6. Equal within
      noise where it was measured enough; the seed spread on supersense was the wider (2.71 against
      the truncated draw's 1.71 over 65 seeds, F-test p = 0.03; HF's 1.86, p = 0.09): re-measure it.
    """
    for child in head.modules():
        if isinstance(child, nn.Linear):
            nn.init.normal_(child.weight, 0.0, config.initializer_range)
            if child.bias is not None:
                nn.init.zeros_(child.bias)
        elif isinstance(child, nn.LayerNorm):
            nn.init.ones_(child.weight)
            if child.bias is not None:
                nn.init.zeros_(child.bias)
