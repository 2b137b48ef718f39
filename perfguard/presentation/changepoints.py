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

The search itself is ruptures' PELT (`Pelt(model="l2", min_size, jump=1)`) re-stated over
cumulative sums (`pelt_l2`): ruptures evaluates each segment's cost in Python on a slice and
copies a dict per candidate, which takes about 3 s for one series of 1,000 reports, and a
published site searches a few hundred such series. `pelt_l2` makes the same decisions
(the same candidates, order, ties and pruning; tests/test_history.py compares the two on
random series) in O(1) per segment cost.

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
    bounds = [0, *pelt_l2(smooth, penalty, min_size)]  # the last bound is n
    changes = []
    for left, cut, right in zip(bounds[:-2], bounds[1:-1], bounds[2:], strict=True):
        before = float(np.median(values[left:cut]))
        after = float(np.median(values[cut:right]))
        if before and abs(after / before - 1.0) >= min_ratio:
            changes.append(Change(index=int(cut), before=before, after=after))
    return changes


def pelt_l2(signal: np.ndarray, pen: float, min_size: int) -> list[int]:
    """The breakpoints (ending with `len(signal)`) that `ruptures.Pelt(model="l2",
    min_size=min_size, jump=1).fit(signal).predict(pen)` returns, step for step: the same
    admissible points in the same order, the first of equal minima, and ruptures' pruning
    (including how it pairs admissible points with the sub-problems it could form)."""
    x = np.asarray(signal, dtype=float).reshape(-1)
    n = len(x)
    cs = np.concatenate([[0.0], np.cumsum(x)])
    cs2 = np.concatenate([[0.0], np.cumsum(x * x)])
    total = np.full(n + 1, np.nan)  # best penalized cost of [0, t); nan: no partition ends at t
    total[0] = 0.0
    previous = np.zeros(n + 1, dtype=np.int64)
    admissible = np.zeros(0, dtype=np.int64)
    for bkp in [k for k in range(n) if k >= min_size] + [n]:
        admissible = np.append(admissible, bkp - min_size)
        formed = admissible[~np.isnan(total[admissible])]
        s = cs[bkp] - cs[formed]
        cost = np.maximum(0.0, (cs2[bkp] - cs2[formed]) - s * s / (bkp - formed))
        values = total[formed] + cost + pen
        i = int(np.argmin(values))  # the first of equal minima, as min() in ruptures
        best = float(values[i])
        total[bkp], previous[bkp] = best, formed[i]
        # As ruptures: zip pairs admissible points with the sub-problems formed (a skipped
        # point shifts the pairing), keeping those within `pen` of the best.
        head = admissible[: len(values)]
        admissible = head[values[: len(head)] <= best + pen]
    bkps, t = [], n
    while t:
        bkps.append(int(t))
        t = int(previous[t])
    return sorted(bkps)
