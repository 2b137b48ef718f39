"""Profiled runs: which operations each stage of a case spent its time in, per side.

An attribution (`perfguard.decision.attribution`) compares two sides' op tables, so
each side is profiled in a process of its own, importing its own perfguard, as the
relative check's base side does (`perfguard.measurement.relative`): the script below
runs with the side's import directory first on `PYTHONPATH` and as its working
directory. It builds the case, warms it up, and makes `runs` profiled runs under
`torch.profiler` (CPU activity always; CUDA, ROCm through CUDA, or NPU where the
platform is one), with the stage timer opening a `record_function` range per stage
and step (`StageTimer(ranges=True)`).

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

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.storage.cases import Case

PROFILE_RUNS = 5
PROFILE_TIMEOUT_S = 600.0
HOST_ROW = "(host code outside ops)"

SCRIPT = r"""
import json, sys
request = json.loads(open(sys.argv[1], encoding="utf-8").read())
import torch
from torch.profiler import ProfilerActivity, profile
import perfguard
from perfguard.device import threads
from perfguard.device.platform import probe
from perfguard.device import timer as timer_module
from perfguard.measurement import runner
from perfguard.measurement.workers import case_from_json

HOST_ROW = request["host_row"]
case = case_from_json(request["case"])
platform = probe(request["platform"])
threads.apply(threads.case_threads(case, platform.name, request.get("threads")))
factory = runner.import_factory(request["factory"]) if request.get("factory") else None
pipeline = (factory or runner._default_factory)(case, platform)
for _ in range(max(1, int(request["warmup"]))):
    pipeline()
platform.synchronize()

activities = [ProfilerActivity.CPU]
if platform.name in ("cuda", "rocm") and torch.cuda.is_available():
    activities.append(ProfilerActivity.CUDA)
elif platform.name == "npu" and hasattr(ProfilerActivity, "PrivateUse1"):
    activities.append(ProfilerActivity.PrivateUse1)
device = len(activities) > 1

def timer():
    inject = request.get("inject") or {}
    try:
        return timer_module.StageTimer(platform, track_memory=False, inject=inject, ranges=True)
    except TypeError:  # a perfguard before stage ranges: open them from outside
        from torch.profiler import record_function
        span = timer_module._Span
        if not getattr(span, "_pg_ranged", False):
            enter, leave = span.__enter__, span.__exit__
            def ranged_enter(self):
                out = enter(self)
                t = self._timer
                label = f"step:{len(t._steps)}" if self._step else f"stage:{self.name}"
                r = record_function(label)
                r.__enter__()
                span._pg_open[id(self)] = r
                return out
            def ranged_exit(self, *exc):
                span._pg_open.pop(id(self)).__exit__(None, None, None)
                return leave(self, *exc)
            span._pg_open = {}
            span.__enter__, span.__exit__, span._pg_ranged = ranged_enter, ranged_exit, True
        return timer_module.StageTimer(platform, track_memory=False, inject=inject)

def stage_of(event):
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("stage:"):
            return parent.name[len("stage:"):]
        parent = parent.cpu_parent
    return None

def table(prof):
    stages = {}
    for e in prof.events():
        if e.name.startswith("ProfilerStep"):
            continue
        if e.name.startswith("stage:"):
            # the range's own time: the stage's host code between its ops
            name, key = e.name[len("stage:"):], (HOST_ROW, "")
        elif e.name.startswith("step:"):
            name, key = stage_of(e), (HOST_ROW, "")
        else:
            name = stage_of(e)
            key = (e.name, json.dumps(e.input_shapes or [], separators=(",", ":")))
        if name is None:
            continue
        cpu = float(e.self_cpu_time_total)
        dev = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        ops = stages.setdefault(name, {})
        row = ops.setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += cpu
        row[2] += dev
    out = {}
    for name, ops in stages.items():
        out[name] = [
            {"name": k[0], "shapes": k[1], "calls": v[0], "cpu_us": round(v[1], 3),
             "device_us": round(v[2], 3), "self_us": round(v[2] if device else v[1], 3)}
            for k, v in sorted(ops.items())
        ]
    return out

def trace_table(path):
    # CPU only: the same table from the exported trace, which takes ~0.1 s where
    # `prof.events()` builds ~13k Python objects a smoke run (~2 s each run).
    events = [e for e in json.load(open(path, encoding="utf-8"))["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    stages = {}
    by_thread = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for rows in by_thread.values():
        rows.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack = []  # [event, end, own, stage]
        def close(item):
            e, _, own, name = item
            label = e["name"]
            if label.startswith("ProfilerStep") or name is None:
                return
            if label.startswith(("stage:", "step:")):
                key = (HOST_ROW, "")
            else:
                dims = (e.get("args") or {}).get("Input Dims") or []
                key = (label, json.dumps(dims, separators=(",", ":")))
            row = stages.setdefault(name, {}).setdefault(key, [0, 0.0, 0.0])
            row[0] += 1
            row[1] += max(own, 0.0)
        for e in rows:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            while stack and stack[-1][1] <= ts + 1e-3:
                close(stack.pop())
            name = stack[-1][3] if stack else None
            if e["name"].startswith("stage:"):
                name = e["name"][len("stage:"):]
            if stack:
                stack[-1][2] -= dur
            stack.append([e, ts + dur, dur, name])
        while stack:
            close(stack.pop())
    return {
        name: [
            {"name": k[0], "shapes": k[1], "calls": v[0], "cpu_us": round(v[1], 3),
             "device_us": 0.0, "self_us": round(v[1], 3)}
            for k, v in sorted(ops.items())
        ]
        for name, ops in stages.items()
    }

import os, tempfile
runs, stage_ms = [], []
scratch = tempfile.mkdtemp(prefix="perfguard-trace-")
for i in range(int(request["runs"])):
    with profile(activities=activities, record_shapes=True) as prof:
        with timer() as t:
            pipeline()
        platform.synchronize()
    keep = i == 0 and request.get("trace")
    path = request["trace"] if keep else os.path.join(scratch, f"run{i}.json")
    if device:
        if keep:
            prof.export_chrome_trace(path)
        runs.append(table(prof))
    else:
        prof.export_chrome_trace(path)
        runs.append(trace_table(path))
        if not keep:
            os.remove(path)
    stage_ms.append(dict(t.record().stages_ms))
os.rmdir(scratch)
out = {
    "perfguard": getattr(perfguard, "__version__", None),
    "perfguard_file": getattr(perfguard, "__file__", None),
    "platform": platform.name,
    "activities": [str(a).rsplit(".", 1)[-1] for a in activities],
    "device_time": device,
    "runs": runs,
    "stages_ms": stage_ms,
}
with open(request["out"], "w", encoding="utf-8") as fh:
    json.dump(out, fh)
"""


@dataclass(frozen=True)
class ProfileSide:
    """Where one side's profiled process gets its code: `import_dir` first on the path
    and as its working directory (None: this process's perfguard, as it is)."""

    label: str
    import_dir: Path | None = None
    inject: Mapping[str, float] | None = None
    env: Mapping[str, str] | None = None
    """Variables set for this side only (a benchmark's slowdown injected from outside)."""


def side_environment(side: ProfileSide) -> tuple[dict[str, str], str | None]:
    """The environment and working directory of `side`'s profiled process."""
    env = {**os.environ, **(side.env or {})}
    if side.import_dir is None:
        return env, None
    from perfguard.measurement.relative import base_environment

    return base_environment(side.import_dir, env), str(side.import_dir)


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

    Returns the script's JSON: `runs` (per run, stage -> rows of name, input shapes,
    calls, CPU / device / ranked self time in microseconds), `stages_ms` (the timer's
    stage times of each profiled run), the platform, its activities and which perfguard
    ran. A side that cannot build, import or run the case raises `PerfguardError`
    naming the side and the last line of its error.
    """
    env, cwd = side_environment(side)
    with tempfile.TemporaryDirectory(prefix="perfguard-profile-") as tmp:
        request = Path(tmp) / "request.json"
        out = Path(tmp) / "profile.json"
        request.write_text(
            json.dumps(
                {
                    "case": case.to_json(),
                    "platform": platform,
                    "warmup": warmup,
                    "runs": runs,
                    "threads": threads,
                    "factory": factory,
                    "trace": str(trace) if trace else None,
                    "inject": dict(side.inject or {}),
                    "out": str(out),
                    "host_row": HOST_ROW,
                }
            ),
            encoding="utf-8",
        )
        try:
            proc = subprocess.run(
                [sys.executable, "-c", SCRIPT, str(request)],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=PROFILE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PerfguardError(
                f"{case.id}: the {side.label}'s profiled run took over {PROFILE_TIMEOUT_S:g} s"
            ) from exc
        if proc.returncode != 0 or not out.exists():
            last = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["?"]
            raise PerfguardError(f"{case.id}: the {side.label}'s profiled run failed: {last[0]}")
        data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    data["trace"] = str(trace) if trace else None
    return data
