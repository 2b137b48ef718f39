"""Profiled runs: which operations each stage of a case spent its time in, per side.

An attribution (`perfguard.decision.attribution`) compares two sides' op tables, so
each side is profiled in a process of its own, importing its own perfguard, as the
relative check's base side does (`perfguard.measurement.relative`): a side worker
(`perfguard.measurement.side_worker`, this revision's file run by path, since the side's
perfguard may lack it) starts with the side's import directory first on `PYTHONPATH` and
as its working directory, and answers one `profile` request: it builds the case, warms
it up, and makes `runs` profiled runs under `torch.profiler` (CPU activity always; CUDA,
ROCm through CUDA, or NPU where the platform is one), with the stage timer opening a
`record_function` range per stage and step (`StageTimer(ranges=True)`).

Why a spawned interpreter, not a fork of a warm server: a side's environment may
change what runs at interpreter start (a `sitecustomize` on its `PYTHONPATH` that slows
the code from outside, as `benchmarks/slow_blocks` does), which a fork would skip; and
an attribution starts two processes a case (its two sides, side by side:
`explain.explain_case`), too few for a server's imports to pay back.

Why a process of its own and never a timed run: the profiler costs each op a few
microseconds and its ranges a few more per boundary, which would move the timings it
explains; and a verdict must not wait for it when nothing regressed. Why several
profiled runs (5 by default): the attribution's noise rule compares each op's change
with how much the same op's self time varies between runs of one side, with the
fastest and slowest run set aside, so it needs five; a smoke case's profiled run costs
well under a second, against the ~20 s of the process's start and build. Why self
time: inclusive times count an op's children too, so a slower `linear` would appear
again in every range around it; self times add up to the stage's time exactly once.

Each op event is given to the innermost stage range above it (its chain of CPU
parents); the range's own self time (the stage's host code between ops: Python,
hooks, a busy wait) is a row of its own, `(host code outside ops)`. The Chrome trace of
the first profiled run is written where the caller asks (`chrome://tracing`, Perfetto).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.storage.cases import Case

PROFILE_RUNS = 5
PROFILE_TIMEOUT_S = 600.0
HOST_ROW = "(host code outside ops)"


@dataclass(frozen=True)
class ProfileSide:
    """Where one side's profiled process gets its code: `import_dir` first on the path
    and as its working directory (None: this process's perfguard, as it is)."""

    label: str
    import_dir: Path | None = None
    inject: Mapping[str, float] | None = None
    env: Mapping[str, str] | None = None
    """Variables set for this side only (a benchmark's slowdown injected from outside)."""


def side_request(
    request: dict[str, Any],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    root: str | None,
    label: str,
    timeout_s: float,
    server: Any = None,
) -> dict[str, Any]:
    """Start a side worker (`launch.SIDE_WORKER`: spawned, or forked from `server`, a
    `launch.SharedFork`), send it `request`, and return its result. `PerfguardError`
    with one line when the side cannot answer: its error (the last line of its
    traceback), else the last line its process wrote, else how it ended;
    `TimeoutError` past `timeout_s`. Its output is kept apart and read only then."""
    from perfguard.measurement.launch import SIDE_WORKER
    from perfguard.measurement.worker_handle import Worker

    with tempfile.TemporaryFile() as log:
        try:
            worker = Worker(
                dict(env), label, cwd, SIDE_WORKER, root=root, server=server, output=log.fileno()
            )
        except OSError as exc:  # cannot start a process, or the server is gone
            raise PerfguardError(f"{label}: {exc}") from exc
        try:
            why = worker.start()
            reply: dict[str, Any] | None = None
            if why is None:
                try:
                    reply = worker.ask(request, time.monotonic() + timeout_s)
                except OSError:
                    reply = None
        except BaseException:
            worker.kill()
            raise
        if reply is not None and "result" in reply:
            worker.close()
            result: dict[str, Any] = reply["result"]
            return result
        text = str((reply or {}).get("error") or (reply or {}).get("fatal") or "")
        if text:
            worker.kill()
            raise PerfguardError(text)
        worker.close()
        log.seek(0)
        lines = [ln.strip() for ln in log.read().decode(errors="replace").splitlines()]
        raise PerfguardError(([ln for ln in lines if ln][-1:] or [why or worker.how()])[0])


def profile_case(
    case: Case,
    side: ProfileSide,
    *,
    platform: str,
    trace: str | os.PathLike[str] | None,
    runs: int = PROFILE_RUNS,
    warmup: int = 1,
    threads: int | None = None,
    factory: str | None = None,
) -> dict[str, Any]:
    """Profile `case` on `side` in a process of its own: the op tables of each run.

    Returns the side worker's `profile` result: `runs` (per run, stage -> rows of name,
    input shapes, calls, CPU / device / ranked self time in microseconds), `stages_ms`
    (the timer's stage times of each profiled run), the platform, its activities and
    which perfguard ran. A side that cannot build, import or run the case raises
    `PerfguardError` naming the side and the last line of its error.
    """
    from perfguard.measurement.launch import child_environment, import_root

    where = side.import_dir
    env = child_environment(update=side.env, import_dir=where)
    cwd, root = (str(where), str(where)) if where else (None, import_root())
    request = {
        "kind": "profile",
        "case": case.to_json(),
        "platform": platform,
        "warmup": warmup,
        "runs": runs,
        "threads": threads,
        "factory": factory,
        "trace": str(trace) if trace else None,
        "inject": dict(side.inject or {}),
        "host_row": HOST_ROW,
    }
    label = f"the {side.label}'s profiled run"
    try:
        data = side_request(
            request, env=env, cwd=cwd, root=root, label=label, timeout_s=PROFILE_TIMEOUT_S
        )
    except TimeoutError as exc:
        raise PerfguardError(
            f"{case.id}: the {side.label}'s profiled run took over {PROFILE_TIMEOUT_S:g} s"
        ) from exc
    except PerfguardError as exc:
        raise PerfguardError(f"{case.id}: the {side.label}'s profiled run failed: {exc}") from exc
    data["trace"] = str(trace) if trace else None
    return data
