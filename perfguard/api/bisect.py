"""`perfguard bisect GOOD BAD`: the first commit of a range where a metric regressed
(`perfguard.measurement.bisect`), and the files its outcome is written to."""

from __future__ import annotations

from typing import Any

from perfguard.api.common import Echo, probe, to_stderr
from perfguard.measurement.bisect import BisectOptions
from perfguard.storage.cases import Selection


def bisect(
    good: str,
    bad: str,
    selection: Selection,
    options: BisectOptions,
    *,
    platform: str | None = None,
    echo: Echo = to_stderr,
) -> dict[str, Any]:
    """Find the first commit of GOOD..BAD (first parents) where `options.metric`
    regressed, each commit measured in a temporary worktree; the bisect report."""
    from perfguard.measurement.bisect import bisect as find_first_bad

    name = probe(platform).name
    return find_first_bad(good, bad, selection, options, platform=name, echo=echo)


def write_bisect(
    report: dict[str, Any], json_path: str | None = None, markdown_path: str | None = None
) -> None:
    """Write the bisect report as JSON (its attribution validated first) and its outcome
    as Markdown (`perfguard.presentation.bisect`), where asked."""
    if json_path:
        from perfguard.storage.explained import write_bisect_report

        write_bisect_report(json_path, report)
    if markdown_path:
        from perfguard.presentation.bisect import markdown
        from perfguard.storage.jsonio import write_text_atomic

        write_text_atomic(markdown_path, markdown(report))
