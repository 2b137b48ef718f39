"""The verdict on what the code does: work counters, judged exactly, and the output.

Work counters (`perfguard.decision.work_counts`) have no noise, so this verdict needs no
statistics:

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
- **like with like.** A baseline counted under another torch, device type or dtype
  compares no counter, says so in one line, and the timings are still judged.
  `gen-baselines` refreshes the counts. A torch upgrade never reads as a regression.

The output is judged beside them (`perfguard.decision.output`: bit-identical, within
tolerance or changed). `perfguard.decision.verdict.judge_scenario` calls this module's
`judge_scenario` and adds both verdicts to the case; nothing here is about time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision.output import OutputSketch, OutputVerdict, judge_output, output_allowed
from perfguard.decision.records import (
    IMPROVEMENT,
    MISSING_STAGE,
    NEW_STAGE,
    PASS,
    REGRESSION,
    CounterVerdict,
)
from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import Band
from perfguard.decision.work_counts import WorkCounts, context_mismatch, failure_counts
from perfguard.metrics import metric_sort_key, work_kind

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.decision.tolerances import Overrides, Profile
    from perfguard.results import CaseResult

TOP_OPS = 5
"""How many of a stage's changed ops a report names: the ones that moved most."""


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
    unjudged = _unjudged(current, baseline, why_missing)
    if unjudged is not None:
        return unjudged
    assert current is not None and baseline is not None
    names = sorted(set(current.counters) | set(baseline.counters), key=metric_sort_key)
    verdicts = [_judge_one(metric, current, baseline, profile, overrides) for metric in names]
    judged = tuple(v for v in verdicts if v is not None)
    return WorkJudgement(judged, current.uncounted, current, baseline)


def _unjudged(
    current: WorkCounts | None, baseline: WorkCounts | None, why_missing: str | None
) -> WorkJudgement | None:
    """The judgement with a note and no verdicts when the two sides' counts cannot be
    compared (one side has none, or their contexts differ); None when they can."""
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
    return None


def _judge_one(
    metric: str,
    current: WorkCounts,
    baseline: WorkCounts,
    profile: Profile,
    overrides: Sequence[Overrides],
) -> CounterVerdict | None:
    """One counter of a case: `missing-stage` / `new-stage` when only one side counted
    it, else `judge_counter` in the profile's band. None for the FLOPs a run could not
    count: the judgement's note says so once."""
    mine, theirs = current.counters.get(metric), baseline.counters.get(metric)
    if mine is None:
        if work_kind(metric) == "flops" and current.uncounted:
            return None
        return CounterVerdict(
            metric,
            MISSING_STAGE,
            baseline=baseline.summary(metric),
            reason="counted in the baseline but not in this run",
        )
    if theirs is None:
        return CounterVerdict(
            metric,
            NEW_STAGE,
            measured=current.summary(metric),
            reason="not in the baseline's counts",
        )
    band = profile.band(metric, overrides)
    return judge_counter(metric, mine, theirs, band.rel, band.abs, (baseline.runs, current.runs))


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
