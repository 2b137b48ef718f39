"""What the commands share: the console and the options, each declared once.

Options come in groups (`selection_options`, `measurement_options`, `baseline_option`,
...), and a command takes the groups that apply to it, so two commands that take an
option take the same option: same name, default, help and validation. The groups that
build a library value hand the command that value (`selection: Selection`,
`options: MeasureOptions`) instead of the raw flags.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from perfguard.api.options import (
    DEFAULT_CONFIRM_GAP_S,
    DEFAULT_MAX_RERUNS,
    DEFAULT_TIMING_GATE,
    PLATFORM_NAMES,
    RELATIVE_ALPHA,
    START_METHODS,
    STORED_ALPHA,
    SYNC_POLICIES,
    TIMING_GATES,
    judge_options_from,
    measure_options_from,
    selection_from,
)

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def console(stderr: bool = False) -> Console:
    """A rich console; rich itself honours NO_COLOR and drops styling when not a TTY."""
    stream = sys.stderr if stderr else sys.stdout
    # Off a terminal (CI logs) rich would wrap at 80 columns; tables read better wider.
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def echo_err(message: str) -> None:
    """Progress notes of the library (`echo=`): stderr, so stdout stays the result."""
    click.echo(message, err=True)


def given(name: str, *, environment: bool = True) -> bool:
    """Whether the option whose parameter is `name` was given on the command line, or
    (unless `environment=False`) by its environment variable."""
    source = click.get_current_context().get_parameter_source(name)
    ambient = {"DEFAULT", "DEFAULT_MAP"} | (set() if environment else {"ENVIRONMENT"})
    return source is not None and source.name not in ambient


def given_among(*names: str) -> set[str]:
    """Those of the options whose parameters are `names` that the command line (or
    their environment variable) set."""
    return {name for name in names if given(name)}


class SharedOption(click.Option):
    """An option of a shared group (`selection`, `measurement`): the CLI reference lists
    the group once and names it where a command takes all of it."""

    def __init__(self, *args: Any, group: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


def _shared(group: str, *names: str, **kwargs: Any) -> Decorator:
    return click.option(*names, cls=SharedOption, group=group, **kwargs)


def _apply(fn: Callable[..., Any], options: list[Decorator]) -> Callable[..., Any]:
    for option in reversed(options):
        fn = option(fn)
    return fn


def value_options(
    name: str, build: Callable[[dict[str, Any]], Any], options: list[Decorator]
) -> Decorator:
    """`options` whose flags the command gets as one value, its parameter `name`: `build`
    pops the flags out of the keyword arguments and returns the value (a `Selection`, a
    `MeasureOptions`, ...), built once, before the command runs."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(**kwargs: Any) -> Any:
            kwargs[name] = build(kwargs)
            return fn(**kwargs)

        return _apply(wrapper, options)

    return decorate


def platform_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--platform",
        "platform_name",
        type=click.Choice(PLATFORM_NAMES),
        default=None,
        envvar="PERFGUARD_PLATFORM",
        help="Platform to use instead of the probed one (env: PERFGUARD_PLATFORM).",
    )(fn)


def cases_dir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return _shared(
        "selection",
        "--cases",
        "cases_dir",
        type=click.Path(file_okay=False),
        metavar="DIR",
        default=None,
        envvar="PERFGUARD_CASES",
        help="Case registry directory (default: ./cases; env: PERFGUARD_CASES).",
    )(fn)


def selection_options(*, shard: bool = True) -> Decorator:
    """--cases / --case / --match / --tag [/ --shard]; the command gets `selection`."""
    options: list[Decorator] = [
        cases_dir_option,
        _shared(
            "selection",
            "--case",
            "case_ids",
            multiple=True,
            metavar="ID",
            help="Case id (repeatable).",
        ),
        _shared(
            "selection",
            "--match",
            default=None,
            metavar="REGEX",
            help="Regular expression searched in case ids.",
        ),
        _shared(
            "selection",
            "--tag",
            "tags",
            multiple=True,
            metavar="TAG",
            help="Only cases with this tag (repeatable).",
        ),
    ]
    if shard:
        options.append(
            click.option(
                "--shard",
                "shard_spec",
                default=None,
                metavar="K/N",
                help="Only shard K of N (K from 1): a deterministic split balanced by "
                "expected time (estimated_time_s, else the baseline's e2e); every case "
                "is in exactly one shard.",
            )
        )
    return value_options("selection", selection_from, options)


DEFAULT_BASELINE_PROCESSES = 10
"""gen-baselines measures in 10 fresh processes by default: the verdict's interval needs
the between-process spread, and the baseline's median is shared by every check against
it, so its error is the one no check can average away. With 3 processes a baseline left
its median a few percent off (the A/A checks of one baseline read their denoising stage
at a median of 1.06-1.09x, those of the next at 1.01x: docs/verdicts.md); with 6, the
mean A/A log ratio of `DenoisingStage` still moved by 2.0-2.4 % (sd) from one baseline
to the next, with 10 by 1.0-1.4 % (one detection run, 11 baselines of each,
interleaved), and at the stored level the A/A checks against them failed 12 of 142
times against 2 of 143. Processes are forks of the warm server and only the first two
recount the work (`options.COUNTED_PROCESSES`), so a process costs its build and runs:
gen-baselines of the smoke tier took a median 8.6 s with 10, 5.3 s with 6, in the same
run (docs/verdicts.md)."""


def measurement_options(
    *,
    repeats: int = 5,
    min_repeats: int = 1,
    processes: int | None = 1,
    workers: bool = True,
    adaptive: bool = False,
    inject: bool = True,
    progress: bool = True,
) -> Decorator:
    """The measurement settings (`MeasureOptions`); the command gets `options`.

    Every command that measures takes --repeats, --warmup, --timeout, --sync, --threads
    and --factory; the others where they mean something: --devices / --isolate where
    cases may run in worker processes (`workers`), --processes with its default
    (`processes`, None: the command has its own notion, like calibrate's --runs),
    --max-repeats for adaptive sampling (`adaptive`), --inject for fault injection.
    """

    options = _core_measurement_options(repeats, min_repeats)
    if progress:
        options.append(_PROGRESS_OPTION)
    if workers:
        options += _WORKER_OPTIONS
    if processes is not None:
        options.append(_processes_option(processes))
    if adaptive:
        options.append(_MAX_REPEATS_OPTION)
    if inject:
        options.append(_INJECT_OPTION)
    return value_options("options", functools.partial(measure_options_from, inject=inject), options)


def _core_measurement_options(repeats: int, min_repeats: int) -> list[Decorator]:
    """The options every measuring command takes, in the order --help lists them."""
    return [
        _shared(
            "measurement",
            "--repeats",
            default=repeats,
            show_default=True,
            type=click.IntRange(min=min_repeats),
            help="Measured runs per case (per process).",
        ),
        _shared(
            "measurement",
            "--warmup",
            default=1,
            show_default=True,
            type=click.IntRange(min=0),
            help="Untimed runs per case first (one-off costs: allocator, autotuning).",
        ),
        _shared(
            "measurement",
            "--timeout",
            default=None,
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds a case may take; past it the case is an error, the others run.",
        ),
        _shared(
            "measurement",
            "--sync",
            default="none",
            show_default=True,
            type=click.Choice(SYNC_POLICIES),
            help="Synchronize the device at every stage boundary (debugging).",
        ),
        _shared(
            "measurement",
            "--threads",
            type=click.IntRange(min=1),
            default=None,
            help="torch intra-op threads for every case (default: $PERFGUARD_THREADS, "
            "else the case's `threads`, else 1 on CPU and 4 on devices).",
        ),
        _shared(
            "measurement",
            "--factory",
            "factory_spec",
            default=None,
            metavar="MODULE:FUNCTION",
            help="Build each case's pipeline with this callable (case, platform) -> "
            "pipeline instead of perfguard's workloads (env: PERFGUARD_FACTORY).",
        ),
    ]


def count_option(name: str, default: int, minimum: int, help: str) -> Decorator:
    """An option that counts something: an integer of at least `minimum`, its default
    shown."""
    return click.option(
        name, default=default, show_default=True, type=click.IntRange(min=minimum), help=help
    )


def _processes_option(default: int) -> Decorator:
    return count_option(
        "--processes",
        default,
        1,
        "Measure each case in K fresh processes (REPEATS runs each) and pool them; the "
        "spread of their medians is the between-process noise the verdict uses.",
    )


_PROGRESS_OPTION = click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar (default: only on a terminal).",
)

_WORKER_OPTIONS: list[Decorator] = [
    click.option(
        "--devices",
        "devices_spec",
        default=None,
        metavar="0,1,...",
        help="One worker process per device, pinned with CUDA_VISIBLE_DEVICES / "
        "HIP_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES; a case with "
        "num_devices > 1 runs through torchrun on that many of them.",
    ),
    click.option(
        "--isolate",
        is_flag=True,
        help="Run each case in a fresh subprocess; --timeout kills it (process tree).",
    ),
    click.option(
        "--start-method",
        default=None,
        type=click.Choice(START_METHODS),
        help="How worker processes start: forkserver forks them from a server "
        "that imported torch, transformers and diffusers once; spawn starts "
        "a fresh interpreter each (default: forkserver on Linux, else spawn).",
    ),
]

_MAX_REPEATS_OPTION = click.option(
    "--max-repeats",
    default=None,
    type=click.IntRange(min=1),
    help="Adaptive sampling: after REPEATS runs keep measuring a case until "
    "every verdict is clear, up to this many runs (default: 20; in-process "
    "runs only).",
)

_INJECT_OPTION = click.option(
    "--inject",
    default=None,
    metavar="STAGE=+N%",
    help="Slow a stage down by N % with real busy work, to prove the gate "
    "catches it (env: PERFGUARD_INJECT). Moves stage:STAGE by N %, each "
    "step:<i> inside it (so step_avg and step_median) by N %, the stages "
    "that enclose it and e2e by the added time; no other stage.",
)


FILE = click.Path(dir_okay=False)
"""A file path (not a directory) a command reads or writes."""


def file_option(*names: str, help: str) -> Decorator:
    """An optional file the command reads or writes: `names` are the flag and its
    parameter's name, as click takes them."""
    return click.option(*names, type=FILE, default=None, help=help)


baseline_option = file_option(
    "--baseline",
    "baseline_path",
    help="Baseline file (default: baselines/<platform>/<hardware-slug>.json).",
)


def profile_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--profile",
        default="pr_test",
        show_default=True,
        help="Tolerance profile of the baseline: pr_test or long_term, sglang's two; on "
        "a baseline perfguard measured both are the minimum effects and judge alike.",
    )(fn)


def max_reruns_option(help: str) -> Decorator:
    return count_option("--max-reruns", DEFAULT_MAX_RERUNS, 0, help)


confirm_gap_option = click.option(
    "--confirm-gap-s",
    type=click.FloatRange(min=0),
    default=DEFAULT_CONFIRM_GAP_S,
    show_default=True,
    envvar="PERFGUARD_CONFIRM_GAP_S",
    help="Seconds to wait before each confirmation, so that it measures another moment "
    "of the runner, not the first measurement's spell (0: none; env: "
    "PERFGUARD_CONFIRM_GAP_S). Only a case over its bound waits.",
)


alpha_option = click.option(
    "--alpha",
    type=click.FloatRange(0, 0.5, min_open=True, max_open=True),
    default=None,
    envvar="PERFGUARD_ALPHA",
    help=f"One-sided false-alarm rate of each metric's credibility test (the per-step "
    f"metrics share it as one family; env: PERFGUARD_ALPHA). Default: {STORED_ALPHA:g} "
    f"against a stored baseline, {RELATIVE_ALPHA:g} with --against. Lower: fewer false "
    "alarms, smaller slowdowns missed more often (docs/verdicts.md).",
)


timing_gate_option = click.option(
    "--timing-gate",
    type=click.Choice(TIMING_GATES),
    default=DEFAULT_TIMING_GATE,
    show_default=True,
    help="Which timed figures get all three answers: auto (those this runner resolves, "
    "by the baseline's recorded noise; the others are judged only for slower), gate "
    "(every one), advise (none: timing fails only when credibly slower). Work and "
    "output always decide (docs/verdicts.md).",
)


def judge_options(
    max_reruns_help: str, *, relative: bool = False, exact: bool = False, files: bool = False
) -> Decorator:
    """How a check judges (`JudgeOptions`); the command gets `judging`.

    Every gate takes --fail-on-missing / --advisory / --allow-output-change and the
    baseline's --profile (a relative check has no baseline: `relative`); --alpha where
    a timing is judged (not `exact`); --max-reruns / --confirm-gap-s where the gate
    measures fresh processes (not `relative`, `exact` or `files`)."""
    confirms = not (relative or exact or files)

    options = []
    if confirms:
        options += [max_reruns_option(max_reruns_help), confirm_gap_option]
    if not exact:
        options.append(alpha_option)
    if not relative:
        options.append(profile_option)
    if not (relative or exact):
        options.append(timing_gate_option)
    options += [click.option(name, is_flag=True, help=text) for name, text in _JUDGE_FLAGS]
    return value_options("judging", judge_options_from, options)


_JUDGE_FLAGS = [
    ("--fail-on-missing", "Missing baselines, missing and new stages fail the check (exit 1)."),
    ("--advisory", "Report regressions but never fail on them."),
    (
        "--allow-output-change",
        "A changed output is reported, not failed (a numerics change; a case can say "
        "so with `output_may_change = true`).",
    ),
]
"""The flags every gate takes (`judge_options`)."""


def import_root_option(flag: str, help: str) -> Decorator:
    """Another revision's import root inside its checkout, where its package lives in a
    subdirectory (sglang: python)."""
    return click.option(flag, default=None, metavar="SUB", help=help)


def json_file_option(help: str) -> Decorator:
    """`--json FILE`: write the command's figures to FILE (not a flag: see --json on
    the file commands, which prints JSON)."""
    return file_option("--json", "json_out", help=help)
