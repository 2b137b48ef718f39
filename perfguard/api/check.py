"""`perfguard check` and `check-work`: the selected cases through the gate against a stored
baseline."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfguard.api.common import (
    NO_OUTPUTS,
    Echo,
    Outputs,
    baseline_path,
    load_baseline,
    resolve_platform,
    run_cases,
    select_cases,
    shard,
    to_stderr,
)
from perfguard.decision.options import JudgeOptions, Judging
from perfguard.decision.verdict import judge_with
from perfguard.measurement.explain import attribute_regressions
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.warm import in_warm_pool
from perfguard.results import Results
from perfguard.storage.baseline import Baseline
from perfguard.storage.cases import SERVER, Case, Selection
from perfguard.storage.reports import Report

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


MOVED_FROM_CHECK = {
    "--against": "compare --against DIR|REF",
    "--against-ref": "compare --against REF",
    "--against-subdir": "compare --against-subdir SUB",
    "--settle": "compare --against REF (the relative check) where the stored check can't tell",
    "--budget-s": "compare --budget-s",
    "--timing": "compare --timing (a stored check follows its baseline's)",
    "--write-baseline": "compare --write-baseline",
    "--counters-only": "check-work",
    "--results": "judge --results FILE",
    "--sglang-perf-log": "judge --sglang-perf-log FILE",
}
"""`check`'s old spellings of the other commands' jobs, and where each went: the command
line refuses each (exit 2) naming the command that took it over."""


# Only a first measurement in workers starts the server first: a server started for
# confirmations that may never come cost a check ~3 s on a 2-core runner (docs/verdicts.md).
@in_warm_pool(lambda options, kw: options.isolated and not options.counters_only)
def check(
    selection: Selection,
    options: MeasureOptions,
    *,
    judging: JudgeOptions | None = None,
    baseline: str | None = None,
    outputs: Outputs = NO_OUTPUTS,
    platform: Platform | str | None = None,
    echo: Echo = to_stderr,
    warm: Any = None,
) -> Report:
    """Run the selected cases through the gate and judge them against the baseline.

    What can be wrong with the baseline (missing, unreadable, another platform or
    thread count, an unknown profile) fails before anything runs. The gate
    (`perfguard.decision.gate`) measures a case over a bound or that can't tell in
    fresh processes, drops contended runs and stops sampling clear cases early;
    `outputs.results` also gets the results it judged; `judging` (`JudgeOptions`) says
    how to judge; a timed regression's attribution traces go to `outputs.traces_dir()`.
    `options.counters_only` (the work check) times nothing: each case runs once and
    once counted, and only what is exact is judged (work, output, CPU tensor memory).
    """
    from perfguard.measurement.comparable import check_comparable
    from perfguard.storage.reports import build_against, write_results

    judging = judging or JudgeOptions()
    platform = resolve_platform(platform)
    cases, (base, path), resolved = _stored_setup(
        selection, options, judging, baseline, platform, echo
    )
    if options.counters_only:
        stored = (base, path)
        return _check_counters(cases, platform, options, resolved, stored, selection, outputs)
    outcome, first = _through_gate(cases, base, resolved, platform, options, warm, echo)
    results = outcome.results
    if outputs.results:
        write_results(outputs.results, results)
    check_comparable(results, base, path)
    warn_hardware(results, base, echo)
    settings = _stored_settings(first, judging, selection)
    report = build_against(outcome.judgement, results, base, path, settings=settings)
    # A timed regression gets its per-op attribution against the baseline's revision; a
    # server case has no pipeline here to profile (its pipeline runs in the server).
    pipelines = [c for c in cases if c.workload != SERVER]
    return attribute_regressions(report, pipelines, options, None, platform=platform.name,
                                 traces_dir=outputs.traces_dir())  # fmt: skip


def _through_gate(
    cases: list[Case],
    base: Baseline,
    judging: Judging,
    platform: Platform,
    options: MeasureOptions,
    warm: Any,
    echo: Echo,
) -> tuple[Any, MeasureOptions]:
    """Measure `cases` through the gate (`run_gate`): its outcome, and the options of the
    first measurement (adaptive sampling's cap in `max_repeats`)."""
    from perfguard.decision.gate import DEFAULT_MAX_REPEATS, run_gate

    # Adaptive sampling needs the verdict after every run, so it applies when the cases
    # run in this process; in workers each measurement is REPEATS runs.
    in_process = not options.uses_workers(cases)
    cap = max(options.repeats, options.max_repeats or DEFAULT_MAX_REPEATS)
    adaptive = in_process and cap > options.repeats
    first = options.replace(max_repeats=cap if adaptive else None)

    def measure_cases(todo: Any, until_for: Any) -> Results:
        stop = until_for if adaptive else None
        return run_cases(list(todo), platform, first, until_for=stop, warm=warm)

    def confirm(todo: Any, until_for: Any) -> Results:
        # A fresh process for each confirmation: the process, not the run, is the unit
        # whose spread the verdict's interval needs (perfguard.decision.gate).
        # It times; it does not count again: the first measurement counted this build's
        # work, and counts are exact (a counted run costs ~3x a plain one).
        again = options.replace(isolate=True, processes=1, max_repeats=None, count_work=False)
        return run_cases(list(todo), platform, again, warm=warm)

    with warm:
        outcome = run_gate(
            cases,
            base,
            judging,
            measure_cases,
            confirm=confirm if in_process else None,
            max_repeats=cap if adaptive else None,
            on_event=lambda case_id, message: echo(f"perfguard: {case_id}: {message}"),
        )
    return outcome, first


def _stored_settings(
    first: MeasureOptions, judging: JudgeOptions, selection: Selection
) -> dict[str, Any]:
    """The settings a stored check's report records: how the first measurement sampled
    (`max_repeats`: its cap) and how it was judged."""
    settings = {"source": "run", **first.settings("check"), "shard": selection.shard}
    settings |= {"max_reruns": judging.max_reruns, "confirm_gap_s": judging.confirm_gap_s}
    settings["alpha"] = judging.rule.alpha
    settings["timing_gate"] = judging.timing_gate
    return settings


def _stored_setup(
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    baseline: str | None,
    platform: Platform,
    echo: Echo,
) -> tuple[list[Case], tuple[Baseline, str], Judging]:
    """The cases, the baseline and its path of a check against a stored baseline, and
    `judging` resolved against it once (the profile it names: `JudgeOptions.against`);
    what can be wrong with the baseline fails here, before anything runs."""
    from perfguard.measurement.comparable import check_threads
    from perfguard.storage import baseline as store

    cases = select_cases(platform.name, dataclasses.replace(selection, shard=None), echo=echo)
    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    base = load_baseline(path)  # before running anything: a bad file fails fast
    store.check_platform(base, platform.name, path)
    resolved = judging.against(base)
    cases = shard(cases, selection.shard, path, echo=echo)
    check_threads(cases, platform.name, base, path, options.threads)
    return cases, (base, path), resolved


def _check_counters(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions,
    judging: Judging,
    stored: tuple[Baseline, str],
    selection: Selection,
    outputs: Outputs,
) -> Report:
    """`check-work`: one counted run per case, judged on what is exact."""
    from perfguard.measurement.work import refuse_another_context
    from perfguard.storage.reports import build_against, write_results

    base, path = stored
    refuse_another_context(cases, platform, base, path)
    counted = options.replace(counters_only=True, max_repeats=None)
    results = run_cases(cases, platform, counted)
    if outputs.results:
        write_results(outputs.results, results)
    timed = {
        m
        for cid in results.cases
        if cid in base.scenarios
        for m in base.scenarios[cid].metrics
        if m not in results.cases[cid].samples
    }
    judgement = judge_with(judging, results, base, ignore_missing=sorted(timed))
    settings = {"source": "run", **counted.settings("counters"), "shard": selection.shard}
    return build_against(judgement, results, base, path, settings=settings)


def warn_hardware(results: Results, baseline: Baseline, echo: Echo) -> None:
    if results.hardware != baseline.hardware:
        echo(f"perfguard: warning: results of {results.hardware!r}, baseline {baseline.hardware!r}")


def write_report(
    report: Report,
    json_path: str | None = None,
    markdown_path: str | None = None,
    *,
    step_summary: bool = True,
) -> tuple[Report, str]:
    """Write the JSON / Markdown files asked for and (`step_summary`) the CI job summary
    (`$GITHUB_STEP_SUMMARY`, where it is set).

    Returns the report as its JSON file holds it (figures rounded) and its Markdown:
    renderings are made from that, so that `perfguard report render` of the file later
    prints exactly the same thing.
    """
    from perfguard.presentation.markdown import append_step_summary, render_markdown, write_markdown
    from perfguard.storage import reports

    data = reports.write_report(json_path, report) if json_path else report.to_json()
    report = Report.from_json(data)
    markdown = render_markdown(report)
    if markdown_path:
        write_markdown(markdown_path, markdown)
    if step_summary:
        append_step_summary(markdown)
    return report, markdown
