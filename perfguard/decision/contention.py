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
- a *slow process* of a check is one whose quiet runs' reference median is above
  `process_ratio` (1.2x) of the baseline's: all its runs count as contended
  (`PROCESS_RATIO`: dividing by the reference does not rescue such a process). A
  baseline's own processes are not screened so: a slow one widens the spread every
  later interval borrows and raises the median, which costs catches, not false alarms;
- contended runs are dropped before the verdict, and their number is reported;
- when more than `max_fraction` of the runs are contended, the measurement as a whole
  says nothing about the code: the gate waits and measures again (`waits` times,
  `wait_s` apart), and a case that stays so gets the verdict `contended` (exit 4).

`speed` is the quiet runs' reference median over the baseline's: the runner's speed
relative to baseline time, which the verdict uses to keep a uniformly slower runner
from reading as slower code (`perfguard.decision.verdict.judge_figure`).
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


PROCESS_RATIO = 1.2
"""A process's reference median over the quiet level above which all its runs count as
contended: 1.2x. On one detection run's kept checks, unchanged code read 0.98-1.04x its
baseline in processes under 1.2x and 1.28-1.31x in those at 1.20-1.30x, where +5 % and
+10 % read alike; the table and its caveats are in
docs/measurements/2026-12-07-constants.md."""


@dataclass(frozen=True)
class ContentionPolicy:
    """When a run, a process, and a whole measurement count as contended; how long to
    wait. `process_ratio` 0 turns the process screen off."""

    ratio: float = CONTENDED_RATIO
    max_fraction: float = 0.5
    waits: int = 2
    wait_s: float = 10.0
    process_ratio: float = PROCESS_RATIO

    def __post_init__(self) -> None:
        if self.ratio <= 1 or not 0 < self.max_fraction <= 1 or self.waits < 0:
            raise ValueError("ratio must be > 1, max_fraction in (0, 1], waits >= 0")
        if self.process_ratio and self.process_ratio <= 1:  # 0: no process screen
            raise ValueError("process_ratio must be > 1 (or 0: no process screen)")


DEFAULT_POLICY = ContentionPolicy()


@dataclass(frozen=True)
class Screen:
    """What the screen found in one measurement of one case."""

    runs: int
    dropped: int
    contended: bool
    level: float | None
    speed: float | None
    slow_processes: int = 0

    @property
    def reason(self) -> str:
        speed = f"reference workload {self.speed:.2f}x its baseline" if self.speed else ""
        slow = (
            f" (the runs of {self.slow_processes} process(es) whose reference median was "
            "over the process screen among them)"
            if self.slow_processes
            else ""
        )
        return (
            f"runner contended: {self.dropped} of {self.runs} runs had a reference workload "
            f"over the quiet level{slow}{'; ' + speed if speed else ''}"
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dropped_runs": self.dropped}
        if self.slow_processes:
            out["slow_processes"] = self.slow_processes
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
    slow = 0
    if policy.process_ratio and baseline_reference:
        flags, slow = _slow_processes(
            reference, flags, getattr(result, "groups", None), level, policy.process_ratio
        )
    dropped = sum(flags)
    contended = dropped > policy.max_fraction * len(flags)
    quiet = [r for r, f in zip(reference, flags, strict=True) if not f] or reference
    basis = reference if contended else quiet
    now = statistics.median(basis)
    speed = now / baseline_reference if baseline_reference and now > 0 else None
    if contended or not dropped:
        return result, Screen(len(flags), dropped, contended, level, speed, slow)
    kept = result.only_runs([not f for f in flags])
    if kept is result:  # the runs could not be aligned: judge them all, say nothing dropped
        dropped, slow = 0, 0
    return kept, Screen(len(flags), dropped, False, level, speed, slow)


def _slow_processes(
    reference: Sequence[float],
    flags: list[bool],
    groups: Sequence[int] | None,
    level: float,
    ratio: float,
) -> tuple[list[bool], int]:
    """`flags` with every run of a slow process set: one whose runs not already flagged
    have a reference median above `ratio` x `level`. `groups` are the runs of each
    process in order (None: one process). Returns the flags and the slow processes."""
    out, slow, at = list(flags), 0, 0
    for size in groups or [len(reference)]:
        runs = zip(reference[at : at + size], flags[at : at + size], strict=True)
        quiet = [r for r, f in runs if not f]
        if quiet and statistics.median(quiet) > ratio * level:
            out[at : at + size] = [True] * size
            slow += 1
        at += size
    return out, slow


# ---- a baseline session on a busy runner ----------------------------------------------------

FOREIGN_LOAD = 0.5
"""Cores other processes used, on average over a baseline session, above which the session
counts as busy (`perfguard.device.load`). The idle 2-core runner read 0.002-0.006 core and
the same runner with a core kept busy by a spinning process 1.001-1.007
(docs/measurements/2026-12-07-noisy-runner.md): half a core is midway."""


def busy_session(
    result: Any, earlier_reference: float | None, foreign_load: float | None = None
) -> str | None:
    """Why a baseline session of `result` was measured on a busy runner, or None.

    Busy is contention, never spread: a runner whose fresh processes spread by 13-29 %
    with nothing else running is noisy by nature, and its baseline records that noise
    (`perfguard.decision.resolution`) instead of being refused. Two signs of contention,
    either enough: the session's reference workload is over `CONTENDED_RATIO` times the
    reference of the baseline it replaces (`earlier_reference`: this runner's usual), so
    the whole session ran slow; other processes used more than `FOREIGN_LOAD` cores on
    average while it measured (`foreign_load`). A session whose runs the screen finds
    mostly contended against its own quiet level is stored marked busy, not refused
    (`perfguard.storage.refresh.record_measured`): on a runner whose processes spread by
    29 % that level is the session's own lower quartile, which the noise alone can put
    under half of the runs. A baseline is met by every check until it is measured again: one
    from a busy session hides real slowdowns behind its own slowness (a +12 % check
    passed 3 of 4 times against one taken with a core kept busy)."""
    if foreign_load is not None and foreign_load > FOREIGN_LOAD:
        return (
            f"other processes used {foreign_load:.2f} core(s) on average while it measured "
            f"(over {FOREIGN_LOAD:g})"
        )
    reference = [r for r in (getattr(result, "reference", None) or []) if r > 0]
    if reference and earlier_reference:
        level = statistics.median(reference) / earlier_reference
        if level > CONTENDED_RATIO:
            return (
                f"its reference workload ran {level:.2f}x the baseline it replaces "
                f"(over {CONTENDED_RATIO:g}x)"
            )
    return None


def busy_against(result: Any, replaced: Any, foreign_load: float | None = None) -> str | None:
    """`busy_session` of a gen-baselines session against the scenario it replaces (None
    for a new case); None when nothing was timed (work is exact)."""
    ref = replaced.reference.median if replaced is not None and replaced.reference else None
    return busy_session(result, ref, foreign_load) if "e2e" in result.samples else None
