"""The results data model: one `CaseResult` per case, every sample of every metric.

What the runner measured, as plain data: `perfguard.measurement.runner` fills it,
`perfguard.storage.reports` reads and writes it as a results file, and the decision layer
judges it. It sits below every layer (docs/architecture.md) and is pure Python, so that
reading a results file never needs torch.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.metrics import metric_class, metrics_of_run

RESULTS_KIND = "perfguard.results"


RESULTS_SCHEMA_VERSION = 1


@dataclass
class CaseResult:
    """What the runner measured for one case (or why it could not)."""

    case_id: str
    status: str = "ok"  # "ok" or "error"
    error: str | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    output_hash: str | None = None
    deterministic: bool | None = None
    load_ms: float | None = None
    warmup: int = 0
    repeats: int = 0
    case: dict[str, Any] = field(default_factory=dict)
    groups: list[int] | None = None
    memory: dict[str, Any] | None = None  # the tracked memory run, where there is one
    threads: dict[str, int] | None = None
    reference: list[float] = field(default_factory=list)
    components: dict[str, dict[str, Any]] | None = None
    counters: dict[str, list[int]] | None = None
    arguments: dict[str, Any] | None = None
    """What the pipeline's `__call__` was given (diffusers cases), by argument name."""
    observed: dict[str, Any] | None = None
    """What the adapter saw of the pipeline (diffusers cases): the seam that timed the
    steps (`step_seam`) or why there are none (`no_steps`), a video output's `frames`."""
    work: list[dict[str, Any]] | None = None
    """One entry per counted run (`perfguard.measurement.work.WorkRun` JSON): a build's work."""
    work_error: str | None = None
    """Why the run could not be counted (the case's timings still stand)."""
    output_sketch: dict[str, Any] | None = None
    """A compact reference of the output (`perfguard.decision.output.OutputSketch`)."""

    def add_counters(self, counts: dict[str, int]) -> None:
        """One measured run's counters; a counter a run did not report counts 0 there."""
        runs = self.repeats  # runs already recorded before this one
        store = self.counters if self.counters is not None else {}
        for name in set(store) | set(counts):
            values = store.setdefault(name, [0] * runs)
            values.append(int(counts.get(name, 0)))
        self.counters = store

    def add_run(self, record: RunRecord) -> None:
        for name, value in metrics_of_run(record.to_dict()).items():
            self.samples.setdefault(name, []).append(value)

    def only_runs(self, keep: Sequence[bool]) -> CaseResult:
        """This result with only the runs where `keep` is true (one flag per run).

        The reference and the timed metrics have one sample per run, so that run `i` is
        the same run in each, and lose the runs not kept. A metric measured once per
        measurement rather than per run (peak memory: the counted run's) is kept whole,
        as counters of another length are. A metric of any other length means the runs
        cannot be aligned, and nothing is dropped. `groups` shrink with their runs, and
        a group left empty disappears.
        """
        runs = len(self.reference)
        if len(keep) != runs or all(keep) or not any(keep):
            return self
        if any(len(v) != runs and not _per_measurement(m) for m, v in self.samples.items()):
            return self
        groups: list[int] = []
        at = 0
        for size in self.groups or [runs]:
            kept = sum(1 for k in keep[at : at + size] if k)
            if kept:
                groups.append(kept)
            at += size
        return dataclasses.replace(
            self,
            samples={
                m: [x for x, k in zip(v, keep, strict=True) if k] if len(v) == runs else v
                for m, v in self.samples.items()
            },
            reference=[x for x, k in zip(self.reference, keep, strict=True) if k],
            counters=None
            if self.counters is None
            else {
                name: [x for x, k in zip(v, keep, strict=True) if k] if len(v) == runs else v
                for name, v in self.counters.items()
            },
            repeats=sum(keep),
            groups=groups if len(groups) > 1 else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "samples": self.samples,
            "output_hash": self.output_hash,
            "deterministic": self.deterministic,
            "load_ms": self.load_ms,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "case": self.case,
            **({"groups": list(self.groups)} if self.groups else {}),
            **({"memory": dict(self.memory)} if self.memory else {}),
            **({"threads": dict(self.threads)} if self.threads else {}),
            **({"reference": list(self.reference)} if self.reference else {}),
            **({"components": self.components} if self.components is not None else {}),
            **({"counters": self.counters} if self.counters is not None else {}),
            **({"arguments": self.arguments} if self.arguments is not None else {}),
            **({"observed": dict(self.observed)} if self.observed else {}),
            **({"work": [dict(w) for w in self.work]} if self.work else {}),
            **({"work_error": self.work_error} if self.work_error else {}),
            **({"output_sketch": dict(self.output_sketch)} if self.output_sketch else {}),
        }

    @classmethod
    def from_json(cls, case_id: str, data: dict[str, Any]) -> CaseResult:
        return cls(
            case_id=case_id,
            status=data.get("status", "ok"),
            error=data.get("error"),
            samples={k: [float(x) for x in v] for k, v in data.get("samples", {}).items()},
            output_hash=data.get("output_hash"),
            deterministic=data.get("deterministic"),
            load_ms=data.get("load_ms"),
            warmup=int(data.get("warmup", 0)),
            repeats=int(data.get("repeats", 0)),
            case=dict(data.get("case", {})),
            groups=[int(g) for g in data["groups"]] if data.get("groups") else None,
            memory=dict(data["memory"]) if data.get("memory") else None,
            threads={k: int(v) for k, v in data["threads"].items()}
            if data.get("threads")
            else None,
            reference=[float(x) for x in data.get("reference", [])],
            components=(
                {k: dict(v) for k, v in data["components"].items()}
                if data.get("components") is not None
                else None
            ),
            counters=(
                {k: [int(x) for x in v] for k, v in data["counters"].items()}
                if data.get("counters") is not None
                else None
            ),
            arguments=dict(data["arguments"]) if data.get("arguments") is not None else None,
            observed=dict(data["observed"]) if data.get("observed") else None,
            work=[dict(w) for w in data["work"]] if data.get("work") else None,
            work_error=data.get("work_error"),
            output_sketch=dict(data["output_sketch"]) if data.get("output_sketch") else None,
        )


def _per_measurement(metric: str) -> bool:
    """A metric measured once per measurement, not per run: peak memory (the counted
    run's tensor storage on CPU, the allocator's peak over the runs on a device)."""
    try:
        return metric_class(metric) == "peak_memory"
    except ValueError:
        return False


def pool(parts: Sequence[CaseResult], new_groups: bool = True) -> CaseResult:
    """One result from several measurements of the same case (processes, re-runs).

    Samples are concatenated in order and `groups` records how many runs each part
    contributed (a part that was itself pooled keeps its own groups). With `new_groups`
    False the parts after the first were measured in the same process as the first (an
    in-process re-run) and extend its last group instead: two pipeline builds in one
    process share that process's slow or fast mode, which is the largest source of noise
    on a shared runner (docs/verdicts.md), so counting them as independent processes
    would understate the noise. A part
    that failed makes the pooled result fail with its error: a baseline or a verdict
    must not rest silently on a subset of what was asked for.
    """
    if not parts:
        raise ValueError("nothing to pool")
    failed = [p for p in parts if p.status != "ok"]
    if failed:
        return failed[0]
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    samples: dict[str, list[float]] = {}
    groups: list[int] = []
    reference: list[float] = []
    counters: dict[str, list[int]] | None = None
    work: list[dict[str, Any]] = []
    for i, part in enumerate(parts):
        work.extend(part.work or [])
        reference.extend(part.reference)
        for name, values in part.samples.items():
            samples.setdefault(name, []).extend(values)
        if part.counters is not None or counters is not None:
            counters = _extend_counters(counters, part, sum(p.repeats for p in parts[:i]))
        if new_groups or i == 0:
            groups.extend(part.groups or [part.repeats])
        else:
            groups[-1] += part.repeats
    hashes = {p.output_hash for p in parts}
    return CaseResult(
        case_id=first.case_id,
        samples=samples,
        output_hash=first.output_hash,
        deterministic=all(p.deterministic for p in parts) and len(hashes) == 1,
        load_ms=first.load_ms,
        warmup=first.warmup,
        repeats=sum(p.repeats for p in parts),
        case=first.case,
        groups=groups if len(groups) > 1 else None,
        memory=first.memory,
        threads=first.threads,
        reference=reference,
        components=first.components,
        counters=counters,
        arguments=first.arguments,
        observed=first.observed,
        work=work or None,
        work_error=next((p.work_error for p in parts if p.work_error), None),
        output_sketch=first.output_sketch,
    )


def _extend_counters(
    counters: dict[str, list[int]] | None, part: CaseResult, before: int
) -> dict[str, list[int]]:
    """`counters` with `part`'s runs appended, zeros where one side lacks a counter."""
    out = {k: list(v) for k, v in (counters or {}).items()}
    theirs = part.counters or {}
    for name in set(out) | set(theirs):
        values = out.setdefault(name, [0] * before)
        values.extend(theirs.get(name, [0] * part.repeats))
    return out


@dataclass
class Results:
    """A results file: the environment and one `CaseResult` per case id."""

    environment: dict[str, Any]
    settings: dict[str, Any]
    cases: dict[str, CaseResult] = field(default_factory=dict)
    created: str = field(default_factory=lambda: utc_now())

    @property
    def platform(self) -> str:
        return str(self.environment.get("platform", "unknown"))

    @property
    def hardware(self) -> str:
        return str(self.environment.get("hardware", "unknown"))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": RESULTS_KIND,
            "schema_version": RESULTS_SCHEMA_VERSION,
            "created": self.created,
            "environment": self.environment,
            "settings": self.settings,
            "cases": {cid: r.to_json() for cid, r in sorted(self.cases.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        return cls(
            environment=dict(data.get("environment", {})),
            settings=dict(data.get("settings", {})),
            cases={cid: CaseResult.from_json(cid, r) for cid, r in data["cases"].items()},
            created=str(data.get("created", "")),
        )


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


@dataclass(frozen=True)
class RunRecord:
    """One measured run of one case: what the timer saw, in milliseconds and MB.

    Nested stages are named by their path, `Outer/Inner`. A stage entered more than once
    in a run accumulates (its figure is the sum). Steps are in the order they ran.
    """

    stages_ms: dict[str, float]
    steps_ms: list[float]
    e2e_ms: float
    peak_memory_mb: float | None = None
    stage_peak_memory_mb: dict[str, float] = field(default_factory=dict)

    @property
    def avg_step_ms(self) -> float | None:
        return statistics.fmean(self.steps_ms) if self.steps_ms else None

    @property
    def median_step_ms(self) -> float | None:
        return statistics.median(self.steps_ms) if self.steps_ms else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages_ms": dict(self.stages_ms),
            "steps_ms": list(self.steps_ms),
            "e2e_ms": self.e2e_ms,
            "avg_step_ms": self.avg_step_ms,
            "median_step_ms": self.median_step_ms,
            "peak_memory_mb": self.peak_memory_mb,
            "stage_peak_memory_mb": dict(self.stage_peak_memory_mb),
        }


def component_changes(
    baseline: Mapping[str, Any] | None, measured: Mapping[str, Any] | None
) -> list[str]:
    """`role: what changed` for each component added, removed, or of another class or
    parameter count than at baseline time (nothing when either side is unknown)."""
    if not baseline or not measured:
        return []

    def short(c: Mapping[str, Any]) -> str:
        return str(c.get("class", "?")).rsplit(".", 1)[-1]

    out = []
    for role in sorted(set(baseline) | set(measured)):
        old, new = baseline.get(role), measured.get(role)
        if old is None:
            out.append(f"{role} added ({short(new)})")
        elif new is None:
            out.append(f"{role} removed (was {short(old)})")
        elif short(old) != short(new):
            out.append(f"{role} {short(old)} -> {short(new)}")
        elif old.get("parameters") != new.get("parameters") and None not in (
            old.get("parameters"),
            new.get("parameters"),
        ):
            out.append(f"{role} parameters {old['parameters']} -> {new['parameters']}")
    return out


def slugify(text: str) -> str:
    """`NVIDIA H200` -> `nvidia-h200`; `Ascend910B3` -> `ascend910b3`; safe in file names."""
    text = re.sub(r"\((r|tm|c)\)", "", text.lower())
    text = re.sub(r"\b(cpu|processor|with radeon graphics)\b", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"
