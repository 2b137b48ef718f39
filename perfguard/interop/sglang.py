"""sglang interop: import its `perf_baselines.json` files, read its `performance.log`.

sglang's diffusion CI keeps its reference figures in `perf_baselines.json` files (one per
hardware pool) and its runtime writes one JSON line per request to `performance.log`.
Importing the former and checking the latter lets a team adopt perfguard without
re-measuring, and lets perfguard gate a real sglang server run.

The import never loses or changes a figure. Each sglang figure lands in its perfguard
place (`expected_e2e_ms` -> `e2e.median`, `stages_ms[S]` -> `stages[S].median`,
`denoise_step_ms["i"]` -> `steps[i].median`, `expected_avg_denoise_ms` ->
`step_avg.median`, `expected_median_denoise_ms` -> `step_median.median`,
`expected_load_ms` -> `load_ms`, `runtime_peak_allocated_mb` -> `peak_memory.median`, the
tolerance profiles -> `tolerances.<name>.rel`, `improvement_reporting.threshold` ->
`improvement_threshold`, `sampling.step_fractions` -> `sampling.step_fractions`), and
whatever has no perfguard meaning is kept verbatim under a field named `sglang_extra`
(at the top, in a profile or in a scenario): the other VRAM figures, `load` /
`*_peak_vram` tolerances, `estimated_full_test_time_s`, `per_frame_generation: null`,
the `0.0` average step that sglang writes for cases without per-step timing, unknown keys.

sglang figures are single values (one request after warm-up), so imported summaries
have `n = 1` and no spread. Absolute pads and the DecodingStage / step-0 floors are not
in sglang's files but in its checker's source; the import writes those (device) values.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfguard.decision.tolerances import DEFAULT_IMPROVEMENT_THRESHOLD, sglang_profiles
from perfguard.errors import PerfguardError
from perfguard.metrics import METRIC_CLASSES, metrics_of_run
from perfguard.results import CaseResult, Results, RunRecord, slugify, utc_now
from perfguard.storage.baseline import (
    BASELINE_KIND,
    BASELINE_SCHEMA_VERSION,
    Baseline,
    parse,
)
from perfguard.storage.cases import PLATFORM_NAMES
from perfguard.storage.jsonio import loads, read_json, read_text

_STAGE_NAME = re.compile(r"^[A-Za-z0-9_./-]+$")
_SGLANG_CLASSES = ("e2e", "denoise_stage", "non_denoise_stage", "denoise_step", "denoise_agg")
_SCENARIO_PLACES = {
    "expected_e2e_ms": "e2e",
    "expected_avg_denoise_ms": "step_avg",
    "expected_median_denoise_ms": "step_median",
    "runtime_peak_allocated_mb": "peak_memory",
}


def _is_figure(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _figure(value: Any, where: str) -> float:
    if not _is_figure(value):
        raise PerfguardError(f"{where}: expected a non-negative number, found {value!r}")
    return value


def guess_platform(data: Mapping[str, Any], source: str) -> str:
    """npu for Ascend pools (sglang's `*_npu` ids), rocm for AMD ones, else cuda."""
    text = f"{source} {json.dumps(data.get('metadata', {}))}".lower()
    ids = list(data.get("scenarios", {}))
    if "npu" in text or "ascend" in text or (ids and all("npu" in i for i in ids)):
        return "npu"
    if re.search(r"\b(amd|mi[23]\d\d\w*|rocm)\b", text):
        return "rocm"
    return "cuda"


def _profile(name: str, raw: Any, platform: str, where: str, layout: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise PerfguardError(f"{where}: expected an object of tolerances, found {raw!r}")
    base = sglang_profiles(platform)[name if name in ("pr_test", "long_term") else "pr_test"]
    out = base.to_json()
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SGLANG_CLASSES:
            out["rel"][key] = _figure(value, f"{where}.{key}")
        else:
            extra[key] = value
    filled = [c for c in METRIC_CLASSES if c not in raw]
    out["description"] = (
        f"imported from sglang ({layout} layout); absolute pads and floors are sglang's "
        f"checker defaults; {', '.join(filled) or 'nothing'} filled from perfguard's defaults"
    )
    if extra:
        out["sglang_extra"] = extra
    return out


def _scenario(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise PerfguardError(f"{where}: expected an object, found {type(raw).__name__}")
    out: dict[str, Any] = {"stages": {}, "steps": []}
    extra: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "stages_ms":
            if not isinstance(value, Mapping):
                raise PerfguardError(f"{where}.stages_ms: expected an object")
            for stage, ms in value.items():
                if ms is None or not _STAGE_NAME.match(stage):
                    extra.setdefault("stages_ms", {})[stage] = ms
                else:
                    out["stages"][stage] = {
                        "median": _figure(ms, f"{where}.stages_ms.{stage}"),
                        "n": 1,
                    }
        elif key == "denoise_step_ms":
            out["steps"], rest = _steps(value, f"{where}.denoise_step_ms")
            if rest:
                extra["denoise_step_ms"] = rest
        elif key in _SCENARIO_PLACES:
            if value is None:
                extra[key] = value
                continue
            figure = _figure(value, f"{where}.{key}")
            no_steps = not raw.get("denoise_step_ms")
            if (
                key in ("expected_avg_denoise_ms", "expected_median_denoise_ms")
                and no_steps
                and figure == 0
            ):
                extra[key] = value  # sglang's "no per-step timing" marker, not a 0 ms step
            else:
                out[_SCENARIO_PLACES[key]] = {"median": figure, "n": 1}
        elif key == "expected_load_ms":
            out["load_ms"] = _figure(value, f"{where}.{key}")
        elif key == "notes" and isinstance(value, str):
            out["notes"] = value
        else:
            extra[key] = value
    if extra:
        out["sglang_extra"] = extra
    return out


def _steps(raw: Any, where: str) -> tuple[list[Any], dict[str, Any]]:
    """`{"0": ms, "1": ms, ...}` -> a list in step order (None for a gap), and the rest."""
    if isinstance(raw, list):
        raw = {str(i): v for i, v in enumerate(raw)}
    if not isinstance(raw, Mapping):
        raise PerfguardError(f"{where}: expected an object of step index -> ms")
    by_index: dict[int, float] = {}
    rest: dict[str, Any] = {}
    for key, value in raw.items():
        if re.fullmatch(r"\d+", str(key)) and value is not None:
            by_index[int(key)] = _figure(value, f"{where}.{key}")
        else:
            rest[str(key)] = value
    steps: list[Any] = [None] * (max(by_index) + 1 if by_index else 0)
    for i, ms in by_index.items():
        steps[i] = {"median": ms, "n": 1}
    return steps, rest


def import_data(
    data: Any,
    source: str,
    *,
    platform: str | None = None,
    hardware: str | None = None,
) -> dict[str, Any]:
    """The perfguard baseline (as JSON data, validated) for an sglang perf_baselines file."""
    if not isinstance(data, Mapping):
        raise PerfguardError(f"{source}: expected a JSON object")
    if data.get("kind") == BASELINE_KIND:
        raise PerfguardError(f"{source}: already a perfguard baseline, nothing to import")
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, Mapping):
        raise PerfguardError(
            f"{source}: $.scenarios: missing or not an object (not an sglang file?)"
        )
    platform = platform or guess_platform(data, source)
    if platform not in PLATFORM_NAMES:
        raise PerfguardError(f"--platform: {platform!r} is not one of {', '.join(PLATFORM_NAMES)}")
    metadata = _metadata(data, source, platform, hardware)
    out: dict[str, Any] = {
        "kind": BASELINE_KIND,
        "schema_version": BASELINE_SCHEMA_VERSION,
        "metadata": metadata,
        "tolerances": _profiles(data.get("tolerances"), source, platform),
        "improvement_threshold": DEFAULT_IMPROVEMENT_THRESHOLD,
        "scenarios": {
            cid: _scenario(s, f"{source}: $.scenarios.{cid}") for cid, s in scenarios.items()
        },
    }
    extra = _take_settings(data, out, source)
    if extra:
        out["sglang_extra"] = extra
    parse(out, f"{source} (imported)")
    return out


def _metadata(
    data: Mapping[str, Any], source: str, platform: str, hardware: str | None
) -> dict[str, Any]:
    """The baseline's metadata from the sglang file's (hardware and date, else the file
    name and now)."""
    meta_raw = data.get("metadata", {})
    if not isinstance(meta_raw, Mapping):
        raise PerfguardError(f"{source}: $.metadata: expected an object")
    hw = hardware or slugify(str(meta_raw.get("hardware") or Path(source).stem))
    stamp = meta_raw.get("last_updated")
    stamp = stamp if isinstance(stamp, str) and stamp else utc_now()
    metadata: dict[str, Any] = {
        "platform": platform,
        "hardware": hw,
        "created": stamp,
        "updated": stamp,
        "source": f"sglang:{Path(source).name}",
    }
    if isinstance(meta_raw.get("description"), str):
        metadata["description"] = meta_raw["description"]
    return metadata


def _profiles(tolerances: Any, source: str, platform: str) -> dict[str, Any]:
    """The tolerance profiles: the file's (per profile, or the older flat layout used for
    every profile), completed with perfguard's defaults for the platform."""
    if tolerances is None:
        profiles = {n: p.to_json() for n, p in sglang_profiles(platform).items()}
        for p in profiles.values():
            p["description"] = "perfguard's device defaults (the sglang file has no tolerances)"
        return profiles
    if not isinstance(tolerances, Mapping):
        raise PerfguardError(f"{source}: $.tolerances: expected an object")
    if not all(isinstance(v, Mapping) for v in tolerances.values()):
        # The older flat layout: one dict of class tolerances, used for every run.
        return {
            n: _profile(n, tolerances, platform, f"{source}: $.tolerances", "flat")
            for n in ("pr_test", "long_term")
        }
    profiles = {
        n: _profile(n, p, platform, f"{source}: $.tolerances.{n}", "profiles")
        for n, p in tolerances.items()
    }
    for name, p in sglang_profiles(platform).items():
        if name not in profiles:
            profiles[name] = {
                **p.to_json(),
                "description": "perfguard default (not in the sglang file)",
            }
    return profiles


def _take_settings(data: Mapping[str, Any], out: dict[str, Any], source: str) -> dict[str, Any]:
    """Move the file's improvement threshold and step fractions into `out`; what else the
    file holds (its metadata verbatim, and anything unknown), to keep as `sglang_extra`."""
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key in ("scenarios", "tolerances"):
            continue
        if key == "improvement_reporting" and isinstance(value, Mapping):
            rest = dict(value)
            if "threshold" in rest:
                t = rest.pop("threshold")
                if not _is_figure(t) or t >= 1:
                    raise PerfguardError(f"{source}: $.improvement_reporting.threshold: {t!r}")
                out["improvement_threshold"] = t
            if rest:
                extra[key] = rest
        elif key == "sampling" and isinstance(value, Mapping) and "step_fractions" in value:
            rest = dict(value)
            out["sampling"] = {"step_fractions": rest.pop("step_fractions")}
            if rest:
                extra[key] = rest
        else:
            extra[key] = value  # metadata verbatim, and anything unknown
    return extra


def import_file(
    src: str | os.PathLike[str], *, platform: str | None = None, hardware: str | None = None
) -> Baseline:
    """Read an sglang perf_baselines.json and return it as a perfguard `Baseline`."""
    data = import_data(read_json(src), str(src), platform=platform, hardware=hardware)
    return parse(data, str(src))


# ---- performance.log -------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfRecord:
    """One request of sglang's performance.log."""

    line: int
    request_id: str | None
    commit_hash: str | None
    tag: str | None
    stages_ms: Mapping[str, float]
    steps_ms: tuple[float, ...]
    total_ms: float

    def samples(self) -> dict[str, float]:
        """The record as perfguard metrics, named and aggregated as a timed run's are (a
        stage seen twice is summed, as the timer does)."""
        run = RunRecord(dict(self.stages_ms), list(self.steps_ms), self.total_ms)
        return metrics_of_run(run.to_dict())


def _record(obj: Any, where: str, line: int) -> PerfRecord:
    if not isinstance(obj, Mapping):
        raise PerfguardError(f"{where}: expected a JSON object, found {type(obj).__name__}")
    stages: dict[str, float] = {}
    raw_stages = obj.get("stages", [])
    if not isinstance(raw_stages, list):
        raise PerfguardError(f"{where}: stages: expected a list")
    for i, st in enumerate(raw_stages):
        if not isinstance(st, Mapping) or not isinstance(st.get("name"), str):
            raise PerfguardError(f"{where}: stages[{i}]: expected {{name, execution_time_ms}}")
        name = st["name"]
        if not _STAGE_NAME.match(name):
            raise PerfguardError(f"{where}: stages[{i}].name: {name!r} is not a stage name")
        ms = _figure(st.get("execution_time_ms"), f"{where}: stages[{i}].execution_time_ms")
        stages[name] = stages.get(name, 0.0) + ms
    raw_steps = obj.get("steps") or []
    if not isinstance(raw_steps, list):
        raise PerfguardError(f"{where}: steps: expected a list of ms")
    steps = tuple(_figure(v, f"{where}: steps[{i}]") for i, v in enumerate(raw_steps))
    total = _figure(obj.get("total_duration_ms"), f"{where}: total_duration_ms")

    def opt(key: str) -> str | None:
        value = obj.get(key)
        return None if value is None else str(value)

    return PerfRecord(line, opt("request_id"), opt("commit_hash"), opt("tag"), stages, steps, total)


def read_perf_log(path: str | os.PathLike[str]) -> list[PerfRecord]:
    """Parse sglang's performance.log (one JSON object per line; blank lines skipped)."""
    path = Path(path)
    text = read_text(path, "performance.log")
    records = []
    # "\n" only: str.splitlines() also splits at U+2028 and friends, which JSON strings may hold.
    for n, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            records.append(_record(loads(line, f"{path}:{n}"), f"{path}:{n}", n))
    if not records:
        raise PerfguardError(f"{path}: no records (expected one JSON object per line)")
    return records


def perf_log_results(
    records: Sequence[PerfRecord],
    baseline: Baseline,
    *,
    case_id: str | None = None,
    source: str = "performance.log",
) -> Results:
    """Results from sglang records: each record is one sample of the case it maps to.

    A record maps to `case_id` when given, else to its `tag`; a record with neither is
    an error (which scenario it measured cannot be guessed). The environment is the
    baseline's platform and hardware: the log does not say where it was written.
    """
    cases: dict[str, CaseResult] = {}
    for rec in records:
        cid = case_id or rec.tag
        if not cid:
            raise PerfguardError(
                f"{source}:{rec.line}: record has no tag: pass --case ID to name its scenario"
            )
        res = cases.setdefault(cid, CaseResult(case_id=cid, case={"source": source}))
        for name, value in rec.samples().items():
            res.samples.setdefault(name, []).append(value)
        res.repeats += 1
    commits = sorted({r.commit_hash for r in records if r.commit_hash})
    environment = {
        "platform": baseline.platform,
        "hardware": baseline.hardware,
        "source": "sglang performance.log",
        "file": source,
        "commit_hash": commits[0] if len(commits) == 1 else commits,
    }
    return Results(
        environment=environment,
        settings={"source": "sglang-perf-log", "records": len(records), "inject": None},
        cases=cases,
    )


NOT_IN_PERF_LOG = ("peak_memory",)
"""Metrics sglang's performance.log cannot carry: not reported missing when checking it."""
