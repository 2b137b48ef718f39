"""What the code does, in words a PR author acts on: the work counters and the output.

A report's Markdown opens with this section, before any time: per case and stage, the
counters that moved, with the ops that moved most, e.g. "DenoisingStage: +24
`aten::addmm` per step (+0.4 GFLOP); +1 host sync per step (`aten::nonzero`)". Counts
are exact (`perfguard.decision.counters`), so a line here is a fact about the code, not
an estimate. Only changed counters and the `TOP_OPS` ops that changed most are named;
the JSON report carries every counter with its baseline, current value and delta.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from perfguard.decision.counters import TOP_OPS
from perfguard.decision.output import BIT_IDENTICAL, CHANGED, OutputVerdict
from perfguard.decision.records import IMPROVEMENT, REGRESSION, CaseVerdict, MetricVerdict
from perfguard.decision.work_counts import is_counter
from perfguard.metrics import DENOISING_STAGE, WORK_KINDS, work_kind, work_stage
from perfguard.presentation.escape import Code, md_parts, md_text, plain_parts
from perfguard.storage.reports import Report

Parts = list[str]
"""A sentence as parts: `Code` parts (op names) are shown as code, the others as text; each
renderer escapes every part for its format (`escape.md_parts`, `escape.plain_parts`)."""


def fmt_bytes(n: float) -> str:
    """Bytes in binary units: 8.0 KiB, 1.5 MiB."""
    size = abs(n)
    for scale, suffix in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if size >= scale:
            return f"{n / scale:.1f} {suffix}"
    return f"{n:g} B"


def fmt_flops(n: float) -> str:
    size = abs(n)
    for scale, suffix in ((1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP"), (1e3, "kFLOP")):
        if size >= scale:
            return f"{n / scale:.1f} {suffix}"
    return f"{n:g} FLOP"


def _signed(n: float, fmt: Callable[[float], str] = lambda x: f"{x:,.0f}") -> str:
    return ("+" if n > 0 else "−") + fmt(abs(n))


def _deltas(case: CaseVerdict) -> dict[str | None, dict[str, tuple[MetricVerdict, float]]]:
    """stage (None: the run's total) -> kind -> (verdict, delta) for counters that moved."""
    out: dict[str | None, dict[str, tuple[MetricVerdict, float]]] = {}
    for m in case.metrics:
        if not is_counter(m.metric) or m.measured is None or m.baseline is None:
            continue
        if m.metric.endswith("_per_step"):
            continue
        delta = m.measured.median - m.baseline.median
        if delta:
            out.setdefault(work_stage(m.metric), {})[work_kind(m.metric)] = (m, delta)
    return out


def _per_step(stage: str, delta: float, steps: int) -> tuple[float, str]:
    """A denoising stage's delta per step when it divides evenly, else the stage's."""
    if stage.endswith(DENOISING_STAGE) and steps > 0 and delta % steps == 0:
        return delta / steps, " per step"
    return delta, ""


def stage_sentence(
    stage: str,
    moved: Mapping[str, tuple[MetricVerdict, float]],
    work: Mapping[str, Any],
) -> Parts:
    """`DenoisingStage: +24 `aten::addmm` per step (+0.4 GFLOP); +1 host sync per step ...`,
    as parts: the op names are `Code` parts, never text with marks around them."""
    steps = int(work.get("steps") or 0)
    parts: list[Parts] = []
    ops = _biggest_first((work.get("op_changes") or {}).get(stage, {}))
    if "ops" in moved or "flops" in moved:
        delta_ops = moved["ops"][1] if "ops" in moved else 0
        shown = list(ops.items())[:TOP_OPS]
        text: Parts = []
        for op, (before, after) in shown:
            d, _ = _per_step(stage, after - before, steps)
            text += [", " if text else "", f"{_signed(d)} ", Code(op)]
        d, where = _per_step(stage, delta_ops, steps)
        if not text:
            text.append(f"{_signed(d)} ops")
        if shown and len(ops) > len(shown):
            text.append(f" (+{len(ops) - len(shown)} more ops)")
        if delta_ops and len(ops) > 1:
            text.append(f", {_signed(d)} ops in all")
        text.append(where)
        if "flops" in moved:
            f, fwhere = _per_step(stage, moved["flops"][1], steps)
            text.append(f" ({_signed(f, fmt_flops)}{fwhere if fwhere != where else ''})")
        parts.append(text)
    if "alloc" in moved:
        a, where = _per_step(stage, moved["alloc"][1], steps)
        parts.append([f"{_signed(a, fmt_bytes)} allocated{where}"])
    if "syncs" in moved:
        s, where = _per_step(stage, moved["syncs"][1], steps)
        syncs = _biggest_first((work.get("sync_changes") or {}).get(stage, {}))
        which: Parts = []
        for op, (a, b) in list(syncs.items())[:TOP_OPS]:
            step = _signed(_per_step(stage, b - a, steps)[0])
            which += [", " if which else "", Code(op), f" {step}"]
        noun = "host sync" if abs(s) == 1 else "host syncs"
        parts.append([f"{_signed(s)} {noun}{where}", *([" (", *which, ")"] if which else [])])
    grew = [k for k in WORK_KINDS if k in moved and moved[k][0].verdict == REGRESSION]
    shrank = [k for k in WORK_KINDS if k in moved and moved[k][0].verdict == IMPROVEMENT]
    mark = "; ".join(
        part
        for part in (
            f"regression: {', '.join(grew)}" if grew else "",
            f"improvement: {', '.join(shrank)}" if shrank else "",
        )
        if part
    )
    out: Parts = [f"{stage}: "]
    for i, part in enumerate(parts):
        out += ["; ", *part] if i else part
    return [*out, f" ({mark})" if mark else ""]


def _biggest_first(changes: Mapping[str, Sequence[int]]) -> dict[str, Sequence[int]]:
    """op -> [before, after], the largest change first (ties by name)."""
    items = sorted(changes.items(), key=lambda kv: (-abs(kv[1][1] - kv[1][0]), kv[0]))
    return dict(items)


def case_lines(case: CaseVerdict) -> list[Parts]:
    """The sentences of one case, as parts: each stage that moved, the output, the notes."""
    work = case.work or {}
    lines: list[Parts] = []
    deltas = _deltas(case)
    for stage in sorted(s for s in deltas if s is not None):
        lines.append(stage_sentence(stage, deltas[stage], work))
    outside = deltas.get(None, {})
    if outside and not any(s is not None for s in deltas):
        parts = [f"{_signed(d)} {kind}" for kind, (_m, d) in sorted(outside.items())]
        lines.append(["the run, outside any stage: " + ", ".join(parts)])
    if work.get("note"):
        lines.append([str(work["note"])])
    if work.get("varies"):
        varies = ", ".join(str(v) for v in work["varies"][:6])
        lines.append([f"counters that vary between runs (judged on their range): {varies}"])
    if case.output is not None:
        out = OutputVerdict.from_json(case.output)
        if out.verdict != BIT_IDENTICAL:
            head = "output CHANGED" if out.failed else f"output {out.verdict}"
            lines.append([f"{head}: {out.reason}"])
    return lines


def work_markdown(report: Report) -> list[str]:
    """The report's opening section: what the code does, per case, before any time."""
    cases = [c for c in report.cases if c.work or c.output]
    if not cases:
        return []
    body: list[str] = []
    for case in cases:
        lines = [md_parts(parts) for parts in case_lines(case)]
        if lines:
            body.append(f"- **{md_text(case.case_id)}**: " + "; ".join(lines[:1]))
            body += [f"  - {ln}" for ln in lines[1:]]
    counted = sum(1 for c in cases if c.work and not c.work.get("note"))
    same = [c for c in cases if c.output and c.output.get("verdict") == BIT_IDENTICAL]
    quiet = []
    if counted and not body:
        quiet.append(f"no work counter moved in {counted} counted case(s)")
    if same and len(same) == len(cases):
        quiet.append("every output bit-identical to its baseline's")
    elif same:
        quiet.append(f"{len(same)} output(s) bit-identical")
    head = ["#### What the code does (work counters, exact)", ""]
    tail = [md_text("; ".join(quiet).capitalize() + "."), ""] if quiet else []
    return head + body + ([""] if body else []) + tail


def work_console_lines(report: Report) -> list[str]:
    """The same sentences for the terminal, one per line, prefixed by the case id."""
    out = []
    for case in report.cases:
        for parts in case_lines(case):
            out.append(plain_parts([case.case_id, ": ", *parts]))
    return out


def output_summary(cases: Sequence[CaseVerdict]) -> str | None:
    """`output changed in 1 case(s)` for the summary line, or None."""
    changed = [c for c in cases if c.output and c.output.get("verdict") == CHANGED]
    if not changed:
        return None
    failed = sum(1 for c in changed if c.output_failed)
    allowed = len(changed) - failed
    return f"output changed in {len(changed)} case(s)" + (
        f" ({allowed} allowed)" if allowed else ""
    )


__all__ = [
    "case_lines",
    "fmt_bytes",
    "fmt_flops",
    "output_summary",
    "stage_sentence",
    "work_console_lines",
    "work_markdown",
]
