"""Counting a bisected commit's work and judging it against GOOD's, exactly.

Work counters (the default, and any `ops:` / `flops:` / `alloc:` / `syncs:` metric) are
counted in one counted run per commit and case, no repeats: counts do not depend on the
runner's speed. A commit is bad when a selected counter of a selected case counts more
than at GOOD; the report names the ops whose counts changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfguard.decision.counters import judge_counter, op_changes
from perfguard.decision.records import REGRESSION
from perfguard.decision.work_counts import WorkCounts
from perfguard.errors import PerfguardError
from perfguard.measurement.commit_range import BAD, GOOD
from perfguard.metrics import metric_sort_key
from perfguard.storage.cases import Case

COUNT_TIMEOUT_S = 600.0
"""How long one commit's counted runs may take, its perfguard's import included."""


class Counter:
    """Counts commits in side workers (`launch.SIDE_WORKER`, its `count` request) forked
    from one warm server that imports the heavy libraries once and no perfguard module,
    as the relative check's shared server does (`launch.SharedFork`): each commit's
    worker imports that commit's perfguard from its checkout (its import root, first on
    `sys.path`, and its working directory), makes one counted run of each case
    (`MeasureOptions(counters_only=True)`: a warm-up, whose output is kept, and the
    counted run) and exits. A commit then costs its perfguard's import, its builds and
    its runs, not an interpreter's start and torch's import (seconds each on a 2-core
    runner). Where forking is not available (`launch.default_start_method`), or the
    server could not start, each commit's worker is a fresh interpreter."""

    def __init__(self, preload: Sequence[str]) -> None:
        from perfguard.measurement.launch import (
            WarmServer,
            child_environment,
            default_start_method,
            import_root,
        )

        self.server: Any = None
        if default_start_method() == "forkserver":
            # No $PYTHONPATH: nothing the server imports may come from a checkout.
            env = child_environment(unset=("PYTHONPATH",))
            root = import_root()
            self.server = WarmServer(env, "count server", preload=preload, root=root, cwd=root)

    def _forks(self) -> Any:
        """The warm server, once it has imported its modules; None: spawn instead."""
        from perfguard.measurement.worker_handle import STARTUP_TIMEOUT_S

        if self.server is not None and (
            not self.server.alive or self.server.start(STARTUP_TIMEOUT_S) is not None
        ):
            self.server.kill()
            self.server = None
        return self.server

    def count(self, import_dir: Path, cases: Sequence[Case], platform: str) -> dict[str, Any]:
        """One counted run of each case with the commit's own perfguard: case -> result
        JSON. A commit that cannot import or run raises `PerfguardError` (it is skipped)."""
        from perfguard.measurement.launch import SharedFork, child_environment
        from perfguard.measurement.profiling import side_request

        where = str(import_dir)
        env = child_environment(import_dir=import_dir)
        server = self._forks()
        request = {"kind": "count", "platform": platform, "cases": [c.to_json() for c in cases]}
        try:
            data = side_request(
                request, env=env, cwd=where, root=where, label="the counted run",
                timeout_s=COUNT_TIMEOUT_S,
                server=SharedFork(server, env, where, where) if server is not None else None,
            )  # fmt: skip
        except TimeoutError as exc:
            raise PerfguardError(f"the counted run took over {COUNT_TIMEOUT_S:g} s") from exc
        except PerfguardError as exc:
            raise PerfguardError(str(exc)[:300]) from exc
        source = data.get("perfguard_file")
        if not source or not Path(source).resolve().is_relative_to(import_dir.resolve()):
            raise PerfguardError(f"perfguard was imported from {source}, not from {import_dir}")
        results: dict[str, Any] = data["cases"]
        failed = [
            f"{cid}: {r.get('error')}" for cid, r in results.items() if r.get("status") != "ok"
        ]
        if failed:
            raise PerfguardError(failed[0][:300])
        return results

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


def work_of(results: Mapping[str, Mapping[str, Any]]) -> dict[str, WorkCounts]:
    out = {}
    for cid, result in results.items():
        counts = WorkCounts.from_runs(result.get("work") or [])
        if counts is not None:
            out[cid] = counts
    return out


def chosen_counters(counts: Mapping[str, WorkCounts], metric: str | None) -> list[tuple[str, str]]:
    """(case, counter) pairs judged: `metric` where a case has it, else every counter."""
    pairs = []
    for cid, wc in sorted(counts.items()):
        for m in sorted(wc.counters, key=metric_sort_key):
            if metric is None or m == metric:
                pairs.append((cid, m))
    return pairs


def judge_work_step(
    good: Mapping[str, WorkCounts], current: Mapping[str, WorkCounts], metric: str | None
) -> tuple[str, str, dict[str, Any]]:
    """Exact: bad when any judged counter counts more than at GOOD. (verdict, figure,
    details with the grown counters and, per case, the ops whose counts changed.)"""
    grown: dict[str, dict[str, list[int]]] = {}
    for cid, m in chosen_counters(good, metric):
        if cid not in current or m not in current[cid].counters:
            continue
        verdict = judge_counter(m, current[cid].counters[m], good[cid].counters[m], 0.0, 0.0)
        if verdict.verdict == REGRESSION:
            grown.setdefault(cid, {})[m] = [good[cid].counters[m][1], current[cid].counters[m][1]]
    if not grown:
        return GOOD, "counts as GOOD" if metric is None else f"{metric} as GOOD", {}
    ops = {
        cid: op_changes(good[cid].op_counts, current[cid].op_counts)
        for cid in grown
        if cid in current
    }
    cid, metrics = next(iter(sorted(grown.items())))
    m, (before, after) = next(iter(sorted(metrics.items(), key=lambda kv: metric_sort_key(kv[0]))))
    more = sum(len(v) for v in grown.values()) - 1
    figure = f"{cid} {m} {before:,} -> {after:,} (+{after - before:,})" + (
        f", {more} more counter(s) grew" if more else ""
    )
    return BAD, figure, {"grown": grown, "op_changes": ops}


def check_metric(metric: str | None, counts: Mapping[str, WorkCounts]) -> None:
    """A work metric no selected case has at GOOD is the user's mistake (exit 2)."""
    if metric is None:
        return
    if not any(metric in wc.counters for wc in counts.values()):
        known = sorted({m for wc in counts.values() for m in wc.counters}, key=metric_sort_key)
        raise PerfguardError(
            f"bisect: --metric {metric}: no selected case counts it at GOOD "
            f"(it counts {', '.join(known[:8])}{', ...' if len(known) > 8 else ''})"
        )


def preload_for(cases: Sequence[Case]) -> list[str]:
    """What the count server imports before it forks: torch and the libraries the cases'
    workloads import (`perfguard.workloads.modules`), never perfguard itself."""
    from perfguard.workloads.modules import BY_WORKLOAD, RUNNER_LIBRARIES

    names = ["torch", *RUNNER_LIBRARIES]
    for case in cases:
        names += [n for n in BY_WORKLOAD.get(case.workload, ()) if n not in names]
    return names
