"""`perfguard gen-baselines`: measure the selected cases and store them in the baseline
file."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfguard.api.common import (
    Echo,
    baseline_path,
    resolve_platform,
    run_cases,
    select_cases,
    shard,
    to_stderr,
)
from perfguard.device.load import LoadMeter
from perfguard.errors import PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.resident import tree_root
from perfguard.measurement.warm import in_warm_pool
from perfguard.results import CaseResult, Results
from perfguard.storage.cases import Case, Selection, load_registry
from perfguard.storage.refresh import DEFAULT_REFRESH, RefreshOptions

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


@dataclass
class BaselineUpdate:
    """What `gen_baselines` did to the baseline file at `path`."""

    path: str
    results: Results
    selected: int
    saved: list[str] = field(default_factory=list)
    contended: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """Cases measured on a busy runner (`contention.busy_session`): not written."""
    pruned: list[str] = field(default_factory=list)
    tightened: bool = False

    @property
    def failed(self) -> bool:
        return any(r.status != "ok" for r in self.results.cases.values())


@in_warm_pool(lambda options, kw: options.isolated)
def gen_baselines(
    selection: Selection,
    options: MeasureOptions,
    *,
    baseline: str | None = None,
    storing: RefreshOptions = DEFAULT_REFRESH,
    platform: Platform | str | None = None,
    echo: Echo = to_stderr,
    say: Echo = print,
    warm: Any = None,
) -> BaselineUpdate:
    """Measure the selected cases and store them in the baseline file, as `storing` says
    (`perfguard.storage.refresh.RefreshOptions`: tighten, prune, timing, allow_busy).

    Only the selected cases are updated; the others, their notes and overrides are kept.
    A case measured on a contended runner (`refresh.record_measured`) is measured again
    after a wait, and not written if it stays so unless `storing.allow_busy`. The file is
    saved after each case, under a lock. Refuses fault injection and a file it cannot
    read, before measuring. `say` hears each case's outcome.
    """
    _refuse_injection(options)
    from perfguard.storage import baseline as store

    platform = resolve_platform(platform)
    target = _open_target(selection, baseline, storing, platform, echo)
    cases = target.cases
    update = BaselineUpdate(path=target.path, results=Results({}, {}), selected=len(cases))
    update.tightened = storing.tighten
    meter = LoadMeter(root=tree_root()).start()
    record = _Recorder(target, storing, update, meter, say)
    update.results = run_cases(cases, platform, options, on_case=record, warm=warm)
    _wait_out_contention(cases, record.waiting, update, say, lambda todo: run_cases(
        todo, platform, options, on_case=record, warm=warm), meter)  # fmt: skip
    if storing.prune:
        known = {c.id for c in load_registry(platform.name, selection.cases_dir)}
        update.pruned = store.prune(target.path, known)
    return update


@dataclass(frozen=True)
class _Target:
    """The baseline file gen-baselines writes and what it needs to write a case: the
    cases of this shard, this runner's environment, the timing stored and the file as
    it was before measuring."""

    path: str
    cases: list[Case]
    environment: dict[str, Any]
    timing: str
    earlier: Any


def _open_target(
    selection: Selection,
    baseline: str | None,
    storing: RefreshOptions,
    platform: Platform,
    echo: Echo,
) -> _Target:
    """The selected cases and the baseline file; a bad timing or a file that cannot be
    read fails here, before measuring."""
    from perfguard.device.platform import fingerprint
    from perfguard.metrics import timing_of
    from perfguard.storage import baseline as store

    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    cases = select_cases(platform.name, dataclasses.replace(selection, shard=None), echo=echo)
    environment = fingerprint(platform)
    timing = timing_of(environment, storing.timing)  # a bad value fails before measuring
    with store.lock(path):
        earlier = store.open_for_update(path, environment)  # refuse an unreadable file first
    cases = shard(cases, selection.shard, path, echo=echo)
    return _Target(path, cases, environment, timing, earlier)


class _Recorder:
    """Stores each measured case as it comes (`refresh.record_measured`), says what it
    did, and keeps the cases whose session was busy (`waiting`: case id -> why)."""

    def __init__(
        self,
        target: _Target,
        storing: RefreshOptions,
        update: BaselineUpdate,
        meter: Any,
        say: Echo,
    ) -> None:
        self.target, self.storing, self.update = target, storing, update
        self.meter, self.say = meter, say
        self.waiting: dict[str, str] = {}

    def __call__(self, result: CaseResult) -> None:
        from perfguard.storage import refresh

        load = self.meter.read()
        if result.status != "ok":
            self.say(f"{result.case_id}: error, baseline not updated: {result.error}")
            return
        target, storing = self.target, self.storing
        done = refresh.record_measured(
            target.path, result, target.environment, target.earlier.scenarios.get(result.case_id),
            allow_busy=storing.allow_busy, tighten=storing.tighten, timing=target.timing,
            foreign_load=load,
        )  # fmt: skip
        if done.stored is None:
            self.waiting[result.case_id] = done.busy or "busy"
            return
        self.waiting.pop(result.case_id, None)
        if done.busy:
            self.say(f"{result.case_id}: warning: the runner was busy ({done.busy}); marked busy")
        if done.contended:
            self.update.contended.append(result.case_id)
            self.say(f"{result.case_id}: warning: {done.contended}; kept every run, marked busy")
        self.update.saved.append(result.case_id)
        self.say(_saved_line(done.stored, done.scenario))


def _refuse_injection(options: MeasureOptions) -> None:
    """A baseline must never contain injected time."""
    from perfguard.device.inject import ENV_INJECT, inject_from

    if options.inject or inject_from(None):
        source = f"${ENV_INJECT}" if inject_from(None) else "--inject"
        raise PerfguardError(
            f"gen-baselines refuses fault injection ({source} is set): "
            "a baseline must never contain injected time"
        )


def _wait_out_contention(
    cases: Sequence[Case],
    waiting: dict[str, str],
    update: BaselineUpdate,
    say: Echo,
    measure: Callable[[Sequence[Case]], Results],
    meter: Any,
) -> None:
    """Measure the cases whose session was busy again, after `ContentionPolicy.wait_s`,
    at most `waits` times (contention passes: a neighbour's job ends); a case still busy
    is not written. Noise is not contention: a spread runner is recorded, never waited
    out (`perfguard.decision.contention.busy_session`)."""
    from perfguard.decision import contention

    policy = contention.DEFAULT_POLICY
    for attempt in range(1, policy.waits + 1):
        if not waiting:
            break
        for cid, why in sorted(waiting.items()):
            say(
                f"{cid}: the runner was busy ({why}): waiting {policy.wait_s:g} s and "
                f"measuring again ({attempt} of {policy.waits})"
            )
        time.sleep(policy.wait_s)
        meter.read()  # the wait is not the session's
        again = measure([c for c in cases if c.id in waiting])
        update.results.cases.update(again.cases)
    for cid, why in sorted(waiting.items()):
        update.busy.append(cid)
        waited = f" after waiting {policy.waits} x {policy.wait_s:g} s" if policy.waits else ""
        say(f"{cid}: the runner was busy ({why}){waited}: baseline not updated")


def _saved_line(result: CaseResult, scenario: Any = None) -> str:
    """What gen-baselines says of a case it stored: its median e2e and what a check
    against it resolves, or (`counters_only`) that only the work and output were."""
    from perfguard.decision.resolution import describe

    resolves = ""
    if scenario is not None and scenario.resolution:
        resolves = f"; a check resolves {describe(scenario.resolution)}"
    server = (result.observed or {}).get("server")
    if server is not None:
        return _server_saved_line(result, server, resolves)
    if "e2e" not in result.samples:
        return f"{result.case_id}: work and output saved (nothing timed)"
    e2e = sorted(result.samples["e2e"])[len(result.samples["e2e"]) // 2]
    where = f", {len(result.groups)} processes" if result.groups else ""
    return f"{result.case_id}: e2e {e2e:.3f} ms (n={result.repeats}{where}) saved{resolves}"


def _server_saved_line(result: CaseResult, server: Any, resolves: str) -> str:
    """A server case's: the median p50 latency and failed requests at each level, and
    the rounds and servers they came from (`c1 p50 54.6 ms, c4 p50 219.4 ms (2 failed)`)."""
    from perfguard.metrics import server_metric

    levels = []
    for name, level in (server.get("levels") or {}).items():
        values = sorted(result.samples.get(server_metric(int(name[1:]), "latency_p50"), []))
        p50 = f"{values[len(values) // 2]:.1f} ms" if values else "none answered"
        failed = f" ({level['failures']} failed)" if level.get("failures") else ""
        levels.append(f"{name} p50 {p50}{failed}")
    rounds, servers = server.get("rounds", result.repeats), server.get("servers", 1)
    where = f"{rounds} rounds on {servers} server{'s' if servers != 1 else ''}"
    return f"{result.case_id}: {', '.join(levels)} ({where}) saved{resolves}"
