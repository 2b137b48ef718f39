"""`perfguard report ...` and `perfguard merge`: render and combine report files (no torch)."""

from __future__ import annotations

import os

import click

from perfguard import api
from perfguard.cli.common import CONTEXT_SETTINGS, console, file_option
from perfguard.errors import EXIT_CODES_HELP, EXIT_OK, PerfguardError
from perfguard.presentation import markdown, render, summary
from perfguard.presentation.escape import rich_markup as escape


@click.group("report", context_settings=CONTEXT_SETTINGS)
def report_group() -> None:
    """Render check reports."""


@report_group.command("render", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["md", "table", "json", "html"]),
    default="md",
    show_default=True,
)
@click.option("--all-metrics", is_flag=True, help="Table: show passing step metrics too.")
@file_option("--out", help="Write to this file (atomically) instead of stdout.")
def report_render(path: str, fmt: str, all_metrics: bool, out: str | None) -> int:
    """Render a JSON report as Markdown (a PR comment), a console table, JSON, or one
    self-contained HTML page with a forest plot per case (plotly inlined: opens offline)."""
    report = api.read_report(path)
    if out is not None or fmt == "html":
        if fmt == "html":
            from perfguard.presentation.html import render_report_html

            text = render_report_html(report, source=os.path.basename(path))
        elif fmt == "md":
            text = markdown.render_markdown(report)
        elif fmt == "json":
            text = api.render_json(report)
        else:
            raise PerfguardError("--out: the table format prints to the terminal only")
        if out is None:
            click.echo(text, nl=False)
        else:
            api.write_bytes_atomic(out, text.encode("utf-8"))
            click.echo(out)
        return EXIT_OK
    if fmt == "md":
        click.echo(markdown.render_markdown(report), nl=False)
    elif fmt == "json":
        click.echo(api.render_json(report), nl=False)
    else:
        render.render_table(report, console(), all_metrics=all_metrics)
    return EXIT_OK


@click.command("merge", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Merged report.")
@file_option("--markdown", "markdown_path", help="Also write the merged Markdown report here.")
def merge_command(paths: tuple[str, ...], out: str, markdown_path: str | None) -> int:
    """Combine the reports of shards (disjoint case sets) into one; exits with its code."""
    merged = api.merge_reports(paths, out)
    if markdown_path:
        markdown.write_markdown(markdown_path, markdown.render_markdown(merged))
    console().print(escape(summary.summary_line(merged)))
    return merged.exit_code


@report_group.command("plot", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
@click.option("--case", "case_ids", multiple=True, help="Only these cases (repeatable).")
def report_plot(path: str, out: str, case_ids: tuple[str, ...]) -> int:
    """Draw a report's per-stage medians against their baselines (extra `plots`)."""
    from perfguard.presentation.plots import plot_report_stages

    report = api.read_report(path)
    rows = [
        {
            "case": case.case_id,
            "metric": m.metric,
            "median": None if m.measured is None else m.measured.median,
            "baseline": None if m.baseline is None else m.baseline.median,
            "bound": m.bound,
            "verdict": m.verdict,
        }
        for case in report.cases
        if not case_ids or case.case_id in case_ids
        for m in case.metrics
        if m.metric.startswith("stage:") and m.measured is not None
    ]
    title = f"{os.path.basename(path)}: {report.verdict} ({report.judgement.profile})"
    click.echo(str(plot_report_stages(rows, title=title, out=out)))
    return EXIT_OK
