"""`perfguard calibrate` and `perfguard ab`: what this runner's noise lets a gate see."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from perfguard import api
from perfguard.api.calibrate import CalibrateOptions, check_setup_from
from perfguard.api.options import MeasureOptions, Selection, popped
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    baseline_option,
    cases_dir_option,
    console,
    count_option,
    echo_err,
    json_file_option,
    max_reruns_option,
    measurement_options,
    platform_option,
    profile_option,
    selection_options,
    value_options,
)
from perfguard.errors import EXIT_CASE_FAILED, EXIT_CODES_HELP, EXIT_OK
from perfguard.presentation.escape import rich_markup as escape
from perfguard.presentation.tables import ab_table, calibration_table

if TYPE_CHECKING:
    from perfguard.decision.calibrate import CheckSetup


_CHECK_SETUP_OPTIONS = [
    count_option("--check-processes", 1, 1, "The --processes of the checks calibrated for."),
    max_reruns_option("The --max-reruns of the checks calibrated for."),
    click.option(
        "--check-isolate",
        is_flag=True,
        help="Accepted for older command lines; no effect: a check's confirmations "
        "always run in fresh processes, and calibrate simulates them so.",
    ),
    count_option(
        "--baseline-processes",
        1,
        1,
        "The baseline's processes where the baseline does not record them.",
    ),
    count_option(
        "--trials", 400, 50, "Simulated checks per point (false-alarm resolution ~ 1/trials)."
    ),
]

check_setup_options = value_options("setup", check_setup_from, _CHECK_SETUP_OPTIONS)
"""The checks calibrated for (--check-processes, --max-reruns, --baseline-processes,
--trials); the command gets `setup: CheckSetup`. Goes below `measurement_options`,
whose `options` gives the checks' repeats."""


def _calibrating_from(flags: dict[str, Any]) -> CalibrateOptions:
    return CalibrateOptions(
        **popped(flags, "profile", "write", "all_metrics", baseline="baseline_path")
    )


def _variants_from(flags: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return api.variants(*popped(flags, "toggles", "spec_a", "spec_b").values())


@click.command("calibrate", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@value_options("calibrating", _calibrating_from, [])
@platform_option
@selection_options(shard=False)
@baseline_option
@count_option(
    "--runs",
    5,
    2,
    "Fresh processes to measure each case in (the between-process noise needs 2+; "
    "--write needs 10+).",
)
@measurement_options(
    repeats=10, min_repeats=3, processes=None, workers=False, inject=False, progress=False
)
@profile_option
@check_setup_options
@click.option("--all-metrics", is_flag=True, help="Per-step metrics too.")
@click.option(
    "--write",
    is_flag=True,
    help="Store the suggested bands as the cases' tolerance_overrides in the baseline.",
)
@json_file_option("Also write every figure to this JSON file.")
def calibrate_command(
    platform_name: str | None,
    selection: Selection,
    runs: int,
    options: MeasureOptions,
    setup: CheckSetup,
    calibrating: CalibrateOptions,
    json_out: str | None,
) -> int:
    """Measure this runner's noise per metric and what the gate can catch through it.

    Each case runs in RUNS fresh processes of REPEATS runs. Per metric it prints the
    noise within a process and between processes, the false-alarm rate of the current
    band, the smallest slowdown caught with >= 95 % probability at <= 1 % false alarms
    (simulated through the real rule, re-runs included, for checks run as the options
    say), and the tightest band that keeps false alarms within 1 %. --write stores those
    bands as per-case tolerance overrides in the baseline.
    """
    result = api.calibrate(
        selection,
        options.replace(processes=runs),
        setup,
        calibrating,
        platform=api.probe(platform_name),
        echo=echo_err,
    )
    out = console()
    for cal in result.cases:
        if cal.error:
            out.print(escape(f"{cal.case_id}: error: {cal.error}"))
        else:
            out.print(calibration_table(cal, runs))
    out.print(
        "false alarms are per metric: a case gated on k metrics alarms at most k times as "
        "often (less, as its metrics move together); steps are left out unless --all-metrics"
    )
    if json_out:
        api.write_json_atomic(json_out, result.to_json())
    if result.written:
        out.print(escape(f"{result.path}: suggested bands written as tolerance_overrides"))
    return EXIT_CASE_FAILED if result.failed else EXIT_OK


@click.command("ab", context_settings=CONTEXT_SETTINGS)
@platform_option
@click.argument("case_id")
@cases_dir_option
@value_options(
    "variant_pair",
    _variants_from,
    [
        click.option(
            "--toggle",
            "toggles",
            multiple=True,
            help="Optimization to measure: A = off (reference), B = on (repeatable).",
        ),
        click.option("--a", "spec_a", default=None, help="Variant A as 'key=value,...'."),
        click.option("--b", "spec_b", default=None, help="Variant B as 'key=value,...'."),
    ],
)
@click.option("--pairs", default=10, show_default=True, help="A/B pairs, run in ABBA order.")
@click.option("--warmup", default=1, show_default=True, help="Untimed runs of each variant.")
@json_file_option("Also write the comparison (with every sample) to this JSON file.")
def ab_command(
    platform_name: str | None,
    case_id: str,
    cases_dir: str | None,
    variant_pair: tuple[dict[str, Any], dict[str, Any]],
    pairs: int,
    warmup: int,
    json_out: str | None,
) -> int:
    """Compare two variants of CASE_ID, interleaved ABBA in one process.

    Each adjacent A/B pair is a block; per metric it prints the medians, the paired
    ratio B/A with its one-sided 99 % bounds (the relative check's engine), and the
    answer: slower, same (faster) or can't tell. A ratio below 1 means B is faster.
    """
    result = api.ab(
        case_id,
        variant_pair,
        cases_dir=cases_dir,
        platform=platform_name,
        pairs=pairs,
        warmup=warmup,
    )
    console().print(ab_table(result, pairs))
    same = len(set(result.hashes.values())) == 1
    console().print(escape(f"outputs identical: {'yes' if same else 'NO'} ({result.hashes})"))
    if json_out:
        api.write_json_atomic(json_out, result.to_json())
    return 0
