"""The gates, one command each: `check` (against a stored baseline), `compare` (the
relative check, against a base revision), `check-work` (work counters only) and `judge`
(measurements made elsewhere).

Each command takes its option groups as values (`Selection`, `MeasureOptions`,
`JudgeOptions`, `RelativeOptions`, `Outputs`) and hands them to one library function:
the stored and the work check (`api.check`), the relative check (`api.check_relative`),
and the file modes that run nothing (`api.judge`).
`check`'s old spellings of the other jobs (`--against`, `--counters-only`,
`--results`, ...; `api.MOVED_FROM_CHECK`) exit 2 naming the command that took each over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from perfguard import api
from perfguard.api import Outputs, Report
from perfguard.api.options import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MIN_BLOCKS,
    RIGOROUS,
    TIMINGS,
    JudgeOptions,
    MeasureOptions,
    RelativeOptions,
    Selection,
    popped,
    relative_judging,
    relative_options_from,
    rigorous_check,
    rigorous_relative,
)
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    FILE,
    Decorator,
    _apply,
    baseline_option,
    console,
    count_option,
    echo_err,
    file_option,
    given_among,
    import_root_option,
    judge_options,
    measurement_options,
    platform_option,
    selection_options,
    value_options,
)
from perfguard.errors import EXIT_CODES_HELP, PerfguardError
from perfguard.presentation.render import render_table

RELATIVE_OPTIONS = [
    click.option(
        "--against",
        default=None,
        metavar="DIR|REF",
        help="The base: a directory holding its checkout, else a revision of this "
        "repository (checked out in a temporary `git worktree add --detach`, always "
        "removed), e.g. the merge base of a PR.",
    ),
    import_root_option(
        "--against-subdir",
        "The base's import root inside its checkout, when its package lives in a "
        "subdirectory (sglang: python).",
    ),
    click.option(
        "--budget-s",
        default=DEFAULT_BUDGET_S,
        show_default=True,
        type=click.FloatRange(min=0),
        help="Stop starting blocks past this many seconds of measuring (--min-blocks "
        "always run); a figure still unresolved then can't tell (exit 4).",
    ),
    count_option(
        "--min-blocks",
        DEFAULT_MIN_BLOCKS,
        2,
        "Relative check: blocks (one base and one head process each) before the first look.",
    ),
    count_option("--max-blocks", DEFAULT_MAX_BLOCKS, 2, "Relative check: blocks at most."),
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
        type=FILE,
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


relative_options = value_options("relative", relative_options_from, RELATIVE_OPTIONS)
"""--against / --against-subdir / --budget-s ...: the command gets `relative`
(`api.options.relative_options_from`)."""


_OUTPUT_OPTIONS = [
    file_option("--report", "report_path", help="Write the JSON report here."),
    file_option(
        "--markdown", "markdown_path", help="Write the Markdown report (a PR comment) here."
    ),
    file_option("--out", help="Also write the results judged here."),
    click.option("--all-metrics", is_flag=True, help="Show passing step metrics in the table too."),
]


def _outputs_from(flags: dict[str, Any]) -> Outputs:
    renamed = {"report": "report_path", "markdown": "markdown_path", "results": "out"}
    return Outputs(**popped(flags, "all_metrics", **renamed))


output_options = value_options("outputs", _outputs_from, _OUTPUT_OPTIONS)
"""--report / --markdown / --out / --all-metrics: the command gets `outputs`
(`api.Outputs`)."""


def moved(flag: str, instead: str) -> Decorator:
    """A hidden option that exits 2 naming the command that took it over: an old
    spelling fails loudly instead of doing something else."""

    def refuse(_ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value not in (None, False, ()):
            raise PerfguardError(f"{flag} moved: use `perfguard {instead}`")

    takes_value = flag not in FLAG_SPELLINGS
    return click.option(
        flag,
        hidden=True,
        expose_value=False,
        is_flag=not takes_value,
        callback=refuse,
        **({"default": None} if takes_value else {}),
    )


FLAG_SPELLINGS = ("--counters-only", "--settle")


def _moved_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    return _apply(fn, [moved(flag, new) for flag, new in api.MOVED_FROM_CHECK.items()])


def preset_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--fast` (the default) / `--rigorous`: how much a check samples, never its rule."""
    return click.option(
        "--rigorous/--fast",
        "rigorous",
        default=False,
        help="Sampling preset (the rule is the same): --fast, the default, or "
        "--rigorous, which measures more before it answers can't tell "
        f"(check: {RIGOROUS['check']}; compare: {RIGOROUS['compare']}).",
    )(fn)


@click.command("check", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@baseline_option
@measurement_options(adaptive=True)
@judge_options(
    "Measure a case in up to this many fresh processes, one at a time, while a figure "
    "is over its bound (to confirm it) or can't tell; the processes are pooled."
)
@preset_option
@output_options
@_moved_options
def check(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    judging: JudgeOptions,
    rigorous: bool,
    outputs: Outputs,
) -> int:
    """The stored check: run the selected cases and answer, per figure, same, slower
    or can't tell against the committed baseline.

    Slower: the median is over max(b * (1 + rel), b + pad) (rel: the minimum effect,
    3 % for e2e, the denoising stage and the step aggregates) and credibly slower
    (99.9 %, Student's t over the spread between processes). Same: the one-sided 95 %
    upper bound lies within the minimum effect. Can't tell: neither (exit 4), with the
    smallest slowdown the check could have caught. A case over its bound or that can't
    tell is measured in fresh processes first; a runner that stays contended gets no
    verdict (exit 4). Work counters and the output are exact: a counter that grew or an
    output that changed fails whatever the timings say. The rule: README.md, "The rule".

    The other jobs have commands of their own: `perfguard compare --against DIR|REF`
    (the relative check), `perfguard check-work` (work only, seconds, any CPU runner),
    `perfguard judge --results FILE` (judge a results file or sglang's log).
    """
    if rigorous:
        given = given_among("processes", "max_repeats", "max_reruns")
        options, judging = rigorous_check(options, judging, given)
    report = _stored(selection, options, judging, outputs, baseline_path, platform_name)
    return _finish(report, outputs)


def _finish(report: Report, outputs: Outputs) -> int:
    """Write the reports, print the table; the exit code."""
    report, _ = api.write_report(report, outputs.report, outputs.markdown)
    render_table(report, console(), all_metrics=outputs.all_metrics)
    return report.exit_code


@click.command("compare", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@measurement_options(processes=None)
@judge_options("", relative=True)
@preset_option
@output_options
@relative_options
def compare(
    platform_name: str | None,
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    rigorous: bool,
    outputs: Outputs,
    relative: RelativeOptions | None,
) -> int:
    """The relative check: this tree against a base (a directory, or a git revision
    checked out in a temporary worktree), side by side on this runner, no baseline.

    The base and this tree run in randomized interleaved blocks of fresh processes;
    each figure is judged on the paired per-block ratios: slower (above 1 + the minimum
    effect and credibly > 1, at 1 %), same (within the minimum effect), or can't tell
    when the budget runs out (exit 4). It stops as soon as every figure is slower or the
    same. Work counters and the output are compared exactly. docs/relative.md.
    """
    if relative is None:
        raise PerfguardError("compare needs --against DIR|REF (the base to compare with)")
    if rigorous:
        relative = rigorous_relative(relative, given_among("budget_s", "max_blocks"))
    judging = relative_judging(judging, given_among("alpha"))
    report = api.check_relative(
        selection,
        options,
        relative,
        judging=judging,
        platform=api.probe(platform_name),
        outputs=outputs,
        echo=echo_err,
    )
    return _finish(report, outputs)


@click.command("check-work", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options()
@baseline_option
@measurement_options(processes=None, workers=False, inject=False, progress=False)
@judge_options("", exact=True)
@output_options
def check_work(
    platform_name: str | None,
    selection: Selection,
    baseline_path: str | None,
    options: MeasureOptions,
    judging: JudgeOptions,
    outputs: Outputs,
) -> int:
    """The work check: time nothing; build each case, run it once counted and judge
    only what is exact (ops, FLOPs, bytes allocated and host syncs per stage and step,
    the output, CPU tensor memory). Seconds on any CPU runner, for GPU code too: the
    answers are same or slower, never can't tell.
    """
    counted = options.replace(counters_only=True)  # one counted run per case, exact figures
    report = _stored(selection, counted, judging, outputs, baseline_path, platform_name)
    return _finish(report, outputs)


@click.command("judge", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@selection_options(shard=False)
@baseline_option
@judge_options("", exact=False, files=True)
@file_option(
    "--results", "results_file", help="Judge this results file (from `perfguard run --out`)."
)
@file_option(
    "--sglang-perf-log",
    "perf_log",
    help="Judge the requests of sglang's performance.log (needs --baseline).",
)
@output_options
def judge_command(
    selection: Selection,
    baseline_path: str | None,
    judging: JudgeOptions,
    results_file: str | None,
    perf_log: str | None,
    outputs: Outputs,
) -> int:
    """Judge measurements made elsewhere against a baseline; nothing runs. The same
    answers as `check` (same, slower, can't tell), without its confirmations."""
    report = api.judge(results_file, perf_log, selection, judging, baseline_path, echo_err)
    return _finish(report, outputs)


def _stored(
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    outputs: Outputs,
    baseline_path: str | None,
    platform_name: str | None,
) -> Report:
    """The check against a stored baseline (`check`, and `check-work` with
    `options.counters_only`): the cases run through the gate."""
    return api.check(
        selection,
        options,
        judging=judging,
        baseline=baseline_path,
        outputs=outputs,
        platform=platform_name,
        echo=echo_err,
    )
