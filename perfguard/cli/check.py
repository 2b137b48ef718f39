"""`perfguard check`: the CI gate, against a stored baseline or a base revision."""

from __future__ import annotations

from collections.abc import Callable
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
    max_reruns_option,
    measurement_options,
    platform_option,
    profile_option,
    selection_options,
)
from perfguard.errors import EXIT_CODES_HELP, PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.relative import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MIN_BLOCKS,
    RelativeOptions,
)
from perfguard.presentation.render import render_table
from perfguard.storage.cases import Selection


def relative_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--against / --against-ref / --against-subdir / --budget-s ...: `RelativeOptions`."""

    options = [
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
            help="Relative check: blocks (one base and one head process each) before the "
            "first look.",
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
    ]
    return _apply(fn, options)


NOT_RELATIVE = {
    "baseline_path": "--baseline",
    "results_file": "--results",
    "perf_log": "--sglang-perf-log",
    "processes": "--processes",
    "max_repeats": "--max-repeats",
    "max_reruns": "--max-reruns",
    "profile": "--profile",
}
"""Options that mean nothing to a relative check (`--against`): giving one is an error."""

NEEDS_CASES = ("shard_spec", "devices_spec", "isolate", "factory_spec")
"""Options that need cases to run: an error with --results / --sglang-perf-log."""


@click.command("check", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@baseline_option
@measurement_options(adaptive=True)
@max_reruns_option(
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
@profile_option
@click.option(
    "--report",
    "report_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the JSON report here.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the Markdown report (a PR comment) here.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the results of the cases run here.",
)
@click.option(
    "--fail-on-missing",
    is_flag=True,
    help="Missing baselines, missing and new stages fail the check (exit 1).",
)
@click.option("--advisory", is_flag=True, help="Report regressions but never fail on them.")
@click.option("--all-metrics", is_flag=True, help="Show passing step metrics in the table too.")
@click.option(
    "--allow-output-change",
    is_flag=True,
    help="A changed output is reported, not failed (a numerics change; a case can say so "
    "with `output_may_change = true`).",
)
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
    max_reruns: int,
    results_file: str | None,
    perf_log: str | None,
    profile: str,
    report_path: str | None,
    markdown_path: str | None,
    out: str | None,
    fail_on_missing: bool,
    advisory: bool,
    all_metrics: bool,
    allow_output_change: bool,
    counters_only: bool,
    against: str | None,
    against_ref: str | None,
    against_subdir: str | None,
    budget_s: float,
    min_blocks: int,
    max_blocks: int,
    order_seed: int | None,
    write_baseline: str | None,
) -> int:
    """Run the selected cases (or read --results) and judge each metric against the baseline.

    A metric regresses when its median exceeds max(b * (1 + rel), b + pad) (rel: the
    minimum effect of interest, 3 % for e2e, the denoising stage and the step
    aggregates; pad: a multiple of the baseline's noise) and the slowdown is credible
    (99 %, Student's t over the spread between processes). A case over a bound is
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
    same, or at --budget-s (docs/relative.md).

    Beside the timings, the work each stage does (ops, FLOPs, bytes allocated, host
    syncs, counted exactly in one untimed run per build) is compared exactly: a counter
    that grew is a regression whatever the timings say; and the output must stay
    bit-identical or within tolerance (PSNR >= 100 dB) unless --allow-output-change.
    """

    verdicts = {
        "fail_on_missing": fail_on_missing,
        "advisory": advisory,
        "allow_output_change": allow_output_change,
    }
    if counters_only and (
        against is not None or against_ref is not None or results_file or perf_log
    ):
        raise PerfguardError(
            "--counters-only runs the cases: it cannot apply to --against, --results "
            "or --sglang-perf-log"
        )
    if against is not None or against_ref is not None:
        for param, flag in NOT_RELATIVE.items():
            if given(param):
                raise PerfguardError(f"{flag} does not apply to a relative check (--against)")
        relative = RelativeOptions(
            directory=against,
            ref=against_ref,
            subdir=against_subdir,
            budget_s=budget_s,
            min_blocks=min_blocks,
            max_blocks=max_blocks,
            order_seed=order_seed,
            write_baseline=write_baseline,
        )
        platform = api.probe(platform_name)
        report = api.check_relative(
            selection, options, relative, out=out, platform=platform, echo=echo_err, **verdicts
        )
    elif write_baseline:
        raise PerfguardError("--write-baseline needs --against or --against-ref")
    elif results_file or perf_log:
        _refuse_run_options(results_file, perf_log, options)
        if perf_log:
            if not baseline_path:
                raise PerfguardError(
                    "--sglang-perf-log needs --baseline (the log names no platform)"
                )
            if len(selection.case_ids) > 1:
                raise PerfguardError("--sglang-perf-log takes at most one --case")
            case_id = selection.case_ids[0] if selection.case_ids else None
            report = api.check_perf_log(
                perf_log,
                baseline=baseline_path,
                case_id=case_id,
                profile=profile,
                fail_on_missing=fail_on_missing,
                advisory=advisory,
            )
        else:
            assert results_file is not None
            report = api.check_results(
                results_file,
                selection,
                baseline=baseline_path,
                profile=profile,
                echo=echo_err,
                **verdicts,
            )
    else:
        report = api.check(
            selection,
            options,
            baseline=baseline_path,
            profile=profile,
            max_reruns=max_reruns,
            out=out,
            platform=api.probe(platform_name),
            echo=echo_err,
            counters_only=counters_only,
            **verdicts,
        )
    report, _ = api.write_report(report, report_path, markdown_path)
    render_table(report, console(), all_metrics=all_metrics)
    return report.exit_code


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
