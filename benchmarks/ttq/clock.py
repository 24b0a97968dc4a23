"""bertforge's side of the wall clock: `on_step_end` hooks that export the model along the run's own clock and that
end a calibration run, and the curve points the exports become. (HF's side: `benchmarks.common.hf_arms`.)

Both read `TrainingState.elapsed_seconds`, the clock bertforge's time budget and schedule follow, and run outside the
span it counts, so exporting costs a run no budget."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from benchmarks.common.hf_arms import calibration_done
from benchmarks.ttq.settings import EXPORT_FRACTIONS


class ExportMarks:
    """Exports the model in HF format as the run's clock passes each of `marks` (seconds); `exports` holds their
    curve points."""

    def __init__(self, marks: tuple[float, ...], exports_dir: Path) -> None:
        self.pending_marks = sorted(marks)
        self.exports_dir = exports_dir
        self.exports: list[dict[str, Any]] = []

    def __call__(self, trainer: Any, state: Any) -> None:
        while self.pending_marks and state.elapsed_seconds >= self.pending_marks[0]:
            self.pending_marks.pop(0)
            self.exports.append(self.export(trainer, state))

    def export(self, trainer: Any, state: Any) -> dict[str, Any]:
        model = trainer.raw_model
        if trainer.ema is not None:  # what final/ would hold if the run stopped here
            model = copy.deepcopy(trainer.raw_model)
            trainer.ema.copy_to(model)
        directory = self.exports_dir / f"step-{state.step:08d}"
        trainer.task.save_final(model, directory)
        return curve_point(state.elapsed_seconds, state.step, state.consumed_tokens, directory)


class CalibrationClock:
    """Arm d's calibration: ends the run by `calibration_done`'s rule over the run's own clock."""

    def __init__(self, seconds: float, warmup: int) -> None:
        self.seconds, self.warmup = seconds, warmup
        self.warm_elapsed = 0.0  # the clock when the warm-up steps were done

    def __call__(self, trainer: Any, state: Any) -> bool:
        if state.step == self.warmup:
            self.warm_elapsed = state.elapsed_seconds
        return calibration_done(state.step - self.warmup, state.elapsed_seconds - self.warm_elapsed, self.seconds)

    def seconds_per_step(self, state: Any) -> float:
        """Over the steps after warm-up, by the run's own clock."""
        return (state.elapsed_seconds - self.warm_elapsed) / (state.step - self.warmup)


def curve_point(seconds: float, step: int, tokens: int, model_dir: Path) -> dict[str, Any]:
    return {"minutes": seconds / 60, "step": step, "tokens": tokens, "model_dir": str(model_dir)}


def curve_points(exports: list[dict[str, Any]], final: dict[str, Any]) -> list[dict[str, Any]]:
    """The exports, then the final model; an export taken at the last step (a mark passed on it) is that model."""
    return [point for point in exports if point["step"] < final["step"]] + [final]


def export_marks(budget_minutes: float) -> tuple[float, ...]:
    return tuple(fraction * budget_minutes * 60 for fraction in EXPORT_FRACTIONS)
