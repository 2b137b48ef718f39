"""Refreshing a baseline: how a fresh measurement becomes a case's stored figures.

The file format is `perfguard.storage.baseline`'s; this module is the policy of
`gen-baselines` (and the pytest plugin's `--perfguard-update-baseline`) on top of it:
each metric summarized with its samples and per-process medians, timed runs stored at the
reference workload's runner speed (`perfguard.decision.normalize`), `--tighten` keeping
an old figure unless the new one is credibly faster (`perfguard.decision.changes`), the
resolution a check against the figures will have recorded
(`perfguard.decision.resolution`), and a session measured on a contended runner refused
or marked (`perfguard.decision.contention`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfguard.decision.changes import credibly_lower
from perfguard.decision.normalize import at_speed_of, normalized
from perfguard.decision.stats import Summary, summarize
from perfguard.decision.work_counts import WorkCounts
from perfguard.errors import PerfguardError
from perfguard.metrics import NORMALIZED, RAW, metric_sort_key, timing_of
from perfguard.results import CaseResult, utc_now
from perfguard.storage.baseline import (
    DIGITS,
    Baseline,
    Scenario,
    lock,
    open_for_update,
    save,
)


@dataclass(frozen=True)
class RefreshOptions:
    """How `gen-baselines` stores what it measured, one frozen value from the command:
    `tighten` keeps an old figure unless the new one is credibly faster
    (`merge_scenario`), `prune` drops the scenarios of cases no longer in the registry,
    `timing` is how timed runs are stored (`raw` or `normalized`; None: the platform's
    default) and `allow_busy` stores a contended session marked busy instead of refusing
    it (`record_measured`)."""

    tighten: bool = False
    prune: bool = False
    timing: str | None = None
    allow_busy: bool = False


DEFAULT_REFRESH = RefreshOptions()


def scenario_from_result(
    result: CaseResult,
    keep_samples: bool = True,
    *,
    reference_version: str | None = None,
    dropped_runs: int | None = None,
    timing: str | None = None,
    busy: str | None = None,
) -> Scenario:
    """The scenario a successful run gives: each metric summarized, samples kept.

    The thread counts and the reference workload's figure travel with the metrics:
    a later check compares like with like (`check_comparable`) and sees whether the
    runner is as fast as it was (`perfguard.decision.gate`). With `timing` normalized
    the timed metrics are stored at the runner speed of the reference median
    (`perfguard.decision.normalize`); a result whose runs have no reference times to
    scale by (a virtual clock, an imported log) is stored raw, and says so.
    """
    if result.status != "ok" or not result.samples:
        raise ValueError(f"{result.case_id}: only a successful run makes a baseline")
    reference = (
        summarize(result.reference, keep_samples).rounded(DIGITS) if result.reference else None
    )
    if timing == NORMALIZED:
        # The level is the reference median as stored, so a check scales to the same one.
        scaled = None if reference is None else normalized(result, reference.median)
        timing = RAW if scaled is None else NORMALIZED
        result = scaled or result
    metrics: dict[str, Summary] = {}
    for name in sorted(result.samples, key=metric_sort_key):
        values = result.samples[name]
        bad = [v for v in values if not math.isfinite(v) or v < 0]
        if bad:
            raise PerfguardError(f"{result.case_id}: {name}: invalid sample {bad[0]!r}")
        metrics[name] = summarize(values, keep_samples, result.groups).rounded(DIGITS)
    case = {k: v for k, v in result.case.items() if k != "traceback_tail"}
    return Scenario(
        metrics=metrics,
        load_ms=result.load_ms,
        output_hash=result.output_hash,
        deterministic=result.deterministic,
        repeats=result.repeats,
        warmup=result.warmup,
        updated=utc_now(),
        case=case or None,
        threads=dict(result.threads) if result.threads else None,
        reference=reference,
        reference_version=reference_version if result.reference else None,
        dropped_runs=dropped_runs,
        components=result.components,
        work=WorkCounts.from_runs(result.work or []),
        output_sketch=dict(result.output_sketch) if result.output_sketch else None,
        timing=timing,
        groups=tuple(result.groups) if result.groups and result.reference else None,
        busy=busy,
        server=_server_record(result.observed),
    )


SERVER_KEPT = ("levels", "rounds", "servers")
"""What a baseline keeps of a server case's `observed.server`: not its URL (a launched
server's port changes every time, and a baseline file's diff should show what moved)."""


def _server_record(observed: Mapping[str, Any] | None) -> dict[str, Any] | None:
    server = (observed or {}).get("server")
    if not isinstance(server, Mapping):
        return None
    return {k: server[k] for k in SERVER_KEPT if k in server}


def merge_scenario(old: Scenario | None, new: Scenario, tighten: bool = False) -> Scenario:
    """The scenario to store when `new` was just measured for a case that had `old`.

    Without `tighten` the new figures replace the old ones. With it a metric takes the
    new summary only when the new measurement is credibly faster (`credibly_lower`), and
    keeps the old one otherwise; metrics the new run lacks are kept. Keeping the lower of
    two medians instead would walk a baseline into the lucky tail of the noise, one
    refresh at a time, until unchanged code fails; a credible improvement moves it to
    the new measurement's median, a robust figure, not to its luckiest sample. Either
    way `notes`, `tolerance_overrides` and imported extras are carried over: they are
    human input.
    """
    if old is None:
        return new
    metrics = dict(new.metrics)
    load_ms = new.load_ms
    if tighten:
        for name, before in at_speed_of(old, new).metrics.items():
            after = metrics.get(name)
            if after is None or not credibly_lower(before, after):
                metrics[name] = before
        if old.load_ms is not None and (load_ms is None or old.load_ms < load_ms):
            load_ms = old.load_ms
    return dataclasses.replace(
        new,
        metrics=dict(sorted(metrics.items(), key=lambda kv: metric_sort_key(kv[0]))),
        load_ms=load_ms,
        notes=old.notes,
        tolerance_overrides=old.tolerance_overrides,
        extra=old.extra,
    )


def record_case(
    path: str | os.PathLike[str],
    result: CaseResult,
    environment: Mapping[str, Any],
    *,
    tighten: bool = False,
    keep_samples: bool = True,
    dropped_runs: int | None = None,
    timing: str | None = None,
    busy: str | None = None,
) -> Baseline:
    """Store one case's fresh measurement in the baseline at `path` (locked, atomic).

    The reference workload's version comes from `environment` (the fingerprint records
    it as `reference_workload`): a later check compares like with like. `timing` None is
    the platform's default (`perfguard.metrics.default_timing`). `busy`:
    why the runner was busy, for a session stored anyway (`Scenario.busy`).
    """
    version = environment.get("reference_workload")
    scenario = scenario_from_result(
        result,
        keep_samples,
        reference_version=str(version) if version else None,
        dropped_runs=dropped_runs,
        timing=timing_of(environment, timing),
        busy=busy,
    )
    with lock(path):
        current = open_for_update(path, environment)
        merged = merge_scenario(current.scenarios.get(result.case_id), scenario, tighten)
        merged = with_resolution(merged, current)
        updated = current.with_scenario(result.case_id, merged).touched(environment)
        save(path, updated)
    return updated


def with_resolution(scenario: Scenario, baseline: Baseline) -> Scenario:
    """`scenario` with the resolution of its timed classes under the baseline's default
    profile (`perfguard.decision.resolution.of_scenario`)."""
    from perfguard.decision.resolution import of_scenario
    from perfguard.decision.tolerances import DEFAULT_PROFILE

    if DEFAULT_PROFILE not in baseline.profiles:
        return scenario
    found = of_scenario(scenario, baseline.profile(DEFAULT_PROFILE))
    return dataclasses.replace(scenario, resolution=found or None)


@dataclass(frozen=True)
class Recorded:
    """What `record_measured` did with a session: the result it stored (None: not
    stored), why the runner was busy (`contention.busy_session`) and why its runs were
    all kept (the screen's reason)."""

    stored: CaseResult | None
    busy: str | None = None
    contended: str | None = None
    scenario: Scenario | None = None
    """The scenario as stored (with its resolution)."""


def record_measured(
    path: str | os.PathLike[str],
    result: CaseResult,
    environment: Mapping[str, Any],
    replaced: Scenario | None,
    *,
    allow_busy: bool = False,
    tighten: bool = False,
    timing: str | None = None,
    foreign_load: float | None = None,
) -> Recorded:
    """Store a fresh session of a case as gen-baselines does: not at all when the runner
    was busy (unless `allow_busy`: then marked busy), without the runs the reference saw
    contended against the session's own level. When most were, every run is kept and the
    scenario is marked busy with the screen's reason: a session whose reference spreads
    that much may be a noisy runner as well as a contended one, so it is recorded, never
    refused, and every later check says so. `foreign_load`: the cores other processes used
    while it measured (`perfguard.device.load`)."""
    from perfguard.decision.contention import busy_against, screen

    busy = busy_against(result, replaced, foreign_load)
    if busy and not allow_busy:
        return Recorded(None, busy)
    quiet, scr = screen(result, None)
    contended = scr.reason if scr.contended else None
    kept = result if contended else quiet
    updated = record_case(
        path,
        kept,
        environment,
        tighten=tighten,
        dropped_runs=0 if contended else scr.dropped,
        timing=timing,
        busy=busy or contended,
    )
    return Recorded(kept, busy, contended, updated.scenarios.get(result.case_id))
