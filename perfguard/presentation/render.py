"""Render reports for people: the terminal table (rich), PR Markdown, one-line summaries.

Every value that came from a file or a case id is escaped before it reaches Markdown or
the terminal (`perfguard.presentation.escape`: `md_text`, `md_code`, `console_text`): a
hostile id renders inert, its control and bidi characters shown, not obeyed.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfguard.decision.answer import UNRESOLVED
from perfguard.decision.changes import BaselineDiff, DiffRow
from perfguard.decision.counters import is_counter
from perfguard.decision.paired import UNKNOWN
from perfguard.decision.verdict import (
    CONTENDED,
    ERROR,
    IMPROVEMENT,
    MISSING,
    MISSING_BASELINE,
    PASS,
    REGRESSION,
    SEVERITY,
    CaseVerdict,
    MetricVerdict,
)
from perfguard.errors import PerfguardError
from perfguard.metrics import metric_sort_key, unit
from perfguard.presentation.answers import answer_lines, answer_phrase
from perfguard.presentation.attribution import console_lines, markdown_lines
from perfguard.presentation.escape import console_text, md_text
from perfguard.presentation.observed import (
    SERVER_COLUMNS,
    observed_facts,
    server_rows,
    server_table_lines,
)
from perfguard.presentation.work_report import output_summary, work_console_lines, work_markdown
from perfguard.storage.jsonio import (
    write_text_atomic,
)
from perfguard.storage.reports import Report

# ---- work counters and output equivalence (perfguard.presentation.work_report) ------------
# The counters have their own section (what the code does, before any time); the timing
# tables below leave them out. These three hooks are the only places render.py meets them.


def _timed(m: MetricVerdict) -> bool:
    """A time or a peak, not a work counter (those render in `work_report`)."""
    return not is_counter(m.metric)


def _work_section(report: Report) -> list[str]:
    return work_markdown(report)


def _work_console(report: Report) -> list[str]:
    return work_console_lines(report)


def _output_part(report: Report) -> list[str]:
    part = output_summary(report.cases)
    return [part] if part else []


# ---- the rest of the rendering ---------------------------------------------------------------


def fmt_value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} {unit(metric)}" if value < 100 else f"{value:.1f} {unit(metric)}"


def fmt_count(n: int | None) -> str:
    """A parameter count the way model cards give it: 88.8K, 20.4B."""
    if n is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def components_line(components: Mapping[str, Any]) -> str:
    """`role Class (params), ...`: what the case measured, in one line.

    A part without parameters (a tokenizer, a scheduler: 0) shows its class alone, and
    `(?)` means a count not known (a diffusers case listed before it ran).
    """

    def count(c: Mapping[str, Any]) -> str:
        n = c.get("parameters")
        return "" if n == 0 else f" ({fmt_count(n)})"

    return ", ".join(
        f"{role} {str(c.get('class', '?')).rsplit('.', 1)[-1]}{count(c)}"
        for role, c in sorted(components.items())
    )


def arguments_line(arguments: Mapping[str, Any]) -> str:
    """`name=value, ...`: what a diffusers pipeline's `__call__` was given."""
    return ", ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in sorted(arguments.items())
    )


def counters_line(counters: Mapping[str, Sequence[int]]) -> str:
    """`name value` per counter; `min-max` when the runs disagree."""
    parts = []
    for name, values in sorted(counters.items()):
        lo, hi = (min(values), max(values)) if values else (0, 0)
        parts.append(f"{name} {lo}" if lo == hi else f"{name} {lo}-{hi}")
    return ", ".join(parts)


def fmt_ratio(ratio: float | None) -> str:
    """A ratio with three significant digits in its change from 1 (1.032x, 0.951x).

    The rule compares ratios near 1 with 1 and with 1 + a 3 % minimum effect: at two
    decimals a +3.2 % e2e read 1.03x, and an interval whose lower end was 1.004 (credible)
    read 1.00, as if it were not. Ratios of 10 and over keep three significant digits.
    """
    return "-" if ratio is None else f"{_ratio_digits(ratio)}x"


def _ratio_digits(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


_fmt_bound = _ratio_digits


def fmt_evidence(m: MetricVerdict) -> str:
    """The ratio with the rule's confidence interval, when the verdict has one.

    Shown only where the band was exceeded or the verdict was borderline: that is where
    a reader asks "is this noise?", and elsewhere the interval is clutter.
    """
    text = fmt_ratio(m.ratio)
    # A median above its bound is a regression or, when noise explains it, borderline.
    if m.low is not None and m.high is not None and (m.verdict == REGRESSION or m.borderline):
        text += f" ({_fmt_bound(m.low)}-{_fmt_bound(m.high)})"
    elif (
        m.paired is not None
        and m.low is not None
        and m.high is not None
        and (m.verdict != PASS or m.paired.decision == UNKNOWN)
    ):
        # A relative check: the interval is what decided, whichever way it went.
        text += f" ({_fmt_bound(m.low)}-{_fmt_bound(m.high)})"
    return text


def against_text(report: Report) -> str:
    """`relative to DIR (commit abc123def456)`: what a relative report compared with."""
    return _against_words(report.against or {})


def _against_words(against: Mapping[str, Any]) -> str:
    commit = against.get("commit")
    where = against.get("ref") or against.get("dir") or "?"
    return f"relative to {where} ({'commit ' + str(commit)[:12] if commit else 'no commit'})"


def _rows(report: Report, all_metrics: bool) -> list[tuple[CaseVerdict, MetricVerdict | None]]:
    """(case, metric) rows, worst verdict first; a failed case is one row without a metric."""
    rows: list[tuple[CaseVerdict, MetricVerdict | None]] = []
    for case in report.cases:
        if case.verdict == ERROR:
            rows.append((case, None))
        for m in case.metrics:
            if not _timed(m):
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


_STYLE = {
    REGRESSION: "bold red",
    ERROR: "bold red",
    CONTENDED: "yellow",
    IMPROVEMENT: "green",
    PASS: "",
}


def render_table(report: Report, console: Console, all_metrics: bool = False) -> None:
    """A rich table, regressions first: measured, baseline, bound and ratio per metric.

    Passing per-step rows are left out unless `all_metrics` (a 50-step case would bury
    the rows that matter); the footer says how many. A verdict that its row's figures do
    not explain (a regression's evidence, a pass over its bound, a contended metric) is
    numbered, and its reason printed under the table with the runner's speed: the JSON
    is not where a reader looks. Every cell is a `Text`, so a case id
    holding rich markup (`[bold]`) prints as written.
    """
    table = Table(title=Text(console_text(summary_line(report))), title_justify="left")
    for col, justify in (
        ("case", "left"),
        ("metric", "left"),
        ("verdict", "left"),
        ("measured", "right"),
        ("baseline", "right"),
        ("bound", "right"),
        ("ratio", "right"),
        ("answer", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    rows = _rows(report, all_metrics)
    reasons = verdict_reasons(report)
    numbered = {id(m): i for i, (_, m) in enumerate(reasons, 1)}
    shown = {id(m) for _, m in rows if m is not None}
    # A reason belongs to a row; a hidden passing step row with one is shown after all.
    rows += [(c, m) for c, m in reasons if id(m) not in shown]
    for case, m in rows:
        if m is None:
            table.add_row(
                Text(console_text(case.case_id)),
                Text("-"),
                Text(ERROR, style=_STYLE[ERROR]),
                Text(console_text(case.error or "")),
                Text(""),
                Text(""),
                Text(""),
                Text(""),
            )
            continue
        table.add_row(
            Text(console_text(case.case_id)),
            Text(console_text(m.metric)),
            Text(
                m.verdict + (f" ({numbered[id(m)]})" if id(m) in numbered else ""),
                style=_STYLE.get(m.verdict, "yellow"),
            ),
            Text(fmt_value(m.measured.median if m.measured else None, m.metric)),
            Text(fmt_value(m.baseline.median if m.baseline else None, m.metric)),
            Text(fmt_value(m.bound, m.metric)),
            Text(fmt_evidence(m)),
            Text(fmt_answer(m)),
        )
    for line in _work_console(report):
        console.print(Text(line))
    console.print(table)
    for case in report.cases:
        for line in server_table_lines(case):
            console.print(Text(console_text(line)))
    for line in console_lines(report.attribution):
        console.print(Text(console_text(line)))
    timed = sum(1 for c in report.cases for m in c.metrics if _timed(m))
    hidden = timed - sum(1 for _, m in rows if m is not None)
    if hidden:
        console.print(Text(f"{hidden} passing step metric(s) not shown (see the JSON report)"))
    for i, (case, m) in enumerate(reasons, 1):
        line = f"({i}) {case.case_id} {m.metric} {m.verdict}: {m.reason}"
        console.print(Text(console_text(line)))
    for line in (
        *answer_lines(report),
        runner_text(report),
        evidence_note(report),
    ):
        if line:
            console.print(Text(console_text(line)))


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
        for c, m in _rows(report, all_metrics=True)
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


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
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


def fmt_answer(m: MetricVerdict) -> str:
    """`same`, `slower`, `can't tell` with the slowdown the check could catch: `(>= +8%)`."""
    if m.answer is None:
        return "-"
    if m.answer.resolution is not None and m.answer.answer == UNRESOLVED:
        return f"{m.answer.label} (resolves +{m.answer.resolution:.0%})"
    if m.answer.detectable is None:
        return m.answer.label
    return f"{m.answer.label} (catches +{m.answer.detectable:.0%})"


_MD_HEADER = ["case", "metric", "measured", "baseline", "bound", "ratio", "answer"]

_ByVerdict = dict[str, list[tuple[CaseVerdict, MetricVerdict]]]


def render_markdown(report: Report) -> str:
    """A PR comment: one summary line, regressions, failures, improvements, details."""
    icons = {"pass": "✅", "fail": "❌", "error": "⚠️", "contended": "⏳", "cant_tell": "❔"}
    icon = icons.get(report.verdict, "")
    lines = [f"### {icon} {escape_md(summary_line(report))}", ""]
    lines += [escape_md(line) + "\n" for line in answer_lines(report)]
    lines += [" · ".join(_md_context(report)), ""]
    lines += _work_section(report)
    runner = runner_text(report)
    if runner:
        lines += [escape_md(runner), ""]
    by_verdict: _ByVerdict = {}
    for case, m in _rows(report, all_metrics=True):
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
        lines += _md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in regressions])
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
        lines += _md_table(["case", "metric", "verdict", *_MD_HEADER[2:]], rows)
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
    lines += _md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in open_])
    return [*lines, ""]


def _md_improvements(
    report: Report, improvements: list[tuple[CaseVerdict, MetricVerdict]]
) -> list[str]:
    """The improvements' table and, against a baseline, the command that lowers it."""
    if not improvements:
        return []
    title = "faster than the base" if report.relative else "the baseline is stale, not a failure"
    lines = [f"#### Improvements ({len(improvements)}): {title}", ""]
    lines += _md_table(_MD_HEADER, [_metric_row(c, m, False) for c, m in improvements])
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
            lines += _md_table(SERVER_COLUMNS, [[escape_md(c) for c in r] for r in levels])
            lines.append("")
        timed = [m for m in case.metrics if _timed(m)]
        if timed:
            rows = [_metric_row(case, m, True)[1:] for m in timed]
            lines += _md_table(["metric", "verdict", *_MD_HEADER[2:]], rows)
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


def render_baseline_diff_markdown(d: BaselineDiff, old_label: str, new_label: str) -> str:
    """What a baseline refresh moved, for the pull request that proposes it.

    Credible slowdowns first (they loosen the gate: the reviewer must agree that the code
    really got slower), then credible speed-ups (they tighten it), then a collapsed table
    of every changed figure with its interval and verdict, so that figures that moved
    within noise are visible without drowning the ones that matter.
    """
    from perfguard.decision.changes import ADDED, FASTER, REMOVED, SLOWER

    counts = d.counts()
    conf = f"{d.confidence:.0%}"
    lines = [
        f"### Baseline changes: {escape_md(old_label)} → {escape_md(new_label)}",
        "",
    ]
    if d.empty:
        return "\n".join([*lines, "No scenario, figure or tolerance changed.", ""])
    cases = {r.case_id for r in d.changed if r.credible}
    lines += [
        f"**{counts[SLOWER]} slower, {counts[FASTER]} faster** (credible at {conf} and at "
        f"least the metric's minimum effect, in {len(cases)} case(s)); {counts['small']} "
        f"credible but small, {counts['noise']} within noise, {counts['unknown']} without a "
        f"known spread; {counts[ADDED]} metric(s) added, {counts[REMOVED]} removed.",
        "",
    ]
    for label, ids in (("Scenarios added", d.added), ("Scenarios removed", d.removed)):
        if ids:
            lines += [f"{label} ({len(ids)}): {', '.join(escape_md(i) for i in ids)}.", ""]
    if d.tolerance_changes:
        changed = ", ".join(escape_md(t) for t in d.tolerance_changes)
        lines += [f"**Tolerances changed:** {changed}.", ""]

    def row(r: DiffRow, with_change: bool) -> list[str]:
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

    header = ["case", "metric", "old", "new", "ratio", f"{conf} interval"]
    for change, title in ((SLOWER, "Slower"), (FASTER, "Faster")):
        rows = [row(r, False) for r in d.changed if r.change == change]
        if rows:
            lines += [f"#### {title} ({len(rows)})", ""]
            lines += _md_table(header, rows)
            lines.append("")
    if d.changed:
        lines += [f"<details><summary>All {len(d.changed)} changed figures</summary>", ""]
        lines += _md_table([*header, "change"], [row(r, True) for r in d.changed])
        lines += ["", "</details>", ""]
    lines += [
        f"_slower / faster: the {conf} interval of new / old (from both files' noise, "
        "as the gate computes it) excludes 1 and the ratio is at least the metric's "
        "minimum effect; small: credible but below it; noise: the interval contains 1._",
        "",
    ]
    return "\n".join(lines)
