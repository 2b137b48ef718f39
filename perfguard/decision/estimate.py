"""The relative check's estimate of one metric: head/base from mirrored blocks.

Each block of the relative check runs a fresh base process and a fresh head process next
to each other, so the drift of the machine (frequency, neighbours, memory layout of that
moment) is common to both and cancels in the block's ratio, where pooled samples would
carry it as noise. The block, not the run, is the independent unit (as in Laaber et al.'s
RMIT and pyperf's process-level view). `paired_estimate` turns the blocks' log ratios
into a `PairedEstimate`, and its answer is the one rule's (`perfguard.decision.answer`).

A value type first: `perfguard.decision.paired` judges with it, a `MetricVerdict`
carries it into the report, so it sits below both (the verdict module must not import
the paired decision that is built on it).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfguard.decision.answer import Answer, Criteria, assess, bound, log_se

PAIRED_TRIM = 0.2
"""The share of blocks trimmed from each end before averaging the per-block log ratios (Yuen's
trimmed mean, winsorized variance): 20 %, none with fewer than 5 blocks. In a 24-block
check of the smoke cases 19 blocks read 1.02-1.12 and 5 read 0.64-1.98 (a contention
episode on one side); trimmed, those few stop moving the estimate and widening the
interval fourfold (docs/measurements/2026-12-07-constants.md)."""

SAME = "same"
DIFFERENT = "different"
UNKNOWN = "unknown"
"""Pinpoint's three words for the answer, as a report's `paired.decision` holds them."""


@dataclass(frozen=True)
class PairedEstimate:
    """head/base for one metric from per-block log ratios.

    `ratio` is the exponent of the blocks' trimmed mean log ratio, `se` its log-scale
    standard error on `dof` degrees of freedom (the blocks kept, less one), `low` /
    `high` its one-sided (1 - alpha) bounds (`answer.bound`). `min_effect` is the
    metric's minimum effect and `floor` the timer floor over the base's median: a
    difference must clear both (`margin`).
    """

    blocks: int
    ratio: float
    se: float
    dof: int
    low: float
    high: float
    alpha: float
    min_effect: float
    floor: float = 0.0
    reference_exponent: float | None = None
    """The share of the reference workload the blocks' runs were scaled by (normalized
    timing; `perfguard.decision.paired.reference_exponent`), None when compared raw."""
    recorded: str | None = None
    """The decision a report holds, for an estimate read back from one (`from_json`): its
    rounded figures are not what it was decided on."""

    @property
    def margin(self) -> float:
        return max(self.min_effect, self.floor)

    @property
    def criteria(self) -> Criteria:
        """The one rule's two-sided statement for this figure (`answer.Criteria`): over
        1 + the minimum effect and the floor, or within +-the minimum effect or the floor."""
        return Criteria(
            self.alpha, 1.0 + self.margin, self.min_effect, two_sided=True, floor=self.floor
        )

    @functools.cached_property
    def sides(self) -> tuple[bool, bool]:
        """(slower, faster) by the one rule's two-sided statement (`Criteria.sides`)."""
        return self.criteria.sides(self.ratio, self.low, self.high)

    @functools.cached_property
    def answer(self) -> Answer:
        """The figure's answer by the one rule (`answer.assess`)."""
        slower, faster = self.sides
        return assess(self.ratio, self.se, self.dof, self.criteria, slower=slower, faster=faster)

    @property
    def slower(self) -> bool:
        return self.sides[0]

    @property
    def decision(self) -> str:
        """Pinpoint's three words for what the blocks show (`different`: credibly slower or
        faster; `same`: the interval within the margin; else `unknown`), by the one rule's
        two-sided statement; a figure may stop measuring once it is not `unknown`. Its
        answer adds what a *same* answer needs besides (`answer.assess`: precision). Read
        back from a report, the decision the report holds."""
        if self.recorded is not None:
            return self.recorded
        if any(self.sides):
            return DIFFERENT
        return SAME if self.criteria.inside(self.low, self.high) else UNKNOWN

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "blocks": self.blocks,
            "decision": self.decision,
            "min_effect": self.min_effect,
            "alpha": round(self.alpha, 6),
        }
        if self.reference_exponent is not None:
            out["reference_exponent"] = round(self.reference_exponent, 3)
        return out

    @classmethod
    def from_json(cls, paired: dict[str, Any], metric: dict[str, Any]) -> PairedEstimate:
        """From a report: `paired`, the ratio and its bounds from `metric`, the standard
        error read off the lower bound and the floor off the band (its pad)."""
        exponent = paired.get("reference_exponent")
        blocks, alpha = int(paired["blocks"]), float(paired["alpha"])
        ratio, low = float(metric["ratio"]), float(metric["ratio_low"])
        dof = kept_blocks(blocks) - 1
        se = log_se(ratio, low, alpha, dof) if low > 0 else math.inf
        band, base = metric.get("band") or {}, (metric.get("baseline") or {}).get("median")
        pad = float(band.get("abs", 0.0))
        return cls(
            blocks=blocks,
            ratio=ratio,
            se=se,
            dof=dof,
            low=low,
            high=float(metric["ratio_high"]),
            alpha=alpha,
            min_effect=float(paired["min_effect"]),
            floor=pad / float(base) if base and pad > 0 else 0.0,
            reference_exponent=None if exponent is None else float(exponent),
            recorded=str(paired["decision"]),
        )


def kept_blocks(blocks: int, trim: float = PAIRED_TRIM) -> int:
    """The blocks left of `blocks` once `trim` of them is cut from each end."""
    return blocks - 2 * math.floor(trim * blocks)


def paired_estimate(
    log_ratios: Sequence[float], effect: float, alpha: float, trim: float = PAIRED_TRIM
) -> PairedEstimate:
    """The paired estimate of `log_ratios` (one `log(head / base)` per block) at `alpha`,
    for a metric whose minimum effect is `effect`: Yuen's trimmed mean (`trim`) with its
    t-interval on `h - 1` degrees of freedom, `h` the blocks kept. Fewer than two kept
    blocks have no spread: an infinite standard error, which answers can't tell."""
    n = len(log_ratios)
    if n == 0:
        raise ValueError("no blocks")
    ordered = sorted(log_ratios)
    g = math.floor(trim * n)
    kept = ordered[g : n - g]
    h = len(kept)
    ratio = math.exp(math.fsum(kept) / h)
    if h < 2:
        return PairedEstimate(n, ratio, math.inf, 0, 0.0, math.inf, alpha, effect)
    winsorized = [min(max(x, kept[0]), kept[-1]) for x in ordered]
    wmean = math.fsum(winsorized) / n
    ss = math.fsum((x - wmean) ** 2 for x in winsorized)
    se = math.sqrt(ss / (h * (h - 1)))  # = s_w / ((1 - 2 trim) sqrt(n)), Yuen 1974
    low, high = bound(ratio, se, h - 1, alpha)
    return PairedEstimate(n, ratio, se, h - 1, low, high, alpha, effect)
