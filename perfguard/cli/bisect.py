"""`perfguard bisect GOOD BAD`: the first commit where a selected metric regressed."""

from __future__ import annotations

import os
from typing import Any

import click

from perfguard import api
from perfguard.api import BisectOptions
from perfguard.api.options import Selection, popped
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    file_option,
    import_root_option,
    json_file_option,
    platform_option,
    selection_options,
    value_options,
)
from perfguard.errors import EXIT_CASE_FAILED, EXIT_CODES_HELP, EXIT_OK
from perfguard.presentation.bisect import summary_lines


def _bisect_options_from(flags: dict[str, Any]) -> BisectOptions:
    """Pop bisect's flags out of `flags`; the traces go beside the JSON report."""
    json_out = flags["json_out"]
    traces = os.path.dirname(os.path.abspath(json_out)) if json_out else None
    chosen = popped(flags, "metric", "subdir", "budget_s", cases_dir="registry")
    return BisectOptions(**chosen, traces_dir=traces)


_BISECT_OPTIONS = [
    click.option(
        "--metric",
        default=None,
        metavar="METRIC",
        help="What regressed: a work counter (ops:DenoisingStage), judged exactly with one "
        "counted run per commit, or a time (stage:DenoisingStage, step_avg, e2e), judged side "
        "by side with GOOD. Default: every work counter.",
    ),
    click.option(
        "--registry",
        "registry",
        default=None,
        metavar="PATH",
        help="The case registry's path inside each commit (default: cases).",
    ),
    import_root_option(
        "--subdir", "Each commit's import root inside the repository (sglang: python)."
    ),
    click.option(
        "--budget-s",
        type=click.FloatRange(min=1),
        default=120.0,
        show_default=True,
        help="Timings: measurement time per commit compared with GOOD.",
    ),
]
"""What bisect looks for and how it measures: the command gets `options` (`BisectOptions`)."""


@click.command("bisect", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("good")
@click.argument("bad")
@platform_option
@selection_options(shard=False)
@value_options("options", _bisect_options_from, _BISECT_OPTIONS)
@json_file_option(
    "Write the bisect report (JSON) here; timings also write the first bad "
    "commit's Chrome traces beside it."
)
@file_option(
    "--markdown",
    "markdown_path",
    help="Also write the outcome as Markdown (a CI step summary): the steps, the first bad "
    "commit and, for timings, its per-op attribution.",
)
def bisect_command(
    good: str,
    bad: str,
    platform_name: str | None,
    selection: Selection,
    options: BisectOptions,
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
    report = api.bisect(good, bad, selection, options, platform=platform_name, echo=echo_err)
    api.write_bisect(report, json_out, markdown_path)
    out = console()
    for line in summary_lines(report):
        out.print(line, markup=False, highlight=False)
    return EXIT_OK if report.get("first_bad") else EXIT_CASE_FAILED
