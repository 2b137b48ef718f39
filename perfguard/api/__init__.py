"""The library API: what each command does, one function each, a module per command
(`run`, `baselines`, `check`, `judge`, `compare`, `calibrate`, `ab`, `bisect`, `explain`,
`serve`; `common` is what they share, `options` the values they take from a command line).

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

from perfguard.api.ab import ab, variants
from perfguard.api.baseline_files import (
    baseline_json,
    diff_baselines,
    diff_json,
    import_sglang,
    merge_baselines,
    read_baseline,
)
from perfguard.api.baselines import BaselineUpdate, gen_baselines
from perfguard.api.bisect import bisect, write_bisect
from perfguard.api.calibrate import CalibrateOptions, Calibration, calibrate
from perfguard.api.cases import case_entries, environment, listed_cases, registry_files
from perfguard.api.check import MOVED_FROM_CHECK, check, write_report
from perfguard.api.common import (
    NO_OUTPUTS,
    Echo,
    Outputs,
    baseline_path,
    load_baseline,
    probe,
    resolve_platform,
    run_cases,
    select_cases,
    shard,
)
from perfguard.api.compare import check_relative
from perfguard.api.explain import against_of
from perfguard.api.history import archive_label
from perfguard.api.judge import check_perf_log, check_results, judge, judge_results
from perfguard.api.reports import merge_reports
from perfguard.api.run import run
from perfguard.api.serve import ServeSettings, serve
from perfguard.measurement.bisect import BisectOptions
from perfguard.measurement.explain import attribute_regressions, explain
from perfguard.measurement.resident import servers, stop_all
from perfguard.storage.archive import add_reports
from perfguard.storage.jsonio import write_bytes_atomic, write_json_atomic, write_text_atomic
from perfguard.storage.refresh import RefreshOptions
from perfguard.storage.reports import Report, read_report, render_json

__all__ = [
    "MOVED_FROM_CHECK",
    "NO_OUTPUTS",
    "BaselineUpdate",
    "BisectOptions",
    "CalibrateOptions",
    "Calibration",
    "Echo",
    "Outputs",
    "RefreshOptions",
    "Report",
    "ServeSettings",
    "ab",
    "add_reports",
    "against_of",
    "archive_label",
    "attribute_regressions",
    "baseline_json",
    "baseline_path",
    "bisect",
    "calibrate",
    "case_entries",
    "check",
    "check_perf_log",
    "check_relative",
    "check_results",
    "diff_baselines",
    "diff_json",
    "environment",
    "explain",
    "gen_baselines",
    "import_sglang",
    "judge",
    "judge_results",
    "listed_cases",
    "load_baseline",
    "merge_baselines",
    "merge_reports",
    "probe",
    "read_baseline",
    "read_report",
    "registry_files",
    "render_json",
    "resolve_platform",
    "run",
    "run_cases",
    "select_cases",
    "serve",
    "servers",
    "shard",
    "stop_all",
    "variants",
    "write_bisect",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_report",
    "write_text_atomic",
]
