"""Baseline files: the reference figures of one platform and hardware, and their store.

One file per platform and hardware, `baselines/<platform>/<hardware-slug>.json`, because a
figure means nothing away from the machine it was measured on. A file holds:

- `metadata`: platform, hardware, created / updated, perfguard version, git commit and
  the environment fingerprint of the last generation; `advisory: true` marks the
  platform advisory (checks report but never fail);
- `tolerances`: the `pr_test` and `long_term` profiles (`perfguard.decision.tolerances.Profile`),
  stored in the file so a CPU baseline can carry smaller pads than a GPU one and a
  reviewer sees the band next to the figures;
- `improvement_threshold` and optional `sampling.step_fractions` (sglang's);
- `scenarios` by case id: `e2e`, `stages`, `steps` (a list, in step order), `step_avg`,
  `step_median`, `peak_memory`, `stage_peak_memory` (the device allocator's peak per
  stage, by stage name; CUDA/ROCm/NPU only), each a summary (median, n, spread, samples, and with
  `gen-baselines --processes K` the median of each process), plus
  `tolerance_overrides` and `notes`, which regeneration keeps.

Every load and every write is checked against `schemas/baseline.schema.json`; a file
that fails is never written over. Writes are atomic (`jsonio.write_json_atomic`) and
each read-modify-write holds the file's lock (filelock, under `~/.cache/perfguard/locks`
or `$PERFGUARD_LOCK_DIR`, not beside the file), so shards that generate different
cases into one file do not lose each other's work. Figures are rounded to 3 decimals
(µs for ms, kB for MB) and keys sorted, so a regenerated file diffs only where it changed.
"""

from __future__ import annotations

import binascii
import contextlib
import dataclasses
import hashlib
import math
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import filelock

from perfguard import __version__
from perfguard.decision.output import OutputSketch
from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    Profile,
    default_profiles,
)
from perfguard.decision.work_counts import WorkCounts
from perfguard.errors import PerfguardError
from perfguard.metrics import NORMALIZED, STAGE_PEAK_PREFIX, is_metric_name, metric_sort_key
from perfguard.results import utc_now
from perfguard.storage.jsonio import json_path, read_json, validate, write_json_atomic

BASELINE_KIND = "perfguard.baseline"
BASELINE_SCHEMA_VERSION = 1
DIGITS = 3
DEFAULT_ROOT = "baselines"
LOCK_TIMEOUT_S = 600.0
_SCALARS = ("e2e", "step_avg", "step_median", "peak_memory")


def default_path(platform: str, hardware: str, root: str | os.PathLike[str] = DEFAULT_ROOT) -> Path:
    """`baselines/<platform>/<hardware-slug>.json`."""
    return Path(root) / platform / f"{hardware}.json"


# ---- model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """The baseline of one case: a summary per metric and what regeneration must keep."""

    metrics: Mapping[str, Summary] = field(default_factory=dict)
    load_ms: float | None = None
    output_hash: str | None = None
    deterministic: bool | None = None
    repeats: int | None = None
    warmup: int | None = None
    updated: str | None = None
    case: Mapping[str, Any] | None = None
    notes: str | None = None
    tolerance_overrides: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    threads: Mapping[str, int] | None = None
    reference: Summary | None = None
    reference_version: str | None = None
    dropped_runs: int | None = None
    source: str | None = None
    """The input file `baselines merge` took this scenario from (`baseline_merge`)."""
    components: Mapping[str, Mapping[str, Any]] | None = None
    """role -> class and parameter count of what was measured: a check whose pipeline
    differs says so (`perfguard.decision.verdict.component_changes`)."""
    work: WorkCounts | None = None
    """The work counters of the counted runs (`perfguard.decision.counters`)."""
    output_sketch: Mapping[str, Any] | None = None
    """A compact reference of the output, for the output-equivalence check."""
    timing: str | None = None
    """`normalized`: the timed metrics are at the runner speed of `reference.median`
    (`perfguard.decision.normalize`); `raw` or None (a file from before it): wall times."""
    busy: str | None = None
    """Why the runner was busy when these figures were made, stored anyway under
    `--allow-busy` (`perfguard.decision.contention.busy_session`); a check's case notes
    say so. None for a quiet session: a fresh measurement clears it."""
    groups: tuple[int, ...] | None = None
    """Runs of each process, in the order of the samples (those the screen kept): a
    check re-weighs the reference's share per metric and needs the processes
    (`perfguard.decision.normalize.fitted_pair`). None in files from before it."""
    resolution: Mapping[str, float] | None = None
    """Per timed class, the smallest slowdown a default check against these figures
    catches on the runner that made them (`perfguard.decision.resolution`); a check
    computes each figure's own from its summary. None in files from before it."""
    server: Mapping[str, Any] | None = None
    """A server case's answers per level (`levels`: answers by kind, `failures`,
    `throughput_rps`, `first_error`), with its `rounds` and the `servers` they ran on:
    what a check's `failures:c<N>` are judged against (`perfguard.decision.counters`)."""

    @property
    def normalized(self) -> bool:
        return self.timing == NORMALIZED and self.reference is not None

    @property
    def check_notes(self) -> str | None:
        """What a check says of this scenario: that a busy runner made it, its notes."""
        busy = f"baseline measured on a busy runner ({self.busy})" if self.busy else None
        return "; ".join(x for x in (busy, self.notes) if x) or None

    @property
    def step_count(self) -> int:
        steps = [int(m[5:]) for m in self.metrics if m.startswith("step:")]
        return max(steps) + 1 if steps else 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _SCALARS:
            if name in self.metrics:
                out[name] = self.metrics[name].to_json(DIGITS)
        out["stages"] = {
            m[6:]: s.to_json(DIGITS) for m, s in self.metrics.items() if m.startswith("stage:")
        }
        peaks = {
            m[len(STAGE_PEAK_PREFIX) :]: s.to_json(DIGITS)
            for m, s in self.metrics.items()
            if m.startswith(STAGE_PEAK_PREFIX)
        }
        if peaks:  # absent on CPU, so CPU baselines keep their layout
            out["stage_peak_memory"] = peaks
        steps: list[Any] = [None] * self.step_count
        for m, s in self.metrics.items():
            if m.startswith("step:"):
                steps[int(m[5:])] = s.to_json(DIGITS)
        out["steps"] = steps
        optional = {
            "load_ms": None if self.load_ms is None else round(self.load_ms, DIGITS),
            "output_hash": self.output_hash,
            "deterministic": self.deterministic,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "updated": self.updated,
            "case": None if self.case is None else dict(self.case),
            "notes": self.notes,
            "threads": None if self.threads is None else dict(self.threads),
            "reference": None if self.reference is None else self.reference.to_json(DIGITS),
            "reference_version": self.reference_version,
            "dropped_runs": self.dropped_runs,
            "timing": self.timing,
            "groups": None if self.groups is None else list(self.groups),
            "busy": self.busy,
            "resolution": None if self.resolution is None else dict(self.resolution),
            "source": self.source,
            "components": None
            if self.components is None
            else {k: dict(v) for k, v in sorted(self.components.items())},
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        if self.tolerance_overrides:
            out["tolerance_overrides"] = {k: dict(v) for k, v in self.tolerance_overrides.items()}
        if self.extra:
            out["sglang_extra"] = dict(self.extra)
        if self.work is not None:
            out["work"] = self.work.to_json()
        if self.output_sketch is not None:
            out["output_sketch"] = dict(self.output_sketch)
        if self.server is not None:
            out["server"] = dict(self.server)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scenario:
        metrics: dict[str, Summary] = {}
        for name in _SCALARS:
            if data.get(name) is not None:
                metrics[name] = Summary.from_json(data[name])
        for stage, s in data.get("stages", {}).items():
            metrics[f"stage:{stage}"] = Summary.from_json(s)
        for stage, s in data.get("stage_peak_memory", {}).items():
            metrics[STAGE_PEAK_PREFIX + stage] = Summary.from_json(s)
        for i, s in enumerate(data.get("steps", [])):
            if s is not None:
                metrics[f"step:{i}"] = Summary.from_json(s)
        return cls(
            metrics=dict(sorted(metrics.items(), key=lambda kv: metric_sort_key(kv[0]))),
            load_ms=data.get("load_ms"),
            output_hash=data.get("output_hash"),
            deterministic=data.get("deterministic"),
            repeats=data.get("repeats"),
            warmup=data.get("warmup"),
            updated=data.get("updated"),
            case=data.get("case"),
            notes=data.get("notes"),
            tolerance_overrides={
                k: dict(v) for k, v in data.get("tolerance_overrides", {}).items()
            },
            extra=dict(data.get("sglang_extra", {})),
            threads=None if data.get("threads") is None else dict(data["threads"]),
            reference=None
            if data.get("reference") is None
            else Summary.from_json(data["reference"]),
            reference_version=data.get("reference_version"),
            dropped_runs=data.get("dropped_runs"),
            timing=data.get("timing"),
            groups=None if data.get("groups") is None else tuple(data["groups"]),
            busy=data.get("busy"),
            resolution=None if data.get("resolution") is None else dict(data["resolution"]),
            source=data.get("source"),
            components=data.get("components"),
            work=None if data.get("work") is None else WorkCounts.from_json(data["work"]),
            output_sketch=None
            if data.get("output_sketch") is None
            else dict(data["output_sketch"]),
            server=None if data.get("server") is None else dict(data["server"]),
        )


@dataclass(frozen=True)
class Baseline:
    """A whole baseline file."""

    metadata: Mapping[str, Any]
    profiles: Mapping[str, Profile]
    scenarios: Mapping[str, Scenario] = field(default_factory=dict)
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD
    step_fractions: tuple[float, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def platform(self) -> str:
        return str(self.metadata["platform"])

    @property
    def hardware(self) -> str:
        return str(self.metadata["hardware"])

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(sorted(self.profiles))
            raise PerfguardError(
                f"baseline has no tolerance profile {name!r} (it has: {known})"
            ) from None

    def with_scenario(self, case_id: str, scenario: Scenario) -> Baseline:
        return dataclasses.replace(self, scenarios={**self.scenarios, case_id: scenario})

    def without(self, case_ids: Iterable[str]) -> Baseline:
        drop = set(case_ids)
        kept = {k: v for k, v in self.scenarios.items() if k not in drop}
        return dataclasses.replace(self, scenarios=kept)

    def touched(self, environment: Mapping[str, Any] | None = None) -> Baseline:
        """A copy stamped `updated` now (and with `environment`, when given)."""
        meta = {**self.metadata, "updated": utc_now(), "perfguard": __version__}
        if environment is not None:
            meta["environment"] = dict(environment)
            meta["git_commit"] = environment.get("git_commit")
        return dataclasses.replace(self, metadata=meta)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": BASELINE_KIND,
            "schema_version": BASELINE_SCHEMA_VERSION,
            "metadata": {k: v for k, v in self.metadata.items() if v is not None},
            "tolerances": {name: p.to_json() for name, p in self.profiles.items()},
            "improvement_threshold": self.improvement_threshold,
            "scenarios": {cid: s.to_json() for cid, s in self.scenarios.items()},
        }
        if self.step_fractions is not None:
            out["sampling"] = {"step_fractions": list(self.step_fractions)}
        if self.extra:
            out["sglang_extra"] = dict(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Baseline:
        fractions = data.get("sampling", {}).get("step_fractions")
        return cls(
            metadata=dict(data["metadata"]),
            profiles={n: Profile.from_json(n, p) for n, p in data["tolerances"].items()},
            scenarios={cid: Scenario.from_json(s) for cid, s in data["scenarios"].items()},
            improvement_threshold=float(
                data.get("improvement_threshold", DEFAULT_IMPROVEMENT_THRESHOLD)
            ),
            step_fractions=None if fractions is None else tuple(float(f) for f in fractions),
            extra=dict(data.get("sglang_extra", {})),
        )


def new_baseline(environment: Mapping[str, Any]) -> Baseline:
    """An empty baseline for the platform and hardware of `environment` (a fingerprint)."""
    now = utc_now()
    platform = str(environment["platform"])
    return Baseline(
        metadata={
            "platform": platform,
            "hardware": str(environment["hardware"]),
            "created": now,
            "updated": now,
            "perfguard": __version__,
            "git_commit": environment.get("git_commit"),
            "environment": dict(environment),
        },
        profiles=default_profiles(platform),
    )


# ---- reading and writing -------------------------------------------------------------------


def non_finite(data: Any, path: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    """The JSON path of the first infinite number in `data`, or None.

    `json` refuses the `NaN` / `Infinity` literals only when asked (jsonio does), but it
    parses an overflowing literal such as `1e400` to `inf` silently, and JSON Schema's
    `number` accepts it. An infinite timing is as wrong as a NaN one.
    """
    if isinstance(data, float):
        return None if math.isfinite(data) else path
    if isinstance(data, Mapping):
        items: Iterable[tuple[Any, Any]] = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = non_finite(value, (*path, key))
        if found is not None:
            return found
    return None


def _semantic_errors(data: Mapping[str, Any]) -> Iterator[tuple[list[Any], str]]:
    """What the schema cannot say: finite figures, sample counts, min <= median <= max."""
    where = non_finite(data)
    if where is not None:
        yield list(where), "is not a finite number"
    for cid, scen in data["scenarios"].items():
        entries: list[tuple[list[Any], Any]] = [([n], scen.get(n)) for n in _SCALARS]
        entries += [(["stages", k], v) for k, v in scen.get("stages", {}).items()]
        entries += [
            (["stage_peak_memory", k], v) for k, v in scen.get("stage_peak_memory", {}).items()
        ]
        entries += [(["steps", i], v) for i, v in enumerate(scen.get("steps", []))]
        for where, s in entries:
            if s is None:
                continue
            path = ["scenarios", cid, *where]
            samples = s.get("samples")
            if samples is not None and len(samples) != s["n"]:
                yield path, f"n is {s['n']} but there are {len(samples)} samples"
            memory = where == ["peak_memory"] or where[0] == "stage_peak_memory"
            if not memory and s["median"] == 0:
                # A stage that took no time at all was not measured (a clock that did not
                # move, a figure lost in a conversion); as a baseline it would flag any
                # real time as an infinite slowdown. A stage that allocates nothing (or
                # under the 1 kB the file keeps) is a measurement: memory can be 0.
                yield [*path, "median"], "a time of 0 ms is not a measurement"
            lo, hi = s.get("min"), s.get("max")
            if lo is not None and hi is not None and not lo <= s["median"] <= hi:
                yield path, f"median {s['median']} is outside [min {lo}, max {hi}]"
        for key in ("stages", "stage_peak_memory"):
            for stage in scen.get(key, {}):
                if not is_metric_name(f"stage:{stage}"):
                    yield ["scenarios", cid, key, stage], "not a valid stage name"
        if scen.get("timing") == NORMALIZED and not (scen.get("reference") or {}).get("median"):
            yield ["scenarios", cid, "timing"], "normalized timings need the reference's median"
        runs = (scen.get("reference") or {}).get("n")
        if scen.get("groups") is not None and runs is not None and sum(scen["groups"]) != runs:
            yield (
                ["scenarios", cid, "groups"],
                f"the groups hold {sum(scen['groups'])} runs but the reference has {runs}",
            )
        if scen.get("work") is not None:
            yield from _work_errors(["scenarios", cid, "work"], scen["work"])
        if scen.get("output_sketch") is not None:
            try:
                OutputSketch.from_json(scen["output_sketch"])
            except (ValueError, binascii.Error) as exc:
                yield ["scenarios", cid, "output_sketch"], str(exc)


def _work_errors(path: list[Any], work: Mapping[str, Any]) -> Iterator[tuple[list[Any], str]]:
    """What the schema cannot say of a scenario's work counters.

    A `[min, max]` pair must be ordered, and every stage must have the counters the
    others have: a stage whose `syncs` are missing would otherwise pass unjudged, as if
    it had none.
    """
    groups = [("total", work.get("total", {})), ("per_step", work.get("per_step"))]
    groups += [(("stages", s), c) for s, c in work.get("stages", {}).items()]
    for where, counts in groups:
        for kind, value in (counts or {}).items():
            if isinstance(value, list) and len(value) == 2 and value[0] > value[1]:
                yield [*path, *_parts(where), kind], f"[min, max] is {value}: min > max"
    stages = work.get("stages", {})
    kinds = set().union(*(set(c) for c in stages.values())) if stages else set()
    for stage, counts in sorted(stages.items()):
        for kind in sorted(kinds - set(counts)):
            others = sorted(s for s, c in stages.items() if kind in c)
            yield (
                [*path, "stages", stage, kind],
                f"missing, but counted in the other stages ({', '.join(others[:3])})",
            )


def _parts(where: Any) -> list[Any]:
    return list(where) if isinstance(where, tuple) else [where]


def parse(data: Any, source: str) -> Baseline:
    """Validate `data` (a parsed baseline file) and build the `Baseline`."""
    if isinstance(data, dict) and "kind" not in data and "scenarios" in data:
        raise PerfguardError(
            f"{source}: this looks like an sglang perf_baselines.json, not a perfguard "
            "baseline: convert it with `perfguard baselines import-sglang`"
        )
    if isinstance(data, dict) and data.get("kind") not in (None, BASELINE_KIND):
        raise PerfguardError(f"{source}: $.kind: {data['kind']!r} is not a perfguard baseline")
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version > BASELINE_SCHEMA_VERSION:
        raise PerfguardError(
            f"{source}: $.schema_version: {version} is newer than this perfguard reads "
            f"({BASELINE_SCHEMA_VERSION}): upgrade perfguard"
        )
    validate(data, "baseline", source)
    for path, message in _semantic_errors(data):
        raise PerfguardError(f"{source}: {json_path(path)}: {message}")
    return Baseline.from_json(data)


def load(path: str | os.PathLike[str]) -> Baseline:
    """Read and validate a baseline file; any defect is a `PerfguardError` naming it."""
    return parse(read_json(path), str(path))


def save(path: str | os.PathLike[str], baseline: Baseline) -> None:
    """Validate, then write atomically. Callers doing read-modify-write hold `lock(path)`."""
    data = baseline.to_json()
    validate(data, "baseline", f"{path} (about to be written)")
    write_json_atomic(path, data)


ENV_LOCK_DIR = "PERFGUARD_LOCK_DIR"


def lock_dir() -> Path:
    """Where baseline locks live: `$PERFGUARD_LOCK_DIR`, else `~/.cache/perfguard/locks`
    (`$XDG_CACHE_HOME`), else a per-user folder of the temp directory.

    Not beside the baseline: a lock file there stayed after every run (filelock leaves
    it, and deleting it on release would let two processes lock two different files of
    one name), so `git status` showed it beside the committed baselines.
    """
    env = os.environ.get(ENV_LOCK_DIR)
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "perfguard" / "locks"


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of baseline `path`: one per resolved path, in `lock_dir()`."""
    resolved = str(Path(path).resolve())
    key = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return lock_dir() / f"{Path(path).name}.{key}.lock"


@contextlib.contextmanager
def lock(path: str | os.PathLike[str], timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold `lock_path(path)` for a read-modify-write of `path`."""
    path = Path(path)
    where = lock_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # no writable cache (a read-only home): the temp directory's
            import tempfile

            uid = getattr(os, "getuid", lambda: "user")()
            where = Path(tempfile.gettempdir()) / f"perfguard-locks-{uid}" / where.name
            where.parent.mkdir(parents=True, exist_ok=True)
        held = filelock.FileLock(str(where), timeout=timeout)
        held.acquire()
    except filelock.Timeout as exc:
        raise PerfguardError(
            f"{path}: another perfguard process holds its lock {where} (waited {timeout:g} s)"
        ) from exc
    except OSError as exc:  # a read-only directory, no permission, a full disk
        raise PerfguardError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    try:
        yield
    finally:
        held.release()


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_platform(baseline: Baseline, platform: str, source: str) -> None:
    if baseline.platform != platform:
        raise PerfguardError(
            f"{source}: baseline is for platform {baseline.platform!r}, not {platform!r}"
        )


def open_for_update(path: str | os.PathLike[str], environment: Mapping[str, Any]) -> Baseline:
    """The baseline at `path` (validated), or a new one when there is no file yet.

    Called before any case runs, so a file that cannot be read stops `gen-baselines`
    before it measures anything, and the file is left exactly as it was.
    """
    path = Path(path)
    if not path.exists():
        return new_baseline(environment)
    baseline = load(path)
    check_platform(baseline, str(environment["platform"]), str(path))
    return baseline


def prune(path: str | os.PathLike[str], keep: Iterable[str]) -> list[str]:
    """Drop the scenarios whose case id is not in `keep`; returns the dropped ids."""
    keep = set(keep)
    with lock(path):
        if not Path(path).exists():
            return []
        current = load(path)
        dropped = sorted(set(current.scenarios) - keep)
        if dropped:
            save(path, current.without(dropped).touched())
    return dropped
