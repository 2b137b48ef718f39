"""What a case saw besides its figures: a diffusers case's adapter, as the report's case
line says it, and a server case's latency against concurrency, as a table.

`CaseVerdict.observed` (`perfguard.interop.diffusers.DiffusersCase.observed`): the seam
that timed the denoising steps, or the one line that says why there are none, and for a
video output its frame count, with `e2e` per frame beside `e2e` itself: a video
pipeline's cost is read per frame, and a case that renders more frames is slower for a
reason its report should show.

A server case (`observed.server`, docs/serving.md) gets one row per concurrency level:
p50, p90 and p99 latency, throughput and failed requests, each as measured / baseline,
read from the level's figures (`stage:c4/latency_p50`, ..., `failures:c4`): how a
server's users feel load, and what moved.
"""

from __future__ import annotations

from typing import Any

from perfguard.decision.records import CaseVerdict
from perfguard.metrics import failures_metric, server_metric


def observed_facts(case: CaseVerdict) -> list[str]:
    """The case line's words for `case.observed` (none for a case without it)."""
    seen: dict[str, Any] = dict(case.observed or {})
    out = []
    if seen.get("step_seam"):
        out.append(f"steps timed at {seen['step_seam']}")
    elif seen.get("no_steps"):
        out.append(f"no steps: {seen['no_steps']}")
    frames = seen.get("frames")
    if isinstance(frames, int) and frames > 0:
        e2e = next((m for m in case.metrics if m.metric == "e2e" and m.measured), None)
        if e2e is None or e2e.measured is None:
            out.append(f"video: {frames} frames")
        else:
            ms = e2e.measured.median
            out.append(f"video: {frames} frames, e2e {ms:.2f} ms, {ms / frames:.2f} ms per frame")
    return out


SERVER_COLUMNS = ("level", "p50", "p90", "p99", "req/s", "failures")
"""The latency-against-concurrency table's columns; each cell is measured / baseline."""


def _pair(measured: float | None, baseline: float | None, fmt: str) -> str:
    def one(v: float | None) -> str:
        return "-" if v is None else format(v, fmt)

    return f"{one(measured)} / {one(baseline)}"


def server_rows(case: CaseVerdict) -> list[list[str]]:
    """One row per level of a server case (`SERVER_COLUMNS`); none for any other case."""
    server = (case.observed or {}).get("server")
    if not isinstance(server, dict):
        return []
    by_name = {m.metric: m for m in case.metrics}

    def median(metric: str) -> tuple[float | None, float | None]:
        m = by_name.get(metric)
        if m is None:
            return None, None
        return (
            None if m.measured is None else m.measured.median,
            None if m.baseline is None else m.baseline.median,
        )

    rows = []
    for name in sorted(
        server.get("levels") or {}, key=lambda n: int(n[1:]) if n[1:].isdigit() else 0
    ):
        if not name[1:].isdigit():
            continue
        level = int(name[1:])
        row = [name]
        for figure in ("latency_p50", "latency_p90", "latency_p99"):
            row.append(_pair(*median(server_metric(level, figure)), ".1f") + " ms")
        inv = median(server_metric(level, "inv_throughput"))
        row.append(_pair(*(None if v in (None, 0) else 1000.0 / v for v in inv), ".2f"))
        failures = median(failures_metric(level))
        counted = server["levels"][name].get("failures")
        row.append(_pair(failures[0] if failures[0] is not None else counted, failures[1], ".0f"))
        rows.append(row)
    return rows


def server_table_lines(case: CaseVerdict) -> list[str]:
    """The table as aligned text lines (console), titled; none for a non-server case."""
    rows = server_rows(case)
    if not rows:
        return []
    table = [list(SERVER_COLUMNS), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(SERVER_COLUMNS))]
    title = f"{case.case_id}: latency against concurrency (measured / baseline)"
    return [title, *("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table)]
