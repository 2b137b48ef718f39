"""How an attribution reads: terminal lines, a Markdown section, an HTML bar chart.

The section comes from a report's `attribution` (`perfguard.decision.attribution`), as
its JSON holds it, so `report render` of a file later prints exactly what the check
printed. Per attributed stage: its time on each side, then its ops ranked by their
change in self time (the most slowed first), with input shapes, calls and self time on
each side, the change and its share of the stage's change; rows within noise are marked
`~` (terminal, Markdown) or drawn grey (HTML). The Markdown keeps the top `TOP` rows of
each stage inside a collapsible `<details>` block, so a PR comment stays short.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perfguard.decision.attribution import Attribution, CaseAttribution, OpRow, StageAttribution
from perfguard.presentation.escape import html_attr, html_text, md_cell_code, md_code, md_text

TOP = 10
SHAPES_CHARS = 48


def _ms(us: float) -> str:
    return f"{us / 1e3:.3f} ms"


def _delta(us: float) -> str:
    return f"{us / 1e3:+.3f} ms"


def _share(row: OpRow) -> str:
    return "-" if row.share is None else f"{row.share:.0%}"


def _shapes(row: OpRow) -> str:
    text = row.shapes
    return text if len(text) <= SHAPES_CHARS else text[: SHAPES_CHARS - 3] + "..."


def _stage_line(case_id: str, stage: StageAttribution) -> str:
    real = len(stage.outside_noise)
    return (
        f"{case_id} {stage.stage}: {_ms(stage.base_us)} -> {_ms(stage.head_us)} "
        f"({_delta(stage.delta_us)}) under the profiler; {real} of {stage.rows_total} op "
        "row(s) outside noise"
    )


def _sides_line(case: CaseAttribution) -> str:
    parts = []
    for name in ("base", "head"):
        side = case.sides.get(name, {})
        commit = side.get("commit")
        where = f"commit {commit[:12]}" if commit else (side.get("dir") or "this checkout")
        trace = f", trace {side['trace']}" if side.get("trace") else ""
        parts.append(f"{name}: {where}{trace}")
    return "; ".join(parts)


def console_lines(data: Mapping[str, Any] | None, top: int = TOP) -> list[str]:
    """The attribution as plain lines for a terminal (empty without one)."""
    if not data:
        return []
    attribution = Attribution.from_json(data)
    out = [f"Per-op attribution ({attribution.runs} profiled runs a side; ~ within noise):"]
    for case in attribution.cases:
        if case.error:
            out.append(f"{case.case_id}: no attribution: {case.error}")
            continue
        out.append(f"{case.case_id}: {_sides_line(case)}")
        for stage in case.stages:
            out.append("  " + _stage_line(case.case_id, stage))
            for row in stage.rows[:top]:
                mark = "~" if row.within_noise else " "
                out.append(
                    f"   {mark} {row.name} {_shapes(row)}: calls {row.calls_base} -> "
                    f"{row.calls_head}, self {_ms(row.base_us)} -> {_ms(row.head_us)} "
                    f"({_delta(row.delta_us)}, {_share(row)} of the stage's change)"
                )
    return out


def markdown_lines(data: Mapping[str, Any] | None, top: int = TOP) -> list[str]:
    """The attribution as a Markdown section, each stage's top rows collapsible."""
    if not data:
        return []
    attribution = Attribution.from_json(data)
    out = ["#### Where the time went (per-op attribution)", ""]
    out += [
        f"Each side profiled {attribution.runs} times (`torch.profiler`, never a judged "
        "run); ops ranked by their change in self time; *~* marks a change within the "
        "noise of repeated runs (docs/bisect.md).",
        "",
    ]
    for case in attribution.cases:
        if case.error:
            out += [f"- {md_code(case.case_id)}: no attribution: {md_text(case.error)}", ""]
            continue
        out += [f"{md_text(case.case_id)}: {md_text(_sides_line(case))}", ""]
        for stage in case.stages:
            # Inside an HTML block Markdown is not parsed: the summary is HTML text.
            summary = html_text(_stage_line(case.case_id, stage))
            out += ["<details>", f"<summary>{summary}</summary>", ""]
            out += [
                "| op | input shapes | calls | self time | change | share | |",
                "|---|---|---:|---:|---:|---:|---|",
            ]
            for row in stage.rows[:top]:
                out.append(
                    f"| {md_cell_code(row.name)} | {md_cell_code(_shapes(row))} | "
                    f"{row.calls_base} → "
                    f"{row.calls_head} | {_ms(row.base_us)} → {_ms(row.head_us)} | "
                    f"{_delta(row.delta_us)} | {_share(row)} | {'~' if row.within_noise else ''} |"
                )
            more = stage.rows_total - min(top, len(stage.rows))
            if more > 0:
                out += ["", f"{more} more row(s) in the JSON report."]
            out += ["", "</details>", ""]
    return out


def _bars(stage: StageAttribution, top: int) -> str:
    """An inline SVG bar chart of a stage's top rows' changes (no script needed)."""
    rows = list(stage.rows[:top])
    if not rows:
        return ""
    widest = max(abs(r.delta_us) for r in rows) or 1.0
    width, label_w, bar_w, row_h = 760, 300, 360, 20
    mid = label_w + bar_w // 2
    parts = [
        f'<svg class="attribution" width="{width}" height="{row_h * len(rows) + 10}" '
        f'role="img" aria-label="change in self time per op">',
        f'<line x1="{mid}" y1="0" x2="{mid}" y2="{row_h * len(rows)}" stroke="#888"/>',
    ]
    for i, row in enumerate(rows):
        y = i * row_h
        length = abs(row.delta_us) / widest * (bar_w / 2)
        x = mid if row.delta_us >= 0 else mid - length
        color = "#bbb" if row.within_noise else ("#c0392b" if row.delta_us > 0 else "#27ae60")
        label = html_text(f"{row.name} {_shapes(row)}"[:48])
        parts += [
            f'<text x="0" y="{y + 14}" font-size="11">{label}</text>',
            f'<rect x="{x:.1f}" y="{y + 3}" width="{max(length, 1):.1f}" height="{row_h - 6}" '
            f'fill="{html_attr(color)}"><title>{html_text(_delta(row.delta_us))}</title></rect>',
            f'<text x="{label_w + bar_w + 6}" y="{y + 14}" font-size="11">'
            f"{html_text(_delta(row.delta_us))} ({html_text(_share(row))})</text>",
        ]
    parts.append("</svg>")
    return "".join(parts)


def html_section(data: Mapping[str, Any] | None, top: int = TOP) -> str:
    """The attribution as an HTML section: per stage, a bar chart and its table."""
    if not data:
        return ""
    attribution = Attribution.from_json(data)
    out = ["<section><h2>Where the time went (per-op attribution)</h2>"]
    out.append(
        f"<p>Each side profiled {attribution.runs} times; bars are each op's change in self "
        "time (red slower, green faster, grey within noise).</p>"
    )
    for case in attribution.cases:
        if case.error:
            why = f"{case.case_id}: no attribution: {case.error}"
            out.append(f"<p>{html_text(why)}</p>")
            continue
        out.append(f"<p>{html_text(_sides_line(case))}</p>")
        for stage in case.stages:
            out.append(f"<h3>{html_text(_stage_line(case.case_id, stage))}</h3>")
            out.append(_bars(stage, top))
            out.append(_html_table(stage.rows[:top]))
    out.append("</section>")
    return "\n".join(out)


def _html_table(rows: Sequence[OpRow]) -> str:
    head = "".join(
        f"<th>{h}</th>" for h in ("op", "input shapes", "calls", "self time", "change", "share")
    )
    body = []
    for r in rows:
        cells = (
            r.name, _shapes(r), f"{r.calls_base} → {r.calls_head}",
            f"{_ms(r.base_us)} → {_ms(r.head_us)}", _delta(r.delta_us), _share(r),
        )  # fmt: skip
        style = ' class="noise"' if r.within_noise else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html_text(c)}</td>" for c in cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def standalone_html(data: Mapping[str, Any], title: str) -> str:
    """A page of its own for `perfguard explain` (no report around it)."""
    return (
        '<!doctype html><html><head><meta charset="utf-8">'
        f"<title>{html_text(title)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 8px;font-size:12px}"
        "tr.noise{color:#888}</style></head><body>"
        f"<h1>{html_text(title)}</h1>{html_section(data)}</body></html>\n"
    )
