"""`train.disable_dropout`: train with every dropout off while the model keeps its rates, for the whole
run or (`train.disable_dropout_until`) for its first part.

Cramming pre-trains without dropout (a budget run sees each token about once, so there is nothing to
regularise, and every step is cheaper) and fine-tunes with dropout 0.1. Setting `model.hidden_dropout`
and `model.attention_dropout` to 0 does the first half but writes 0 into the model's config, so
`final/config.json` and every fine-tune started from it (ours, or Hugging Face's) would train without
dropout too. This switch is a training-time setting instead: the trainer sets each dropout
probability of the built model to 0, and the model's config, and with it the exported `config.json`,
keeps the rates that fine-tuning will use.

Turning the rates back on for the last part of a run keeps most of the speed (a CPU step with
dropout costs about 1.33x one without) while the model ends its pre-training under the noise it
will be fine-tuned with.
"""

from __future__ import annotations

from torch import nn

from bertforge.models.dropout import Dropout
from bertforge.models.encoder import SelfAttention


class DropoutSwitch:
    """Every dropout probability of a model above 0 (dropout modules' `p`, attention layers' `dropout_p`,
    the probability they pass their kernel), set to 0 or back to the model's own rate. The model's config
    is never touched."""

    def __init__(self, model: nn.Module) -> None:
        self.rates: list[tuple[nn.Module, str, float]] = []
        for module in model.modules():
            if isinstance(module, Dropout | nn.Dropout) and module.p > 0:
                self.rates.append((module, "p", module.p))
            if isinstance(module, SelfAttention) and module.dropout_p > 0:
                self.rates.append((module, "dropout_p", module.dropout_p))
        self.on = True

    def __len__(self) -> int:
        return len(self.rates)

    def set(self, on: bool) -> None:
        if on != self.on:
            for module, attribute, rate in self.rates:
                setattr(module, attribute, rate if on else 0.0)
            self.on = on


def dropout_is_on(fraction_done: float, until: float) -> bool:
    """Whether a run with `train.disable_dropout` trains with dropout at `fraction_done` of its progress:
    off before `until`, on from it (never, for `until` = 1)."""
    return until < 1.0 and fraction_done >= until
