"""The worker that probes, profiles and counts a side with that side's own perfguard.

    python -m perfguard.measurement.side_worker serve --result-fd N
        Report ready, then answer each request on stdin (one JSON line, `kind`
        `probe`, `profile` or `count`) with one JSON line on fd N: `{"result": ...}`, or
        `{"error": "Type: message"}` when the side cannot build, import or run it.

It speaks the protocol of `perfguard.measurement.worker` (a ready message, requests on
stdin, replies on a pipe of their own) and starts the same ways (`launch.spawn_worker`,
or a fork of a warm server), but it is run **by path** (`launch.SIDE_WORKER`), never
imported from the side: a relative check probes, an attribution profiles, and a bisect
counts revisions older
than this file, whose perfguard lacks it. So this module imports only the standard
library at module level; each request imports the perfguard of the process's import
root (the side's checkout) and what it needs from it, as the side's own code.

- `probe` (`perfguard.measurement.base_revision.probe_base`): where the side's perfguard
  (and a factory module) is imported from, its version, worker module and protocol, and
  the case and option fields it knows, so that a base that cannot run the head's cases
  is refused before anything is measured.

- `profile` (`perfguard.measurement.profiling`): build the case, warm it up, and make
  `runs` profiled runs under `torch.profiler` (CPU activity always; CUDA, ROCm through
  CUDA, or NPU where the platform is one), with the stage timer opening a
  `record_function` range per stage and step (`StageTimer(ranges=True)`, opened from
  outside on a perfguard older than that); the result is each run's op table per stage
  and the timer's stage times.
- `count` (`perfguard.measurement.commit_counts`): one counted run of each case
  (`MeasureOptions(counters_only=True)`: a warm-up, whose output is kept, and the counted
  run); the result is each case's result and the file perfguard was imported from.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
import traceback
from typing import Any


def _case_from_json() -> Any:
    """The side's `case_from_json`: in `measurement/worker_handle.py` since 7 December,
    in `measurement/workers.py` in the revisions before (a bisected commit, an older
    merge base), whose perfguard this process imports."""
    try:
        from perfguard.measurement.worker_handle import case_from_json
    except ImportError:
        from perfguard.measurement.workers import case_from_json  # type: ignore[attr-defined]
    return case_from_json


def serve(result_fd: int) -> int:
    out = os.fdopen(result_fd, "w", buffering=1, encoding="utf-8")

    def send(msg: dict[str, Any]) -> None:
        out.write(json.dumps(msg, allow_nan=False) + "\n")
        out.flush()

    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            result = KINDS[request["kind"]](request)
        except Exception as exc:  # the side's error, in the last line of its traceback
            send({"error": traceback.format_exception_only(exc)[-1].strip()})
            continue
        send({"result": result})
    return 0


# ---- probe ---------------------------------------------------------------------------------


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """What the side's perfguard is and can run (`base_revision.probe_base` reads it)."""
    import perfguard

    out: dict[str, Any] = {
        "file": getattr(perfguard, "__file__", None),
        "version": getattr(perfguard, "__version__", None),
    }
    here = os.path.dirname(getattr(perfguard, "__file__", None) or ".")

    def first(*names: str) -> tuple[str, Any]:
        # By the files of the side's own package: a module it lacks could otherwise be
        # found by an editable install's finder in another checkout.
        for name in names:
            rel = os.path.join(*name.split(".")[1:])
            if os.path.exists(os.path.join(here, rel + ".py")):
                return name, importlib.import_module(name)
        raise ModuleNotFoundError(f"the base's perfguard has none of {', '.join(names)}")

    # Layouts: perfguard.measurement.* (layered), perfguard.* (flat, before).
    out["worker_module"], worker = first("perfguard.measurement.worker", "perfguard._worker")
    out["protocol"] = getattr(worker, "WORKER_PROTOCOL", 1)
    _, cases = first("perfguard.storage.cases", "perfguard.cases")
    out["case_fields"] = [f.name for f in dataclasses.fields(cases.Case)]
    _, options = first("perfguard.measurement.options", "perfguard.workers")
    if hasattr(options, "WORKER_FIELDS"):
        out["option_fields"] = ["platform", *options.WORKER_FIELDS]
    else:
        out["option_fields"] = [f.name for f in dataclasses.fields(options.RunOptions)]
    if request.get("factory"):
        module = importlib.import_module(str(request["factory"]).partition(":")[0])
        out["factory_file"] = getattr(module, "__file__", None)
    return out


# ---- count -----------------------------------------------------------------------------------


def count(request: dict[str, Any]) -> dict[str, Any]:
    """One counted run of each case of `request["cases"]`: `{"perfguard_file", "cases":
    {case id: result JSON}}`."""
    import perfguard
    from perfguard.device.platform import probe
    from perfguard.measurement.options import MeasureOptions
    from perfguard.measurement.runner import run_case

    case_from_json = _case_from_json()

    platform = probe(request["platform"])
    options = MeasureOptions(counters_only=True)
    cases = {}
    for data in request["cases"]:
        case = case_from_json(data)
        cases[case.id] = run_case(case, platform, options).to_json()
    return {"perfguard_file": perfguard.__file__, "cases": cases}


# ---- profile ---------------------------------------------------------------------------------


def profile(request: dict[str, Any]) -> dict[str, Any]:
    """The profiled runs of `request["case"]` (`profiling.profile_case` says what each
    field is); the Chrome trace of the first run goes to `request["trace"]` if set."""
    import perfguard

    platform, pipeline = _warm_pipeline(request)
    activities = _activities(platform)
    device = len(activities) > 1
    runs, stage_ms = _profiled_runs(request, platform, pipeline, activities)
    return {
        "perfguard": getattr(perfguard, "__version__", None),
        "perfguard_file": getattr(perfguard, "__file__", None),
        "platform": platform.name,
        "activities": [str(a).rsplit(".", 1)[-1] for a in activities],
        "device_time": device,
        "runs": runs,
        "stages_ms": stage_ms,
    }


def _warm_pipeline(request: dict[str, Any]) -> tuple[Any, Any]:
    """The side's platform and the case's pipeline, built with the side's perfguard (or
    the request's factory) and run `warmup` times: what a profiled run measures."""
    from perfguard.device import threads
    from perfguard.device.platform import probe
    from perfguard.measurement import runner

    case_from_json = _case_from_json()

    case = case_from_json(request["case"])
    platform = probe(request["platform"])
    threads.apply(threads.case_threads(case, platform.name, request.get("threads")))
    factory = runner.import_factory(request["factory"]) if request.get("factory") else None
    pipeline = (factory or runner._default_factory)(case, platform)
    for _ in range(max(1, int(request["warmup"]))):
        pipeline()
    platform.synchronize()
    return platform, pipeline


def _activities(platform: Any) -> list[Any]:
    """What the profiler records: the host, and the device where it can."""
    import torch
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU]
    if platform.name in ("cuda", "rocm") and torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    elif platform.name == "npu" and hasattr(ProfilerActivity, "PrivateUse1"):
        activities.append(ProfilerActivity.PrivateUse1)
    return activities


def _profiled_runs(
    request: dict[str, Any], platform: Any, pipeline: Any, activities: list[Any]
) -> tuple[list[Any], list[dict[str, float]]]:
    """`request["runs"]` profiled runs: each run's op table and its stage times."""
    from torch.profiler import profile as profiler

    host_row, device = request["host_row"], len(activities) > 1
    runs, stage_ms = [], []
    scratch = tempfile.mkdtemp(prefix="perfguard-trace-")
    for i in range(int(request["runs"])):
        with profiler(activities=activities, record_shapes=True) as prof:
            with _timer(platform, request.get("inject") or {}) as t:
                pipeline()
            platform.synchronize()
        keep = i == 0 and request.get("trace")
        path = request["trace"] if keep else os.path.join(scratch, f"run{i}.json")
        if device:
            if keep:
                prof.export_chrome_trace(path)
            runs.append(_table(prof, host_row, device))
        else:
            # CPU: the same table from the exported trace, which takes ~0.1 s where
            # `prof.events()` builds ~13k Python objects a smoke run (~2 s each run).
            prof.export_chrome_trace(path)
            runs.append(_trace_table(path, host_row))
            if not keep:
                os.remove(path)
        stage_ms.append(dict(t.record().stages_ms))
    os.rmdir(scratch)
    return runs, stage_ms


def _timer(platform: Any, inject: dict[str, float]) -> Any:
    """A stage timer that opens a profiler range per stage and step."""
    from perfguard.device import timer as timer_module

    try:
        return timer_module.StageTimer(platform, track_memory=False, inject=inject, ranges=True)
    except TypeError:  # a perfguard before stage ranges: open them from outside
        _range_spans(timer_module._Span)
        return timer_module.StageTimer(platform, track_memory=False, inject=inject)


def _range_spans(span: Any) -> None:
    """Make an older perfguard's timer spans open a `record_function` range each."""
    from torch.profiler import record_function

    if getattr(span, "_pg_ranged", False):
        return
    enter, leave = span.__enter__, span.__exit__

    def ranged_enter(self: Any) -> Any:
        out = enter(self)
        t = self._timer
        label = f"step:{len(t._steps)}" if self._step else f"stage:{self.name}"
        r = record_function(label)
        r.__enter__()
        span._pg_open[id(self)] = r
        return out

    def ranged_exit(self: Any, *exc: Any) -> Any:
        span._pg_open.pop(id(self)).__exit__(None, None, None)
        return leave(self, *exc)

    span._pg_open = {}
    span.__enter__, span.__exit__, span._pg_ranged = ranged_enter, ranged_exit, True


def _stage_of(event: Any) -> str | None:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("stage:"):
            return str(parent.name[len("stage:") :])
        parent = parent.cpu_parent
    return None


def _rows(stages: dict[str, dict[tuple[str, str], list[Any]]], device: bool) -> dict[str, Any]:
    return {
        name: [
            {"name": k[0], "shapes": k[1], "calls": v[0], "cpu_us": round(v[1], 3),
             "device_us": round(v[2], 3), "self_us": round(v[2] if device else v[1], 3)}
            for k, v in sorted(ops.items())
        ]
        for name, ops in stages.items()
    }  # fmt: skip


def _table(prof: Any, host_row: str, device: bool) -> dict[str, Any]:
    """Stage -> op rows from the profiler's events (with device time)."""
    stages: dict[str, dict[tuple[str, str], list[Any]]] = {}
    for e in prof.events():
        if e.name.startswith("ProfilerStep"):
            continue
        if e.name.startswith("stage:"):
            # the range's own time: the stage's host code between its ops
            name, key = e.name[len("stage:") :], (host_row, "")
        elif e.name.startswith("step:"):
            name, key = _stage_of(e), (host_row, "")
        else:
            name = _stage_of(e)
            key = (e.name, json.dumps(e.input_shapes or [], separators=(",", ":")))
        if name is None:
            continue
        row = stages.setdefault(name, {}).setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += float(e.self_cpu_time_total)
        row[2] += float(getattr(e, "self_device_time_total", 0.0) or 0.0)
    return _rows(stages, device)


def _trace_table(path: str, host_row: str) -> dict[str, Any]:
    """Stage -> op rows from an exported Chrome trace (CPU only): each op's self time is
    its duration less its children's, given to the innermost stage range above it."""
    with open(path, encoding="utf-8") as fh:
        events = [
            e for e in json.load(fh)["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
        ]  # fmt: skip
    stages: dict[str, dict[tuple[str, str], list[Any]]] = {}
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in events:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)

    def close(item: list[Any]) -> None:
        e, _, own, name = item
        label = e["name"]
        if label.startswith("ProfilerStep") or name is None:
            return
        if label.startswith(("stage:", "step:")):
            key = (host_row, "")
        else:
            dims = (e.get("args") or {}).get("Input Dims") or []
            key = (label, json.dumps(dims, separators=(",", ":")))
        row = stages.setdefault(name, {}).setdefault(key, [0, 0.0, 0.0])
        row[0] += 1
        row[1] += max(own, 0.0)

    for rows in by_thread.values():
        rows.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0))))
        stack: list[list[Any]] = []  # [event, end, own, stage]
        for e in rows:
            ts, dur = float(e["ts"]), float(e.get("dur", 0))
            while stack and stack[-1][1] <= ts + 1e-3:
                close(stack.pop())
            name = stack[-1][3] if stack else None
            if e["name"].startswith("stage:"):
                name = e["name"][len("stage:") :]
            if stack:
                stack[-1][2] -= dur
            stack.append([e, ts + dur, dur, name])
        while stack:
            close(stack.pop())
    return _rows(stages, device=False)


KINDS = {"count": count, "probe": probe, "profile": profile}
"""The request kinds this worker answers."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfguard.measurement.side_worker")
    sub = parser.add_subparsers(dest="mode", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args(argv)
    return serve(args.result_fd)


if __name__ == "__main__":
    sys.exit(main())
