"""Is the runner as fast as it was? Screening a measurement with the reference workload.

The runner times the reference workload (`perfguard.device.reference`) right before and right
after every run of a case and keeps, per run, the slower of the two. On the shared CPU
runner we measured bursts in which another job took the core for a few hundred
milliseconds: the case's `DenoisingStage` ran 2.2x slower for a few runs in a row, and
the reference beside those runs 3x slower, while the median of the reference over the
whole process hardly moved. So the screen works run by run:

- a run is *contended* when its reference took more than `ratio` (1.3x) of the quiet
  level: the baseline's reference median when the baseline has one (then a runner
  that is slower as a whole, a slower host or a capped clock, is caught too), else the
  measurement's own lower quartile;
- contended runs are dropped before the verdict, and their number is reported;
- when more than `max_fraction` of the runs are contended, the measurement as a whole
  says nothing about the code: the gate waits and measures again (`waits` times,
  `wait_s` apart), and a case that stays so gets the verdict `contended` (exit 4).

`speed` is the quiet runs' reference median over the baseline's: the runner's speed
relative to baseline time, which the verdict uses to keep a uniformly slower runner
from reading as slower code (`perfguard.decision.verdict.judge_metric`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CONTENDED_RATIO = 1.3
"""Reference median / baseline reference median above which the runner counts as
contended. One other process spinning on the second core of the 2-core runner moved
the one-thread reference by under 3 %; two (both cores busy) made it 2.0x slower."""


@dataclass(frozen=True)
class ContentionPolicy:
    """When a run, and a whole measurement, counts as contended; how long to wait."""

    ratio: float = CONTENDED_RATIO
    max_fraction: float = 0.5
    waits: int = 2
    wait_s: float = 10.0

    def __post_init__(self) -> None:
        if self.ratio <= 1 or not 0 < self.max_fraction <= 1 or self.waits < 0:
            raise ValueError("ratio must be > 1, max_fraction in (0, 1], waits >= 0")


DEFAULT_POLICY = ContentionPolicy()


@dataclass(frozen=True)
class Screen:
    """What the screen found in one measurement of one case."""

    runs: int
    dropped: int
    contended: bool
    level: float | None
    speed: float | None

    @property
    def reason(self) -> str:
        speed = f"reference workload {self.speed:.2f}x its baseline" if self.speed else ""
        return (
            f"runner contended: {self.dropped} of {self.runs} runs had a reference workload "
            f"over the quiet level{'; ' + speed if speed else ''}"
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dropped_runs": self.dropped}
        if self.speed is not None:
            out["runner_speed"] = round(self.speed, 4)
        return out


def quiet_level(reference: Sequence[float], baseline_median: float | None) -> float | None:
    """The reference time of a quiet runner: the baseline's, else this lower quartile."""
    if baseline_median is not None and baseline_median > 0:
        return baseline_median
    if len(reference) < 2:
        return reference[0] if reference else None
    return statistics.quantiles(reference, n=4, method="inclusive")[0]


def screen(
    result: Any, baseline_reference: float | None, policy: ContentionPolicy = DEFAULT_POLICY
) -> tuple[Any, Screen]:
    """`result` with its contended runs dropped, and what was found.

    A result without reference figures (an sglang log, an older results file) passes
    unchanged. A contended measurement is returned whole: nothing is dropped from a
    measurement that is reported as `contended` rather than judged.
    """
    reference = list(getattr(result, "reference", None) or [])
    level = quiet_level(reference, baseline_reference)
    if not reference or level is None or level <= 0:
        # No yardstick (an sglang log, an older results file) or a clock that did not
        # move (a virtual one in tests): nothing to screen.
        return result, Screen(len(reference), 0, False, level, None)
    flags = [r > policy.ratio * level for r in reference]
    dropped = sum(flags)
    contended = dropped > policy.max_fraction * len(flags)
    quiet = [r for r, f in zip(reference, flags, strict=True) if not f] or reference
    basis = reference if contended else quiet
    now = statistics.median(basis)
    speed = now / baseline_reference if baseline_reference and now > 0 else None
    if contended or not dropped:
        return result, Screen(len(flags), dropped, contended, level, speed)
    kept = result.only_runs([not f for f in flags])
    if kept is result:  # the runs could not be aligned: judge them all, say nothing dropped
        dropped = 0
    return kept, Screen(len(flags), dropped, False, level, speed)
