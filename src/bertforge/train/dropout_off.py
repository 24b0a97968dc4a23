"""`train.disable_dropout`: train with every dropout off while the model keeps its rates.

Cramming pre-trains without dropout (a budget run sees each token about once, so there is nothing to
regularise, and every step is cheaper) and fine-tunes with dropout 0.1. Setting `model.hidden_dropout`
and `model.attention_dropout` to 0 does the first half but writes 0 into the model's config, so
`final/config.json` and every fine-tune started from it (ours, or Hugging Face's) would train without
dropout too. This switch is a training-time setting instead: the trainer sets each dropout
probability of the built model to 0, and the model's config, and with it the exported `config.json`,
keeps the rates that fine-tuning will use.
"""

from __future__ import annotations

from torch import nn

from bertforge.models.dropout import Dropout
from bertforge.models.encoder import SelfAttention


def switch_off_dropout(model: nn.Module) -> int:
    """Set every dropout probability in `model` to 0 (dropout modules and the attention layers' `dropout_p`);
    returns how many were above 0. The model's config is left as it was."""
    switched = 0
    for module in model.modules():
        if isinstance(module, Dropout | nn.Dropout):
            switched += module.p > 0
            module.p = 0.0
        if isinstance(module, SelfAttention):  # its attention dropout is the probability it passes its kernel
            switched += module.dropout_p > 0
            module.dropout_p = 0.0
    return switched
