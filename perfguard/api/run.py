"""`perfguard run`: measure the selected cases, every sample of every metric."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfguard.api.common import (
    Echo,
    baseline_path,
    resolve_platform,
    run_cases,
    select_cases,
    to_stderr,
)
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.warm import in_warm_pool
from perfguard.results import Results
from perfguard.storage.cases import Selection

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


@in_warm_pool(lambda options, kw: options.isolated)
def run(
    selection: Selection,
    options: MeasureOptions,
    *,
    platform: Platform | str | None = None,
    out: str | None = None,
    echo: Echo = to_stderr,
    warm: Any = None,
) -> Results:
    """Measure the selected cases; every sample of every metric, errors kept per case.

    `out` also writes the results file (the input of `judge --results`).
    """
    from perfguard.storage.reports import write_results

    platform = resolve_platform(platform)
    split_by = baseline_path(None, platform.name, platform.hardware_slug())
    cases = select_cases(platform.name, selection, split_by=split_by, echo=echo)
    results = run_cases(cases, platform, options, warm=warm)
    if out:
        write_results(out, results)
    return results
