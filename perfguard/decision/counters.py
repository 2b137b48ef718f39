"""The verdict on what the code does: work counters and output equivalence.

Work counters (`ops`, `flops`, `alloc`, `syncs`, per stage and per denoising step;
`perfguard.metrics`) are counted exactly in one untimed run per pipeline build
(`perfguard.measurement.work`). They have no noise, so this verdict needs no statistics:

- **exact by default.** A counter's band is `max(b * (1 + rel), b + abs)` as for times,
  with `rel = abs = 0` in the default profiles: one more op than the baseline is a
  regression (exit 1) whatever the timings say, and one fewer is an improvement
  (reported with the refresh command, never a failure). A profile or a case may give a
  counter class (`"ops": {"rel": 0.01}`) or one counter (`"ops:DecodingStage": {"abs":
  2}`) a tolerance, as PyTorch's pr_time_benchmarks give their instruction counts one.
- **a counter that varies is judged on its range.** Where the runs of one build (or the
  builds of one baseline) counted different values, data-dependent control flow is at
  work: the baseline keeps the observed `[min, max]`, and the check fails only when it
  counts more than the band around the max, and calls an improvement only below the min.
- **like with like.** Counts depend on the torch version, the device type and the dtype
  (another torch dispatches other ops; a CUDA build runs fused kernels a CPU one does
  not): a baseline counted under another context compares no counter, says so in one
  line, and the timings are still judged. `gen-baselines` refreshes the counts. A torch
  upgrade never reads as a regression.

Output equivalence: every reference optimization is exact math, so a performance change
must leave the output bit-identical (`output_hash`, a SHA-256 of the output). When it is
not, a compact reference (`OutputSketch`: the output, or block means of it at most
`SKETCH_VALUES` values) gives the max abs diff and the PSNR against the baseline's:

- **bit-identical**: the hashes match;
- **within tolerance**: PSNR >= `OUTPUT_PSNR_DB` (100 dB): float32 reassociation (another
  BLAS blocking, a fused kernel) leaves ~120 dB, a block computed in bfloat16 ~80 dB;
- **changed**: below it. A changed output fails the case (exit 1) unless the case
  (`output_may_change = true`) or the command (`--allow-output-change`) says this change
  is meant to change numerics; it is then reported, not failed.

`perfguard.decision.verdict.judge_case` calls `judge_work` and `judge_output` and adds
their verdicts to the case; nothing here is about time.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import Band
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

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.decision.tolerances import Overrides, Profile
    from perfguard.results import CaseResult

# The verdict names of `perfguard.decision.verdict`, which imports this module (so this
# one cannot import it); tests/test_counters.py pins them equal.
PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
MISSING_STAGE = "missing-stage"
NEW_STAGE = "new-stage"


@dataclass(frozen=True)
class CounterVerdict:
    """The verdict on one counter: the first fields of `verdict.MetricVerdict`, which
    extends it (a counter's verdict becomes one)."""

    metric: str
    verdict: str
    measured: Summary | None = None
    baseline: Summary | None = None
    band: Band | None = None
    bound: float | None = None
    ratio: float | None = None
    reason: str = ""


CONTEXT_KEYS = ("torch", "device_type", "dtype")
"""What a count depends on beside the code and the case (`perfguard.measurement.work.context`)."""

TOP_OPS = 5
"""How many of a stage's changed ops a report names: the ones that moved most."""


# ---- the counts of a case ------------------------------------------------------------------


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


# ---- the verdict ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkJudgement:
    """The counter verdicts of one case and, when none could be given, why."""

    metrics: tuple[CounterVerdict, ...] = ()
    note: str | None = None
    current: WorkCounts | None = None
    baseline: WorkCounts | None = None

    def to_json(self) -> dict[str, Any]:
        """The report's `work` section of a case: context, notes and the changed ops."""
        out: dict[str, Any] = {}
        if self.note:
            out["note"] = self.note
        if self.current is not None:
            out["context"] = dict(self.current.context)
            out["runs"] = self.current.runs
            out["steps"] = self.current.steps
            if self.current.varies:
                out["varies"] = self.current.varies
        if self.baseline is not None:
            out["baseline_context"] = dict(self.baseline.context)
        if self.current is not None and self.baseline is not None:
            changed = op_changes(self.baseline.op_counts, self.current.op_counts)
            if changed:
                out["op_changes"] = changed
            syncs = op_changes(self.baseline.sync_ops, self.current.sync_ops)
            if syncs:
                out["sync_changes"] = syncs
        return out


def op_changes(
    before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]
) -> dict[str, dict[str, list[int]]]:
    """stage -> op -> [before, after] for every op whose count changed, biggest first."""
    out: dict[str, dict[str, list[int]]] = {}
    for stage in sorted(set(before) | set(after)):
        b, a = before.get(stage, {}), after.get(stage, {})
        moved = [(op, int(b.get(op, 0)), int(a.get(op, 0))) for op in set(b) | set(a)]
        moved = [m for m in moved if m[1] != m[2]]
        moved.sort(key=lambda m: (-abs(m[2] - m[1]), m[0]))
        if moved:
            out[stage] = {op: [x, y] for op, x, y in moved}
    return out


def judge_counter(
    metric: str,
    current: tuple[int, int],
    baseline: tuple[int, int],
    rel: float,
    pad: float,
    runs: tuple[int, int] = (1, 1),
) -> CounterVerdict:
    """One counter: regression above the band around the baseline's max, improvement
    below its min, else pass. `current` and `baseline` are (min, max) over their runs."""
    (c_lo, c_hi), (b_lo, b_hi) = current, baseline
    band = Band(rel, pad)
    bound = band.bound(float(b_hi))
    measured = Summary(median=float(c_hi), n=runs[1], min=float(c_lo), max=float(c_hi))
    base = Summary(median=float(b_hi), n=runs[0], min=float(b_lo), max=float(b_hi))
    ratio = c_hi / b_hi if b_hi > 0 else None
    ranged = " (the most of its runs; it varies)" if c_lo != c_hi or b_lo != b_hi else ""
    if c_hi > bound:
        verdict = REGRESSION
        reason = f"counted {c_hi:,}, baseline {_range(b_lo, b_hi)}{ranged}: +{c_hi - b_hi:,}"
    elif c_hi < b_lo and c_hi < band.improvement_below(float(b_lo), 0.0):
        verdict = IMPROVEMENT
        reason = f"counted {c_hi:,}, baseline {_range(b_lo, b_hi)}{ranged}: {c_hi - b_lo:,}"
    else:
        verdict = PASS
        reason = "" if c_hi == b_hi and c_lo == b_lo else f"baseline {_range(b_lo, b_hi)}"
    return CounterVerdict(metric, verdict, measured, base, band, bound, ratio, reason)


def _range(lo: int, hi: int) -> str:
    return f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"


def judge_work(
    current: WorkCounts | None,
    baseline: WorkCounts | None,
    profile: Profile,
    overrides: Sequence[Overrides] = (),
    *,
    why_missing: str | None = None,
) -> WorkJudgement:
    """Every counter of a case against its baseline counts.

    No verdicts, with a note, when either side has no counts (a baseline from before
    counters: refresh it; a run that could not be counted: `why_missing`) or when the
    contexts differ (`context_mismatch`). A counter only one side has is `new-stage` /
    `missing-stage`, as a timing would be.
    """
    if current is None:
        if baseline is None:
            return WorkJudgement(note=why_missing)
        note = why_missing or "this run was not counted"
        return WorkJudgement(note=f"work counters missing: {note}", baseline=baseline)
    if baseline is None:
        return WorkJudgement(
            note="the baseline has no work counters: `gen-baselines` records them",
            current=current,
        )
    mismatch = context_mismatch(baseline.context, current.context)
    if mismatch:
        return WorkJudgement(note=mismatch, current=current, baseline=baseline)
    out: list[CounterVerdict] = []
    names = sorted(set(current.counters) | set(baseline.counters), key=metric_sort_key)
    for metric in names:
        mine, theirs = current.counters.get(metric), baseline.counters.get(metric)
        if mine is None and theirs is not None:
            if work_kind(metric) == "flops" and current.uncounted:
                continue  # said once, in the note
            out.append(
                CounterVerdict(
                    metric,
                    MISSING_STAGE,
                    baseline=baseline.summary(metric),
                    reason="counted in the baseline but not in this run",
                )
            )
            continue
        if theirs is None:
            assert mine is not None
            out.append(
                CounterVerdict(
                    metric,
                    NEW_STAGE,
                    measured=current.summary(metric),
                    reason="not in the baseline's counts",
                )
            )
            continue
        assert mine is not None
        band = profile.band(metric, overrides)
        out.append(
            judge_counter(metric, mine, theirs, band.rel, band.abs, (baseline.runs, current.runs))
        )
    return WorkJudgement(tuple(out), current.uncounted, current, baseline)


# ---- output equivalence --------------------------------------------------------------------

BIT_IDENTICAL = "bit-identical"
WITHIN_TOLERANCE = "within-tolerance"
CHANGED = "changed"
UNCOMPARED = "not-compared"

OUTPUT_PSNR_DB = 100.0
"""An output whose PSNR against the baseline's is at least this, 100 dB, is within
tolerance. Reordered float32 arithmetic leaves ~120 dB and more; every DiT block rounded
through bfloat16 gives 78 dB (`benchmarks/counters.py`): the threshold sits 20 dB from
each (docs/measurements/2026-12-07-constants.md)."""

SKETCH_VALUES = 4096
"""The most values a compact reference keeps (16 KiB of float32, ~22 KB in the file)."""


@dataclass(frozen=True)
class OutputSketch:
    """A compact, fixed reference of a case's output: its shape and block means.

    `values` are the output itself when it has at most `SKETCH_VALUES` elements, else
    the means of equal blocks of its last two dimensions (an image downsampled), so that
    two sketches of the same shape compare position by position. `exact` says no
    averaging took place (the max abs diff is then the output's own).
    """

    shape: tuple[int, ...]
    sketch_shape: tuple[int, ...]
    values: tuple[float, ...]

    @property
    def exact(self) -> bool:
        return self.shape == self.sketch_shape

    def to_json(self) -> dict[str, Any]:
        data = struct.pack(f"<{len(self.values)}f", *self.values)
        return {
            "shape": list(self.shape),
            "sketch_shape": list(self.sketch_shape),
            "float32_le_base64": base64.b64encode(data).decode("ascii"),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputSketch:
        raw = base64.b64decode(str(data["float32_le_base64"]), validate=True)
        if len(raw) % 4:
            raise ValueError("float32_le_base64 is not a whole number of float32 values")
        values = struct.unpack(f"<{len(raw) // 4}f", raw)
        shape = tuple(int(x) for x in data["sketch_shape"])
        if math.prod(shape) != len(values):
            raise ValueError(f"{len(values)} values for a sketch of shape {list(shape)}")
        return cls(tuple(int(x) for x in data["shape"]), shape, tuple(values))


@dataclass(frozen=True)
class OutputVerdict:
    """Whether a case's output is what the baseline's was, and by how much it moved."""

    verdict: str
    allowed: bool = False
    max_abs_diff: float | None = None
    psnr_db: float | None = None
    reason: str = ""

    @property
    def failed(self) -> bool:
        """A changed output fails the case unless a change was allowed."""
        return self.verdict == CHANGED and not self.allowed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self.verdict, "allowed": self.allowed}
        if self.max_abs_diff is not None:
            out["max_abs_diff"] = float(f"{self.max_abs_diff:.6g}")
        if self.psnr_db is not None:
            out["psnr_db"] = None if math.isinf(self.psnr_db) else round(self.psnr_db, 2)
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputVerdict:
        psnr = data.get("psnr_db")
        return cls(
            verdict=str(data["verdict"]),
            allowed=bool(data.get("allowed", False)),
            max_abs_diff=None if data.get("max_abs_diff") is None else float(data["max_abs_diff"]),
            psnr_db=None if psnr is None else float(psnr),
            reason=str(data.get("reason", "")),
        )


def compare_sketches(current: OutputSketch, baseline: OutputSketch) -> tuple[float, float] | None:
    """(max abs diff, PSNR in dB) of two sketches of one shape, or None when they differ.

    PSNR is `20 log10(range / rms)` with the range of the baseline's values (inf when
    the values are equal).
    """
    if current.shape != baseline.shape or current.sketch_shape != baseline.sketch_shape:
        return None
    diffs = [abs(a - b) for a, b in zip(current.values, baseline.values, strict=True)]
    if not diffs:
        return None
    if any(not math.isfinite(d) for d in diffs):
        return math.inf, -math.inf
    peak = max(baseline.values) - min(baseline.values) or 1.0
    rms = math.sqrt(sum(d * d for d in diffs) / len(diffs))
    psnr = math.inf if rms == 0 else 20.0 * math.log10(peak / rms)
    return max(diffs), psnr


def judge_output(
    current_hash: str | None,
    current: OutputSketch | None,
    baseline_hash: str | None,
    baseline: OutputSketch | None,
    *,
    allowed: bool = False,
    psnr_db: float = OUTPUT_PSNR_DB,
) -> OutputVerdict | None:
    """Bit-identical, within tolerance or changed; None when there is nothing to compare."""
    if current_hash is None or baseline_hash is None:
        return None
    if current_hash == baseline_hash:
        return OutputVerdict(BIT_IDENTICAL, allowed)
    if current is None or baseline is None:
        return OutputVerdict(
            CHANGED,
            allowed,
            reason="the output hash differs and one side keeps no reference to measure by how much",
        )
    figures = compare_sketches(current, baseline)
    if figures is None:
        return OutputVerdict(
            CHANGED,
            allowed,
            reason=f"output shape {list(current.shape)}, baseline {list(baseline.shape)}",
        )
    max_abs, psnr = figures
    where = "" if current.exact else " (block means)"
    if psnr >= psnr_db:
        return OutputVerdict(
            WITHIN_TOLERANCE,
            allowed,
            max_abs,
            psnr,
            f"not bit-identical; PSNR {psnr:.1f} dB >= {psnr_db:g} dB{where}",
        )
    reason = f"PSNR {_db(psnr)} < {psnr_db:g} dB, max abs diff {max_abs:.3g}{where}"
    if allowed:
        reason += "; allowed (output_may_change / --allow-output-change)"
    return OutputVerdict(CHANGED, allowed, max_abs, psnr, reason)


def _db(psnr: float) -> str:
    return "-inf dB" if psnr == -math.inf else f"{psnr:.1f} dB"


def output_allowed(case: Mapping[str, Any], allow: bool) -> bool:
    """Whether the case definition or the command allows the output to change."""
    return bool(allow or case.get("output_may_change", False))


def judge_exact(
    result: CaseResult,
    work: WorkCounts | None,
    output_hash: str | None,
    output_sketch: Mapping[str, Any] | None,
    profile: Profile | None = None,
    overrides: Sequence[Overrides] = (),
    *,
    allow_output_change: bool = False,
) -> tuple[WorkJudgement, OutputVerdict | None]:
    """A result's work counters and output against a baseline's (or a base revision's).

    `profile` None takes the default profiles' work bands (exact), with `overrides`.
    """
    from perfguard.decision.tolerances import default_profiles

    profile = profile or default_profiles("cpu")["pr_test"]
    judged = judge_work(
        WorkCounts.from_runs(result.work or []),
        work,
        profile,
        overrides,
        why_missing=result.work_error,
    )
    output = judge_output(
        result.output_hash,
        None if result.output_sketch is None else OutputSketch.from_json(result.output_sketch),
        output_hash,
        None if output_sketch is None else OutputSketch.from_json(output_sketch),
        allowed=output_allowed(result.case, allow_output_change),
    )
    return judged, output


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


def judge_failures(
    current: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None
) -> tuple[CounterVerdict, ...]:
    """Each level's failed requests against the baseline's, exactly (`judge_counter`
    with no tolerance): one failure the baseline did not have fails the case, "counted
    3, baseline 0: +3"; fewer is an improvement. Both count the requests of one
    measurement's rounds (a check's confirmations add rounds, not failures), so the
    counts are of as many requests. A level only one side has is judged by its timings'
    `new-stage` / `missing-stage`; none here."""
    mine, theirs = failure_counts(current), failure_counts(baseline)
    return tuple(
        judge_counter(metric, (mine[metric],) * 2, (theirs[metric],) * 2, 0.0, 0.0)
        for metric in mine
        if metric in theirs
    )


def judge_scenario(
    result: CaseResult,
    scenario: Any,
    profile: Profile,
    overrides: Sequence[Overrides],
    allow_output_change: bool = False,
) -> tuple[WorkJudgement, OutputVerdict | None]:
    """`judge_exact` against a baseline scenario's work counters and output."""
    return judge_exact(
        result,
        scenario.work,
        scenario.output_hash,
        scenario.output_sketch,
        profile,
        overrides,
        allow_output_change=allow_output_change,
    )
