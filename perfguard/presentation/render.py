"""Render reports for people: the terminal table (rich); the PR Markdown is `markdown.py`.

Every value that came from a file or a case id is escaped before it reaches Markdown or
the terminal (`perfguard.presentation.escape`: `md_text`, `md_code`, `console_text`): a
hostile id renders inert, its control and bidi characters shown, not obeyed.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from perfguard.decision.records import (
    CONTENDED,
    ERROR,
    IMPROVEMENT,
    PASS,
    REGRESSION,
    CaseVerdict,
    MetricVerdict,
)
from perfguard.presentation import summary
from perfguard.presentation.answers import answer_lines
from perfguard.presentation.attribution import console_lines
from perfguard.presentation.escape import console_text
from perfguard.presentation.figures import fmt_answer, fmt_evidence, fmt_value
from perfguard.presentation.observed import server_table_lines
from perfguard.presentation.summary import evidence_note, runner_text, summary_line
from perfguard.presentation.work_report import work_console_lines
from perfguard.storage.reports import Report

_STYLE = {
    REGRESSION: "bold red",
    ERROR: "bold red",
    CONTENDED: "yellow",
    IMPROVEMENT: "green",
    PASS: "",
}

_COLUMNS = (
    ("case", "left"),
    ("metric", "left"),
    ("verdict", "left"),
    ("measured", "right"),
    ("baseline", "right"),
    ("bound", "right"),
    ("ratio", "right"),
    ("answer", "left"),
)

_Row = tuple[CaseVerdict, MetricVerdict | None]


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
    for col, justify in _COLUMNS:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    rows: list[_Row] = list(summary.report_rows(report, all_metrics))
    reasons = summary.verdict_reasons(report)
    numbered = {id(m): i for i, (_, m) in enumerate(reasons, 1)}
    shown = {id(m) for _, m in rows if m is not None}
    # A reason belongs to a row; a hidden passing step row with one is shown after all.
    rows += [(c, m) for c, m in reasons if id(m) not in shown]
    for case, m in rows:
        table.add_row(*_cells(case, m, numbered))
    for line in work_console_lines(report):
        console.print(Text(line))
    console.print(table)
    _print_notes(report, console, rows, reasons)


def _cells(case: CaseVerdict, m: MetricVerdict | None, numbered: dict[int, int]) -> list[Text]:
    """One row's cells; a case that failed to run shows its error in the measured column."""
    if m is None:
        return [
            Text(console_text(case.case_id)),
            Text("-"),
            Text(ERROR, style=_STYLE[ERROR]),
            Text(console_text(case.error or "")),
            Text(""),
            Text(""),
            Text(""),
            Text(""),
        ]
    return [
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
    ]


def _print_notes(
    report: Report,
    console: Console,
    rows: list[_Row],
    reasons: list[tuple[CaseVerdict, MetricVerdict]],
) -> None:
    """Under the table: server levels, attribution, hidden rows, the numbered reasons,
    the answers, the runner's speed and what the intervals mean."""
    for case in report.cases:
        for line in server_table_lines(case):
            console.print(Text(console_text(line)))
    for line in console_lines(report.attribution):
        console.print(Text(console_text(line)))
    timed = sum(1 for c in report.cases for m in c.metrics if summary.is_timed(m))
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
