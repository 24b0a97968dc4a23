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

`train.disable_dropout_from: plateau_exit` keeps dropout on until the model has left the MLM plateau
(a validation evaluation's MLM accuracy above the unigram baseline, always guessing the most frequent
token, by `train.plateau_exit_margin`), and only then turns it off: issue 40's budget-recipe model,
trained on the plateau without dropout, fine-tuned to the majority class (docs/benchmarks.md, "Why the
budget recipe fine-tuned to the majority class").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from bertforge.models.dropout import Dropout
from bertforge.models.encoder import SelfAttention

if TYPE_CHECKING:
    from bertforge.config import TrainSection

PLATEAU_METRICS = ("mlm_accuracy", "mlm_unigram_accuracy")  # what a plateau_exit switch reads from an evaluation


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


def dropout_is_on(fraction_done: float, until: float, waiting_for_plateau_exit: bool = False) -> bool:
    """Whether a run with `train.disable_dropout` trains with dropout at `fraction_done` of its progress: on while
    it waits for the plateau exit (`train.disable_dropout_from: plateau_exit`), then off before `until`, on from it
    (never, for `until` = 1)."""
    return waiting_for_plateau_exit or (until < 1.0 and fraction_done >= until)


def left_plateau(results: dict[str, float], margin: float) -> bool:
    """Whether an evaluation's MLM accuracy is above its unigram baseline by more than `margin` (at or below the
    baseline is the plateau: `bertforge.tasks.mlm_plateau.MlmStanding.on_plateau`)."""
    return results["mlm_accuracy"] > results["mlm_unigram_accuracy"] + margin


def check_plateau_switch(train: TrainSection, metric_names: set[str] | None) -> None:
    """A plateau_exit switch needs evaluations that report the MLM accuracy and its unigram baseline."""
    from bertforge.errors import ConfigError

    if train.disable_dropout_from != "plateau_exit" or metric_names is None:
        return
    if missing := [name for name in PLATEAU_METRICS if name not in metric_names]:
        raise ConfigError("`train.disable_dropout_from: plateau_exit` waits for the validation MLM accuracy to leave "
                          f"the unigram baseline, but this task's evaluation reports no {' or '.join(missing)}; it is "
                          "for pre-training: use train.disable_dropout_from=start")


def dropout_plan(train: TrainSection) -> str:
    """The log line that says when the run trains without dropout."""
    back_on = f" until {train.disable_dropout_until:g} of the run" if train.disable_dropout_until < 1.0 else ""
    start = (f"with dropout on until the validation MLM accuracy is {train.plateau_exit_margin:g} above the unigram "
             "baseline, then off" if train.disable_dropout_from == "plateau_exit" else "with dropout off")
    return (f"training {start}{back_on} (train.disable_dropout); the model's config, and so final/config.json, keeps "
            "its dropout rates for fine-tuning")
