"""What changed between two figures: `gen-baselines --tighten` and `baselines diff`.

A baseline refresh is a decision like a verdict: a figure may be lowered only on a
credible improvement (`credibly_lower`), and a diff calls a change `slower` / `faster`
only under the gate's own two conditions, a credible interval and the metric's minimum
effect (`judge_change`). The files themselves are read and written by
`perfguard.storage.baseline`; this module only compares what they hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision.answer import bound
from perfguard.decision.normalize import at_speed_of
from perfguard.decision.stats import Summary, log_ratio_noise, log_spread
from perfguard.decision.tolerances import min_effect
from perfguard.metrics import metric_sort_key

if TYPE_CHECKING:
    from perfguard.decision.work_counts import WorkCounts
    from perfguard.storage.baseline import Baseline

TIGHTEN_ALPHA = 0.01
"""`--tighten` lowers a figure only when the improvement is credible at this level."""


def credibly_lower(before: Summary, after: Summary, alpha: float = TIGHTEN_ALPHA) -> bool:
    """Whether `after` is faster than `before` beyond noise (one-sided, at `alpha`).

    The upper confidence bound of after/before must be below 1, with the same noise
    model and t-quantile as the gate's credibility test. Without any spread to go on
    (single samples, or none left at the stored 3 decimals) the figures alone decide,
    as the band alone decides a verdict in that case.
    """
    if before.median <= 0 or after.median <= 0:
        return False
    noise = log_ratio_noise(before, after)
    if noise.se <= 0:  # no spread at the stored precision (or one sample): figures decide
        return after.median < before.median
    return bound(after.median / before.median, noise.se, noise.dof, alpha)[1] < 1.0


DIFF_CONFIDENCE = 0.99
"""The two-sided confidence of the interval `baselines diff` puts on each new / old ratio.

99 %, split over both tails: a reviewer's confidence, not the gate's (the stored check
tests at 0.1 % one-sided, `comparison.STORED_ALPHA`, because of the offsets between
sessions). A baseline refresh can move a figure either way, and a reviewer should hear
about a faster figure (it tightens the gate) as readily as about a slower one (it
loosens it).
"""

SLOWER, FASTER, SMALL, NOISE, UNKNOWN = "slower", "faster", "small", "noise", "unknown"
ADDED, REMOVED = "added", "removed"
CREDIBLE_CHANGES = (SLOWER, FASTER)


def judge_change(
    metric: str, old: Summary, new: Summary
) -> tuple[float | None, float | None, str] | None:
    """The DIFF_CONFIDENCE interval of new / old and what it says, or None without a ratio.

    The interval is the gate's (`stats.log_ratio_noise`: both sides' within-process
    spread, and the spread of per-process medians where either side has them), two-sided.
    The change is `slower` / `faster` when the interval excludes 1 and the point
    estimate is at least the metric's minimum effect (`tolerances.min_effect`) away from
    it, the same two conditions a regression needs; `small` when credible but below the
    minimum effect; `noise` when the interval contains 1; `unknown` when neither side
    has a spread (an imported single figure): then only the ratio can be read. A spread
    that is known to be zero (a peak memory that every run repeats) is no noise at all:
    the interval is the ratio itself.
    """
    if old.median <= 0 or new.median <= 0:
        return None
    ratio = new.median / old.median
    se = log_ratio_noise(old, new).se
    if se <= 0 and log_spread(old) is None and log_spread(new) is None:
        return None, None, UNKNOWN
    low, high = bound(ratio, se, 0, (1.0 - DIFF_CONFIDENCE) / 2)  # two-sided, normal
    if low <= 1.0 <= high:
        change = NOISE
    elif abs(math.log(ratio)) < math.log1p(min_effect(metric)):
        change = SMALL
    else:
        change = SLOWER if ratio > 1 else FASTER
    return low, high, change


@dataclass(frozen=True)
class DiffRow:
    """One difference between two baselines: a metric's median before and after.

    `low` / `high` bound the ratio at `DIFF_CONFIDENCE`; `change` says whether it is
    credible (`judge_change`), or that the metric was `added` or `removed`.
    """

    case_id: str
    metric: str
    old: float | None
    new: float | None
    low: float | None = None
    high: float | None = None
    change: str | None = None

    @property
    def ratio(self) -> float | None:
        if self.old is None or self.new is None or self.old == 0:
            return None
        return self.new / self.old

    @property
    def credible(self) -> bool:
        return self.change in CREDIBLE_CHANGES

    def to_json(self) -> dict[str, Any]:
        ratio = self.ratio

        def r4(v: float | None) -> float | None:
            return None if v is None else round(v, 4)

        return {
            "case": self.case_id,
            "metric": self.metric,
            "old": self.old,
            "new": self.new,
            "ratio": r4(ratio),
            "ratio_low": r4(self.low),
            "ratio_high": r4(self.high),
            "change": self.change,
            "credible": self.credible,
        }


@dataclass(frozen=True)
class BaselineDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[DiffRow, ...]
    tolerance_changes: tuple[str, ...]
    confidence: float = DIFF_CONFIDENCE

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed or self.tolerance_changes)

    def counts(self) -> dict[str, int]:
        """How many changed rows say each `change` (every key present, zero or not)."""
        keys = (SLOWER, FASTER, SMALL, NOISE, UNKNOWN, ADDED, REMOVED)
        out = dict.fromkeys(keys, 0)
        for row in self.changed:
            if row.change in out:
                out[row.change] += 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": [r.to_json() for r in self.changed],
            "tolerance_changes": list(self.tolerance_changes),
            "confidence": self.confidence,
            "counts": self.counts(),
        }


def diff(older: Baseline, newer: Baseline) -> BaselineDiff:
    """Scenarios added and removed, medians that changed (and how credibly), tolerances.

    Two normalized scenarios are compared at one runner speed: `older`'s timed figures are
    rescaled to `newer`'s reference median (`perfguard.decision.normalize.at_speed_of`), so
    a regeneration on a faster or slower runner does not read as a change of the code.
    """
    added = tuple(sorted(set(newer.scenarios) - set(older.scenarios)))
    removed = tuple(sorted(set(older.scenarios) - set(newer.scenarios)))
    rows: list[DiffRow] = []
    for cid in sorted(set(older.scenarios) & set(newer.scenarios)):
        ma = at_speed_of(older.scenarios[cid], newer.scenarios[cid]).metrics
        mb = newer.scenarios[cid].metrics
        for metric in sorted(set(ma) | set(mb), key=metric_sort_key):
            sa, sb = ma.get(metric), mb.get(metric)
            old = None if sa is None else sa.median
            new = None if sb is None else sb.median
            if old == new:
                continue
            if sa is None or sb is None:
                rows.append(DiffRow(cid, metric, old, new, change=ADDED if sa is None else REMOVED))
                continue
            judged = judge_change(metric, sa, sb)
            if judged is None:
                rows.append(DiffRow(cid, metric, old, new, change=UNKNOWN))
            else:
                rows.append(DiffRow(cid, metric, old, new, *judged))
    for cid in sorted(set(older.scenarios) & set(newer.scenarios)):
        rows += _work_rows(cid, older.scenarios[cid].work, newer.scenarios[cid].work)
    tol: list[str] = []
    for name in sorted(set(older.profiles) | set(newer.profiles)):
        pa = older.profiles[name].to_json() if name in older.profiles else None
        pb = newer.profiles[name].to_json() if name in newer.profiles else None
        if pa != pb:
            tol.append(name)
    if older.improvement_threshold != newer.improvement_threshold:
        tol.append("improvement_threshold")
    for cid in sorted(set(older.scenarios) & set(newer.scenarios)):
        if older.scenarios[cid].tolerance_overrides != newer.scenarios[cid].tolerance_overrides:
            tol.append(f"scenarios.{cid}.tolerance_overrides")
    return BaselineDiff(added, removed, tuple(rows), tuple(tol))


def _work_rows(cid: str, a: WorkCounts | None, b: WorkCounts | None) -> list[DiffRow]:
    """The work counters that differ: exact, so any change is credible (`slower` = more
    work, `faster` = less); `unknown` where the two were counted under another torch,
    device type or dtype (their counts mean other ops)."""
    if a is None or b is None:
        return []
    same_context = dict(a.context) == dict(b.context)
    rows = []
    for metric in sorted(set(a.counters) | set(b.counters), key=metric_sort_key):
        va, vb = a.counters.get(metric), b.counters.get(metric)
        if va == vb:
            continue
        old = None if va is None else float(va[1])
        new = None if vb is None else float(vb[1])
        if va is None or vb is None:
            change = ADDED if va is None else REMOVED
        elif not same_context:
            change = UNKNOWN
        else:
            change = SLOWER if vb[1] > va[1] else FASTER
        rows.append(DiffRow(cid, metric, old, new, change=change))
    return rows
