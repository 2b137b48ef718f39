"""`perfguard bisect GOOD BAD`: the first commit where a selected metric regressed."""

from __future__ import annotations

import os
from typing import Any

import click

from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    json_file_option,
    platform_option,
    selection_options,
)
from perfguard.errors import EXIT_CASE_FAILED, EXIT_CODES_HELP, EXIT_OK
from perfguard.storage.cases import Selection


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


@click.command("bisect", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("good")
@click.argument("bad")
@platform_option
@selection_options(shard=False)
@click.option(
    "--metric",
    default=None,
    metavar="METRIC",
    help="What regressed: a work counter (ops:DenoisingStage), judged exactly with one "
    "counted run per commit, or a time (stage:DenoisingStage, step_avg, e2e), judged side "
    "by side with GOOD. Default: every work counter.",
)
@click.option(
    "--registry",
    "registry",
    default=None,
    metavar="PATH",
    help="The case registry's path inside each commit (default: cases).",
)
@click.option(
    "--subdir",
    default=None,
    metavar="SUB",
    help="Each commit's import root inside the repository (sglang: python).",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Timings: measurement time per commit compared with GOOD.",
)
@json_file_option(
    "Write the bisect report (JSON) here; timings also write the first bad "
    "commit's Chrome traces beside it."
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the outcome as Markdown (a CI step summary): the steps, the first bad "
    "commit and, for timings, its per-op attribution.",
)
def bisect_command(
    good: str,
    bad: str,
    platform_name: str | None,
    selection: Selection,
    metric: str | None,
    registry: str | None,
    subdir: str | None,
    budget_s: float,
    json_out: str | None,
    markdown_path: str | None,
) -> int:
    """Find the first commit of GOOD..BAD (first parents) where METRIC regressed.

    Each commit is checked out in a temporary `git worktree` (your tree and index are
    never touched; Ctrl-C removes them), imports its own code and reads its own cases.
    About log2(N) + 2 commits are measured; one that fails to import or run is skipped
    and listed. Exit 0 with the first bad commit, 3 when skipped commits leave it
    undecided, 2 on bad input (no such revision, GOOD not an ancestor of BAD, a metric
    no case has, BAD not worse than GOOD, a named revision with uncommitted changes)."""
    from perfguard.device.platform import probe
    from perfguard.measurement.bisect import BisectOptions, bisect
    from perfguard.storage.explained import write_bisect_report

    platform = probe(platform_name).name
    traces = os.path.dirname(os.path.abspath(json_out)) if json_out else None
    options = BisectOptions(
        metric=metric, cases_dir=registry, subdir=subdir, budget_s=budget_s, traces_dir=traces
    )
    report = bisect(good, bad, selection, options, platform=platform, echo=echo_err)
    if json_out:
        write_bisect_report(json_out, report)
    if markdown_path:
        from perfguard.storage.jsonio import write_text_atomic

        write_text_atomic(markdown_path, markdown(report))
    out = console()
    for line in summary_lines(report):
        out.print(line, markup=False, highlight=False)
    return EXIT_OK if report.get("first_bad") else EXIT_CASE_FAILED
