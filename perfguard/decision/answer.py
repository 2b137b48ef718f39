"""The rule of a timed figure and the answer it gives: *same*, *slower* or *can't tell*.

A regression test alone says "slower" or "not shown slower", and "not shown" is what a
noisy runner says about every change. So each timed figure also gets an equivalence
statement (Schuirmann's one-sided test, the non-inferiority half of TOST: only a
slowdown can fail a check) and the size of the slowdown the check could have caught:

- **slower**: the regression rule rejected (`perfguard.decision.verdict`: the median over
  its band and the one-sided lower bound on median/baseline above 1, at the gate's level).
- **same**: the one-sided upper bound on median/baseline, at `SAME_ALPHA`, lies inside
  the minimum effect (`margin`): a slowdown of that size would have been seen. A figure
  credibly faster than its baseline is **faster** (the same answer for the gate: not
  slower). The relative check states it two-sided, at its own level: the interval lies
  within +-margin (`Criteria.two_sided`).
- **can't tell**: neither. The figure carries the smallest slowdown the check could have
  caught (`detectable`) and the margin it would take to call it the same (`needs`).
- **below resolution**: not slower, on a runner too noisy for this figure's minimum
  effect (`perfguard.decision.resolution`): neither *same* nor a reason to measure more.

Work counters and the output are exact: they are *same* or *slower*, never can't tell.

Every interval on a ratio is `bound`'s: both checks, the futility stop and a baseline
diff take their bounds from it, and both checks split their level over the per-step
figures with `step_level`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from perfguard.decision.stats import t_quantile
from perfguard.metrics import metric_class

SAME = "same"
FASTER = "faster"
SLOWER = "slower"
CANT_TELL = "cant_tell"
UNRESOLVED = "unresolved"
"""Not slower, and the runner cannot resolve the figure's minimum effect: the check
decides on it only whether it is slower (`perfguard.decision.resolution`)."""
ANSWERS = (SLOWER, CANT_TELL, UNRESOLVED, SAME, FASTER)
"""Worst first. A case's answer is its worst figure's, with faster counted as same."""

LABELS = {
    SAME: "same",
    FASTER: "faster",
    SLOWER: "slower",
    CANT_TELL: "can't tell",
    UNRESOLVED: "below resolution",
}

SAME_ALPHA = 0.05
"""The level of the equivalence statement: the chance of calling a figure *same* when it
is in truth slower by exactly the margin, at one look. 5 % one-sided is Schuirmann's
(a 90 % two-sided interval). The gate looks after each process, so for code slower by
exactly the margin the rate over a check is higher; for code slower by twice the margin
or more it is negligible (docs/verdicts.md, held-out figures)."""

SAME_PROCESSES = 3
"""A stored check says *same* only from 3 processes of its own (where the baseline has
several): the interval of one process borrows the baseline's spread, and a check that
stops the first time one process reads low says *same* far more often than 5 % of the
time when the code is slower (optional stopping). On simulated runners with 10 % and
20 % between-process spread (`benchmarks/answers.py`, docs/verdicts.md) one process
called +5 % *same* in 10-13 % of checks."""

SAME_PRECISION = 3.0
"""*Same* also needs a check precise enough to have caught a slowdown of this many times
the minimum effect (`detectable` at most 3 x the margin): an interval wide enough to
miss +10 % says little about +3 %, and on simulated runners with 10-20 % spread the
equivalence bound alone called +10 % *same* in 3-7 % of checks (its t-interval does not
hold for a runner whose processes sometimes run 2x slow). On a quiet runner the check
catches 6-7 % on the 3 % figures, well inside 9 % (docs/verdicts.md)."""

POWER = 0.8
"""`detectable` is the smallest slowdown the regression rule catches with this
probability at the check's noise: the textbook 80 % of a power analysis."""


@dataclass(frozen=True)
class Answer:
    """One timed figure's answer, with the two sizes that explain it.

    `margin`: the minimum effect *same* is stated within (a ratio minus 1).
    `high`: the upper bound on the ratio *same* was judged by (`Criteria.within`).
    `detectable`: the smallest slowdown (ratio - 1) the regression rule catches with
    `POWER` at this noise; None when the noise is unknown.
    `needs`: the margin that would have made the figure *same* (high - 1), for can't tell.
    `resolution`: for a figure below resolution, the smallest slowdown a check against
    its baseline could catch on this runner (`perfguard.decision.resolution`).
    """

    answer: str
    margin: float
    high: float | None
    detectable: float | None
    resolution: float | None = None

    @property
    def needs(self) -> float | None:
        return None if self.high is None else max(self.high - 1.0, 0.0)

    @property
    def label(self) -> str:
        return LABELS[self.answer]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"answer": self.answer, "margin": round(self.margin, 4)}
        if self.high is not None:
            out["high"] = round(self.high, 4)
        if self.detectable is not None:
            out["detectable"] = round(self.detectable, 4)
        if self.resolution is not None:
            out["resolution"] = round(self.resolution, 4)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        return cls(
            str(data["answer"]),
            float(data["margin"]),
            opt("high"),
            opt("detectable"),
            opt("resolution"),
        )


MAX_LOG_SPREAD = 50.0
"""The widest interval, in log units (a factor of e**50): a tiny `--alpha` with few
degrees of freedom gives a t quantile in the millions, and `exp` of it overflows. An
interval that wide says what it has to, that nothing is credible, without a crash."""


def bound(ratio: float, se: float, dof: int, alpha: float) -> tuple[float, float]:
    """The one-sided (1 - alpha) bounds (low, high) on a ratio whose log has standard
    error `se` on `dof` degrees of freedom (0: the normal quantile): `ratio` divided and
    multiplied by exp(t se), the exponent capped at `MAX_LOG_SPREAD`."""
    spread = math.exp(min(t_quantile(alpha, dof) * se, MAX_LOG_SPREAD))
    return ratio / spread, ratio * spread


def log_se(ratio: float, low: float, alpha: float, dof: int) -> float:
    """The log-scale standard error behind a one-sided (1 - alpha) lower bound `low`."""
    t = t_quantile(alpha, dof)
    return math.log(ratio / low) / t if t > 0 and low > 0 else 0.0


@dataclass(frozen=True)
class Criteria:
    """What a figure's answer is judged against.

    `alpha` and `threshold` are the regression rule's: its one-sided level and the ratio
    the point estimate must exceed (the band's bound over the baseline, or 1 + the
    minimum effect and the floor side by side). `margin` is the minimum effect *same* is
    stated within (a ratio minus 1). `two_sided`: *same* is the relative check's, the
    (1 - alpha) interval within [1 / (1 + margin), 1 + margin], or within +-`floor` (the
    timer floor over the base, linear); else the stored check's, the one-sided
    (1 - `SAME_ALPHA`) upper bound within 1 + margin.
    """

    alpha: float
    threshold: float
    margin: float
    two_sided: bool = False
    floor: float = 0.0

    @property
    def reach(self) -> float:
        """The smallest difference that matters: the margin, or the floor where larger."""
        return max(self.margin, self.floor)

    def within_floor(self, low: float, high: float) -> bool:
        """The interval lies within the floor: what moved is under the timer's floor."""
        return self.floor > 0 and max(high - 1.0, 1.0 - low) <= self.floor

    def inside(self, low: float, high: float) -> bool:
        """The two-sided statement of *same*: the interval within +-margin (or the floor)."""
        edge = 1.0 + self.margin
        return (low > 1.0 / edge and high < edge) or self.within_floor(low, high)

    def sides(self, ratio: float, low: float, high: float) -> tuple[bool, bool]:
        """Two-sided: (slower, faster). Slower: the ratio over the threshold and its lower
        bound over 1; faster: under 1 / (1 + margin) and by more than the floor, its
        upper bound under 1; neither where the interval lies within the floor."""
        if self.within_floor(low, high):
            return False, False
        slower = ratio > self.threshold and low > 1.0
        faster = ratio < 1.0 / (1.0 + self.margin) and 1.0 - ratio > self.floor and high < 1.0
        return slower, faster

    def within(self, ratio: float, se: float, dof: int, faster: bool) -> tuple[bool, float]:
        """Whether the figure is within the margin, and the upper bound that says so. A
        credibly faster figure's lower end is no reason to doubt it is not slower."""
        if not self.two_sided:
            high = bound(ratio, se, dof, SAME_ALPHA)[1]
            return high <= 1.0 + self.margin, high
        low, high = bound(ratio, se, dof, self.alpha)
        return faster or self.inside(low, high), high


def assess(
    ratio: float,
    se: float,
    dof: int,
    criteria: Criteria,
    *,
    slower: bool,
    faster: bool = False,
    enough_processes: bool = True,
) -> Answer:
    """The answer on a figure read at `ratio` (median over baseline, or head over base)
    with log-scale standard error `se` on `dof` degrees of freedom, under `criteria`.

    `slower` / `faster` are what the regression rule decided. `detectable`: `catches`.
    `dof` is the degrees of freedom of `se` (`stats.Noise.dof`: a session term in it
    counts as known, Welch-Satterthwaite). `enough_processes`: the check has the
    processes a *same* needs (`SAME_PROCESSES`); without them the answer is at best
    can't tell, and the gate measures more. Nor is it *same* when the check could not
    have caught a slowdown of `SAME_PRECISION` times the margin. With no spread known
    (`se` 0) the band alone decides, and sameness is the point's.
    """
    within, high = criteria.within(ratio, se, dof, faster)
    detectable = catches(se, dof, alpha=criteria.alpha, threshold=criteria.threshold)
    precise = detectable is None or detectable <= SAME_PRECISION * criteria.reach
    if slower:
        answer = SLOWER
    elif within and enough_processes and precise:
        answer = FASTER if faster else SAME
    else:
        answer = CANT_TELL
    return Answer(answer, criteria.reach, high, detectable)


def catches(se: float, dof: int, *, alpha: float, threshold: float) -> float | None:
    """The smallest slowdown (ratio - 1) the regression rule catches with `POWER` at a
    log-scale standard error `se` on `dof` degrees of freedom: the rule rejects when the
    ratio is over both `threshold` and its own spread (`bound` at `alpha`), so with
    probability `POWER` when the true ratio is that times exp(z_power se). None when the
    noise is unknown (`se` 0)."""
    if se <= 0:
        return None
    reach = max(threshold, bound(1.0, se, dof, alpha)[1])
    return min(bound(reach, se, 0, 1.0 - POWER)[1], math.exp(MAX_LOG_SPREAD)) - 1.0


def step_level(metric: str, alpha: float, steps: int) -> float:
    """The level `metric` is judged at in a case that judges `steps` per-step metrics:
    the steps are one family and share `alpha` (Bonferroni, each at alpha / steps), the
    other figures take it whole: twenty steps at 1 % each would be twenty chances for
    noise to fail a case (docs/relative.md)."""
    if metric_class(metric) != "denoise_step" or steps < 2:
        return alpha
    return alpha / steps


def step_count(metrics: Iterable[str]) -> int:
    """How many of `metrics` are per-step figures (the family `step_level` splits over)."""
    return sum(1 for name in metrics if metric_class(name) == "denoise_step")


def below_resolution(answer: Answer, resolution: float | None) -> Answer:
    """`answer` on a figure the runner cannot resolve (`resolution`: what it could catch):
    slower stays slower, anything else is `UNRESOLVED` (never *same* without the
    precision the card asks for)."""
    kind = SLOWER if answer.answer == SLOWER else UNRESOLVED
    return Answer(kind, answer.margin, answer.high, answer.detectable, resolution)


def exact(grew: bool) -> Answer:
    """A work counter's or the output's answer: a fact, never can't tell."""
    return Answer(SLOWER if grew else SAME, 0.0, None, None)


def worst(answers: list[str]) -> str | None:
    """The case's answer from its figures' (faster counts as same); None for none."""
    if not answers:
        return None
    found = min(ANSWERS.index(a) for a in answers)
    return SAME if ANSWERS[found] == FASTER else ANSWERS[found]
