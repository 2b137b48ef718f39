"""`perfguard check`: the CI gate, against a stored baseline or a base revision.

The command takes its option groups as values (`Selection`, `MeasureOptions`,
`JudgeOptions`, `RelativeOptions`, `Outputs`) and hands them to one function per mode:
a check against a stored baseline (`_stored`), `--counters-only` (`_counters_only`),
the relative check (`--against`: `_relative`), and the file modes that run nothing
(`--results`: `_results_file`, `--sglang-perf-log`: `_perf_log`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from perfguard import api
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    _apply,
    baseline_option,
    console,
    echo_err,
    given,
    judge_options,
    measurement_options,
    platform_option,
    selection_options,
)
from perfguard.decision.comparison import RELATIVE_RULE
from perfguard.decision.gate import JudgeOptions, open_cases
from perfguard.decision.normalize import TIMINGS
from perfguard.errors import EXIT_CODES_HELP, PerfguardError
from perfguard.measurement.checkout import base_exists
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.relative import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MIN_BLOCKS,
    RelativeOptions,
)
from perfguard.presentation.render import render_table
from perfguard.storage.cases import Selection
from perfguard.storage.reports import Report, settle


def _relative_from(kwargs: dict[str, Any]) -> RelativeOptions | None:
    """The relative group's flags, popped from `kwargs`: a `RelativeOptions` with
    --against or --against-ref, else None."""
    directory, ref, subdir = (kwargs.pop(k) for k in ("against", "against_ref", "against_subdir"))
    names = ("budget_s", "min_blocks", "max_blocks", "order_seed", "write_baseline", "timing")
    values = {name: kwargs.pop(name) for name in names}
    settle = kwargs.pop("settle")
    if directory is None and ref is None:
        if settle:
            raise PerfguardError("--settle needs --against DIR or --against-ref REF (the base)")
        if values["write_baseline"]:
            raise PerfguardError("--write-baseline needs --against or --against-ref")
        if values["timing"]:
            raise PerfguardError(
                "--timing needs --against or --against-ref (a stored check follows its baseline)"
            )
        return None
    return RelativeOptions(directory, ref, subdir, **values, settle=settle)


RELATIVE_OPTIONS = [
    click.option(
        "--against",
        default=None,
        type=click.Path(),
        metavar="DIR",
        help="Relative check: compare with the base revision checked out in DIR, run "
        "side by side in interleaved blocks of fresh processes (no stored baseline).",
    ),
    click.option(
        "--against-ref",
        default=None,
        metavar="REF",
        help="Relative check against REF of this repository (a temporary `git worktree "
        "add --detach`, always removed), e.g. the merge base of a PR.",
    ),
    click.option(
        "--against-subdir",
        default=None,
        metavar="SUB",
        help="The base's import root inside DIR, when its package lives in a "
        "subdirectory (sglang: python).",
    ),
    click.option(
        "--settle",
        is_flag=True,
        help="Check against the stored baseline first; then settle each case whose "
        "timings it leaves open (a timed metric over its bound, credibly or not, and no "
        "exact counter or output against it) by the relative check against --against / "
        "--against-ref (at the relative level; --alpha is the stored check's), whose "
        "verdict counts for that case.",
    ),
    click.option(
        "--budget-s",
        default=DEFAULT_BUDGET_S,
        show_default=True,
        type=click.FloatRange(min=0),
        help="Relative check: stop starting blocks past this many seconds of measuring "
        "(--min-blocks always run); metrics still unresolved then pass with a note.",
    ),
    click.option(
        "--min-blocks",
        default=DEFAULT_MIN_BLOCKS,
        show_default=True,
        type=click.IntRange(min=2),
        help="Relative check: blocks (one base and one head process each) before the first look.",
    ),
    click.option(
        "--max-blocks",
        default=DEFAULT_MAX_BLOCKS,
        show_default=True,
        type=click.IntRange(min=2),
        help="Relative check: blocks at most.",
    ),
    click.option(
        "--order-seed",
        default=None,
        type=int,
        help="Relative check: seed of the randomized block order (default: drawn; the "
        "report records it).",
    ),
    click.option(
        "--write-baseline",
        default=None,
        type=click.Path(dir_okay=False),
        metavar="PATH",
        help="Relative check: also store the base side's measurement as a baseline file.",
    ),
    click.option(
        "--timing",
        type=click.Choice(TIMINGS),
        default=None,
        help="Relative check: compare each block's sides as measured (raw) or with "
        "every run divided by the reference workload timed beside it (normalized: the "
        "runner's spells divide out; docs/relative.md). A factory whose stages sleep "
        "or wait needs raw. [default: normalized on cpu, raw on devices]",
    ),
]
"""The relative group's click options (`relative_options`)."""


def relative_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--against / --against-ref / --against-subdir / --budget-s ...: the command gets
    `relative` (`_relative_from`)."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        relative = _relative_from(kwargs)
        return fn(**kwargs, relative=relative)

    return _apply(wrapper, RELATIVE_OPTIONS)


@dataclass(frozen=True)
class Outputs:
    """What a check writes besides its table: the JSON report, the Markdown report, the
    results of the cases it ran; and whether the table shows passing step metrics."""

    report: str | None = None
    markdown: str | None = None
    results: str | None = None
    all_metrics: bool = False


def output_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--report / --markdown / --out / --all-metrics: the command gets `outputs`."""

    @functools.wraps(fn)
    def wrapper(**kwargs: Any) -> Any:
        kwargs["outputs"] = Outputs(
            report=kwargs.pop("report_path"),
            markdown=kwargs.pop("markdown_path"),
            results=kwargs.pop("out"),
            all_metrics=kwargs.pop("all_metrics"),
        )
        return fn(**kwargs)

    file = click.Path(dir_okay=False)
    options = [
        click.option(
            "--report", "report_path", type=file, default=None, help="Write the JSON report here."
        ),
        click.option(
            "--markdown",
            "markdown_path",
            type=file,
            default=None,
            help="Write the Markdown report (a PR comment) here.",
        ),
        click.option(
            "--out", type=file, default=None, help="Also write the results of the cases run here."
        ),
        click.option(
            "--all-metrics", is_flag=True, help="Show passing step metrics in the table too."
        ),
    ]
    return _apply(wrapper, options)


NOT_RELATIVE = {
    "baseline_path": "--baseline",
    "results_file": "--results",
    "perf_log": "--sglang-perf-log",
    "processes": "--processes",
    "max_repeats": "--max-repeats",
    "max_reruns": "--max-reruns",
    "confirm_gap_s": "--confirm-gap-s",
    "profile": "--profile",
}
"""Options that mean nothing to a relative check (`--against`): giving one on the command
line is an error (an environment variable is the runner's setting, for both kinds)."""

NEEDS_CASES = ("shard_spec", "devices_spec", "isolate", "factory_spec")
"""Options that need cases to run: an error with --results / --sglang-perf-log."""


@click.command("check", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@baseline_option
@measurement_options(adaptive=True)
@judge_options(
    "Confirm a case that is over a bound in up to this many fresh processes, one at a "
    "time, before it can be a regression; the processes are pooled."
)
@click.option(
    "--results",
    "results_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Check this results file (from `perfguard run --out`) instead of running cases.",
)
@click.option(
    "--sglang-perf-log",
    "perf_log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Check the requests of sglang's performance.log (needs --baseline).",
)
@output_options
@click.option(
    "--counters-only",
    is_flag=True,
    help="Time nothing: build each case, run it once counted and judge only what is exact "
    "(work counters, output, CPU tensor memory). Seconds on any CPU runner.",
)
@relative_options
def check(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    judging: JudgeOptions,
    results_file: str | None,
    perf_log: str | None,
    outputs: Outputs,
    counters_only: bool,
    relative: RelativeOptions | None,
) -> int:
    """Run the selected cases (or read --results) and judge each metric against the baseline.

    A metric regresses when its median exceeds max(b * (1 + rel), b + pad) (rel: the
    minimum effect of interest, 3 % for e2e, the denoising stage and the step
    aggregates; pad: a multiple of the baseline's noise) and the slowdown is credible
    (99.9 %, Student's t over the spread between processes; --alpha). A case over a bound is
    confirmed in fresh processes first (--max-reruns); runs that the reference workload
    saw contended are left out, and a runner that stays contended gets the verdict
    `contended` (exit 4), never `regression`. Cases run here stop sampling early once
    every metric is clearly fine (REPEATS to --max-repeats runs). Verdicts: pass,
    regression, improvement (a stale baseline, never a failure), missing-baseline,
    missing-stage, new-stage, error, contended. See docs/verdicts.md.

    With --against DIR (or --against-ref REF) there is no stored baseline: the base
    revision in DIR and this one run side by side in randomized interleaved blocks of
    fresh processes, and each metric is judged on their paired per-block ratios with the
    same minimum effect, stopping once every metric is clearly different or clearly the
    same, or at --budget-s (docs/relative.md). With --settle as well, the stored check
    runs first and only the cases it leaves open are measured side by side.

    Beside the timings, the work each stage does (ops, FLOPs, bytes allocated, host
    syncs, counted exactly in one untimed run per build) is compared exactly: a counter
    that grew is a regression whatever the timings say; and the output must stay
    bit-identical or within tolerance (PSNR >= 100 dB) unless --allow-output-change.
    """

    settling = relative is not None and relative.settle
    if settling:
        _refuse_settle(relative, results_file or perf_log, counters_only)
    if counters_only and (relative is not None or results_file or perf_log):
        raise PerfguardError(
            "--counters-only runs the cases: it cannot apply to --against, --results "
            "or --sglang-perf-log"
        )
    if relative is not None and not settling:
        report = _relative(platform_name, selection, options, judging, relative, outputs)
    elif results_file or perf_log:
        _refuse_run_options(results_file, perf_log, options)
        if perf_log:
            report = _perf_log(perf_log, selection, baseline_path, judging)
        else:
            report = _results_file(results_file or "", selection, baseline_path, judging)
    elif counters_only:
        report = _counters_only(platform_name, selection, baseline_path, options, judging, outputs)
    else:
        report = _stored(platform_name, selection, baseline_path, options, judging, outputs)
        if settling:
            assert relative is not None
            report = _settled(report, platform_name, selection, options, judging, relative)
    report, _ = api.write_report(report, outputs.report, outputs.markdown)
    render_table(report, console(), all_metrics=outputs.all_metrics)
    return report.exit_code


def _stored(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    judging: JudgeOptions,
    outputs: Outputs,
) -> Report:
    """The check against a stored baseline: the cases run through the gate."""
    return api.check(
        selection,
        options,
        judging=judging,
        baseline=baseline_path,
        out=outputs.results,
        platform=platform_name,
        echo=echo_err,
    )


def _refuse_settle(relative: RelativeOptions, file_mode: str | None, counters_only: bool) -> None:
    """--settle needs cases to run and writes no baseline; a base that cannot be found
    fails here, before the stored check measures."""
    if file_mode or counters_only:
        raise PerfguardError(
            "--settle runs the open cases again: it cannot apply to --results, "
            "--sglang-perf-log or --counters-only"
        )
    if relative.write_baseline:
        raise PerfguardError("--write-baseline does not apply to --settle")
    base_exists(relative.directory, relative.ref)


def _settled(
    report: Report,
    platform_name: str | None,
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    relative: RelativeOptions,
) -> Report:
    """The cases whose timings the stored check left open (`gate.open_cases`: over a
    bound, credibly or not) measured again side by side with the base, at the relative
    level; their relative verdicts replace the stored ones (`reports.settle`). Nothing
    runs when no case is open. A relative check runs single-device cases only: an open
    case on several devices keeps its stored verdict, and says so."""
    open_ = open_cases(report.judgement)
    if not open_:
        return report
    platform = api.probe(platform_name)
    narrowed = Selection(selection.cases_dir, tuple(open_))
    cases = api.select_cases(platform.name, narrowed, preflight=False, echo=echo_err)
    for case in (c for c in cases if c.num_devices > 1):
        echo_err(f"perfguard: {case.id} is open but runs on several devices: not settled")
    ids = tuple(c.id for c in cases if c.num_devices == 1)
    if not ids:
        return report
    echo_err(
        f"perfguard: {len(ids)} case(s) with a timing over its bound ({', '.join(ids)}): "
        "settling them side by side with the base"
    )
    settling = api.check_relative(
        Selection(selection.cases_dir, ids),
        options,
        relative,
        judging=judging.replace(rule=RELATIVE_RULE),
        platform=platform,
        echo=echo_err,
    )
    return settle(report, settling)


def _counters_only(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    judging: JudgeOptions,
    outputs: Outputs,
) -> Report:
    """`--counters-only`: one counted run per case, judged on what is exact."""
    counted = options.replace(counters_only=True)
    return _stored(platform_name, selection, baseline_path, counted, judging, outputs)


def _relative(
    platform_name: str | None,
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    relative: RelativeOptions,
    outputs: Outputs,
) -> Report:
    """`--against DIR` / `--against-ref REF`: head and base side by side, no baseline."""
    for param, flag in NOT_RELATIVE.items():
        if given(param, environment=False):
            raise PerfguardError(f"{flag} does not apply to a relative check (--against)")
    if not given("alpha"):
        judging = judging.replace(rule=RELATIVE_RULE)
    platform = api.probe(platform_name)
    return api.check_relative(
        selection,
        options,
        relative,
        judging=judging,
        out=outputs.results,
        platform=platform,
        echo=echo_err,
    )


def _results_file(
    results_file: str, selection: Selection, baseline_path: str | None, judging: JudgeOptions
) -> Report:
    """`--results FILE`: judge a results file; nothing runs."""
    return api.check_results(
        results_file, selection, judging=judging, baseline=baseline_path, echo=echo_err
    )


def _perf_log(
    perf_log: str, selection: Selection, baseline_path: str | None, judging: JudgeOptions
) -> Report:
    """`--sglang-perf-log FILE`: judge sglang's requests; nothing runs."""
    if not baseline_path:
        raise PerfguardError("--sglang-perf-log needs --baseline (the log names no platform)")
    if len(selection.case_ids) > 1:
        raise PerfguardError("--sglang-perf-log takes at most one --case")
    case_id = selection.case_ids[0] if selection.case_ids else None
    return api.check_perf_log(perf_log, judging=judging, baseline=baseline_path, case_id=case_id)


def _refuse_run_options(
    results_file: str | None, perf_log: str | None, options: MeasureOptions
) -> None:
    """Options that need cases to run are an error with --results / --sglang-perf-log."""
    if results_file and perf_log:
        raise PerfguardError("use either --results or --sglang-perf-log, not both")
    if given("inject"):
        raise PerfguardError("--inject needs cases to run: it cannot apply to --results")
    if any(given(param) for param in NEEDS_CASES) or options.processes > 1:
        raise PerfguardError(
            "--shard, --devices, --isolate, --factory and --processes need cases to run: "
            "they cannot apply to --results or --sglang-perf-log"
        )
