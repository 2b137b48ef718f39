"""How a report's answer reads: same, slower or can't tell, the smallest slowdown the
check could have caught, and what would resolve a can't tell (plain text; the
renderers escape it). The answers themselves are `perfguard.decision.answer`'s."""

from __future__ import annotations

from perfguard.decision.answer import CANT_TELL, LABELS, SAME, SLOWER, UNRESOLVED
from perfguard.decision.records import CaseVerdict, MetricVerdict
from perfguard.decision.work_counts import is_counter
from perfguard.metrics import metric_class
from perfguard.storage.reports import Report

HEADLINE_CLASSES = ("e2e", "denoise_stage")
"""The figures whose detectable slowdown the first lines quote: what a reviewer asks
about first ("is the request slower? is the denoising loop?")."""


def counts(report: Report) -> dict[str, int]:
    """Timed figures by answer (faster counted with same)."""
    out = {SAME: 0, SLOWER: 0, CANT_TELL: 0, UNRESOLVED: 0}
    for case in report.cases:
        for m in case.metrics:
            if m.answer is not None and m.measured is not None and m.answer.margin > 0:
                key = SAME if m.answer.answer == "faster" else m.answer.answer
                out[key] += 1
    return out


def answer_phrase(report: Report) -> str:
    """The first line's last words: ` (same)`, ` (slower)`, ` (can't tell: 2 of 12
    timed figures)`; nothing when no case has an answer."""
    answer = report.judgement.answer
    if answer is None:
        return ""
    if answer == UNRESOLVED:
        return f" ({unresolved_phrase(report)})"
    if answer != CANT_TELL:
        return f" ({LABELS[answer]})"
    n = counts(report)
    return f" (can't tell: {n[CANT_TELL]} of {sum(n.values())} timed figures)"


def _below(report: Report) -> list[tuple[CaseVerdict, MetricVerdict]]:
    return [
        (case, m)
        for case in report.cases
        for m in case.metrics
        if m.answer is not None and m.answer.answer == UNRESOLVED
    ]


def _has_work(report: Report) -> bool:
    return any(is_counter(m.metric) for c in report.cases for m in c.metrics)


def unresolved_phrase(report: Report) -> str:
    """`work: same (exact); timing: this runner resolves about +38 % (qwen DenoisingStage),
    not judged below that`: a check whose timing the runner could not resolve."""
    below = _below(report)
    headline = [cm for cm in below if metric_class(cm[1].metric) in HEADLINE_CLASSES] or below
    case, m = max(headline, key=lambda cm: cm[1].answer.resolution or 0.0)  # type: ignore[union-attr]
    assert m.answer is not None
    res = m.answer.resolution
    where = f"{case.case_id} {m.metric}"
    timing = (
        f"timing: this runner resolves about +{res:.0%} ({where}), not judged below that"
        if res is not None
        else f"timing: not resolvable on this runner ({where})"
    )
    return f"work: same (exact); {timing}" if _has_work(report) else timing


def _headline_figures(report: Report) -> list[tuple[CaseVerdict, MetricVerdict]]:
    return [
        (case, m)
        for case in report.cases
        for m in case.metrics
        if m.answer is not None
        and m.answer.detectable is not None
        and metric_class(m.metric) in HEADLINE_CLASSES
    ]


def detectable_line(report: Report) -> str:
    """The smallest slowdown this check could have caught on its headline figures."""
    figures = _headline_figures(report)
    if not figures:
        return ""
    parts = []
    for case, m in figures:
        assert m.answer is not None and m.answer.detectable is not None
        parts.append(f"{case.case_id} {m.metric} +{m.answer.detectable:.0%}")
    worst_case, worst = max(figures, key=lambda cm: cm[1].answer.detectable or 0.0)
    assert worst.answer is not None and worst.answer.detectable is not None
    return (
        "This check catches a slowdown with 80 % probability from: "
        + ", ".join(parts)
        + f" (the least sensitive: {worst_case.case_id} {worst.metric})."
    )


def resolve_line(report: Report) -> str:
    """For a can't tell: which figures, and what would resolve them."""
    open_ = [(case, m) for case in report.cases for m in case.cant_tell]
    if not open_:
        return ""
    shown = []
    for case, m in open_[:4]:
        assert m.answer is not None
        high = m.answer.high or 0.0
        shown.append(
            f"{case.case_id} {m.metric} {m.ratio or 0:.3f}x (up to {high:.3f}x, "
            f"margin +{m.answer.margin:.0%})"
        )
    more = f" and {len(open_) - 4} more" if len(open_) > 4 else ""
    needs = max((m.answer.needs or 0.0) for _, m in open_ if m.answer is not None)
    relative = (
        "more blocks (--rigorous or a larger budget)"
        if report.relative
        else "the relative check on the same runner (perfguard compare --against REF)"
    )
    return (
        f"Can't tell: {'; '.join(shown)}{more}. Neither within the minimum effect nor "
        f"credibly slower. To resolve: {relative}, --rigorous (more processes), a quieter "
        f"runner, or a minimum effect of at least +{needs:.0%}."
    )


def resolution_line(report: Report) -> str:
    """Which timed figures were below this runner's resolution, and what would judge them."""
    below = _below(report)
    if not below:
        return ""
    shown = []
    for case, m in below[:4]:
        assert m.answer is not None
        res = "?" if m.answer.resolution is None else f"+{m.answer.resolution:.0%}"
        shown.append(
            f"{case.case_id} {m.metric} resolves {res} (minimum effect +{m.answer.margin:.0%})"
        )
    more = f" and {len(below) - 4} more" if len(below) > 4 else ""
    return (
        f"Below resolution ({len(below)} timed figure(s), judged only for slower): "
        f"{'; '.join(shown)}{more}. The baseline's runner spreads too much between "
        "processes for them to be called the same; a quieter runner, a GPU, the relative "
        "check (perfguard compare --against REF) or --timing-gate gate judge them in full."
    )


def answer_lines(report: Report) -> list[str]:
    """The lines under the first one: what the check could see, what is open."""
    lines = (detectable_line(report), resolution_line(report), resolve_line(report))
    return [line for line in lines if line]
