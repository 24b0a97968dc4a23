"""The MLM plateau: a pre-trained model that predicts masked tokens no better than the training data's most
frequent token.

MLM training learns the token frequencies first and then sits at (or below) the accuracy of always guessing
the most frequent token for a while before it starts to use the context: the quickstart's bert-tiny leaves
it between steps 100 and 700 on 2.7 M tokens of English; the multilingual DistilBERT (400 steps) and issue
40's 10-minute bert-mini runs ended on it. Fine-tuning from a model on the plateau can do worse than from
random weights (the guide's 200-step quickstart: 0.173 against 0.242), so `bertforge pretrain`'s summary and
the quickstart's say so, with this one definition.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bertforge.data.shards import PretokenizedDataset
    from bertforge.data.tokenizer import LoadedTokenizer
    from bertforge.train.task import Batch

# About 2 M tokens at seq 128: enough for the most frequent token to be unambiguous (the multilingual man pages'
# '-' holds 2.5% of the tokens), few enough to count in under a second at the start (0.2 s for 4,677 samples here).
COUNTED_SAMPLES = 16_384

# A run may sit on the plateau for a while before it leaves (bert-tiny: between steps 100 and 700 of 700);
# still there halfway through its budget is worth a word during the run, not only at its end.
WARN_AFTER_FRACTION = 0.5

# How far above the unigram baseline a model must be to be off the plateau. A model that has learnt frequencies
# only answers one token everywhere; when that token is not the training text's most frequent one but a token
# more frequent among the validation masks, it scores a little above the baseline (the multilingual DistilBERT
# after 40 steps: 0.0224 against 0.0217, loss 7.68). Models that had left the plateau were 0.02 or more above it
# (arabic-tiny at 600 steps, "barely off": 0.064 against 0.043; the quickstart at 700: 0.157 against 0.0425, the
# training data's guess; 0.102 was the validation masks' own most frequent token, the baseline before 2026-11-27).
PLATEAU_MARGIN = 0.01


@dataclass(frozen=True)
class UnigramGuess:
    """The training data's most frequent maskable token: the guess a model that knows only frequencies makes."""

    token_id: int
    token: str
    train_share: float  # its share of the counted training tokens, specials left out
    counted_tokens: int

    def as_json(self) -> dict[str, Any]:
        return {"token": self.token, "token_id": self.token_id, "train_share": self.train_share,
                "counted_tokens": self.counted_tokens}


def unigram_guess(train: PretokenizedDataset, tokenizer: LoadedTokenizer) -> UnigramGuess:
    """Count the tokens of up to `COUNTED_SAMPLES` evenly spaced training samples, once, at the start of a run.

    Specials ([CLS], [SEP], [unusedN]) are never masked, so they are never the answer. A remote dataset is
    counted on its first shard only: spreading the samples over every shard would download the whole
    dataset before the first step."""
    import numpy as np  # here: the quickstart's command line imports this module for the definition alone

    samples = len(train) if train.cache is None else int(train.shard_starts[1]) if len(train.shards) else 0
    indices = np.unique(np.linspace(0, samples - 1, num=min(samples, COUNTED_SAMPLES)).astype(np.int64))
    counts = np.zeros(max(tokenizer.vocab_size, 1), dtype=np.int64)
    for start in range(0, len(indices), 4096):  # bounded memory: a chunk of samples at a time
        tokens, _, _ = train.gather(indices[start:start + 4096])
        counts += np.bincount(tokens, minlength=len(counts))[:len(counts)]
    specials = tokenizer.special_ids()
    counts[specials[specials < len(counts)]] = 0
    total = int(counts.sum())
    token_id = int(counts.argmax())
    return UnigramGuess(token_id, tokenizer.tokenizer.id_to_token(token_id) or str(token_id),
                        float(counts[token_id]) / max(total, 1), total)


def unigram_accuracy(batches: Iterable[Batch], guess: UnigramGuess) -> float:
    """The MLM accuracy of always answering `guess` on these batches' masked tokens: the bar to beat."""
    right = total = 0
    for batch in batches:
        labels = batch["masked_labels"]
        right += int((labels == guess.token_id).sum())
        total += int(labels.numel())
    return right / total if total else 0.0


@dataclass(frozen=True)
class MlmStanding:
    """A model's validation MLM accuracy beside the unigram guess's on the same masked tokens
    (`PretrainTask.evaluate`'s `mlm_accuracy` and `mlm_unigram_accuracy`)."""

    accuracy: float | None
    unigram_accuracy: float | None

    @classmethod
    def of(cls, metrics: dict[str, float]) -> MlmStanding:
        return cls(metrics.get("mlm_accuracy"), metrics.get("mlm_unigram_accuracy"))

    def on_plateau(self) -> bool:
        """No more than `PLATEAU_MARGIN` above the unigram guess: the model has learnt token frequencies and little
        else yet."""
        return self.accuracy is not None and self.unigram_accuracy is not None and (
            self.accuracy <= self.unigram_accuracy + PLATEAU_MARGIN)

    def describe(self) -> str:
        if self.accuracy is None:
            return ""
        baseline = f", unigram baseline {self.unigram_accuracy:.4f}" if self.unigram_accuracy is not None else ""
        return f"  (validation MLM accuracy {self.accuracy:.4f}{baseline})"


def plateau_warning(standing: MlmStanding, *, subject: str, steps: int | None = None, tokens: int | None = None,
                    guess: UnigramGuess | None = None, advice: str) -> str | None:
    """One sentence that names the figures and what to do, when `standing` is on the plateau; None when it is not."""
    if not standing.on_plateau():
        return None
    assert standing.accuracy is not None and standing.unigram_accuracy is not None
    trained = [f"{steps:,} steps"] if steps is not None else []
    trained += [f"{tokens / 1e6:,.1f} M tokens"] if tokens is not None else []
    after = f" after {' and '.join(trained)}" if trained else ""
    token = f"{guess.token!r}, the training data's most frequent token" if guess is not None else "the most frequent token"
    return (f"{subject} is still on the MLM plateau{after}: its validation MLM accuracy {standing.accuracy:.4f} is "
            f"not {PLATEAU_MARGIN:g} above the unigram baseline {standing.unigram_accuracy:.4f} (always predicting "
            f"{token}), so it has "
            f"learnt token frequencies and little else, and fine-tuning from it can do worse than from random "
            f"weights; {advice}")


PRETRAIN_ADVICE = ("train longer (train.max_steps, train.max_tokens or train.max_time_minutes; docs/guide.md, "
                   "'Pre-training on a budget', says at which budget each recipe starts to pay off)")
DURING_RUN_ADVICE = f"it may still leave it before the end; if the summary says it did not, {PRETRAIN_ADVICE}"


class PlateauWatch:
    """Says once, during a run, that the model is still on the plateau past `WARN_AFTER_FRACTION` of its budget."""

    def __init__(self) -> None:
        self.warned = False

    def check(self, metrics: dict[str, float], *, step: int, tokens: int, fraction_done: float,
              guess: UnigramGuess | None) -> str | None:
        """The warning to print now, or None (not yet halfway, off the plateau, said already, or the last step)."""
        if self.warned or fraction_done < WARN_AFTER_FRACTION or fraction_done >= 1.0:
            return None  # the end-of-run summary speaks for the last evaluation
        warning = plateau_warning(MlmStanding.of(metrics), subject=f"at {fraction_done:.0%} of its budget the model",
                                  steps=step, tokens=tokens, guess=guess, advice=DURING_RUN_ADVICE)
        self.warned = warning is not None
        return warning


def pretrain_summary(metrics: dict[str, float], *, steps: int, tokens: int, seconds: float,
                     guess: UnigramGuess | None) -> dict[str, Any]:
    """What `bertforge pretrain` writes to the run's summary.json and prints at its end."""
    standing = MlmStanding.of(metrics)
    warning = plateau_warning(standing, subject="the model", steps=steps, tokens=tokens, guess=guess,
                              advice=PRETRAIN_ADVICE)
    return {"task": "pretrain", "steps": steps, "tokens": tokens, "training_seconds": round(seconds, 1),
            "validation": dict(metrics), "unigram_guess": guess.as_json() if guess is not None else None,
            "on_mlm_plateau": standing.on_plateau(), "warning": warning}
