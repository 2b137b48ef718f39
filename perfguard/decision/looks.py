"""When the relative check looks at its blocks, and the level each look tests at.

The check looks after a fixed, roughly geometric schedule of block counts
(`look_points`), and each look tests at the level that keeps the chance of noise failing
a metric at some look within the check's alpha (`alpha_per_look`, found by simulating
A/A checks through the relative check's own statistic).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from perfguard.decision.estimate import PAIRED_TRIM
from perfguard.errors import PerfguardError

LOOK_SCHEDULE = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Block counts at which the verdicts are looked at: roughly geometric, so that the
number of looks, and with it the price per look (`alpha_per_look`), grows with the log of the
blocks, while an easy verdict is still seen after the first two pairs."""


def look_points(min_blocks: int, max_blocks: int) -> tuple[int, ...]:
    """The block counts at which verdicts are looked at: the minimum, the schedule's
    counts in between, and the maximum."""
    if min_blocks < 2:
        raise PerfguardError("--min-blocks must be at least 2 (a spread needs two blocks)")
    if max_blocks < min_blocks:
        raise PerfguardError("--max-blocks must be at least --min-blocks")
    inner = {n for n in LOOK_SCHEDULE if min_blocks < n < max_blocks}
    return tuple(sorted({min_blocks, *inner, max_blocks}))


LOOK_SIMULATIONS = 100_000
"""A/A checks simulated to find the level per look (`alpha_per_look`): the Monte Carlo
error of a 1 % family-wise rate is then 0.03 percentage points (one standard error)."""


def alpha_per_look(alpha: float, looks: Sequence[int], trim: float = PAIRED_TRIM) -> float:
    """The level each look tests at, so that noise alone fails a metric at some look with
    probability at most `alpha`.

    Found by simulating `LOOK_SIMULATIONS` A/A checks of normal blocks through the same
    statistic as `estimate.paired_estimate` (Yuen's trimmed mean and its t on `h - 1` degrees of
    freedom at each look), with a fixed seed so that a schedule always gets the same
    level: the largest level `a` with `P(some scheduled look crosses at a) + a <= alpha`,
    the `+ a` paying (Bonferroni) for the look a budget stop may add between two
    scheduled ones. One-sided: only a slowdown fails a check.

    Why not plain Bonferroni, `alpha / (K + 1)`: it assumes each look's test holds its
    level, and Yuen's does not on a handful of blocks: in that simulation each of the
    default looks (4, 6, 8, 12, 16, 24 blocks) crossed its nominal 0.143 % 1.0-1.5 times
    as often, so the family reached 0.87 % + 0.14 % for the budget look, over `alpha`.
    The nested looks' correlation wins back most of it: the level is 0.137 %.
    """
    return _simulated_level(float(alpha), tuple(sorted(set(looks))), trim)


@functools.lru_cache(maxsize=16)
def _simulated_level(alpha: float, looks: tuple[int, ...], trim: float) -> float:
    import numpy as np
    from scipy.special import stdtr

    rng = np.random.default_rng(20261204)
    x = rng.standard_normal((LOOK_SIMULATIONS, looks[-1]))
    smallest_p = np.ones(LOOK_SIMULATIONS)
    for n in looks:
        g = math.floor(trim * n)
        h = n - 2 * g
        if h < 2:
            continue  # `paired_estimate` has no spread on fewer than two kept blocks
        ordered = np.sort(x[:, :n], axis=1)
        kept = ordered[:, g : n - g]
        winsorized = np.clip(ordered, kept[:, :1], kept[:, -1:])
        ss = ((winsorized - winsorized.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        t = kept.mean(axis=1) / np.sqrt(ss / (h * (h - 1)))
        smallest_p = np.minimum(smallest_p, stdtr(h - 1, -t))
    ordered_p = np.sort(smallest_p)
    # With a level `a` in (p[k-1], p[k]] exactly k checks cross (p < a): the best `a` for
    # each k is min(p[k], alpha - k / S), usable when it still lies above p[k-1].
    k = np.arange(LOOK_SIMULATIONS)
    best = np.minimum(ordered_p, alpha - k / LOOK_SIMULATIONS)
    usable = best > np.concatenate(([0.0], ordered_p[:-1]))
    return float(best[usable].max()) if usable.any() else 0.0
