"""What the pre-training data path changes over a run: the mask rate and the sequence length, as pure
functions of the step.

Budget recipes change the data as training goes: Mosaic schedules the masking rate (constant,
linear or cosine), mmBERT lowers it from 30% to 15%, BERT trains on 128 tokens for 90% of its steps
before 512. Here the value of a step is a function of
(step, total steps) only, the progress the learning-rate schedule follows (`train/optim.py`), so
a resumed run gets the same masks as an uninterrupted one without saving anything: the sampler
stamps each micro-batch with its step's values in the main process, and the loader workers apply
them. Masks stay a hash of (seed, epoch, sample, position) compared with the step's rate, so the
tokens masked at a lower rate are a subset of those masked at a higher one.

Sequence-length phases cut the samples of one prepared dataset (prepared at the longest length)
to the phase's length, ending each cut sample with [SEP]; BERT and NVIDIA prepared a second dataset
per length instead. One dataset keeps one sample index space, so the sampler's order and the
`consumed_samples` arithmetic of exact resume do not change at a phase boundary, and there is one
`prepare` to run; the price is that a phase does not train on the tail of the samples it cuts
(the next epoch sees them again, cut or whole depending on the phase).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bertforge.config import DataSection


def interpolate(shape: str, start: float, end: float, fraction: float) -> float:
    """`start` at fraction 0, `end` at fraction 1, along a constant (end), linear or cosine path."""
    fraction = min(max(fraction, 0.0), 1.0)
    if shape == "constant":
        return end
    if shape == "linear":
        return start + (end - start) * fraction
    if shape == "cosine":
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * fraction))
    raise AssertionError(f"unhandled schedule shape {shape}")  # config validation lists the choices


@dataclass(frozen=True)
class StepData:
    """The data settings of one optimizer step."""

    mask_prob: float
    seq_len: int | None = None  # cut longer samples to this many tokens; None = as prepared


@dataclass(frozen=True)
class DataCurriculum:
    mask_prob: float = 0.15
    mask_schedule: str = "constant"
    mask_prob_start: float | None = None
    seq_len_phases: tuple[tuple[int, float], ...] = ()  # (seq_len, until) in order; after the last, as prepared

    @classmethod
    def from_config(cls, data: DataSection) -> DataCurriculum:
        return cls(mask_prob=data.mask_prob, mask_schedule=data.mask_schedule, mask_prob_start=data.mask_prob_start,
                   seq_len_phases=tuple((phase.seq_len, phase.until) for phase in data.seq_len_schedule))

    @property
    def follows_steps(self) -> bool:
        """Whether any setting changes with the step (and so needs a step budget)."""
        return self.mask_schedule != "constant" or bool(self.seq_len_phases)

    def at(self, step: int, total_steps: int | None) -> StepData:
        """The settings of `step` (0-based) of `total_steps`: the fraction is step / total_steps, as for the lr."""
        if not self.follows_steps or total_steps is None:
            return StepData(mask_prob=self.mask_prob)
        fraction = step / max(total_steps, 1)
        start = self.mask_prob if self.mask_prob_start is None else self.mask_prob_start
        seq_len = next((length for length, until in self.seq_len_phases if fraction < until), None)
        return StepData(mask_prob=interpolate(self.mask_schedule, start, self.mask_prob, fraction), seq_len=seq_len)


def cut_samples(flat: np.ndarray, lengths: np.ndarray, seq_len: int, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples (back to back in `flat`) longer than `seq_len` cut to their first `seq_len` tokens, the last of
    which becomes [SEP], as a sample of that length would end."""
    if len(lengths) == 0 or int(lengths.max()) <= seq_len:
        return flat, lengths
    starts = np.cumsum(lengths) - lengths
    kept = np.minimum(lengths, seq_len)
    position = np.arange(len(flat)) - np.repeat(starts, lengths)
    cut = flat[position < np.repeat(kept, lengths)]
    ends = np.cumsum(kept) - 1
    cut[ends[lengths > seq_len]] = sep_id
    return cut, kept
