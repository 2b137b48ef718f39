"""`perfguard run` and `perfguard gen-baselines`: measure the selected cases."""

from __future__ import annotations

from typing import Any

import click

from perfguard import api
from perfguard.api.options import (
    TIMINGS,
    MeasureOptions,
    RefreshOptions,
    Selection,
    popped,
    work_only_options,
)
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    DEFAULT_BASELINE_PROCESSES,
    baseline_option,
    console,
    echo_err,
    file_option,
    given,
    measurement_options,
    platform_option,
    selection_options,
    value_options,
)
from perfguard.errors import (
    EXIT_CASE_FAILED,
    EXIT_CODES_HELP,
    EXIT_CONTENDED,
    EXIT_OK,
    PerfguardError,
)
from perfguard.presentation.escape import rich_markup as escape
from perfguard.presentation.tables import results_table


@click.command("run", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@measurement_options()
@file_option("--out", help="Write every sample to this results file (input of `judge --results`).")
def run_command(
    platform_name: str | None, selection: Selection, options: MeasureOptions, out: str | None
) -> int:
    """Run the selected cases: WARMUP untimed plus REPEATS measured runs each.

    Records every sample of every metric (stages, denoising steps, e2e, average and median
    step, peak memory) and each output's hash. A case that raises or times out is recorded
    as an error and the others still run (exit 3).
    """
    results = api.run(selection, options, platform=platform_name, out=out, echo=echo_err)
    console().print(results_table(results))
    if out:
        console().print(escape(f"results written to {out}"))
    failed = any(r.status != "ok" for r in results.cases.values())
    return EXIT_CASE_FAILED if failed else EXIT_OK


_REFRESH_OPTIONS = [
    click.option(
        "--tighten",
        is_flag=True,
        help="Only lower a figure, and only on a credible improvement (99 %), to the new median.",
    ),
    click.option("--prune", is_flag=True, help="Drop scenarios whose case no longer exists."),
    click.option(
        "--work-only",
        is_flag=True,
        help="Time nothing: store only what is exact (work counters, output, CPU tensor "
        "memory), the baseline of the work check; any CPU runner with the same torch can "
        "check against it (docs/ci.md).",
    ),
    click.option(
        "--timing",
        type=click.Choice(TIMINGS),
        default=None,
        help="Store each timed run as measured (raw) or scaled by the reference workload "
        "timed beside it to the runner speed of its median (normalized: the shared runner's "
        "slow and fast spells divide out; docs/verdicts.md). Checks follow the baseline. "
        "[default: normalized on cpu, raw on devices]",
    ),
    click.option(
        "--allow-busy",
        is_flag=True,
        envvar="PERFGUARD_ALLOW_BUSY",
        help="Store a case measured on a contended runner anyway, marked busy (most runs "
        "beside a slow reference, other processes using over half a core, or its reference "
        "workload over 1.3x the baseline's): by default it is measured again after 10 s, "
        "twice, then not written and the command exits 4 (env: PERFGUARD_ALLOW_BUSY). A "
        "noisy runner is never refused: its spread is recorded as what a check resolves.",
    ),
]
"""gen-baselines' storing flags: the command gets `storing` (`RefreshOptions`), and
`work_only`."""


def _refresh_from(flags: dict[str, Any]) -> RefreshOptions:
    return RefreshOptions(**popped(flags, "tighten", "prune", "timing", "allow_busy"))


@click.command("gen-baselines", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@baseline_option
@measurement_options(processes=DEFAULT_BASELINE_PROCESSES, inject=False)
@value_options("storing", _refresh_from, _REFRESH_OPTIONS)
@click.option("--inject", default=None, hidden=True)
def gen_baselines(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    storing: RefreshOptions,
    work_only: bool,
    inject: str | None,
) -> int:
    """Measure the selected cases and store them in the baseline file.

    Only the selected cases are updated; the others, and every case's notes and
    tolerance_overrides, are kept. The file is saved after each case, under a file lock,
    so an interrupt loses at most the case in flight. Refuses fault injection and
    refuses to touch a baseline it cannot read. With --processes K each metric also
    keeps the median of each of the K processes, which the verdict uses as the
    between-process noise (see docs/verdicts.md), and each case records what a check
    against it resolves on this runner. A case measured while another process kept the
    runner busy is measured again after a wait, and not written if it stays so (exit 4).
    """
    if given("inject"):  # the library refuses $PERFGUARD_INJECT itself
        raise PerfguardError(
            "gen-baselines refuses fault injection (--inject is set): "
            "a baseline must never contain injected time"
        )
    if work_only:
        options = work_only_options(options, storing)
    out = console()
    update = api.gen_baselines(
        selection,
        options,
        baseline=baseline_path,
        storing=storing,
        platform=platform_name,
        echo=echo_err,
        say=lambda line: out.print(escape(line)),
    )
    if update.pruned:
        out.print(escape(f"pruned {len(update.pruned)} scenario(s): {', '.join(update.pruned)}"))
    mode = "tightened" if storing.tighten else "updated"
    out.print(escape(f"{update.path}: {mode} {len(update.saved)} of {update.selected} case(s)"))
    if update.failed:
        return EXIT_CASE_FAILED
    if update.busy:
        out.print(
            escape(
                f"{len(update.busy)} case(s) measured on a contended runner and not written: "
                f"{', '.join(update.busy)}; measure them again when nothing else runs on it "
                "(exit 4)"
            )
        )
        return EXIT_CONTENDED
    return EXIT_OK
