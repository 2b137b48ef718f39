"""`perfguard judge`: measurements made elsewhere (a results file, sglang's performance.log)
against a baseline; nothing runs."""

from __future__ import annotations

from typing import Any

from perfguard.api.check import warn_hardware
from perfguard.api.common import Echo, baseline_path, load_baseline, to_stderr
from perfguard.decision.options import JudgeOptions
from perfguard.decision.verdict import judge_with
from perfguard.errors import PerfguardError
from perfguard.results import Results
from perfguard.storage.cases import Selection
from perfguard.storage.reports import Report


def judge(
    results_file: str | None,
    perf_log: str | None,
    selection: Selection,
    judging: JudgeOptions,
    baseline: str | None = None,
    echo: Echo = to_stderr,
) -> Report:
    """`perfguard judge`: a results file (`check_results`) or sglang's performance.log
    (`check_perf_log`, which needs `baseline` and takes at most one selected case)
    against a baseline; nothing runs. One of the two files, not both."""
    if results_file and perf_log:
        raise PerfguardError("use either --results or --sglang-perf-log, not both")
    if perf_log:
        if not baseline:
            raise PerfguardError("--sglang-perf-log needs --baseline (the log names no platform)")
        if len(selection.case_ids) > 1:
            raise PerfguardError("--sglang-perf-log takes at most one --case")
        case_id = selection.case_ids[0] if selection.case_ids else None
        return check_perf_log(perf_log, judging=judging, baseline=baseline, case_id=case_id)
    if results_file:
        return check_results(results_file, selection, judging=judging, baseline=baseline, echo=echo)
    raise PerfguardError("judge needs --results FILE or --sglang-perf-log FILE")


def check_results(
    results_file: str,
    selection: Selection | None = None,
    *,
    judging: JudgeOptions | None = None,
    baseline: str | None = None,
    echo: Echo = to_stderr,
) -> Report:
    """Judge a results file (`perfguard run --out`) against its baseline; no torch."""
    from perfguard.storage.reports import read_results

    results = (selection or Selection()).filter_results(read_results(results_file))
    settings = {
        "source": "results",
        "results_file": results_file,
        "repeats": results.settings.get("repeats"),
        "warmup": results.settings.get("warmup"),
        "inject": results.settings.get("inject"),
    }
    return judge_results(
        results, judging, baseline=baseline, settings=settings, source=results_file, echo=echo
    )


def judge_results(
    results: Results,
    judging: JudgeOptions | None = None,
    *,
    baseline: str | None = None,
    settings: dict[str, Any] | None = None,
    source: str = "the results",
    echo: Echo = to_stderr,
) -> Report:
    """Judge `results` measured elsewhere (a results file, a pytest session) against the
    baseline at `baseline` (default: its platform and hardware's), as `judging` says;
    no torch. `settings` (default: the results') is what the report records; `source`
    names the results in an error."""
    from perfguard.measurement.comparable import check_comparable
    from perfguard.storage.reports import build_against

    path = baseline_path(baseline, results.platform, results.hardware)
    base = load_baseline(path)
    if results.platform != base.platform:
        raise PerfguardError(
            f"{source} is from platform {results.platform!r} but {path} is a "
            f"baseline for {base.platform!r}"
        )
    check_comparable(results, base, path)
    warn_hardware(results, base, echo)
    judgement = judge_with(judging or JudgeOptions(), results, base)
    return build_against(
        judgement, results, base, path, settings=results.settings if settings is None else settings
    )


def check_perf_log(
    perf_log: str,
    *,
    judging: JudgeOptions | None = None,
    baseline: str,
    case_id: str | None = None,
) -> Report:
    """Judge the requests of sglang's `performance.log` against a baseline; no torch.

    The log names no platform, so the baseline is required; what the log cannot hold
    (sglang's log has no memory figures, no per-stage allocator peaks, no outputs) is
    not missing.
    """
    from perfguard.interop.sglang import NOT_IN_PERF_LOG, perf_log_results, read_perf_log
    from perfguard.metrics import STAGE_PEAK_PREFIX
    from perfguard.storage.reports import build_against

    base = load_baseline(baseline)
    results = perf_log_results(read_perf_log(perf_log), base, case_id=case_id, source=perf_log)
    metrics = {m for s in base.scenarios.values() for m in s.metrics}
    peaks = {m for m in metrics if m.startswith(STAGE_PEAK_PREFIX)}
    judging = judging or JudgeOptions()
    judgement = judge_with(
        judging, results, base, ignore_missing=NOT_IN_PERF_LOG + tuple(sorted(peaks))
    )
    settings = {"source": "sglang-perf-log", "perf_log": perf_log, "inject": None}
    return build_against(judgement, results, base, baseline, settings=settings)
