"""The PR comment: a report in Markdown, and where it is written.

One summary line, then the sections a reviewer reads in order: what the code does (work
counters), regressions with their reasons, failures, missing metrics, what the check
can't tell, improvements with the command that lowers the baseline, and every metric
folded. Every value that came from a file or a case id goes through `escape_md`.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from perfguard.decision.records import (
    ERROR,
    IMPROVEMENT,
    MISSING,
    MISSING_BASELINE,
    REGRESSION,
    CaseVerdict,
    MetricVerdict,
)
from perfguard.errors import PerfguardError
from perfguard.presentation.answers import answer_lines
from perfguard.presentation.attribution import markdown_lines
from perfguard.presentation.escape import md_text
from perfguard.presentation.figures import (
    arguments_line,
    components_line,
    counters_line,
    fmt_answer,
    fmt_evidence,
    fmt_value,
)
from perfguard.presentation.observed import SERVER_COLUMNS, observed_facts, server_rows
from perfguard.presentation.summary import (
    against_text,
    evidence_note,
    is_timed,
    report_rows,
    runner_text,
    summary_line,
    verdict_reasons,
)
from perfguard.presentation.work_report import work_markdown
from perfguard.storage.jsonio import write_text_atomic
from perfguard.storage.reports import Report

_SAFE_ARG = re.compile(r"^[A-Za-z0-9_.:/+=-]+$")


def escape_md(text: object) -> str:
    """`text` safe in a Markdown table cell or line (`perfguard.presentation.escape.md_text`:
    no markup, no HTML, no mentions; newlines and other controls shown, not obeyed)."""
    return md_text(text)


def tighten_command(report: Report) -> str | None:
    """The `gen-baselines --tighten` command that takes this report's improvements.

    Only ids and paths made of shell- and Markdown-safe characters are put in it; a case
    id that is not is left out (its rows in the table still show it, escaped).
    """
    ids = sorted({c.case_id for c in report.cases for m in c.metrics if m.verdict == IMPROVEMENT})
    ids = [i for i in ids if _SAFE_ARG.match(i)]
    if not ids:
        return None
    cmd = ["perfguard", "gen-baselines", "--tighten"]
    platform = report.environment.get("platform")
    if isinstance(platform, str) and _SAFE_ARG.match(platform):
        cmd += ["--platform", platform]
    path = report.baseline.get("path")
    if isinstance(path, str) and _SAFE_ARG.match(path):
        cmd += ["--baseline", path]
    for cid in ids:
        cmd += ["--case", cid]
    return shlex.join(cmd)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    numeric = {"measured", "baseline", "bound", "ratio"}
    aligns = ["---:" if h in numeric else "---" for h in header]
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(aligns) + " |"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _metric_row(case: CaseVerdict, m: MetricVerdict, with_verdict: bool) -> list[str]:
    row = [escape_md(case.case_id), escape_md(m.metric)]
    if with_verdict:
        row.append(escape_md(m.verdict))
    row += [
        escape_md(fmt_value(m.measured.median if m.measured else None, m.metric)),
        escape_md(fmt_value(m.baseline.median if m.baseline else None, m.metric)),
        escape_md(fmt_value(m.bound, m.metric)),
        escape_md(fmt_evidence(m)),
        escape_md(fmt_answer(m)),
    ]
    return row


_MD_HEADER = ["case", "metric", "measured", "baseline", "bound", "ratio", "answer"]

_ByVerdict = dict[str, list[tuple[CaseVerdict, MetricVerdict]]]


def render_markdown(report: Report) -> str:
    """A PR comment: one summary line, regressions, failures, improvements, details."""
    icons = {"pass": "✅", "fail": "❌", "error": "⚠️", "contended": "⏳", "cant_tell": "❔"}
    icon = icons.get(report.verdict, "")
    lines = [f"### {icon} {escape_md(summary_line(report))}", ""]
    lines += [escape_md(line) + "\n" for line in answer_lines(report)]
    lines += [" · ".join(_md_context(report)), ""]
    lines += work_markdown(report)
    runner = runner_text(report)
    if runner:
        lines += [escape_md(runner), ""]
    by_verdict: _ByVerdict = {}
    for case, m in report_rows(report, all_metrics=True):
        if m is not None:
            by_verdict.setdefault(m.verdict, []).append((case, m))
    lines += _md_regressions(report, by_verdict.get(REGRESSION, []))
    lines += _md_failed(report)
    lines += _md_missing(report, by_verdict)
    lines += _md_unresolved(report)
    lines += _md_improvements(report, by_verdict.get(IMPROVEMENT, []))
    lines += markdown_lines(report.attribution)
    lines += _md_details(report)
    return "\n".join(lines)


def _md_context(report: Report) -> list[str]:
    """What was measured against what: platform, baseline or base, injection, shards."""
    env = report.environment
    context = [
        f"platform {escape_md(env.get('platform', '?'))} / {escape_md(env.get('hardware', '?'))}",
        escape_md(against_text(report))
        if report.relative
        else f"baseline {escape_md(report.baseline.get('path', '?'))} "
        f"(sha256 {escape_md(str(report.baseline.get('sha256', '?'))[:12])})",
    ]
    if report.relative:
        against = report.against or {}
        context.append(
            f"{escape_md(against.get('blocks', '?'))} blocks, stopped: "
            f"{escape_md(against.get('stopped', '?'))}"
        )
    inject = report.settings.get("inject")
    if inject:
        context.append(f"**injected slowdown: {escape_md(inject)}**")
    if report.merged_from:
        context.append(f"merged from {len(report.merged_from)} shard(s)")
    return context


def _md_regressions(
    report: Report, regressions: list[tuple[CaseVerdict, MetricVerdict]]
) -> list[str]:
    """The regressions' table, the reasons that decided the verdicts, the evidence note."""
    lines: list[str] = []
    if regressions:
        lines += [f"#### Regressions ({len(regressions)})", ""]
        lines += md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in regressions])
        lines.append("")
    reasons = verdict_reasons(report)
    if reasons:
        lines += [f"#### Reasons ({len(reasons)}): what decided these verdicts", ""]
        lines += [
            f"- {escape_md(c.case_id)} {escape_md(m.metric)} **{escape_md(m.verdict)}**: "
            f"{escape_md(m.reason)}"
            for c, m in reasons
        ]
        lines.append("")
    note = evidence_note(report)
    if note:
        lines += [escape_md(note), ""]
    return lines


def _md_failed(report: Report) -> list[str]:
    failed = [c for c in report.cases if c.verdict == ERROR]
    if not failed:
        return []
    lines = [f"#### Cases that failed to run ({len(failed)})", ""]
    lines += [f"- {escape_md(c.case_id)}: {escape_md(c.error or 'failed')}" for c in failed]
    return [*lines, ""]


def _md_missing(report: Report, by_verdict: _ByVerdict) -> list[str]:
    missing = [(c, m) for v in MISSING for c, m in by_verdict.get(v, [])]
    if not missing:
        return []
    no_scenario = sorted({c.case_id for c in report.cases if c.verdict == MISSING_BASELINE})
    enforced = " (failing: --fail-on-missing)" if report.judgement.fail_on_missing else ""
    lines = [f"#### Missing or new metrics ({len(missing)}){enforced}", ""]
    if no_scenario:
        ids = ", ".join(escape_md(i) for i in no_scenario)
        lines += [f"No baseline scenario for: {ids}.", ""]
    rows = [[*_metric_row(c, m, True)] for c, m in missing if c.verdict != MISSING_BASELINE]
    if rows:
        lines += md_table(["case", "metric", "verdict", *_MD_HEADER[2:]], rows)
    return [*lines, ""]


def _md_unresolved(report: Report) -> list[str]:
    """The figures the check can't tell from their baseline (or base): neither the same
    within the minimum effect nor credibly slower."""
    open_ = [(c, m) for c in report.cases for m in c.cant_tell]
    if not open_:
        return []
    lines = [
        f"#### Can't tell ({len(open_)})",
        "",
        "Neither within the minimum effect nor credibly slower when the check stopped; "
        "the answer column says the smallest slowdown the check would have caught.",
        "",
    ]
    lines += md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in open_])
    return [*lines, ""]


def _md_improvements(
    report: Report, improvements: list[tuple[CaseVerdict, MetricVerdict]]
) -> list[str]:
    """The improvements' table and, against a baseline, the command that lowers it."""
    if not improvements:
        return []
    title = "faster than the base" if report.relative else "the baseline is stale, not a failure"
    lines = [f"#### Improvements ({len(improvements)}): {title}", ""]
    lines += md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in improvements])
    lines.append("")
    cmd = None if report.relative else tighten_command(report)
    if cmd:
        hardware = escape_md(report.environment.get("hardware", "?"))
        lines += [
            f"To lower the baseline, run on {hardware} and commit the file:",
            "",
            "```sh",
            cmd,
            "```",
            "",
        ]
    return lines


def _md_details(report: Report) -> list[str]:
    """Every case's line (output, notes, components, arguments, counters) and metrics,
    folded."""
    lines = ["<details><summary>All metrics</summary>", ""]
    for case in report.cases:
        extra = _md_case_facts(case)
        lines.append(
            f"**{escape_md(case.case_id)}**: {escape_md(case.verdict)}"
            + (f" · {' · '.join(extra)}" if extra else "")
        )
        lines.append("")
        levels = server_rows(case)
        if levels:
            lines.append("Latency against concurrency (measured / baseline):")
            lines.append("")
            lines += md_table(SERVER_COLUMNS, [[escape_md(c) for c in r] for r in levels])
            lines.append("")
        timed = [m for m in case.metrics if is_timed(m)]
        if timed:
            rows = [_metric_row(case, m, True)[1:] for m in timed]
            lines += md_table(["metric", "verdict", *_MD_HEADER[2:]], rows)
            lines.append("")
    return [*lines, "</details>", ""]


def _md_case_facts(case: CaseVerdict) -> list[str]:
    extra = []
    if case.output_hash:
        same = ""
        if case.baseline_output_hash:
            same = (
                " (same as baseline)"
                if case.baseline_output_hash == case.output_hash
                else (f" (baseline {escape_md(case.baseline_output_hash)})")
            )
        extra.append(f"output {escape_md(case.output_hash)}{same}")
    if case.notes:
        extra.append(f"notes: {escape_md(case.notes)}")
    if case.components:
        extra.append(f"components: {escape_md(components_line(case.components))}")
    if case.arguments:
        extra.append(f"call arguments: {escape_md(arguments_line(case.arguments))}")
    if case.counters:
        extra.append(f"counters per run: {escape_md(counters_line(case.counters))}")
    extra += [escape_md(fact) for fact in observed_facts(case)]
    return extra


def write_markdown(path: str | os.PathLike[str], markdown: str) -> None:
    """Write a Markdown report atomically (temporary file, fsync, `os.replace`)."""
    write_text_atomic(path, markdown)


def append_step_summary(markdown: str, env: Mapping[str, str] | None = None) -> Path | None:
    """Append to `$GITHUB_STEP_SUMMARY` when set (GitHub Actions' job summary file)."""
    target = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
    except OSError as exc:
        raise PerfguardError(f"GITHUB_STEP_SUMMARY={target}: cannot append: {exc}") from exc
    return path
