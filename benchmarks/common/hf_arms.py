"""The Hugging Face side of the pre-training comparisons: training sets as the reference examples build them,
`BertForMaskedLM` of a bertforge preset, and `TrainerCallback`s for a wall-clock budget and a step-time
calibration (HF `Trainer` has neither)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from benchmarks.common.corpora import document_lines
from benchmarks.common.mlm import SEQ_LEN

MIN_TIMED_STEPS = 5  # a calibration times at least this many steps after its warm-up


def calibration_done(timed_steps: int, timed_seconds: float, seconds: float) -> bool:
    """The stop rule of both arms' calibrations (`StepTiming` here, bertforge's `CalibrationClock`), each over its
    own clock: `seconds` have passed after the warm-up and at least `MIN_TIMED_STEPS` steps were timed."""
    return timed_steps >= MIN_TIMED_STEPS and timed_seconds >= seconds


def hf_training_dataset(arm: str, documents: list[str], tokenizer: Any) -> Any:
    """The training set as each reference example builds it."""
    from itertools import chain

    from datasets import Dataset

    if arm in ("hf-padded", "hf-lines"):
        # Union/Flyte, Mosaic: one line = one sample, padded to max_length. run_mlm.py --line_by_line
        # without --pad_to_max_length: the same samples, which its collator pads to the batch's longest.
        padding = "max_length" if arm == "hf-padded" else False
        lines = Dataset.from_dict({"text": document_lines(documents)})
        return lines.map(lambda rows: tokenizer(rows["text"], padding=padding, truncation=True,
                                                max_length=SEQ_LEN), batched=True, remove_columns=["text"])

    def group_texts(examples: dict[str, list[Any]]) -> dict[str, list[Any]]:  # run_mlm.py's, verbatim
        concatenated_examples = {k: list(chain(*examples[k])) for k in examples.keys()}
        total_length = len(concatenated_examples[list(examples.keys())[0]])
        total_length = (total_length // SEQ_LEN) * SEQ_LEN
        return {k: [t[i: i + SEQ_LEN] for i in range(0, total_length, SEQ_LEN)]
                for k, t in concatenated_examples.items()}

    texts = Dataset.from_dict({"text": documents})
    tokenized = texts.map(lambda rows: tokenizer(rows["text"], return_special_tokens_mask=True), batched=True,
                          remove_columns=["text"])
    return tokenized.map(group_texts, batched=True)


def hf_masked_lm(tokenizer: Any, preset: str) -> Any:
    """`BertForMaskedLM` of the preset's shape and HF's default dropout (0.1), as `pretrain_vs_hf.run_hf` builds it."""
    from transformers import BertConfig, BertForMaskedLM

    from bertforge.models import get_preset

    geometry = get_preset(preset)
    return BertForMaskedLM(BertConfig(
        vocab_size=len(tokenizer), hidden_size=geometry.hidden_size, num_hidden_layers=geometry.num_layers,
        num_attention_heads=geometry.num_heads, intermediate_size=geometry.intermediate_size,
        max_position_embeddings=geometry.max_position_embeddings, pad_token_id=tokenizer.pad_token_id,
        attn_implementation="sdpa"))


class BudgetClock(TrainerCallback):
    """Stops HF `Trainer` once `budget_seconds` of training have passed, and calls `export(model, seconds,
    step)` (keeping what it returns in `exports`) as the clock passes each of `marks` (seconds).

    The clock starts at `on_train_begin` and is paused while exporting, as bertforge's elapsed time leaves
    its checkpoints and exports out; `stopped_at` is its reading when training ended.
    """

    def __init__(self, budget_seconds: float, marks: tuple[float, ...] = (),
                 export: Callable[[Any, float, int], dict[str, Any]] | None = None) -> None:
        self.budget_seconds = budget_seconds
        self.pending_marks = sorted(mark for mark in marks if mark < budget_seconds)
        self.export = export
        self.exports: list[dict[str, Any]] = []
        self.started = self.paused = 0.0
        self.stopped_at: float | None = None

    def elapsed(self) -> float:
        return time.perf_counter() - self.started - self.paused

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started, self.paused = time.perf_counter(), 0.0

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        while self.pending_marks and self.elapsed() >= self.pending_marks[0]:
            self.pending_marks.pop(0)
            if self.export is not None:
                pause_began = time.perf_counter()
                self.exports.append(self.export(model, self.elapsed(), state.global_step))
                self.paused += time.perf_counter() - pause_began
        if self.elapsed() >= self.budget_seconds:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.stopped_at = self.elapsed()


class StepTiming(TrainerCallback):
    """HF's arms' calibration: times `Trainer`'s steps and stops it by `calibration_done`'s rule over their start
    times."""

    def __init__(self, seconds: float, warmup: int) -> None:
        self.seconds, self.warmup = seconds, warmup
        self.starts: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.starts.append(time.perf_counter())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.calibrated():
            control.should_training_stop = True

    def calibrated(self) -> bool:
        """Whether the steps begun so far are enough, by `calibration_done`'s rule over their start times."""
        timed = len(self.starts) - 1 - self.warmup
        if timed < 0:  # the warm-up is not over: there is no start to time from yet
            return False
        return calibration_done(timed, self.starts[-1] - self.starts[self.warmup], self.seconds)

    def seconds_per_step(self) -> float:
        """Between the starts of the first step after warm-up and of the last step."""
        return (self.starts[-1] - self.starts[self.warmup]) / (len(self.starts) - 1 - self.warmup)
