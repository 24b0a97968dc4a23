"""Word-embedding gradients kept across optimizer steps instead of freed and allocated anew.

With it on, each `Embeddings` module adds its rows' gradients into its weight's `.grad` in place
(`models/embeddings.py` says why: a fresh dense gradient costs page faults every step), and
`zero_grad` zeroes that one buffer where the optimizer would set it to None. Every other gradient
is freed as before.

On CPU, in a single process, without `torch.compile`: DDP's and FSDP's reducers are driven by
autograd's gradient accumulation, which the in-place path skips; a compiled graph would break at
it; and on a GPU the caching allocator already reuses the block, while `index_add_`'s atomics there
would make the order of the sums, and so exact resume, nondeterministic.
"""

from __future__ import annotations

import torch
from torch import nn

from bertforge.models.embeddings import Embeddings


class KeptGradients:
    def __init__(self, model: nn.Module, enabled: bool) -> None:
        modules = [m for m in model.modules() if isinstance(m, Embeddings)] if enabled else []
        for module in modules:
            module.accumulate_word_gradient_in_place = True
        self.parameters = [m.word_embeddings.weight for m in modules]

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer.zero_grad(set_to_none=True)`, except that the kept buffers are zeroed and kept."""
        kept = [(p, p.grad) for p in self.parameters if p.grad is not None]
        optimizer.zero_grad(set_to_none=True)
        for parameter, grad in kept:
            parameter.grad = grad.zero_()
