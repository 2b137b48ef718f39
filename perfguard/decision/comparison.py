"""One metric's median against its baseline's: the rule that says how much evidence a
verdict needs, and the interval, bound and stopping test it applies
(`perfguard.decision.verdict` names the verdict and says why)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfguard.decision.answer import bound
from perfguard.decision.stats import (
    MEDIAN_SE_FACTOR,
    Noise,
    Summary,
    log_ratio_noise,
    log_spread,
)
from perfguard.decision.tolerances import Band

# ---- the evidence a regression needs -------------------------------------------------------

STORED_ALPHA = 0.001
"""The stored check's one-sided level, 0.1 %: a stored baseline is one session, met by every
check until it is regenerated, so its false alarms come together and the level is set by
those measured. Replayed on 428 kept checks (`benchmarks/rejudge.py`), 0.1 % failed 2 of
143 A/A checks against 10 at 1 %, and caught +10 % in 32 of 36 against 35
(docs/measurements/2026-12-07-constants.md)."""

RELATIVE_ALPHA = 0.01
"""The relative check's level: base and head are measured in the same minutes, block by
mirrored block, so the session offset that a stored baseline carries cancels in the
pairs, and the level can stay at the nominal 1 % (docs/relative.md)."""

FUTILITY_ALPHA = 0.01
"""The futility stop's level (`Comparison.clear`): a case stops sampling once its median
could not cross its bound at this level. It only ever removes rejections, so it is set
for cost, not for false alarms: 1 %, the level the detection runs of docs/verdicts.md
sampled with. A step's stop takes it whole, not split over the per-step family as the
verdict's level is (`answer.step_level`)."""


@dataclass(frozen=True)
class Rule:
    """How much evidence a verdict needs, and which verdicts are flagged as borderline.

    `alpha` is the one-sided false-alarm rate of the credibility test: a median above
    its band is a regression only when the (1 - alpha) lower confidence bound of
    median/baseline is above 1. 0.1 % against a stored baseline (`STORED_ALPHA`), 1 %
    for a relative check (`RELATIVE_RULE`).

    `borderline` (1.2) is how close to the band a credible slowdown counts as
    borderline: its excess over the baseline is within 1.2x of the band's allowance, or
    above 1/1.2 of it while still inside. Such a verdict could flip with the next
    process's drift: the report flags it and shows its interval.
    """

    alpha: float = STORED_ALPHA
    borderline: float = 1.2

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), not {self.alpha}")
        if self.borderline < 1:
            raise ValueError(f"borderline must be >= 1, not {self.borderline}")


DEFAULT_RULE = Rule()
RELATIVE_RULE = Rule(alpha=RELATIVE_ALPHA)


# ---- one metric against its baseline ------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One metric's median `m` against its baseline's `b` (both > 0): the band's bound on
    `m` and the rule's interval [low, high] on m/b."""

    metric: str
    measured: Summary
    baseline: Summary
    band: Band
    rule: Rule
    noise: Noise
    low: float
    high: float

    @classmethod
    def of(
        cls,
        metric: str,
        measured: Summary,
        baseline: Summary,
        band: Band,
        rule: Rule,
        session_sd: float = 0.0,
    ) -> Comparison:
        """`session_sd`: the sd of one session's offset on this metric (`Profile.session_sd_of`)."""
        noise = log_ratio_noise(baseline, measured, session_sd)
        low, high = bound(measured.median / baseline.median, noise.se, noise.dof, rule.alpha)
        return cls(metric, measured, baseline, band, rule, noise, low, high)

    @property
    def m(self) -> float:
        return self.measured.median

    @property
    def b(self) -> float:
        return self.baseline.median

    @property
    def bound(self) -> float:
        return self.band.bound(self.b)

    @property
    def ratio(self) -> float:
        return self.m / self.b

    @property
    def over(self) -> bool:
        """The median is above the band's bound."""
        return self.m > self.bound

    @property
    def significant(self) -> bool:
        """Slower beyond noise: the interval's lower end is above 1."""
        return self.low > 1.0

    def borderline(self) -> bool:
        """A verdict the next process could flip: over the bound but not credibly (or by
        little, or on one process), or credibly slower but well within the bound."""
        allowance = self.bound - self.b
        excess = (self.m - self.b) / allowance if allowance > 0 else math.inf
        one_process = self.noise.processes_current == 1
        edge = self.rule.borderline
        return (self.over and (not self.significant or excess <= edge or one_process)) or (
            self.significant and not self.over and excess > 1.0 / edge
        )

    def clear(self) -> bool:
        """More runs of this process would not move the median across the bound.

        The test is on the median's own reach (`median_reach`: this process's standard
        error), not on the interval, which also holds the baseline's noise and the
        between-process spread that no further run can shrink: a stop waiting for the
        interval to clear a 3 % band never fired for unchanged code. Stopping on this is
        safe for the false-alarm rate: the gate only stops a case that is within its
        bounds, and a stop for futility removes rejections of the one final test, never
        adds one. So its level is its own (`FUTILITY_ALPHA`, or the rule's where that is
        looser): a stricter verdict need not cost unchanged code more runs.
        """
        m, b, limit = self.m, self.b, self.bound
        level = max(self.rule.alpha, FUTILITY_ALPHA)
        low, high = bound(m / b, self.noise.se, self.noise.dof, level)
        reach = median_reach(self.measured, self.baseline, level)
        return not (low * b <= limit < high * b) or m * reach <= limit or m / reach > limit


def median_reach(current: Summary, baseline: Summary | None, alpha: float) -> float:
    """How far (a factor >= 1) more runs of the process that measured `current` could
    still move its median: `bound` on its own standard error, one-sided at `alpha`.

    The futility stop of adaptive sampling asks this, not the verdict's interval: the
    interval also holds the baseline's noise and the between-process spread, which no
    number of further runs of this process can shrink, so a stop that waits for the
    interval to clear the bound waits for ever (unchanged code ran every case to
    `--max-repeats`). The per-sample noise is `current`'s (`log_spread`), else
    `baseline`'s; with neither known (one sample each: a memory figure, an exact count)
    the median cannot move and the reach is 1.
    """
    spread = log_spread(current)
    if spread is None and baseline is not None:
        spread = log_spread(baseline)
    if not spread or current.n < 1:
        return 1.0
    se = MEDIAN_SE_FACTOR * spread / math.sqrt(current.n)
    return bound(1.0, se, max(1, current.n - 1), alpha)[1]
