"""The library API: what each command does, one function each, a module per command
(`run`, `baselines`, `check`, `judge`, `compare`, `calibrate`; `common` is what they share).

    from perfguard import MeasureOptions, Selection, check, gen_baselines

    options = MeasureOptions(repeats=5, processes=6)
    gen_baselines(Selection(tags=("smoke",)), options, baseline="b.json")
    report = check(Selection(tags=("smoke",)), options.replace(processes=1), baseline="b.json")
    raise SystemExit(report.exit_code)

Every function composes the layers below: `perfguard.measurement` runs cases (it needs
torch, so it is imported inside the functions that measure), `perfguard.decision` judges,
`perfguard.storage` reads and writes. The CLI parses flags, calls one, and renders.

Errors the user can fix raise `PerfguardError` (one line, exit 2); progress notes go to
`echo` (stderr by default), never into the returned values.
"""

from __future__ import annotations

from perfguard.api.baselines import BaselineUpdate, gen_baselines
from perfguard.api.calibrate import Calibration, calibrate
from perfguard.api.check import check, write_report
from perfguard.api.common import (
    Echo,
    baseline_path,
    load_baseline,
    probe,
    resolve_platform,
    run_cases,
    select_cases,
    shard,
)
from perfguard.api.compare import check_relative
from perfguard.api.judge import check_perf_log, check_results, judge_results
from perfguard.api.run import run
from perfguard.measurement.explain import attribute_regressions, explain
from perfguard.storage.refresh import RefreshOptions

__all__ = [
    "BaselineUpdate",
    "Calibration",
    "Echo",
    "RefreshOptions",
    "attribute_regressions",
    "baseline_path",
    "calibrate",
    "check",
    "check_perf_log",
    "check_relative",
    "check_results",
    "explain",
    "gen_baselines",
    "judge_results",
    "load_baseline",
    "probe",
    "resolve_platform",
    "run",
    "run_cases",
    "select_cases",
    "shard",
    "write_report",
]
