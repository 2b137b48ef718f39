"""A bisect's outcome as text: the console's summary and the Markdown of a CI step
summary (`perfguard bisect`, `perfguard.measurement.bisect`)."""

from __future__ import annotations

from typing import Any


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The end of a bisect: the first bad commit, its subject and its deltas."""
    out = [
        f"bisect: {report['commits']} commit(s), {report['measured']} measured in "
        f"{report['seconds']:.1f} s ({report['mode']}: {report['metric'] or 'every work counter'})"
    ]
    for skipped in report["skipped"]:
        out.append(f"skipped {skipped['commit'][:12]} {skipped['subject']}: {skipped['reason']}")
    first = report.get("first_bad")
    if not first:
        out.append(f"no first bad commit: {report.get('undecided')}")
        return out
    out.append(f"first bad commit: {first['commit']} {first['subject']}")
    out.append(f"  {first['figure']}")
    details = first.get("details", {})
    for cid, stages in sorted(details.get("op_changes", {}).items()):
        for stage, ops in stages.items():
            moved = ", ".join(f"{op} {a}->{b}" for op, (a, b) in list(ops.items())[:5])
            out.append(f"  {cid} {stage}: {moved}")
    if first.get("attribution"):
        from perfguard.presentation.attribution import console_lines

        out += ["  " + line for line in console_lines(first["attribution"])]
    return out


def markdown(report: dict[str, Any]) -> str:
    """The outcome as Markdown: the summary and steps as text, then the attribution."""
    from perfguard.presentation.attribution import markdown_lines

    first = report.get("first_bad") or {}
    if first:
        head = f"first bad commit `{first['commit'][:12]}` {first['subject']}"
    else:
        head = "no first bad commit"
    steps = [
        f"{s['commit'][:12]} {s['verdict']}: {s['figure']} ({s['subject']})"
        for s in report["steps"]
    ]
    text = "\n".join([*summary_lines(report), "", *steps]).replace("```", "'''")
    lines = [f"#### perfguard bisect: {head}", "", "```", text, "```", ""]
    lines += markdown_lines(first.get("attribution"))
    return "\n".join(lines) + "\n"
