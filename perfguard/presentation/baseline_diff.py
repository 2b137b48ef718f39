"""What a baseline refresh moved, in Markdown for the pull request that proposes it.

Credible slowdowns first (they loosen the gate: the reviewer must agree that the code
really got slower), then credible speed-ups (they tighten it), then a collapsed table of
every changed figure with its interval and verdict, so that figures that moved within
noise are visible without drowning the ones that matter.
"""

from __future__ import annotations

from perfguard.decision.changes import ADDED, FASTER, REMOVED, SLOWER, BaselineDiff, DiffRow
from perfguard.presentation.figures import fmt_ratio, fmt_value
from perfguard.presentation.markdown import escape_md, md_table


def render_baseline_diff_markdown(d: BaselineDiff, old_label: str, new_label: str) -> str:
    """The refresh's Markdown: a count line, scenario and tolerance changes, the tables."""
    lines = [
        f"### Baseline changes: {escape_md(old_label)} → {escape_md(new_label)}",
        "",
    ]
    if d.empty:
        return "\n".join([*lines, "No scenario, figure or tolerance changed.", ""])
    conf = f"{d.confidence:.0%}"
    lines += _counts_line(d, conf)
    lines += _scenario_changes(d)
    lines += _change_tables(d, conf)
    lines += [
        f"_slower / faster: the {conf} interval of new / old (from both files' noise, "
        "as the gate computes it) excludes 1 and the ratio is at least the metric's "
        "minimum effect; small: credible but below it; noise: the interval contains 1._",
        "",
    ]
    return "\n".join(lines)


def _counts_line(d: BaselineDiff, conf: str) -> list[str]:
    """How many figures got credibly slower or faster, and how many moved within noise."""
    counts = d.counts()
    cases = {r.case_id for r in d.changed if r.credible}
    return [
        f"**{counts[SLOWER]} slower, {counts[FASTER]} faster** (credible at {conf} and at "
        f"least the metric's minimum effect, in {len(cases)} case(s)); {counts['small']} "
        f"credible but small, {counts['noise']} within noise, {counts['unknown']} without a "
        f"known spread; {counts[ADDED]} metric(s) added, {counts[REMOVED]} removed.",
        "",
    ]


def _scenario_changes(d: BaselineDiff) -> list[str]:
    """The scenarios added and removed, and the tolerances that changed."""
    lines: list[str] = []
    for label, ids in (("Scenarios added", d.added), ("Scenarios removed", d.removed)):
        if ids:
            lines += [f"{label} ({len(ids)}): {', '.join(escape_md(i) for i in ids)}.", ""]
    if d.tolerance_changes:
        changed = ", ".join(escape_md(t) for t in d.tolerance_changes)
        lines += [f"**Tolerances changed:** {changed}.", ""]
    return lines


def _change_tables(d: BaselineDiff, conf: str) -> list[str]:
    """The slower and faster tables, then every changed figure folded."""
    lines: list[str] = []
    header = ["case", "metric", "old", "new", "ratio", f"{conf} interval"]
    for change, title in ((SLOWER, "Slower"), (FASTER, "Faster")):
        rows = [_row(r, False) for r in d.changed if r.change == change]
        if rows:
            lines += [f"#### {title} ({len(rows)})", ""]
            lines += md_table(header, rows)
            lines.append("")
    if d.changed:
        lines += [f"<details><summary>All {len(d.changed)} changed figures</summary>", ""]
        lines += md_table([*header, "change"], [_row(r, True) for r in d.changed])
        lines += ["", "</details>", ""]
    return lines


def _row(r: DiffRow, with_change: bool) -> list[str]:
    interval = "-" if r.low is None or r.high is None else f"{r.low:.3f}–{r.high:.3f}"
    cells = [
        escape_md(r.case_id),
        escape_md(r.metric),
        escape_md(fmt_value(r.old, r.metric)),
        escape_md(fmt_value(r.new, r.metric)),
        escape_md(fmt_ratio(r.ratio)),
        interval,
    ]
    return [*cells, escape_md(r.change or "-")] if with_change else cells
