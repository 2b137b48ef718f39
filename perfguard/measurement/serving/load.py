"""The load generator: requests at a concurrency level, as sglang's `bench_serving` sends them.

Closed loop by default: `concurrency` requests in flight, the next one sent when one
returns, which is what a concurrency sweep measures (vLLM-Omni's 1, 2, 4, 8). With a
`rate`, arrivals are Poisson (exponential gaps, seeded) and at most `concurrency` are in
flight, as `bench_serving --request-rate --max-concurrency`.

Every request ends as an `Outcome`; nothing here raises for what a server answers. An
HTTP 4xx / 5xx is a failure with the first line of its body, a malformed answer one
naming the field. Only a server that cannot be reached at all raises (`Unreachable`):
that is a broken setup, not a figure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from perfguard.measurement.serving import WARMUP_HEADER

POLL_S = 0.01
"""How often a video job is polled: well under a tiny job's time, so that latency is
the job's and not the poll's."""


class Unreachable(Exception):
    """The server did not answer at all (refused, reset, timed out while connecting)."""


@dataclass
class Outcome:
    """One request: its latency, whether it succeeded, and what the server said of it."""

    ok: bool
    latency_ms: float
    status: int = 0
    error: str | None = None
    request_id: str | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    queue_ms: float | None = None
    peak_memory_mb: float | None = None


@dataclass
class LevelRun:
    """The requests of one concurrency level in one round, and its wall time."""

    concurrency: int
    outcomes: list[Outcome]
    wall_ms: float


def _first_line(text: str) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line[:300]


def _figures(body: Mapping[str, Any], out: Outcome) -> None:
    """The optional figures of an answer (vLLM-Omni's and perfguard serve's names)."""
    stages = body.get("stage_durations")
    if isinstance(stages, Mapping):
        out.stages_ms = {str(k): float(v) for k, v in stages.items() if isinstance(v, (int, float))}
    queued = body.get("queue_time_s")
    if isinstance(queued, (int, float)):
        out.queue_ms = float(queued) * 1e3
    peak = body.get("peak_memory_mb")
    if isinstance(peak, (int, float)):
        out.peak_memory_mb = float(peak)
    rid = body.get("request_id", body.get("id"))
    out.request_id = str(rid) if rid is not None else None


def _malformed(body: Any, api: str) -> str | None:
    """The field a successful answer lacks, or None when it has what it must."""
    if not isinstance(body, Mapping):
        return "the body is not a JSON object"
    if api == "videos":
        return None if isinstance(body.get("id"), str) else "id: missing"
    data = body.get("data")
    if not isinstance(data, list) or not data:
        return "data: missing or empty"
    if not isinstance(data[0], Mapping) or not isinstance(data[0].get("b64_json"), str):
        return "data[0].b64_json: missing"
    return None


class Client:
    """Sends one case's requests to one server (`base_url`)."""

    def __init__(self, base_url: str, api: str, body: Mapping[str, Any], timeout_s: float):
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.body = dict(body)
        self.http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            limits=httpx.Limits(max_connections=1024, max_keepalive_connections=1024),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def one(self, *, warmup: bool = False) -> Outcome:
        """Send one request and wait for its answer (a video job: until it is done)."""
        headers = {WARMUP_HEADER: "1"} if warmup else {}
        path = "/v1/videos" if self.api == "videos" else "/v1/images/generations"
        t0 = time.perf_counter()
        try:
            resp = await self.http.post(path, json=self.body, headers=headers)
            out = await self._answer(resp)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            raise Unreachable(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        except httpx.TimeoutException as exc:
            out = Outcome(False, 0.0, error=f"timed out: {type(exc).__name__}")
        out.latency_ms = (time.perf_counter() - t0) * 1e3
        return out

    async def _answer(self, resp: httpx.Response) -> Outcome:
        if resp.status_code >= 400:
            return Outcome(False, 0.0, resp.status_code, f"HTTP {resp.status_code}: "
                           f"{_first_line(resp.text)}")  # fmt: skip
        try:
            body = resp.json()
        except ValueError:
            return Outcome(False, 0.0, resp.status_code, "malformed answer: not JSON")
        wrong = _malformed(body, self.api)
        if wrong is not None:
            return Outcome(False, 0.0, resp.status_code, f"malformed answer: {wrong}")
        if self.api == "videos":
            body = await self._poll(str(body["id"]))
            if body.get("status") != "completed":
                err = body.get("error") or {}
                msg = err.get("message") if isinstance(err, Mapping) else err
                return Outcome(False, 0.0, resp.status_code, f"video job failed: {msg}")
        out = Outcome(True, 0.0, resp.status_code)
        _figures(body, out)
        return out

    async def _poll(self, vid: str) -> dict[str, Any]:
        while True:
            resp = await self.http.get(f"/v1/videos/{vid}")
            if resp.status_code >= 400:
                return {"status": "failed", "error": f"HTTP {resp.status_code} polling {vid}"}
            body = resp.json()
            if not isinstance(body, dict) or body.get("status") in ("completed", "failed"):
                return body if isinstance(body, dict) else {"status": "failed"}
            await asyncio.sleep(POLL_S)


async def run_level(
    client: Client, concurrency: int, requests: int, rate: float | None, seed: int
) -> LevelRun:
    """`requests` requests at `concurrency` (closed loop, or Poisson at `rate`)."""
    gate = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)
    outcomes: list[Outcome] = []

    async def send(delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        async with gate:
            outcomes.append(await client.one())

    starts, at = [], 0.0
    for _ in range(requests):
        starts.append(at if rate else 0.0)
        if rate:
            at += rng.expovariate(rate)
    t0 = time.perf_counter()
    await asyncio.gather(*(send(s) for s in starts))
    return LevelRun(concurrency, outcomes, (time.perf_counter() - t0) * 1e3)


async def warm_up(client: Client, count: int) -> None:
    """Untimed requests, one at a time: the server's one-off costs, not the round's."""
    for _ in range(count):
        await client.one(warmup=True)
