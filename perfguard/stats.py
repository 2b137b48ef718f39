"""Sample statistics shared by the verdict, A/B and calibration code (scipy.stats).

Why medians: timings on a shared machine are right-skewed (a preempted run is slower,
never faster), so the mean chases outliers while the median stays put. Why a bootstrap
for the ratio of medians: the ratio is what users read ("10 % slower"), and its sampling
distribution has no closed form for small, skewed samples; resampling makes no normality
assumption. Why Mann-Whitney U: a rank test, robust to outliers, that asks the question
the gate needs ("are the new samples stochastically larger?") without assuming a shape.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as _st


@dataclass(frozen=True)
class Summary:
    """What a report keeps of a metric's samples."""

    n: int
    median: float
    mean: float
    stdev: float
    iqr: float
    min: float
    max: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def rel_iqr(self) -> float:
        """IQR as a fraction of the median: the noise figure quoted throughout perfguard."""
        return self.iqr / self.median if self.median else 0.0


def summarize(samples: Sequence[float]) -> Summary:
    if not samples:
        raise ValueError("no samples")
    xs = np.asarray(samples, dtype=float)
    q1, q3 = np.percentile(xs, [25, 75])
    return Summary(
        n=len(xs),
        median=float(np.median(xs)),
        mean=float(xs.mean()),
        stdev=float(xs.std(ddof=1)) if len(xs) > 1 else 0.0,
        iqr=float(q3 - q1),
        min=float(xs.min()),
        max=float(xs.max()),
    )


@dataclass(frozen=True)
class RatioEstimate:
    """median(new) / median(old) with a bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _median_ratio(old: np.ndarray, new: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(new, axis=axis) / np.median(old, axis=axis)


def ratio_of_medians(
    old: Sequence[float],
    new: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """Bootstrap (percentile) CI of median(new)/median(old), independent resampling.

    The percentile method is used rather than BCa because BCa's jackknife degenerates on
    the small, tied samples a CI gate sees (5-10 runs, identical microsecond readings).
    With fewer than two samples on a side the interval is the point itself.
    """
    a = np.asarray(old, dtype=float)
    b = np.asarray(new, dtype=float)
    point = float(np.median(b) / np.median(a)) if np.median(a) else math.inf
    if len(a) < 2 or len(b) < 2 or not math.isfinite(point):
        return RatioEstimate(point, point, point, confidence)
    res = _st.bootstrap(
        (a, b),
        _median_ratio,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        paired=False,
        rng=np.random.default_rng(seed),
    )
    low, high = res.confidence_interval
    return RatioEstimate(point, float(low), float(high), confidence)


def slower_p_value(old: Sequence[float], new: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value for "new is stochastically larger than old".

    1.0 when either side has no samples; with all values tied the test has no power and
    scipy returns 1.0 or NaN, which is mapped to 1.0 (no evidence of a slowdown).
    """
    if len(old) == 0 or len(new) == 0:
        return 1.0
    with np.errstate(all="ignore"):
        p = _st.mannwhitneyu(new, old, alternative="greater", method="auto").pvalue
    return 1.0 if not math.isfinite(p) else float(p)


def two_sided_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) == 0 or len(b) == 0:
        return 1.0
    with np.errstate(all="ignore"):
        p = _st.mannwhitneyu(a, b, alternative="two-sided", method="auto").pvalue
    return 1.0 if not math.isfinite(p) else float(p)


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))
