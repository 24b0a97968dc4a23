"""Statistics as the reports print them."""

from __future__ import annotations

import math
import statistics


def mean_std(values: list[float], scale: float = 1.0, digits: int = 4) -> str:
    """`mean ± std` of `values` times `scale`, `digits` decimals; one value alone, without a spread."""
    if not values:  # e.g. no downstream fine-tunes (`--downstream-seeds 0`)
        return "—"
    mean = f"{scale * statistics.fmean(values):.{digits}f}"
    return f"{mean} ± {scale * statistics.stdev(values):.{digits}f}" if len(values) > 1 else mean


def welch_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% confidence interval (Welch's t), in points (×100)."""
    from scipy import stats

    difference = statistics.mean(a) - statistics.mean(b)
    if len(a) < 2 or len(b) < 2:
        return 100 * difference, math.nan, math.nan
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return 100 * difference, 100 * difference, 100 * difference
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = stats.t.ppf(0.975, df) * se
    return 100 * difference, 100 * (difference - half), 100 * (difference + half)


def accuracy_standard_error(accuracy: float, masked_tokens: int) -> float:
    """The binomial standard error of an MLM accuracy measured on `masked_tokens` masks: how far one model's accuracy
    moves from one draw of validation text of that size to another (0.0044 at 0.175 on 7,474 masks)."""
    return math.sqrt(accuracy * (1 - accuracy) / masked_tokens)
