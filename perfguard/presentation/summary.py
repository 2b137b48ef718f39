"""The words around a report's figures: the first line, the reasons, the notes.

The console table and the PR Markdown share them: the summary line, the rows a report
shows (worst verdict first), the reasons a row's figures do not give alone, what the
intervals mean, what confirming found, and the runner's speed. Work counters have their
own section (`perfguard.presentation.work_report`); the rows here are the timed metrics.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfguard.decision.records import (
    CONTENDED,
    ERROR,
    IMPROVEMENT,
    MISSING,
    PASS,
    REGRESSION,
    SEVERITY,
    CaseVerdict,
    MetricVerdict,
)
from perfguard.decision.work_counts import is_counter
from perfguard.metrics import metric_sort_key
from perfguard.presentation.answers import answer_phrase
from perfguard.presentation.figures import fmt_evidence
from perfguard.presentation.work_report import output_summary
from perfguard.storage.reports import Report


def is_timed(m: MetricVerdict) -> bool:
    """A time or a peak, not a work counter (those render in `work_report`)."""
    return not is_counter(m.metric)


def _output_part(report: Report) -> list[str]:
    part = output_summary(report.cases)
    return [part] if part else []


def against_text(report: Report) -> str:
    """`relative to DIR (commit abc123def456)`: what a relative report compared with."""
    return _against_words(report.against or {})


def _against_words(against: Mapping[str, Any]) -> str:
    commit = against.get("commit")
    where = against.get("ref") or against.get("dir") or "?"
    return f"relative to {where} ({'commit ' + str(commit)[:12] if commit else 'no commit'})"


def report_rows(
    report: Report, all_metrics: bool
) -> list[tuple[CaseVerdict, MetricVerdict | None]]:
    """(case, metric) rows, worst verdict first; a failed case is one row without a metric."""
    rows: list[tuple[CaseVerdict, MetricVerdict | None]] = []
    for case in report.cases:
        if case.verdict == ERROR:
            rows.append((case, None))
        for m in case.metrics:
            if not is_timed(m):
                continue
            quiet = m.verdict == PASS and m.metric.startswith("step:")
            if all_metrics or not quiet:
                rows.append((case, m))

    def key(row: tuple[CaseVerdict, MetricVerdict | None]) -> tuple[Any, ...]:
        case, m = row
        verdict = ERROR if m is None else m.verdict
        return (SEVERITY.index(verdict), case.case_id, metric_sort_key(m.metric if m else "e2e"))

    return sorted(rows, key=key)


def summary_line(report: Report) -> str:
    """One line: the verdict and what made it (plain text; escape before Markdown)."""
    counts = report.judgement.counts
    n_cases = len(report.cases)
    parts = [f"{counts[REGRESSION]} regression(s)", *_output_part(report)]
    errors = sum(1 for c in report.cases if c.verdict == ERROR)
    if errors:
        parts.append(f"{errors} case(s) failed to run")
    busy = sum(1 for c in report.cases if c.verdict == CONTENDED)
    if busy:
        parts.append(f"{busy} case(s) measured on a contended runner (no verdict)")
    missing = sum(counts[v] for v in MISSING)
    if missing:
        parts.append(f"{missing} missing or new metric(s)")
    if counts[IMPROVEMENT]:
        parts.append(f"{counts[IMPROVEMENT]} improvement(s)")
    advisory = " (advisory: not enforced)" if report.judgement.advisory else ""
    against = against_text(report) if report.relative else f"profile {report.judgement.profile}"
    headline = _HEADLINES.get(report.verdict, report.verdict.upper())
    return (
        f"perfguard {headline}{advisory}: {', '.join(parts)} "
        f"in {n_cases} case(s), {against}, "
        f"exit {report.exit_code}{answer_phrase(report)}"
    )


_HEADLINES = {"cant_tell": "CAN'T TELL"}
"""The first line's word for a verdict whose JSON name is not one."""


def _confirmations(case: CaseVerdict) -> int:
    sampling = case.sampling or {}
    return int(sampling.get("confirmations", sampling.get("reruns", 0)) or 0)


def confirmation_text(case: CaseVerdict) -> str:
    """What the confirmation of a case over a bound found, in words that cannot be misread.

    "confirmed" only where a regression was declared; a case that came back within its
    bounds says so, since "over a bound at first, confirmed" reads like a failure.
    """
    n = _confirmations(case)
    where = f"re-measured in {n} fresh process{'es' if n != 1 else ''}"
    if any(m.verdict == REGRESSION for m in case.metrics):
        names = ", ".join(m.metric for m in case.metrics if m.verdict == REGRESSION)
        return f"{case.case_id}: over a bound, {where}: regression confirmed ({names})"
    if case.verdict == CONTENDED:
        return f"{case.case_id}: over a bound, {where}: the runner was contended, no verdict"
    if any(m.over for m in case.metrics):
        return f"{case.case_id}: over a bound, {where}: not a credible regression (see the reasons)"
    return f"{case.case_id}: over a bound at first, {where}: within bounds"


def runner_speeds(report: Report) -> list[tuple[str, float]]:
    """(case, reference workload now / at baseline time) for the cases that measured it."""
    out = []
    for c in report.cases:
        speed = (c.runner or {}).get("runner_speed")
        if isinstance(speed, (int, float)) and speed > 0:
            out.append((c.case_id, float(speed)))
    return out


def runner_text(report: Report) -> str:
    """The runner's speed per case: part of every verdict, so it is always shown."""
    speeds = runner_speeds(report)
    if not speeds:
        return ""
    cells = ", ".join(f"{cid} {speed:.3f}x" for cid, speed in speeds)
    normalized = [c.case_id for c in report.cases if (c.runner or {}).get("timing") == "normalized"]
    if len(normalized) == len(report.cases):
        how = (
            "every case's times are normalized run by run, so they read at the baseline's "
            "runner speed"
        )
    elif normalized:
        how = (
            f"times of {', '.join(normalized)} are normalized run by run (at the baseline's "
            "runner speed); for the others a slowdown it would explain gets no verdict"
        )
    else:
        how = "a slowdown it would explain gets no verdict (contended)"
    shares = [
        f"{c.case_id} {exps[STAGE]:.2f}"
        for c in report.cases
        if STAGE in (exps := (c.runner or {}).get("reference_exponents") or {})
    ]
    if shares:
        how += (
            " by the reference's share fitted on both sides' runs (run x (baseline's "
            f"reference / its own) ** share; {STAGE}: {', '.join(shares)})"
        )
    return (
        f"runner speed (reference workload now / at baseline time): {cells}; above 1 the "
        f"runner is slower; {how}"
    )


STAGE = "stage:DenoisingStage"


def verdict_reasons(report: Report) -> list[tuple[CaseVerdict, MetricVerdict]]:
    """The metrics whose row does not explain its verdict alone, with a reason to give.

    A regression (the evidence that made it one), a contended metric, and a pass whose
    median is over its bound (noise or the runner's speed explained it): the figures in
    such a row break the rule printed under the table, so the reason must be beside them.
    """
    return [
        (c, m)
        for c, m in report_rows(report, all_metrics=True)
        if m is not None
        and m.reason
        and (m.verdict in (REGRESSION, CONTENDED) or (m.verdict == PASS and m.over))
    ]


def evidence_note(report: Report) -> str:
    """What the intervals in the ratio column mean, what re-measuring found, what was dropped."""
    parts = []
    if report.relative and any(
        m.low is not None and "(" in fmt_evidence(m) for c in report.cases for m in c.metrics
    ):
        parts.append(
            "ratio (low-high): head/base, the geometric mean of per-block ratios with its "
            "one-sided bounds; a regression needs ratio > 1 + the metric's minimum effect "
            "and low > 1 (docs/verdicts.md)"
        )
    elif any(m.low is not None and "(" in fmt_evidence(m) for c in report.cases for m in c.metrics):
        parts.append(
            "ratio (low-high): the rule's confidence bounds on measured/baseline; a median "
            "above its bound is a regression only when low > 1 (docs/verdicts.md)"
        )
    parts += [confirmation_text(c) for c in report.cases if _confirmations(c)]
    for c in report.cases:
        changes = c.component_changes
        if changes:
            parts.append(
                f"{c.case_id}: the pipeline differs from the one the baseline measured "
                f"({'; '.join(changes)}): regenerate the baseline if that is intended"
            )
    waited = [c.case_id for c in report.cases if c.sampling and c.sampling.get("contention_waits")]
    if waited:
        parts.append(f"measured again after the runner was contended: {', '.join(waited)}")
    dropped = sum(int((c.runner or {}).get("dropped_runs", 0)) for c in report.cases)
    if dropped:
        parts.append(f"{dropped} run(s) left out: the reference workload beside them was slow")
    return ". ".join(parts)
