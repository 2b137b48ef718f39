"""The counts a check judges exactly: a case's work counters over its counted runs, and
the failed requests of a server case's levels.

Work counters (`ops`, `flops`, `alloc`, `syncs`, per stage and per denoising step;
`perfguard.metrics`) are counted in one untimed run per pipeline build
(`perfguard.measurement.work`). Counts depend on the torch version, the device type and
the dtype (another torch dispatches other ops; a CUDA build runs fused kernels a CPU one
does not), so `WorkCounts` keeps that context beside them and `context_mismatch` says
why two contexts' counts cannot be compared. How they are judged is
`perfguard.decision.counters`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision.stats import Summary
from perfguard.metrics import (
    PER_STEP,
    WORK_KINDS,
    failures_metric,
    is_failures_metric,
    is_work_metric,
    metric_sort_key,
    work_kind,
    work_metric,
    work_stage,
)

CONTEXT_KEYS = ("torch", "device_type", "dtype")
"""What a count depends on beside the code and the case (`perfguard.measurement.work.context`)."""


@dataclass(frozen=True)
class WorkCounts:
    """The work counters of a case over one or more counted runs: a baseline's, or a check's.

    `counters` maps each metric name to its (min, max) over `runs` counted runs (equal
    when every run counted the same). `op_counts` / `sync_ops` are the per-stage
    histograms of the first run; `steps` is the number of denoising steps counted.
    `context` holds `CONTEXT_KEYS`.
    """

    counters: Mapping[str, tuple[int, int]]
    context: Mapping[str, str] = field(default_factory=dict)
    runs: int = 1
    steps: int = 0
    op_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    sync_ops: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    uncounted: str | None = None

    @property
    def varies(self) -> list[str]:
        """The counters that differed between runs (data-dependent work)."""
        return sorted((m for m, (lo, hi) in self.counters.items() if lo != hi), key=metric_sort_key)

    def summary(self, metric: str) -> Summary:
        lo, hi = self.counters[metric]
        return Summary(median=float(hi), n=self.runs, min=float(lo), max=float(hi))

    def to_json(self) -> dict[str, Any]:
        """The baseline layout: integers, `[min, max]` where runs differed; sorted keys."""

        def value(metric: str) -> int | list[int]:
            lo, hi = self.counters[metric]
            return lo if lo == hi else [lo, hi]

        total = {k: value(k) for k in WORK_KINDS if k in self.counters}
        per_step = {k: value(k + PER_STEP) for k in WORK_KINDS if k + PER_STEP in self.counters}
        stages: dict[str, dict[str, Any]] = {}
        for metric in self.counters:
            stage = work_stage(metric)
            if stage is not None:
                stages.setdefault(stage, {})[work_kind(metric)] = value(metric)
        out: dict[str, Any] = {
            "context": dict(self.context),
            "runs": self.runs,
            "steps": self.steps,
            "total": total,
            "stages": dict(sorted(stages.items())),
            "op_counts": {s: dict(sorted(c.items())) for s, c in sorted(self.op_counts.items())},
        }
        if per_step:
            out["per_step"] = per_step
        syncs = {s: dict(sorted(c.items())) for s, c in sorted(self.sync_ops.items()) if c}
        if syncs:
            out["sync_ops"] = syncs
        if self.uncounted:
            out["uncounted"] = self.uncounted
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkCounts:
        def pair(v: Any) -> tuple[int, int]:
            return (int(v[0]), int(v[1])) if isinstance(v, list) else (int(v), int(v))

        counters: dict[str, tuple[int, int]] = {}
        for kind, v in data.get("total", {}).items():
            counters[work_metric(kind)] = pair(v)
        for kind, v in data.get("per_step", {}).items():
            counters[work_metric(kind, step=True)] = pair(v)
        for stage, values in data.get("stages", {}).items():
            for kind, v in values.items():
                counters[work_metric(kind, stage)] = pair(v)
        return cls(
            counters=dict(sorted(counters.items(), key=lambda kv: metric_sort_key(kv[0]))),
            context={k: str(v) for k, v in data.get("context", {}).items()},
            runs=int(data.get("runs", 1)),
            steps=int(data.get("steps", 0)),
            op_counts={s: dict(c) for s, c in data.get("op_counts", {}).items()},
            sync_ops={s: dict(c) for s, c in data.get("sync_ops", {}).items()},
            uncounted=data.get("uncounted"),
        )

    @classmethod
    def from_runs(cls, runs: Sequence[Mapping[str, Any]]) -> WorkCounts | None:
        """From the counted runs of a result (`perfguard.measurement.work.WorkRun` JSON).

        Runs under another context than the first are not pooled with it (they cannot
        be: their counts mean other ops); None when there are no runs.
        """
        usable = [r for r in runs if r.get("total")]
        if not usable:
            return None
        first = usable[0]
        ctx = {k: str(first.get("context", {}).get(k, "")) for k in CONTEXT_KEYS}
        same = [r for r in usable if {k: str(r.get("context", {}).get(k, "")) for k in ctx} == ctx]
        values: dict[str, list[int]] = {}
        for run in same:
            for name, v in flatten(run).items():
                values.setdefault(name, []).append(int(v))
        counters = {
            m: (min(vs), max(vs))
            for m, vs in sorted(values.items(), key=lambda kv: metric_sort_key(kv[0]))
            if len(vs) == len(same)  # a counter some runs lack is not a count of this case
        }
        uncounted = first.get("uncounted_flops")
        return cls(
            counters=counters,
            context=ctx,
            runs=len(same),
            steps=len(first.get("steps", [])),
            op_counts={s: dict(c) for s, c in first.get("op_counts", {}).items()},
            sync_ops={s: dict(c) for s, c in first.get("sync_ops", {}).items()},
            uncounted=(
                f"no FLOP formula could be applied to {', '.join(uncounted)}: FLOPs not counted"
                if uncounted
                else None
            ),
        )


def flatten(run: Mapping[str, Any]) -> dict[str, int]:
    """A counted run (`WorkRun.to_json()` layout) as metric name -> count.

    The run's total, each stage's, and the heaviest denoising step's (`<kind>_per_step`).
    FLOPs are left out of a run some of whose ops had no applicable formula: a partial
    count would pass for a whole one.
    """
    out: dict[str, int] = {}
    skip = {"flops"} if run.get("uncounted_flops") else set()
    steps = run.get("steps") or []
    for kind in WORK_KINDS:
        if kind in skip:
            continue
        out[work_metric(kind)] = int(run["total"][kind])
        for stage, counts in run.get("stages", {}).items():
            out[work_metric(kind, stage)] = int(counts[kind])
        if steps:
            out[work_metric(kind, step=True)] = max(int(s[kind]) for s in steps)
    return out


def context_mismatch(baseline: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """Why counts of `current`'s context cannot be compared with `baseline`'s, or None."""
    diffs = [
        f"{k} {baseline.get(k) or '?'} -> {current.get(k) or '?'}"
        for k in CONTEXT_KEYS
        if baseline.get(k) != current.get(k)
    ]
    if not diffs:
        return None
    return (
        f"work counters not compared: counted under another {', '.join(diffs)} "
        "(counts depend on them; `gen-baselines` refreshes the counts); timings still judged"
    )


def is_counter(metric: str) -> bool:
    """A work counter's verdict, not a time's (the gate does not confirm these)."""
    return is_work_metric(metric)


def is_exact(metric: str) -> bool:
    """A count judged exactly (a work counter, a server level's failures): measuring it
    again cannot change its answer, and a busy runner does not excuse it."""
    return is_work_metric(metric) or is_failures_metric(metric)


def failure_counts(server: Mapping[str, Any] | None) -> dict[str, int]:
    """`failures:c<N>` -> failed requests of each level of a server summary
    (`observed.server`, or a baseline scenario's `server`); empty for anything else."""
    levels = (server or {}).get("levels") or {}
    out: dict[str, int] = {}
    for name, level in levels.items():
        if not (isinstance(level, Mapping) and name[1:].isdigit()):
            continue
        answers = level.get("answers") or {}
        count = level.get("failures", sum(n for k, n in answers.items() if k != "ok"))
        out[failures_metric(int(name[1:]))] = int(count)
    return dict(sorted(out.items(), key=lambda kv: metric_sort_key(kv[0])))
