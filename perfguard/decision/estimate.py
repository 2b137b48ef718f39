"""The relative check's estimate of one metric: head/base from mirrored blocks.

A value type only: `perfguard.decision.paired` computes it, a `MetricVerdict` carries
it into the report, so it sits below both (the verdict module must not import the paired
decision that is built on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SAME = "same"
DIFFERENT = "different"
UNKNOWN = "unknown"
"""Pinpoint's three answers to "did head change this metric?"."""


@dataclass(frozen=True)
class PairedEstimate:
    """head/base for one metric from per-block log ratios, and what it lets us say.

    `ratio` is the geometric mean of the blocks' median ratios, `low` / `high` its
    one-sided (1 - alpha) bounds from a t-interval over the blocks (n - 1 degrees of
    freedom); `decision` is Pinpoint's three answers: `different` (a regression: ratio
    above 1 + min_effect and low above 1; or an improvement: ratio below 1 / (1 +
    min_effect) and high below 1), `same` (the interval lies within +-min_effect), or
    `unknown` (measure more).
    """

    blocks: int
    ratio: float
    low: float
    high: float
    min_effect: float
    alpha: float
    decision: str
    reference_exponent: float | None = None
    """The share of the reference workload the blocks' runs were scaled by (normalized
    timing; `perfguard.decision.paired.reference_exponent`), None when compared raw."""

    @property
    def slower(self) -> bool:
        return self.decision == DIFFERENT and self.ratio > 1.0

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
        """From a report: `paired`, and the ratio and its bounds from `metric`."""
        exponent = paired.get("reference_exponent")
        return cls(
            blocks=int(paired["blocks"]),
            ratio=float(metric["ratio"]),
            low=float(metric["ratio_low"]),
            high=float(metric["ratio_high"]),
            min_effect=float(paired["min_effect"]),
            alpha=float(paired["alpha"]),
            decision=str(paired["decision"]),
            reference_exponent=None if exponent is None else float(exponent),
        )
