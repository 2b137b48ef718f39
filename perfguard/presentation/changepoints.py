"""Change points in a metric's history: where did performance step, by how much, which way.

A gate compares one run with one baseline, so a slow drift passes every gate; a history
of medians over commits shows it. Detection is PELT (`ruptures`) on the series, made
robust in three ways:

- a running median of width 3 first, which removes an isolated spike (one bad runner,
  one noisy neighbour) while keeping the edge of a real step where it is;
- a noise-aware penalty, `beta * sigma^2 * log(n)`, with sigma estimated from the median
  absolute first difference (robust to the steps themselves): the louder the machine, the
  bigger a shift must be to count. `beta = 8` was chosen in a one-off study on synthetic
  series of 40 points at 3 % noise (200 trials each; not kept as a script, so redo it
  before changing beta): a +10 % step found at the right commit 97.5 % of the time, no
  change point on flat series or on series with one +80 % spike (beta 4: 3 % and 1 %
  false changes; beta 12: 91 % found);
- a minimum segment length, so a new level must hold for several commits.

A change is reported only when its two neighbouring segments differ by at least
`min_ratio` (default 2 %), so statistically clear but practically irrelevant shifts stay out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Change:
    """A step between two segments; `index` is the first point of the new level."""

    index: int
    before: float
    after: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else math.inf

    @property
    def direction(self) -> str:
        """For timings and memory, higher is worse."""
        return "slower" if self.after > self.before else "faster"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "direction": self.direction}


def robust_sigma(values: np.ndarray) -> float:
    """Noise level from first differences: MAD(diff) * 1.4826 / sqrt(2).

    Differencing removes the level, so steps contribute only one large difference each
    and the median ignores them.
    """
    if len(values) < 3:
        return 0.0
    diffs = np.diff(values)
    mad = float(np.median(np.abs(diffs - np.median(diffs))))
    return 1.4826 * mad / math.sqrt(2.0)


def despike(values: np.ndarray) -> np.ndarray:
    """Running median of width 3 (edges kept): removes single-point spikes, keeps steps."""
    if len(values) < 3:
        return values.copy()
    out = values.copy()
    stacked = np.stack([values[:-2], values[1:-1], values[2:]])
    out[1:-1] = np.median(stacked, axis=0)
    return out


def detect(
    series: Sequence[float],
    *,
    min_size: int = 3,
    beta: float = 8.0,
    min_ratio: float = 0.02,
) -> list[Change]:
    """Change points of `series` (ordered by commit); see the module docstring."""
    try:
        import ruptures as rpt
    except ImportError as exc:
        from perfguard.errors import PerfguardError

        raise PerfguardError(
            "change-point detection needs ruptures: pip install 'perfguard[history]'"
        ) from exc

    values = np.asarray(series, dtype=float)
    n = len(values)
    if n < 2 * min_size:
        return []
    smooth = despike(values)
    # Noise from the raw series: the running median shrinks and correlates the noise, so
    # estimating on it would under-state sigma and over-segment.
    sigma = robust_sigma(values)
    # A floor on sigma: a perfectly flat series (identical medians) would otherwise make
    # every rounding-level wiggle a change point.
    floor = 1e-3 * float(np.median(np.abs(values))) or 1e-12
    sigma = max(sigma, floor)
    penalty = beta * sigma**2 * math.log(n)
    algo = rpt.Pelt(model="l2", min_size=min_size, jump=1).fit(smooth.reshape(-1, 1))
    bounds = [0, *algo.predict(pen=penalty)]  # the last bound is n
    changes = []
    for left, cut, right in zip(bounds[:-2], bounds[1:-1], bounds[2:], strict=True):
        before = float(np.median(values[left:cut]))
        after = float(np.median(values[cut:right]))
        if before and abs(after / before - 1.0) >= min_ratio:
            changes.append(Change(index=int(cut), before=before, after=after))
    return changes
