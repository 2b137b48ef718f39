"""A `workload = "server"` case measured into a `CaseResult`: rounds of a load scenario.

Why rounds: the verdict's noise model is built on processes (`CaseResult.groups`: the
spread of per-process medians, Student's t on their degrees of freedom). A round of a
server case is one such group: `warmup` untimed requests, then `requests` at each
concurrency level, and one sample of each figure per level (`perfguard.metrics`: p50, p90,
p99, inverse throughput, queue time, stages, steps, peak memory). The rule then applies
unchanged, and a check's confirmation measures one more round. A measurement takes the
case's `rounds` (gen-baselines and a check's first measurement alike), a confirmation one.

Why a fresh server per round (`launch` cases): a server process has an offset of its own
(its allocator's layout, its threads' placement, its hash seed) that every request it
answers shares. Rounds of one server would show only the spread within that server, and a
check's server differing from the baseline's by that offset read as a slowdown of every
figure at once (1 of 4 A/A checks of unchanged code, docs/serving.md). A round on a server
of its own puts the offset into the spread of the rounds, where the interval sees it, as a
fresh process per group does for a pipeline case. A launch costs a fork of the resident
server (`perfguard serve` starts warm, `perfguard.cli`) and a tiny pipeline's build. A
`url` case measures a server perfguard did not start, so every round shares it: its
figures take the server's session term (`perfguard.decision.tolerances.SERVER_SESSION_SD`).

Why no reference workload: a pipeline case's runs are each divided by the reference
workload timed beside them (`perfguard.decision.normalize`). The server's work runs in
another process, and the reference timed in this one between rounds did not follow it:
tried on the busy 2-core runner (7 December), it read a check of unchanged code 1.77x
slower than its baseline. Server figures are stored raw.

Why failures are an exact figure: a failed request is a fact, not a noisy figure, and one
the baseline did not have must fail the check whatever the timings say. Each level's
count of failed requests is `failures:c<N>` (`observed.server.levels`), judged as a work
counter is (`perfguard.decision.counters.judge_failures`: "counted 3, baseline 0"). The
kinds of answer (`ok`, `HTTP 500`, ...) and the first error are kept beside them.

What the figures come from, best first: sglang's `performance.log` joined by request id,
the answer's own `stage_durations` (vLLM-Omni, `perfguard serve`), Prometheus `/metrics`
(means over the level). A server that speaks only the API is gated on latency,
throughput and its answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from perfguard.measurement.serving import scrape
from perfguard.measurement.serving.launch import Launched, LaunchFailed
from perfguard.measurement.serving.load import Client, LevelRun, Unreachable, run_level, warm_up
from perfguard.metrics import server_metric, server_peak_metric
from perfguard.results import CaseResult, Results
from perfguard.storage.cases import SERVER, Case

Echo = Callable[[str], None]
JOIN_WAIT_S = 2.0
"""How long a level waits for the perf-log lines of its requests (sglang writes a line
after it answers)."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def answer_kind(error: str | None) -> str:
    """`ok`, `HTTP 500`, `malformed answer`, ...: how the answers of a level are counted."""
    if error is None:
        return "ok"
    head = error.split(":", 1)[0]
    return head if head.startswith("HTTP") else head.replace("_", " ")


def run_coroutine(coro: Any) -> Any:
    """`asyncio.run(coro)`, or in a thread of its own when this thread already runs an event
    loop (a notebook, a test session that drove a browser): a round's requests need a
    loop of their own, and `asyncio.run` refuses to nest."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


class ServerRun:
    """The rounds of one server case, each against a server launched for it (`launch`)
    or all against the one at `url`, and what they measured."""

    def __init__(self, case: Case, echo: Echo) -> None:
        self.case, self.echo = case, echo
        self.url = case.url
        self.launch_s: list[float] = []
        self.rounds: list[dict[str, float]] = []
        self.answers: dict[int, Counter[str]] = {c: Counter() for c in case.concurrency}
        self.first_error: dict[int, str] = {}
        self.throughput: dict[int, list[float]] = {c: [] for c in case.concurrency}
        self.perf_log = scrape.PerfLog(Path(case.perf_log)) if case.perf_log else None
        self.problems: list[str] = []

    def measure(self, rounds: int) -> None:
        """`rounds` rounds, each on a fresh server of the case's `launch` (started here,
        stopped with its process tree whatever happens) or on the server at `url`."""
        for r in range(rounds):
            if not self.case.launch:
                run_coroutine(self._round(r))
                continue
            server = Launched(self.case.launch, self.case.ready, self.case.ready_timeout_s)
            t0 = time.perf_counter()
            try:
                self.url = server.start()
                self.launch_s.append(time.perf_counter() - t0)
                run_coroutine(self._round(r))
            finally:
                server.stop()

    async def _round(self, r: int) -> None:
        client = Client(self.url, self.case.api, self.case.request, self.case.request_timeout_s)
        try:
            await warm_up(client, self.case.warmup)
            figures: dict[str, float] = {}
            for level in self.case.concurrency:
                figures.update(await self._level(client, level, r))
            self.rounds.append(figures)
        finally:
            await client.close()

    async def _level(self, client: Client, level: int, round_: int) -> dict[str, float]:
        if self.perf_log is not None:
            self.perf_log.read_new()  # what earlier requests (warm-up) left
        before = await self._metrics()
        run = await run_level(client, level, self.case.requests, self.case.rate, seed=round_)
        after = await self._metrics()
        for o in run.outcomes:
            self.answers[level][answer_kind(o.error)] += 1
            if o.error and level not in self.first_error:
                self.first_error[level] = o.error
        ok = [o for o in run.outcomes if o.ok]
        if not ok:
            return {}
        self.throughput[level].append(len(ok) / (run.wall_ms / 1e3))
        lines = await self._perf_lines(ok)
        return self._figures(level, run, lines, (before, after))

    async def _metrics(self) -> scrape.Samples | None:
        if not self.case.metrics:
            return None
        async with httpx.AsyncClient(timeout=10.0) as http:
            resp = await http.get(f"{self.url.rstrip('/')}/metrics")
        if resp.status_code != 200:
            self._problem(f"/metrics: HTTP {resp.status_code}")
            return None
        return scrape.parse_metrics(resp.text, self.problems)

    async def _perf_lines(self, ok: list[Any]) -> dict[str, scrape.PerfLine]:
        if self.perf_log is None:
            return {}
        wanted = {o.request_id for o in ok if o.request_id}
        found: dict[str, scrape.PerfLine] = {}
        for _ in range(int(JOIN_WAIT_S / 0.05)):
            found.update(self.perf_log.read_new())
            if wanted <= set(found):
                break
            await asyncio.sleep(0.05)
        missing = len(wanted - set(found))
        if missing:
            self._problem(f"{self.perf_log.path}: no line for {missing} request id(s)")
        return found

    def _figures(
        self, level: int, run: LevelRun, lines: dict[str, scrape.PerfLine], reads: tuple[Any, Any]
    ) -> dict[str, float]:
        """One round's figures of one level (`perfguard.metrics`, server figures)."""
        ok = [o for o in run.outcomes if o.ok]
        latencies = [o.latency_ms for o in ok]
        out = {
            server_metric(level, "latency_p50"): quantile(latencies, 0.5),
            server_metric(level, "latency_p90"): quantile(latencies, 0.9),
            server_metric(level, "latency_p99"): quantile(latencies, 0.99),
            server_metric(level, "inv_throughput"): run.wall_ms / len(ok),
        }
        before, after = reads
        stages: dict[str, list[float]] = {}
        steps: list[float] = []
        for o in ok:
            line = lines.get(o.request_id or "")
            for name, ms in (line.stages_ms if line else o.stages_ms).items():
                stages.setdefault(name, []).append(ms)
            if line and line.steps_ms:
                steps.append(statistics.fmean(line.steps_ms))
        if not stages and before is not None and after is not None:
            for name in scrape.stages_of(after):
                mean = scrape.mean_ms(before, after, scrape.STAGE, stage=name)
                if mean is not None:
                    stages[name] = [mean]
        for name, values in stages.items():
            out[server_metric(level, name)] = statistics.median(values)
        if steps:
            out[server_metric(level, "step_avg")] = statistics.median(steps)
        queued = [o.queue_ms for o in ok if o.queue_ms is not None]
        if before is not None and after is not None:
            mean = scrape.mean_ms(before, after, scrape.QUEUE)
            queued = [mean] if mean is not None else queued
        if queued:
            out[server_metric(level, "queue_time")] = statistics.median(queued)
        peaks = [o.peak_memory_mb for o in ok if o.peak_memory_mb is not None]
        if peaks:
            out[server_peak_metric(level)] = max(peaks)
        return out

    def _problem(self, message: str) -> None:
        self.problems.append(message)

    def result(self, result: CaseResult) -> CaseResult:
        """`result` with the rounds' samples (the figures every round has), the answers as
        its output, and the level summary under `observed.server`."""
        if self.perf_log is not None:
            self.problems.extend(self.perf_log.problems)
        for message in dict.fromkeys(self.problems):
            self.echo(f"perfguard: {self.case.id}: {message}")
        common = set.intersection(*(set(r) for r in self.rounds)) if self.rounds else set()
        result.samples = {m: [r[m] for r in self.rounds] for m in sorted(common)}
        result.repeats = len(self.rounds)
        result.groups = [1] * len(self.rounds) if len(self.rounds) > 1 else None
        # The answers are judged as `failures:c<N>` (exact), not as an output hash.
        result.output_hash = None
        result.deterministic = True
        result.observed = {"server": self.summary()}
        return result

    def summary(self) -> dict[str, Any]:
        """`observed.server`: per level, the answers by kind, the failed requests, the
        median throughput and the first error; how many servers the rounds ran on."""
        levels = {}
        for level in self.case.concurrency:
            tp = self.throughput[level]
            kinds = self.answers[level]
            levels[f"c{level}"] = {
                "answers": dict(sorted(kinds.items())),
                "failures": sum(n for kind, n in kinds.items() if kind != "ok"),
                "throughput_rps": round(statistics.median(tp), 4) if tp else None,
                **({"first_error": self.first_error[level]} if level in self.first_error else {}),
            }
        out: dict[str, Any] = {
            "url": self.url,
            "levels": levels,
            "problems": len(self.problems),
            "rounds": len(self.rounds),
            "servers": len(self.launch_s) if self.case.launch else 1,
        }
        if self.launch_s:
            out["launch_s"] = round(statistics.median(self.launch_s), 3)
        return out


def rounds_for(case: Case, options: Any) -> int:
    """A measurement's rounds: the case's, or one for a check's confirmation (which, as
    one more process of a pipeline case, does not count work) and for a work check."""
    if options.counters_only or not options.count_work:
        return 1
    return case.rounds


def run_server_case(case: Case, options: Any, *, echo: Echo = _stderr) -> CaseResult:
    """Measure one server case; a server that cannot be reached, that never gets ready or
    that dies mid-run makes the case an error (exit 3) naming it, and nothing else."""
    result = CaseResult(case_id=case.id, warmup=case.warmup, repeats=0, case=case.definition())
    try:
        run = ServerRun(case, echo)
        run.measure(rounds_for(case, options))
        return run.result(result)
    except (Unreachable, LaunchFailed) as exc:
        result.status = "error"
        where = f" at {case.url}" if case.url else ""
        result.error = f"server{where} unreachable or gone: {exc}"[:2000]
        return result


def with_server_cases(
    execute: Callable[..., Results],
    cases: Sequence[Case],
    platform: Any,
    options: Any,
    *,
    on_case: Callable[[CaseResult], None] | None = None,
    **others: Any,
) -> Results:
    """`execute(cases, ...)` for the pipeline cases, and the server cases measured here, in
    this process: a server case's processes are its rounds, never worker processes."""
    servers = [c for c in cases if c.workload == SERVER]
    rest = [c for c in cases if c.workload != SERVER]
    if not servers:
        return execute(rest, platform, options, on_case=on_case, **others)
    if rest:
        results = execute(rest, platform, options, on_case=on_case, **others)
    else:
        from perfguard.device.platform import fingerprint

        results = Results(environment=fingerprint(platform), settings=options.settings())
    for case in servers:
        res = run_server_case(case, options)
        results.cases[case.id] = res
        if on_case is not None:
            on_case(res)
    return results
