"""Split a case selection into `n` shards so that CI can run them on `n` machines at once.

`--shard k/n` (k is 1-based) keeps the k-th of `n` shards. The split must be the same in
every shard job, since each job computes it on its own and no job may run a case twice or
drop one: it depends only on the selected cases (their ids, order-independent) and their
expected times, never on the clock, the host or the order of the registry files.

Why balance by time rather than by count: CI waits for the slowest shard, and one
60-second case and ten 1-second cases are not the same amount of work. The split is the
greedy "longest processing time first" rule (Graham, 1969): take the cases from the
longest down and give each to the shard that has the least work so far. It is within
4/3 of the best possible makespan, needs no search, and its ties are broken by case id
and shard index, so every job gets the same answer.

A case's expected time is its `estimated_time_s` when the registry gives one (the
author's figure, which covers model loading and every run), else the measured `e2e` of
the baseline times the number of runs when a baseline is given, else 1 s.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from perfguard.errors import PerfguardError
from perfguard.storage.cases import Case

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.storage.baseline import Baseline

DEFAULT_TIME_S = 1.0
"""Expected time of a case with neither an estimate nor a baseline figure."""

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `total`, 1-based: `Shard(1, 4)` is written `1/4`."""

    index: int
    total: int

    def __post_init__(self) -> None:
        if self.total < 1 or not 1 <= self.index <= self.total:
            raise PerfguardError(
                f"--shard {self.index}/{self.total}: expected k/n with 1 <= k <= n"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`'2/4'` -> `Shard(2, 4)`; anything else is a usage error (exit 2)."""
        match = _SPEC.match(text or "")
        if not match:
            raise PerfguardError(f"--shard {text!r}: expected k/n, e.g. 1/4 (k counts from 1)")
        return cls(int(match.group(1)), int(match.group(2)))


def expected_time_s(case: Case, measured_s: Mapping[str, float] | None = None) -> float:
    """The time the split assumes for `case`: estimate, else measured, else 1 s."""
    if case.estimated_time_s is not None:
        return float(case.estimated_time_s)
    if measured_s and measured_s.get(case.id, 0) > 0:
        return float(measured_s[case.id])
    return DEFAULT_TIME_S


def split(
    cases: Sequence[Case], total: int, measured_s: Mapping[str, float] | None = None
) -> list[list[Case]]:
    """All `total` shards of `cases`; each case is in exactly one, in its original order.

    `measured_s` maps case ids to a measured time in seconds (see `measured_from_e2e`).
    """
    if total < 1:
        raise PerfguardError(f"--shard: the number of shards must be >= 1, not {total}")
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise PerfguardError(f"case {case.id!r} is selected twice; cannot shard")
        seen.add(case.id)
    times = {case.id: expected_time_s(case, measured_s) for case in cases}
    loads = [0.0] * total
    owner: dict[str, int] = {}
    # Longest first; equal times in id order so that every job sees the same sequence.
    for cid in sorted(times, key=lambda c: (-times[c], c)):
        target = min(range(total), key=lambda i: (loads[i], i))
        owner[cid] = target
        loads[target] += times[cid]
    shards: list[list[Case]] = [[] for _ in range(total)]
    for case in cases:
        shards[owner[case.id]].append(case)
    return shards


def select_shard(
    cases: Sequence[Case], shard: Shard | None, measured_s: Mapping[str, float] | None = None
) -> list[Case]:
    """The cases of `shard` (all of them when `shard` is None).

    A shard may be empty when there are more shards than cases; that is not an error, so
    that a CI matrix with a fixed number of shards keeps working when cases are removed.
    """
    if shard is None:
        return list(cases)
    return split(cases, shard.total, measured_s)[shard.index - 1]


def measured_from_e2e(
    e2e_ms: Mapping[str, float], runs_per_case: int = 1, load_ms: Mapping[str, float] | None = None
) -> dict[str, float]:
    """Seconds per case from a baseline's per-run `e2e` (ms), times the runs, plus loading."""
    load_ms = load_ms or {}
    return {
        cid: (ms * max(1, runs_per_case) + float(load_ms.get(cid) or 0.0)) / 1e3
        for cid, ms in e2e_ms.items()
        if ms and ms > 0
    }


def measured_from_baseline(baseline: Baseline | None, runs_per_case: int = 1) -> dict[str, float]:
    """Seconds per case from a baseline's scenarios: median `e2e` times the runs, plus load.

    A scenario's own `warmup + repeats`, when recorded, beats `runs_per_case`: it is how
    many runs the figure was measured over, and so how many the next run will likely do.
    """
    if baseline is None:
        return {}
    out: dict[str, float] = {}
    for cid, scenario in baseline.scenarios.items():
        summary = scenario.metrics.get("e2e")
        if summary is None:
            continue
        runs = (scenario.warmup or 0) + (scenario.repeats or 0) or runs_per_case
        out.update(measured_from_e2e({cid: summary.median}, runs, {cid: scenario.load_ms or 0}))
    return out


def shard_selection(
    cases: Sequence[Case], spec: str | None, baseline_path: str | os.PathLike[str] | None = None
) -> list[Case]:
    """`--shard spec` applied to the selected cases (all of them when `spec` is None).

    Cases without `estimated_time_s` are timed from the baseline at `baseline_path` when
    that file exists: every command that shards (`list-cases`, `run`, `check`,
    `gen-baselines`) reads the same default file, so they all agree on the split.
    """
    if spec is None:
        return list(cases)
    shard = Shard.parse(spec)
    measured: dict[str, float] = {}
    unestimated = any(c.estimated_time_s is None for c in cases)
    if unestimated and baseline_path is not None and Path(baseline_path).is_file():
        from perfguard.storage.baseline import load

        measured = measured_from_baseline(load(baseline_path))
    return select_shard(cases, shard, measured)
