"""The `perfguard` command line: parses flags, calls the library, renders the result.

Library modules do the work and raise `PerfguardError` for anything the user got wrong;
`main()` is the one place that turns it into a one-line message and an exit code.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfguard import __version__
from perfguard.cases import Case, load_registry, select
from perfguard.errors import (
    EXIT_CASE_FAILED,
    EXIT_CODES_HELP,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    PerfguardError,
)
from perfguard.platform import PLATFORM_NAMES, Platform, availability, fingerprint, probe

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def console(stderr: bool = False) -> Console:
    """A rich console; rich itself honours NO_COLOR and drops styling when not a TTY."""
    stream = sys.stderr if stderr else sys.stdout
    # Off a terminal (CI logs) rich would wrap at 80 columns; tables read better wider.
    width = None if stream.isatty() else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


# ---- shared options ----------------------------------------------------------------------------


def platform_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--platform",
        "platform_name",
        type=click.Choice(PLATFORM_NAMES),
        default=None,
        envvar="PERFGUARD_PLATFORM",
        help="Platform to use instead of the probed one (env: PERFGUARD_PLATFORM).",
    )(fn)


def selection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--cases / --case / --match / --tag, shared by every command that runs cases."""
    options = [
        click.option(
            "--cases",
            "cases_dir",
            type=click.Path(file_okay=False),
            default=None,
            envvar="PERFGUARD_CASES",
            help="Case registry directory (default: ./cases; env: PERFGUARD_CASES).",
        ),
        click.option("--case", "case_ids", multiple=True, help="Case id (repeatable)."),
        click.option("--match", default=None, help="Regular expression searched in case ids."),
        click.option("--tag", "tags", multiple=True, help="Only cases with this tag (repeatable)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def selected_cases(
    platform: Platform,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
) -> list[Case]:
    cases = select(load_registry(platform.name, cases_dir), case_ids, match, tags)
    if not cases:
        raise PerfguardError("no case matches the selection (see `perfguard list-cases`)")
    from perfguard.workloads.diffusers_pipeline import preflight_all

    preflight_all(cases)  # a diffusers model that cannot load offline: exit 2 before any run
    return cases


def shard_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--shard k/n (perfguard.shard), on every command that selects cases."""
    return click.option(
        "--shard",
        "shard_spec",
        default=None,
        metavar="K/N",
        help="Only shard K of N (K from 1): a deterministic split balanced by expected time "
        "(estimated_time_s, else the baseline's e2e); every case is in exactly one shard.",
    )(fn)


def worker_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--devices / --isolate / --factory (perfguard.workers), for commands that run cases."""
    options = [
        click.option(
            "--devices",
            "devices_spec",
            default=None,
            metavar="0,1,...",
            help="One worker process per device, pinned with CUDA_VISIBLE_DEVICES / "
            "HIP_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES; a case with num_devices > 1 "
            "runs through torchrun on that many of them.",
        ),
        click.option(
            "--isolate",
            is_flag=True,
            help="Run each case in a fresh subprocess; --timeout kills it (process tree).",
        ),
        click.option(
            "--factory",
            "factory_spec",
            default=None,
            metavar="MODULE:FUNCTION",
            help="Build each case's pipeline with this callable (case, platform) -> "
            "pipeline instead of perfguard's workloads (env: PERFGUARD_FACTORY).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def sharded(cases: list[Case], shard_spec: str | None, baseline_path: str | None) -> list[Case]:
    """The cases of `--shard`; says so on stderr when this shard has none."""
    from perfguard.shard import shard_selection

    chosen = shard_selection(cases, shard_spec, baseline_path)
    if shard_spec and not chosen:
        click.echo(f"perfguard: shard {shard_spec} has no case ({len(cases)} selected)", err=True)
    return chosen


def run_selected(
    cases: list[Case],
    platform: Platform,
    devices_spec: str | None,
    isolate: bool,
    factory_spec: str | None,
    **settings: Any,
) -> Any:
    """Run in this process, or in worker processes (perfguard.workers.execute)."""
    from perfguard.workers import execute, factory_from, parse_devices

    devices = parse_devices(devices_spec)
    factory = factory_from(factory_spec)
    return execute(cases, platform, devices=devices, isolate=isolate, factory=factory, **settings)


# ---- group -------------------------------------------------------------------------------------


@click.group(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="perfguard")
@click.option(
    "--debug",
    is_flag=True,
    help="On an internal error (exit 70), print the traceback too (env: PERFGUARD_DEBUG=1).",
)
def cli(debug: bool) -> None:
    """perfguard: stage-level performance baselines and a CI gate for diffusion serving."""
    _DEBUG[0] = debug


ENV_DEBUG = "PERFGUARD_DEBUG"
_DEBUG = [False]  # --debug of the command being run (main resets it)
ENV_TRACEBACK_DIR = "PERFGUARD_TRACEBACK_DIR"


class Terminated(BaseException):
    """Raised by the SIGTERM handler, so that a terminated command unwinds like an
    interrupted one: `finally` blocks run, locks are released, an atomic write in
    progress removes its temporary file, and the previous file stays whole."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def _debug() -> bool:
    env = os.environ.get(ENV_DEBUG, "").strip().lower() not in ("", "0", "false", "no")
    return _DEBUG[0] or env


def _report_internal(exc: BaseException) -> None:
    """One stderr line naming the error and the file holding its traceback.

    The traceback goes to a file rather than the log so that CI shows one line that
    cannot be mistaken for a verdict; `--debug` / `PERFGUARD_DEBUG=1` prints it as well.
    """
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    where: str
    try:
        folder = os.environ.get(ENV_TRACEBACK_DIR) or tempfile.gettempdir()
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w",
            encoding="utf-8",
            dir=folder,
            prefix=f"perfguard-traceback-{time.strftime('%Y%m%dT%H%M%S')}-",
            suffix=".txt",
            delete=False,
        ) as fh:
            fh.write(f"perfguard {__version__}: {sys.argv!r}\n{text}")
        where = f"traceback in {fh.name}"
    except OSError as write_error:
        where = f"traceback not saved ({write_error.strerror or write_error}): rerun with --debug"
    reason = " ".join(str(exc).split())
    if len(reason) > 300:
        reason = reason[:300] + "..."
    if _debug():
        click.echo(text.rstrip("\n"), err=True)
    click.echo(
        f"perfguard: internal error (exit {EXIT_INTERNAL}, not a verdict): "
        f"{type(exc).__name__}: {reason or '(no message)'}; {where}",
        err=True,
    )


def main(argv: list[str] | None = None) -> None:
    """Entry point and the one exit path of every command.

    `PerfguardError` -> its one-line message and code (2 unless it says otherwise);
    Ctrl-C -> 130; SIGTERM -> 143 (the handler raises, so files stay whole); anything else
    (a bug, a library raising something unexpected) -> 70 with one line naming the error
    and where its traceback is. A crash is never exit 1, which CI reads as a regression.
    """
    import signal
    import threading

    _DEBUG[0] = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    code: int
    try:
        rv = cli.main(args=argv, prog_name="perfguard", standalone_mode=False)
        code = rv if isinstance(rv, int) else EXIT_OK
    except PerfguardError as exc:
        click.echo(f"perfguard: error: {exc}", err=True)
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("perfguard: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except Terminated:
        click.echo("perfguard: terminated (SIGTERM)", err=True)
        code = EXIT_TERMINATED
    except click.ClickException as exc:
        exc.show()
        code = EXIT_USAGE if exc.exit_code == 2 else exc.exit_code
    except SystemExit:
        raise
    except BaseException as exc:  # the one place every other error ends
        _report_internal(exc)
        code = EXIT_INTERNAL
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    sys.exit(code)


# ---- env ---------------------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT_SETTINGS)
@platform_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def env(platform_name: str | None, as_json: bool) -> None:
    """Print the environment fingerprint stored with baselines and reports."""
    platform = probe(platform_name)
    fp = fingerprint(platform)
    if as_json:
        fp["availability"] = {
            n: {"available": a.available, "reason": a.reason} for n, a in availability().items()
        }
        click.echo(json.dumps(fp, indent=2, sort_keys=True))
        return
    table = Table(title="perfguard environment", show_header=False)
    for key, value in fp.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif isinstance(value, list):
            value = "; ".join(map(str, value)) or "-"
        table.add_row(escape(key), escape(str(value)))
    console().print(table)


# ---- list-cases --------------------------------------------------------------------------------


@cli.command("list-cases", context_settings=CONTEXT_SETTINGS)
@platform_option
@selection_options
@shard_option
@click.option(
    "--baseline",
    "baseline_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --shard: the baseline whose e2e times cases without estimated_time_s "
    "(default: baselines/<platform>/<hardware-slug>.json, as check uses).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of case objects.")
def list_cases(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    shard_spec: str | None,
    baseline_path: str | None,
    as_json: bool,
) -> None:
    """List the cases selected for this platform, with the file each came from."""
    platform = probe(platform_name)
    cases = select(load_registry(platform.name, cases_dir), case_ids, match, tags)
    if shard_spec:
        path = _baseline_path(baseline_path, platform.name, platform.hardware_slug())
        cases = sharded(cases, shard_spec, path)
    if as_json:
        from perfguard.runner import planned_components

        listed = []
        for c in cases:
            components, note = planned_components(c, platform)
            entry = {**c.to_json(), "components": components}
            if note:
                entry["components_note"] = note
            listed.append(entry)
        click.echo(json.dumps(listed, indent=2, sort_keys=True))
        return
    table = Table(title=f"cases for {platform.name} ({len(cases)})")
    for col in ("id", "workload", "preset", "size", "steps", "batch", "devices", "tags", "file"):
        table.add_column(col)
    for c in cases:
        table.add_row(
            escape(c.id),
            escape(c.workload),
            escape(c.preset or c.model or ""),
            f"{c.width}x{c.height}",
            str(c.steps),
            str(c.batch),
            str(c.num_devices),
            escape(",".join(c.tags)),
            escape(c.source),
        )
    console().print(table)
    from perfguard.cases import display_path, registry_root, scan_registry

    files = scan_registry(registry_root(cases_dir), platform.name)
    console().print(escape(f"read: {', '.join(display_path(p) for p in files.read)}"))
    if files.other_platforms:
        others = ", ".join(display_path(p) for p in files.other_platforms)
        console().print(escape(f"for other platforms: {others}"))


# ---- ab ----------------------------------------------------------------------------------------


@cli.command("ab", context_settings=CONTEXT_SETTINGS)
@platform_option
@click.argument("case_id")
@click.option(
    "--cases",
    "cases_dir",
    type=click.Path(file_okay=False),
    default=None,
    envvar="PERFGUARD_CASES",
    help="Case registry directory.",
)
@click.option(
    "--toggle",
    "toggles",
    multiple=True,
    help="Optimization to measure: A = off (reference), B = on (repeatable).",
)
@click.option("--a", "spec_a", default=None, help="Variant A as 'key=value,...'.")
@click.option("--b", "spec_b", default=None, help="Variant B as 'key=value,...'.")
@click.option("--pairs", default=10, show_default=True, help="A/B pairs, run in ABBA order.")
@click.option("--warmup", default=1, show_default=True, help="Untimed runs of each variant.")
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the comparison (with every sample) to this JSON file.",
)
def ab_command(
    platform_name: str | None,
    case_id: str,
    cases_dir: str | None,
    toggles: tuple[str, ...],
    spec_a: str | None,
    spec_b: str | None,
    pairs: int,
    warmup: int,
    json_out: str | None,
) -> int:
    """Compare two variants of CASE_ID, interleaved ABBA in one process.

    Prints per metric the medians, the ratio B/A with a 95 % bootstrap confidence
    interval, and a Mann-Whitney p-value. A ratio below 1 means B is faster.
    """
    from perfguard.ab import parse_variant, run_ab, toggle_variants
    from perfguard.jsonio import write_json_atomic
    from perfguard.metrics import unit as metric_unit

    if toggles and (spec_a or spec_b):
        raise PerfguardError("use either --toggle or --a/--b, not both")
    if toggles:
        variant_a, variant_b = toggle_variants(toggles)
    elif spec_a is not None and spec_b is not None:
        variant_a, variant_b = parse_variant(spec_a), parse_variant(spec_b)
    else:
        raise PerfguardError("give --toggle NAME, or both --a and --b")
    platform = probe(platform_name)
    (case,) = select(load_registry(platform.name, cases_dir), [case_id])
    result = run_ab(case, variant_a, variant_b, platform, pairs=pairs, warmup=warmup)
    fmt = lambda v: ",".join(f"{k}={v}" for k, v in v.items()) or "(case as is)"  # noqa: E731
    table = Table(
        title=escape(
            f"A/B {case.id}: A[{fmt(variant_a)}] vs B[{fmt(variant_b)}], {pairs} pairs ABBA"
        )
    )
    for col in ("metric", "A median", "B median", "B/A", "95% CI", "p"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for comp in result.comparisons():
        unit = metric_unit(comp.metric)
        table.add_row(
            comp.metric,
            f"{comp.median_a:.3f} {unit}",
            f"{comp.median_b:.3f} {unit}",
            f"{comp.estimate.ratio:.3f}",
            f"[{comp.estimate.low:.3f}, {comp.estimate.high:.3f}]",
            f"{comp.p_value:.3g}",
        )
    console().print(table)
    same = len(set(result.hashes.values())) == 1
    console().print(escape(f"outputs identical: {'yes' if same else 'NO'} ({result.hashes})"))
    if json_out:
        write_json_atomic(json_out, result.to_json())
    return 0


# ---- run / gen-baselines / check (baselines and reports) ---------------------------------------
#
# The options below are shared by the commands that run cases, so that a new one (say
# `--shard k/n`) is added in one place: `measure_options` for how cases are run,
# `selected_cases` for which.


def _set_threads(ctx: click.Context, param: click.Parameter, value: int | None) -> None:
    """`--threads` travels as `$PERFGUARD_THREADS`, so worker processes see it too."""
    if value is not None:
        from perfguard.threads import ENV_OVERRIDE

        os.environ[ENV_OVERRIDE] = str(value)


def measure_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--repeats / --warmup / --timeout / --sync / --progress, for commands that run cases."""
    options = [
        click.option(
            "--repeats",
            default=5,
            show_default=True,
            type=click.IntRange(min=1),
            help="Measured runs per case.",
        ),
        click.option(
            "--warmup",
            default=1,
            show_default=True,
            type=click.IntRange(min=0),
            help="Untimed runs per case first (one-off costs: allocator, autotuning).",
        ),
        click.option(
            "--timeout",
            default=None,
            type=click.FloatRange(min=0, min_open=True),
            help="Seconds a case may take; past it the case is an error, the others run.",
        ),
        click.option(
            "--sync",
            default="none",
            show_default=True,
            type=click.Choice(["none", "stage"]),
            help="Synchronize the device at every stage boundary (debugging).",
        ),
        click.option(
            "--threads",
            type=click.IntRange(min=1),
            default=None,
            expose_value=False,
            callback=_set_threads,
            help="torch intra-op threads for every case (default: the case's `threads`, "
            "else 1 on CPU and 4 on devices; env: PERFGUARD_THREADS).",
        ),
        click.option(
            "--progress/--no-progress",
            default=None,
            help="Progress bar (default: only on a terminal).",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def processes_option(fn: Callable[..., Any], default: int = 1) -> Callable[..., Any]:
    """--processes K (perfguard.workers): the process as the unit of measurement."""
    return click.option(
        "--processes",
        default=default,
        show_default=True,
        type=click.IntRange(min=1),
        help="Measure each case in K fresh processes (REPEATS runs each) and pool them; "
        "the spread of their medians is the between-process noise the verdict uses.",
    )(fn)


DEFAULT_BASELINE_PROCESSES = 3
"""gen-baselines measures in 3 fresh processes by default: the verdict's interval needs
the between-process spread, and a baseline of 3 processes gives it 2 degrees of freedom
of its own; a check confirmed in 2 more fresh processes adds 2, and the one-sided 99 %
t quantile is then 3.75 (with one process a side there is no spread at all). Each
process pays ~5 s of imports and builds with the real diffusers / transformers
components, so 3 keeps the smoke suite's gen-baselines + check under 30 s on the 2-core
runner; `--processes 5` buys more power at +5 % for ~10 s more (docs/verdicts.md)."""


def baseline_processes_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return processes_option(fn, DEFAULT_BASELINE_PROCESSES)


def inject_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--inject",
        default=None,
        metavar="STAGE=+N%",
        help="Slow a stage down by N % with real busy work, to prove the gate catches it "
        "(env: PERFGUARD_INJECT).",
    )(fn)


def baseline_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--baseline",
        "baseline_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="Baseline file (default: baselines/<platform>/<hardware-slug>.json).",
    )(fn)


def _baseline_path(option: str | None, platform: str, hardware: str) -> str:
    from perfguard.baseline import default_path

    return option or str(default_path(platform, hardware))


def _load_baseline(path: str) -> Any:
    """Load the baseline a check compares with; a missing file says how to make one."""
    import os

    from perfguard import baseline as store

    if not os.path.exists(path):
        raise PerfguardError(
            f"{path}: no baseline file: measure one with `perfguard gen-baselines` "
            "on this hardware, or pass --baseline"
        )
    return store.load(path)


def _results_table(results: Any) -> Table:
    from perfguard.metrics import unit

    table = Table(title=escape(f"results ({results.platform} / {results.hardware})"))
    for col in ("case", "status", "e2e", "DenoisingStage", "peak memory", "n", "output"):
        table.add_column(col, justify="left" if col in ("case", "status", "output") else "right")
    for cid, res in sorted(results.cases.items()):

        def med(metric: str, samples: dict[str, list[float]] = res.samples) -> str:
            values = sorted(samples.get(metric, []))
            return f"{values[len(values) // 2]:.3f} {unit(metric)}" if values else "-"

        status = res.status if res.status == "ok" else f"error: {res.error}"
        table.add_row(
            escape(cid),
            escape(status),
            med("e2e"),
            med("stage:DenoisingStage"),
            med("peak_memory"),
            str(res.repeats),
            escape(res.output_hash or "-"),
        )
    return table


@cli.command("run", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options
@shard_option
@measure_options
@worker_options
@processes_option
@inject_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write every sample to this results file (input of `check --results`).",
)
def run_command(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    shard_spec: str | None,
    repeats: int,
    warmup: int,
    timeout: float | None,
    sync: str,
    progress: bool | None,
    devices_spec: str | None,
    isolate: bool,
    factory_spec: str | None,
    processes: int,
    inject: str | None,
    out: str | None,
) -> int:
    """Run the selected cases: WARMUP untimed plus REPEATS measured runs each.

    Records every sample of every metric (stages, denoising steps, e2e, average and median
    step, peak memory) and each output's hash. A case that raises or times out is recorded
    as an error and the others still run (exit 3).
    """
    from perfguard.inject import inject_from
    from perfguard.report import write_results

    injection = inject_from(inject)
    platform = probe(platform_name)
    cases = selected_cases(platform, cases_dir, case_ids, match, tags)
    split_by = _baseline_path(None, platform.name, platform.hardware_slug())
    cases = sharded(cases, shard_spec, split_by)
    results = run_selected(
        cases,
        platform,
        devices_spec,
        isolate,
        factory_spec,
        repeats=repeats,
        warmup=warmup,
        timeout=timeout,
        sync=sync,
        inject=injection,
        progress=progress,
        processes=processes,
    )
    if out:
        write_results(out, results)
    console().print(_results_table(results))
    if out:
        console().print(escape(f"results written to {out}"))
    failed = any(r.status != "ok" for r in results.cases.values())
    return EXIT_CASE_FAILED if failed else EXIT_OK


@cli.command("gen-baselines", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options
@baseline_option
@shard_option
@measure_options
@worker_options
@baseline_processes_option
@click.option(
    "--tighten",
    is_flag=True,
    help="Only lower a figure, and only on a credible improvement (99 %), to the new median.",
)
@click.option("--prune", is_flag=True, help="Drop scenarios whose case no longer exists.")
@click.option("--inject", default=None, hidden=True)
def gen_baselines(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    baseline_path: str | None,
    shard_spec: str | None,
    repeats: int,
    warmup: int,
    timeout: float | None,
    sync: str,
    progress: bool | None,
    devices_spec: str | None,
    isolate: bool,
    factory_spec: str | None,
    processes: int,
    tighten: bool,
    prune: bool,
    inject: str | None,
) -> int:
    """Measure the selected cases and store them in the baseline file.

    Only the selected cases are updated; the others, and every case's notes and
    tolerance_overrides, are kept. The file is saved after each case, under a file lock,
    so an interrupt loses at most the case in flight. Refuses fault injection and
    refuses to touch a baseline it cannot read. With --processes K each metric also
    keeps the median of each of the K processes, which the verdict uses as the
    between-process noise (see docs/verdicts.md).
    """
    import dataclasses

    from perfguard import baseline as store
    from perfguard.contention import screen
    from perfguard.inject import ENV_INJECT, inject_from
    from perfguard.runner import CaseResult

    if inject is not None or inject_from(None):
        source = "--inject" if inject is not None else f"${ENV_INJECT}"
        raise PerfguardError(
            f"gen-baselines refuses fault injection ({source} is set): "
            "a baseline must never contain injected time"
        )
    platform = probe(platform_name)
    cases = selected_cases(platform, cases_dir, case_ids, match, tags)
    path = _baseline_path(baseline_path, platform.name, platform.hardware_slug())
    environment = fingerprint(platform)
    with store.lock(path):
        store.open_for_update(path, environment)  # refuse an unreadable file before measuring
    cases = sharded(cases, shard_spec, path)
    out = console()
    saved: list[str] = []
    busy: list[str] = []

    def on_case(result: CaseResult) -> None:
        if result.status != "ok":
            out.print(escape(f"{result.case_id}: error, baseline not updated: {result.error}"))
            return
        # Runs that the reference workload saw contended (against this measurement's own
        # lower quartile) are not part of a baseline. When most were, there is no quiet
        # level to trust: the runs are kept and the file says how busy the runner was.
        quiet, scr = screen(result, None)
        if scr.contended:
            busy.append(result.case_id)
            out.print(escape(f"{result.case_id}: warning: {scr.reason}; kept every run"))
            scr = dataclasses.replace(scr, dropped=0)
        else:
            result = quiet
        store.record_case(path, result, environment, tighten=tighten, dropped_runs=scr.dropped)
        saved.append(result.case_id)
        e2e = sorted(result.samples["e2e"])[len(result.samples["e2e"]) // 2]
        where = f", {len(result.groups)} processes" if result.groups else ""
        out.print(escape(f"{result.case_id}: e2e {e2e:.3f} ms (n={result.repeats}{where}) saved"))

    results = run_selected(
        cases,
        platform,
        devices_spec,
        isolate,
        factory_spec,
        repeats=repeats,
        warmup=warmup,
        timeout=timeout,
        sync=sync,
        progress=progress,
        on_case=on_case,
        processes=processes,
    )
    if prune:
        known = {c.id for c in load_registry(platform.name, cases_dir)}
        dropped = store.prune(path, known)
        if dropped:
            out.print(escape(f"pruned {len(dropped)} scenario(s): {', '.join(dropped)}"))
    mode = "tightened" if tighten else "updated"
    out.print(escape(f"{path}: {mode} {len(saved)} of {len(cases)} case(s)"))
    failed = any(r.status != "ok" for r in results.cases.values())
    return EXIT_CASE_FAILED if failed else EXIT_OK


def _filter_results(
    results: Any, case_ids: tuple[str, ...], match: str | None, tags: tuple[str, ...]
) -> Any:
    """Apply --case / --match / --tag to a results file (tags from each result's case)."""
    import re

    unknown = [i for i in case_ids if i not in results.cases]
    if unknown:
        raise PerfguardError(f"unknown case id(s) in the results: {', '.join(unknown)}")
    try:
        pattern = re.compile(match) if match else None
    except re.error as exc:
        raise PerfguardError(f"--match: invalid regular expression {match!r}: {exc}") from exc
    kept = {
        cid: r
        for cid, r in results.cases.items()
        if (not case_ids or cid in case_ids)
        and (pattern is None or pattern.search(cid))
        and (not tags or set(tags) & set(r.case.get("tags", ())))
    }
    if not kept:
        raise PerfguardError("no case of the results matches the selection")
    results.cases = kept
    return results


def relative_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--against / --against-ref / --against-subdir / --budget-s ... (perfguard.relative)."""
    from perfguard import relative

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
            default=relative.DEFAULT_BUDGET_S,
            show_default=True,
            type=click.FloatRange(min=0),
            help="Relative check: stop starting blocks past this many seconds of measuring "
            "(--min-blocks always run); metrics still unresolved then pass with a note.",
        ),
        click.option(
            "--min-blocks",
            default=relative.DEFAULT_MIN_BLOCKS,
            show_default=True,
            type=click.IntRange(min=2),
            help="Relative check: blocks (one base and one head process each) before the "
            "first look.",
        ),
        click.option(
            "--max-blocks",
            default=relative.DEFAULT_MAX_BLOCKS,
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
    for option in reversed(options):
        fn = option(fn)
    return fn


@cli.command("check", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options
@baseline_option
@shard_option
@measure_options
@worker_options
@processes_option
@click.option(
    "--max-repeats",
    default=None,
    type=click.IntRange(min=1),
    help="Adaptive sampling: after REPEATS runs keep measuring a case until every verdict "
    "is clear, up to this many runs (default: 20; in-process runs only).",
)
@click.option(
    "--max-reruns",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="Confirm a case that is over a bound in up to this many fresh processes, one at a "
    "time, before it can be a regression; the processes are pooled.",
)
@inject_option
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
@click.option(
    "--profile",
    default="pr_test",
    show_default=True,
    help="Tolerance profile of the baseline: pr_test or long_term.",
)
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
@relative_options
def check(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    baseline_path: str | None,
    shard_spec: str | None,
    repeats: int,
    warmup: int,
    timeout: float | None,
    sync: str,
    progress: bool | None,
    devices_spec: str | None,
    isolate: bool,
    factory_spec: str | None,
    processes: int,
    max_repeats: int | None,
    max_reruns: int,
    inject: str | None,
    results_file: str | None,
    perf_log: str | None,
    profile: str,
    report_path: str | None,
    markdown_path: str | None,
    out: str | None,
    fail_on_missing: bool,
    advisory: bool,
    all_metrics: bool,
    against: str | None = None,
    against_ref: str | None = None,
    against_subdir: str | None = None,
    budget_s: float = 150.0,
    min_blocks: int = 4,
    max_blocks: int = 24,
    order_seed: int | None = None,
    write_baseline: str | None = None,
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
    """
    from perfguard import baseline as store
    from perfguard import report as rep
    from perfguard.inject import describe, inject_from
    from perfguard.metrics import STAGE_PEAK_PREFIX
    from perfguard.sglang import NOT_IN_PERF_LOG, perf_log_results, read_perf_log
    from perfguard.verdict import judge

    if against is not None or against_ref is not None:
        return _relative_check(
            platform_name=platform_name,
            cases_dir=cases_dir,
            case_ids=case_ids,
            match=match,
            tags=tags,
            shard_spec=shard_spec,
            repeats=repeats,
            warmup=warmup,
            timeout=timeout,
            sync=sync,
            devices_spec=devices_spec,
            factory_spec=factory_spec,
            inject=inject,
            report_path=report_path,
            markdown_path=markdown_path,
            out=out,
            fail_on_missing=fail_on_missing,
            advisory=advisory,
            all_metrics=all_metrics,
            against=against,
            against_ref=against_ref,
            against_subdir=against_subdir,
            budget_s=budget_s,
            min_blocks=min_blocks,
            max_blocks=max_blocks,
            order_seed=order_seed,
            write_baseline=write_baseline,
        )
    if write_baseline:
        raise PerfguardError("--write-baseline needs --against or --against-ref")
    if results_file and perf_log:
        raise PerfguardError("use either --results or --sglang-perf-log, not both")
    injection = inject_from(inject) if not (results_file or perf_log) else {}
    if inject and (results_file or perf_log):
        raise PerfguardError("--inject needs cases to run: it cannot apply to --results")
    if (shard_spec or devices_spec or isolate or factory_spec or processes > 1) and (
        results_file or perf_log
    ):
        raise PerfguardError(
            "--shard, --devices, --isolate, --factory and --processes need cases to run: "
            "they cannot apply to --results or --sglang-perf-log"
        )
    ignore_missing: tuple[str, ...] = ()
    settings: dict[str, Any]
    judgement = None
    if perf_log:
        if not baseline_path:
            raise PerfguardError("--sglang-perf-log needs --baseline (the log names no platform)")
        path = baseline_path
        baseline = _load_baseline(path)
        case_id = case_ids[0] if len(case_ids) == 1 else None
        if len(case_ids) > 1:
            raise PerfguardError("--sglang-perf-log takes at most one --case")
        results = perf_log_results(
            read_perf_log(perf_log), baseline, case_id=case_id, source=perf_log
        )
        # sglang's log has no per-stage allocator peaks either (`peak_memory:<Stage>`).
        ignore_missing = NOT_IN_PERF_LOG + tuple(
            sorted(
                {
                    m
                    for s in baseline.scenarios.values()
                    for m in s.metrics
                    if m.startswith(STAGE_PEAK_PREFIX)
                }
            )
        )
        settings = {"source": "sglang-perf-log", "perf_log": perf_log, "inject": None}
    elif results_file:
        results = _filter_results(rep.read_results(results_file), case_ids, match, tags)
        path = _baseline_path(baseline_path, results.platform, results.hardware)
        baseline = _load_baseline(path)
        if results.platform != baseline.platform:
            raise PerfguardError(
                f"{results_file} is from platform {results.platform!r} but {path} is a "
                f"baseline for {baseline.platform!r}"
            )
        settings = {
            "source": "results",
            "results_file": results_file,
            "repeats": results.settings.get("repeats"),
            "warmup": results.settings.get("warmup"),
            "inject": results.settings.get("inject"),
        }
    else:
        platform = probe(platform_name)
        cases = selected_cases(platform, cases_dir, case_ids, match, tags)
        path = _baseline_path(baseline_path, platform.name, platform.hardware_slug())
        baseline = _load_baseline(path)  # before running anything: a bad file fails fast
        store.check_platform(baseline, platform.name, path)
        baseline.profile(profile)
        cases = sharded(cases, shard_spec, path)
        store.check_threads(cases, platform.name, baseline, path)
        outcome, cap = _gate(
            cases,
            platform,
            baseline,
            profile,
            devices_spec=devices_spec,
            isolate=isolate,
            factory_spec=factory_spec,
            processes=processes,
            max_repeats=max_repeats,
            max_reruns=max_reruns,
            fail_on_missing=fail_on_missing,
            advisory=advisory,
            repeats=repeats,
            warmup=warmup,
            timeout=timeout,
            sync=sync,
            inject=injection,
            progress=progress,
        )
        results, judgement = outcome.results, outcome.judgement
        if out:
            rep.write_results(out, results)
        settings = {
            "source": "run",
            "repeats": repeats,
            "max_repeats": cap,
            "max_reruns": max_reruns,
            "processes": processes,
            "warmup": warmup,
            "sync": sync,
            "inject": describe(injection),
            "shard": shard_spec,
            "devices": devices_spec,
            "isolate": isolate,
        }
    if not perf_log:
        store.check_comparable(results, baseline, path)
    if results.hardware != baseline.hardware and not perf_log:
        click.echo(
            f"perfguard: warning: results are from hardware {results.hardware!r}, "
            f"the baseline from {baseline.hardware!r}",
            err=True,
        )
    if judgement is None:
        judgement = judge(
            results,
            baseline,
            profile,
            fail_on_missing=fail_on_missing,
            advisory=advisory,
            ignore_missing=ignore_missing,
        )
    report = rep.build_against(judgement, results, baseline, path, settings=settings)
    _emit_report(report, report_path, markdown_path, all_metrics)
    return report.exit_code


_NOT_RELATIVE = {
    "baseline_path": "--baseline",
    "results_file": "--results",
    "perf_log": "--sglang-perf-log",
    "processes": "--processes",
    "max_repeats": "--max-repeats",
    "max_reruns": "--max-reruns",
    "profile": "--profile",
}


def _relative_check(
    *,
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    shard_spec: str | None,
    repeats: int,
    warmup: int,
    timeout: float | None,
    sync: str,
    devices_spec: str | None,
    factory_spec: str | None,
    inject: str | None,
    report_path: str | None,
    markdown_path: str | None,
    out: str | None,
    fail_on_missing: bool,
    advisory: bool,
    all_metrics: bool,
    against: str | None,
    against_ref: str | None,
    against_subdir: str | None,
    budget_s: float,
    min_blocks: int,
    max_blocks: int,
    order_seed: int | None,
    write_baseline: str | None,
) -> int:
    """`check --against DIR` / `--against-ref REF`: composes `perfguard.relative`.

    Everything that can be wrong with the flags, the registry, the base checkout or the
    baseline file to write is checked before the first block runs, so a bad input
    measures nothing and writes nothing.
    """
    import contextlib

    from perfguard import baseline as store
    from perfguard import relative
    from perfguard import report as rep
    from perfguard.inject import describe, inject_from
    from perfguard.runner import Results
    from perfguard.workers import RunOptions, factory_from, import_factory, parse_devices

    ctx = click.get_current_context()
    for param, flag in _NOT_RELATIVE.items():
        source = ctx.get_parameter_source(param)
        if source is not None and source.name not in ("DEFAULT",):
            raise PerfguardError(f"{flag} does not apply to a relative check (--against)")
    if against is not None and against_ref is not None:
        raise PerfguardError("use either --against DIR or --against-ref REF, not both")
    if max_blocks < min_blocks:
        raise PerfguardError("--max-blocks must be at least --min-blocks")
    devices = parse_devices(devices_spec)
    if devices is not None and len(devices) > 1:
        raise PerfguardError("--devices: a relative check runs both sides on one device; list one")
    platform = probe(platform_name)
    cases = selected_cases(platform, cases_dir, case_ids, match, tags)
    cases = sharded(cases, shard_spec, None)
    multi = [c.id for c in cases if c.num_devices > 1]
    if multi:
        raise PerfguardError(
            f"case {multi[0]!r} needs more than one device: a relative check "
            "runs single-device cases only (select them with --case / --tag)"
        )
    factory = factory_from(factory_spec)
    if factory:
        import_factory(factory)
    injection = inject_from(inject)
    options = RunOptions(
        platform=platform.name, repeats=repeats, warmup=warmup, timeout=timeout, sync=sync,
        inject=injection, factory=factory,
    )  # fmt: skip
    environment = fingerprint(platform)
    if write_baseline:
        if injection:
            click.echo("perfguard: the injection applies to the head only", err=True)
        store.open_for_update(write_baseline, environment)  # a bad file fails now
    with contextlib.ExitStack() as stack:
        directory = against
        if against_ref is not None:
            directory = str(stack.enter_context(relative.temporary_worktree(against_ref)))
        assert directory is not None
        base = relative.probe_base(
            directory, subdir=against_subdir, factory=factory, ref=against_ref
        )
        for case in cases:
            relative.case_for_base(case, base)  # an unknown field fails before any block
        sides = {
            relative.HEAD: relative.head_side(options),
            relative.BASE: relative.base_side(options, base),
        }
        click.echo(
            f"perfguard: relative check of {len(cases)} case(s) against {base.describe()}, "
            f"base perfguard {base.version}; up to {max_blocks} blocks in {budget_s:g} s",
            err=True,
        )

        def on_block(index: int, block: Any, open_metrics: int) -> None:
            looked = f", {open_metrics} metric(s) unresolved" if open_metrics >= 0 else ""
            click.echo(
                f"perfguard: block {index + 1} ({block.order}) took {block.seconds:.1f} s" + looked,
                err=True,
            )

        outcome = relative.run_relative(
            cases,
            relative.process_blocks(sides, platform.name, devices),
            min_blocks=min_blocks,
            max_blocks=max_blocks,
            budget_s=budget_s,
            seed=order_seed,
            fail_on_missing=fail_on_missing,
            advisory=advisory,
            on_block=on_block,
        )
    against_info = {**base.to_json(), **outcome.summary()}
    if against_ref is not None:
        against_info["dir"] = f"{against_ref} (temporary worktree)"
    settings = {
        "source": "relative",
        "repeats": repeats,
        "warmup": warmup,
        "sync": sync,
        "inject": describe(injection),
        "shard": shard_spec,
        "devices": devices_spec,
        "factory": factory,
        "budget_s": budget_s,
        "min_blocks": min_blocks,
        "max_blocks": max_blocks,
    }
    report = rep.build_relative(
        outcome.judgement, environment=environment, against=against_info, settings=settings
    )
    if out:
        head = Results(environment=environment, settings=settings)
        head.cases = dict(outcome.pooled[relative.HEAD])
        rep.write_results(out, head)
    if write_baseline:
        base_env = {**environment, "git_commit": base.commit}
        for _, result in sorted(outcome.pooled[relative.BASE].items()):
            if result.status == "ok":
                store.record_case(write_baseline, result, base_env)
    _emit_report(report, report_path, markdown_path, all_metrics)
    return report.exit_code


def _gate(
    cases: list[Case],
    platform: Platform,
    baseline: Any,
    profile: str,
    *,
    devices_spec: str | None,
    isolate: bool,
    factory_spec: str | None,
    processes: int,
    max_repeats: int | None,
    max_reruns: int,
    fail_on_missing: bool,
    advisory: bool,
    repeats: int,
    **settings: Any,
) -> tuple[Any, int]:
    """Run the cases through `perfguard.gate`; the outcome and the runs cap it sampled to.

    Adaptive sampling needs the verdict after every run, so it applies when the cases
    run in this process; in workers each measurement is REPEATS runs.
    """
    from perfguard.gate import DEFAULT_MAX_REPEATS, run_gate
    from perfguard.workers import parse_devices, uses_workers

    in_process = not uses_workers(cases, parse_devices(devices_spec), isolate, processes)
    cap = max(repeats, max_repeats if max_repeats is not None else DEFAULT_MAX_REPEATS)
    adaptive = in_process and cap > repeats

    def measure(todo: Any, until_for: Any) -> Any:
        return run_selected(
            list(todo),
            platform,
            devices_spec,
            isolate,
            factory_spec,
            repeats=repeats,
            processes=processes,
            max_repeats=cap if adaptive else None,
            until_for=until_for if adaptive else None,
            **settings,
        )

    def confirm(todo: Any, until_for: Any) -> Any:
        # A fresh process for each confirmation: the process, not the run, is the unit
        # whose spread the verdict's interval needs (perfguard.gate).
        return run_selected(
            list(todo),
            platform,
            devices_spec,
            True,
            factory_spec,
            repeats=repeats,
            processes=1,
            **settings,
        )

    def on_event(case_id: str, message: str) -> None:
        click.echo(escape(f"perfguard: {case_id}: {message}"), err=True)

    outcome = run_gate(
        cases,
        baseline,
        profile,
        measure,
        confirm=confirm if in_process else None,
        adaptive=adaptive,
        max_reruns=max_reruns,
        fail_on_missing=fail_on_missing,
        advisory=advisory,
        max_repeats=cap if adaptive else None,
        on_event=on_event,
    )
    return outcome, cap if adaptive else repeats


def _emit_report(
    report: Any, report_path: str | None, markdown_path: str | None, all_metrics: bool
) -> None:
    """Write the JSON / Markdown files asked for, the job summary, and the console table.

    Renderings are made from the report as its JSON file holds it (figures rounded), so
    that `perfguard report render` of that file later prints exactly the same thing.
    """
    from perfguard import report as rep

    if report_path:
        rep.write_report(report_path, report)
    report = rep.Report.from_json(report.to_json())
    markdown = rep.render_markdown(report)
    if markdown_path:
        rep.write_markdown(markdown_path, markdown)
    rep.append_step_summary(markdown)
    rep.render_table(report, console(), all_metrics=all_metrics)


# ---- calibrate ---------------------------------------------------------------------------------


@cli.command("calibrate", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options
@baseline_option
@click.option(
    "--runs",
    default=5,
    show_default=True,
    type=click.IntRange(min=2),
    help="Fresh processes to measure each case in (the between-process noise needs 2+; "
    "--write needs 10+).",
)
@click.option(
    "--repeats",
    default=10,
    show_default=True,
    type=click.IntRange(min=3),
    help="Measured runs per process, and per measurement of the checks calibrated for.",
)
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0))
@click.option("--timeout", default=None, type=click.FloatRange(min=0, min_open=True))
@click.option(
    "--factory",
    "factory_spec",
    default=None,
    metavar="MODULE:FUNCTION",
    help="Build each case's pipeline with this callable (env: PERFGUARD_FACTORY).",
)
@click.option("--profile", default="pr_test", show_default=True, help="Tolerance profile.")
@click.option(
    "--check-processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="The --processes of the checks calibrated for.",
)
@click.option(
    "--max-reruns",
    default=2,
    show_default=True,
    type=click.IntRange(min=0),
    help="The --max-reruns of the checks calibrated for.",
)
@click.option(
    "--check-isolate",
    is_flag=True,
    help="The checks calibrated for run with --isolate (re-runs in fresh processes).",
)
@click.option(
    "--baseline-processes",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="The baseline's processes where the baseline does not record them.",
)
@click.option(
    "--trials",
    default=400,
    show_default=True,
    type=click.IntRange(min=50),
    help="Simulated checks per point (false-alarm resolution ~ 1/trials).",
)
@click.option("--all-metrics", is_flag=True, help="Per-step metrics too.")
@click.option(
    "--write",
    is_flag=True,
    help="Store the suggested bands as the cases' tolerance_overrides in the baseline.",
)
@click.option(
    "--json",
    "json_out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write every figure to this JSON file.",
)
def calibrate_command(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    baseline_path: str | None,
    runs: int,
    repeats: int,
    warmup: int,
    timeout: float | None,
    factory_spec: str | None,
    profile: str,
    check_processes: int,
    max_reruns: int,
    check_isolate: bool,
    baseline_processes: int,
    trials: int,
    all_metrics: bool,
    write: bool,
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
    import dataclasses
    import os

    from perfguard import baseline as store
    from perfguard import calibrate as calibration
    from perfguard.calibrate import CheckSetup, calibrate_case, suggested_overrides
    from perfguard.inject import ENV_INJECT, inject_from
    from perfguard.jsonio import write_json_atomic
    from perfguard.verdict import default_profiles

    if inject_from(None):
        raise PerfguardError(f"calibrate refuses fault injection (${ENV_INJECT} is set)")
    if write and runs < calibration.MIN_RUNS_TO_WRITE:
        raise PerfguardError(
            f"calibrate --write needs --runs >= {calibration.MIN_RUNS_TO_WRITE} (got {runs}): "
            f"from {runs} processes the simulated false-alarm rate moves in steps of "
            f"1/{runs}^2 = {1 / runs**2:.0%}, too coarse to hold a band to "
            f"{calibration.FALSE_ALARM_TARGET:.0%}"
        )
    platform = probe(platform_name)
    cases = selected_cases(platform, cases_dir, case_ids, match, tags)
    path = _baseline_path(baseline_path, platform.name, platform.hardware_slug())
    baseline = _load_baseline(path) if (write or os.path.exists(path)) else None
    if baseline is not None:
        store.check_platform(baseline, platform.name, path)
    prof = baseline.profile(profile) if baseline else default_profiles(platform.name)[profile]
    if write and baseline is not None:
        missing = [c.id for c in cases if c.id not in baseline.scenarios]
        if missing:
            raise PerfguardError(
                f"{path}: no scenario for {', '.join(missing)}: "
                "run gen-baselines for them before calibrate --write"
            )
    setup = CheckSetup(
        repeats=repeats,
        baseline_processes=baseline_processes,
        check_processes=check_processes,
        max_reruns=max_reruns,
        isolate=check_isolate,
        trials=trials,
    )
    results = run_selected(
        cases,
        platform,
        None,
        True,
        factory_spec,
        repeats=repeats,
        warmup=warmup,
        timeout=timeout,
        processes=runs,
    )
    out = console()
    report: dict[str, Any] = {"baseline": path if baseline else None, "profile": profile}
    calibrations = []
    for case in cases:
        scenario = baseline.scenarios.get(case.id) if baseline else None
        cal = calibrate_case(
            results.cases[case.id], prof, setup, scenario=scenario, all_metrics=all_metrics
        )
        calibrations.append(cal)
        report[case.id] = cal.to_json()
        if cal.error:
            out.print(escape(f"{case.id}: error: {cal.error}"))
            continue
        out.print(_calibration_table(cal, runs))
    out.print(
        "false alarms are per metric: a case gated on k metrics alarms at most k times as "
        "often (less, as its metrics move together); steps are left out unless --all-metrics"
    )
    if json_out:
        write_json_atomic(json_out, report)
    if write and baseline is not None:
        with store.lock(path):
            current = store.load(path)
            for cal in calibrations:
                if cal.error or not cal.detections:
                    continue
                scenario = current.scenarios[cal.case_id]
                merged = suggested_overrides(cal.detections, scenario.tolerance_overrides)
                current = current.with_scenario(
                    cal.case_id, dataclasses.replace(scenario, tolerance_overrides=merged)
                )
            store.save(path, current.touched())
        out.print(escape(f"{path}: suggested bands written as tolerance_overrides"))
    failed = any(c.error for c in calibrations)
    return EXIT_CASE_FAILED if failed else EXIT_OK


def _calibration_table(cal: Any, runs: int) -> Table:
    def pct(x: float | None) -> str:
        return "not caught" if x is None else f"+{x:.0%}"

    s = cal.setup
    table = Table(
        title=escape(
            f"{cal.case_id}: {runs} processes x {s.repeats} runs; checks of {s.check_processes} "
            f"process(es) x {s.repeats} runs vs a baseline of {s.baseline_processes}, "
            f"<= {s.max_reruns} re-runs {'in fresh processes' if s.fresh_reruns else 'in process'}"
            f", alpha {s.rule.alpha:g}"
        )
    )
    for col in (
        "metric",
        "median",
        "within",
        "between",
        "band (rel/abs)",
        "false alarms",
        "catches (95 %)",
        "suggested band",
        "false alarms ",
        "catches (95 %) ",
    ):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for d in cal.detections:
        n = d.noise
        table.add_row(
            escape(n.metric),
            f"{n.median:.3f} ms",
            f"{n.within:.1%}",
            f"{n.between:.1%}",
            f"{d.band.rel:g} / {d.band.abs:g}",
            f"{d.false_alarm:.1%}",
            pct(d.catches) if d.false_alarm <= 0.01 else "(too many alarms)",
            f"{d.suggested.rel:g} / {d.suggested.abs:g}",
            f"{d.suggested_false_alarm:.1%}",
            pct(d.suggested_catches),
        )
    return table


# ---- baselines ---------------------------------------------------------------------------------


@cli.group("baselines", context_settings=CONTEXT_SETTINGS)
def baselines_group() -> None:
    """Inspect, compare, merge and import baseline files."""


@baselines_group.command("validate", context_settings=CONTEXT_SETTINGS)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def baselines_validate(paths: tuple[str, ...]) -> int:
    """Check each baseline file against the schema; exit 2 if any is invalid."""
    from perfguard import baseline as store

    bad = 0
    for path in paths:
        try:
            b = store.load(path)
        except PerfguardError as exc:
            bad += 1
            click.echo(f"invalid: {exc}", err=True)
            continue
        console().print(
            escape(f"ok: {path} ({b.platform}/{b.hardware}, {len(b.scenarios)} scenario(s))")
        )
    if bad:
        raise PerfguardError(f"{bad} of {len(paths)} baseline file(s) are invalid")
    return EXIT_OK


@baselines_group.command("show", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--case", "case_id", default=None, help="Only this scenario.")
@click.option("--json", "as_json", is_flag=True, help="Print the (selected) JSON.")
def baselines_show(path: str, case_id: str | None, as_json: bool) -> int:
    """Print a baseline's metadata, tolerance profiles and scenarios."""
    from perfguard import baseline as store
    from perfguard.jsonio import dumps

    b = store.load(path)
    if case_id is not None and case_id not in b.scenarios:
        raise PerfguardError(f"{path}: no scenario {case_id!r}")
    ids = [case_id] if case_id else sorted(b.scenarios)
    if as_json:
        data = b.to_json()
        click.echo(dumps(data["scenarios"][case_id] if case_id else data), nl=False)
        return EXIT_OK
    out = console()
    meta = b.metadata
    out.print(
        escape(
            f"{path}: {b.platform}/{b.hardware}, updated {meta.get('updated')}, "
            f"git {str(meta.get('git_commit') or '-')[:12]}, {len(b.scenarios)} scenario(s)"
            + (" [advisory]" if meta.get("advisory") else "")
        )
    )
    prof = Table(title="tolerance profiles (rel / abs)")
    prof.add_column("class")
    for name in sorted(b.profiles):
        prof.add_column(escape(name + (" (advisory)" if b.profiles[name].advisory else "")))
    from perfguard.metrics import METRIC_CLASSES

    for cls in METRIC_CLASSES:
        prof.add_row(
            cls,
            *(
                f"{b.profiles[n].rel[cls]:g} / {b.profiles[n].abs[cls]:g}"
                for n in sorted(b.profiles)
            ),
        )
    out.print(prof)
    for cid in ids:
        s = b.scenarios[cid]
        table = Table(title=escape(cid + (f" — {s.notes}" if s.notes else "")))
        for col in ("metric", "median", "n", "iqr", "min", "max", "override"):
            table.add_column(col, justify="left" if col in ("metric", "override") else "right")
        for metric, summ in s.metrics.items():
            ov = s.tolerance_overrides.get(metric)

            def f(v: float | None) -> str:
                return "-" if v is None else f"{v:.3f}"

            table.add_row(
                escape(metric),
                f(summ.median),
                str(summ.n),
                f(summ.iqr),
                f(summ.min),
                f(summ.max),
                escape(json.dumps(ov)) if ov else "",
            )
        out.print(table)
    return EXIT_OK


@baselines_group.command("diff", context_settings=CONTEXT_SETTINGS)
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON (same as --format json).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "md", "json"]),
    default="table",
    show_default=True,
    help="md: the Markdown for a baseline pull request's description.",
)
def baselines_diff(a: str, b: str, as_json: bool, fmt: str) -> int:
    """Compare two baseline files: what moved from A (old) to B (new), and whether it matters.

    Per case and metric: old -> new median, the ratio with its 99 % interval from both
    sides' noise, and the change: slower / faster (credible and at least the metric's
    minimum effect), small (credible but below it), noise (the interval contains 1) or
    unknown (no spread on either side). Also scenarios added / removed and tolerances
    changed.
    """
    from perfguard import baseline as store
    from perfguard.jsonio import dumps

    d = store.diff(store.load(a), store.load(b))
    if as_json or fmt == "json":
        click.echo(dumps(d.to_json()), nl=False)
        return EXIT_OK
    if fmt == "md":
        from perfguard.report import render_baseline_diff_markdown

        click.echo(render_baseline_diff_markdown(d, a, b), nl=False)
        return EXIT_OK
    out = console()
    if d.empty:
        out.print("no difference in scenarios, figures or tolerances")
        return EXIT_OK
    for label, ids in (("added", d.added), ("removed", d.removed)):
        if ids:
            out.print(escape(f"{label}: {', '.join(ids)}"))
    if d.tolerance_changes:
        out.print(escape(f"tolerances changed: {', '.join(d.tolerance_changes)}"))
    if d.changed:
        table = Table(title=escape(f"{a} -> {b}"))
        for col in ("case", "metric", "old", "new", "new/old", f"{d.confidence:.0%} interval"):
            table.add_column(col, justify="left" if col in ("case", "metric") else "right")
        table.add_column("change")
        styles = {"slower": "red", "faster": "green"}
        for row in d.changed:
            ratio = row.ratio
            interval = (
                "-" if row.low is None or row.high is None else f"{row.low:.3f}-{row.high:.3f}"
            )
            change = row.change or "-"
            table.add_row(
                escape(row.case_id),
                escape(row.metric),
                "-" if row.old is None else f"{row.old:.3f}",
                "-" if row.new is None else f"{row.new:.3f}",
                "-" if ratio is None else f"{ratio:.3f}",
                interval,
                f"[{styles[change]}]{change}[/]" if change in styles else change,
            )
        out.print(table)
        counts = d.counts()
        out.print(
            f"{counts['slower']} slower, {counts['faster']} faster (credible, at least the "
            f"minimum effect); {counts['small']} small, {counts['noise']} within noise, "
            f"{counts['unknown']} without a known spread"
        )
    return EXIT_OK


@baselines_group.command("merge", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="The merged baseline (may be one of the inputs; written atomically under its lock).",
)
@click.option(
    "--prefer",
    type=click.Choice(["newest", "first"]),
    default=None,
    help="Resolve a case held with different figures: newest keeps the scenario updated "
    "last, first the first input's (default: such a conflict is an error).",
)
def baselines_merge(paths: tuple[str, ...], out: str, prefer: str | None) -> int:
    """Merge baseline files (e.g. the shards of `gen-baselines --shard K/N`) into one.

    Scenarios are deduplicated by case id; identical ones collapse to one. A case held
    with different figures is an error naming both files, the case and the first metric
    that differs, unless --prefer resolves it; the merged file records which input each
    such scenario came from (`source`). The inputs must share platform, hardware, thread
    policy, tolerance profiles and schema version (else exit 2 naming the field). Every
    input's notes and tolerance_overrides are kept; overrides that conflict are an error.
    """
    from perfguard.baseline_merge import merge_files

    result = merge_files(paths, out, prefer)
    b = result.baseline
    # Plain lines, not a rich console: paths are long and must not wrap mid-name in a log.
    click.echo(
        f"{out}: {len(b.scenarios)} scenario(s) from {len(result.inputs)} file(s) "
        f"({b.platform}/{b.hardware}); {len(result.collapsed)} identical in several "
        f"inputs, {len(result.conflicts)} conflict(s) resolved"
        + (f" with --prefer {prefer}" if result.conflicts else "")
    )
    for c in result.conflicts:
        click.echo(
            f"  {c.case_id}: kept {c.kept}, not {', '.join(c.dropped)} (first in {c.metric})"
        )
    return EXIT_OK


@baselines_group.command("import-sglang", context_settings=CONTEXT_SETTINGS)
@click.argument("src", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    "dst",
    required=True,
    type=click.Path(dir_okay=False),
    help="The perfguard baseline to write.",
)
@click.option(
    "--platform",
    "platform_name",
    type=click.Choice(PLATFORM_NAMES),
    default=None,
    help="Platform of the figures (default: guessed from the file: npu, rocm, cuda).",
)
@click.option(
    "--hardware", default=None, help="Hardware slug (default: from the file's metadata.hardware)."
)
def baselines_import_sglang(
    src: str, dst: str, platform_name: str | None, hardware: str | None
) -> int:
    """Convert an sglang perf_baselines.json into a perfguard baseline, keeping every figure.

    Fields with no perfguard equivalent are kept verbatim under `sglang_extra`.
    """
    from perfguard import baseline as store
    from perfguard.sglang import import_file

    b = import_file(src, platform=platform_name, hardware=hardware)
    with store.lock(dst):
        store.save(dst, b)
    console().print(
        escape(
            f"{dst}: {len(b.scenarios)} scenario(s) imported from {src} ({b.platform}/{b.hardware})"
        )
    )
    return EXIT_OK


# ---- report / merge ----------------------------------------------------------------------------


@cli.group("report", context_settings=CONTEXT_SETTINGS)
def report_group() -> None:
    """Render check reports."""


@report_group.command("render", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--format", "fmt", type=click.Choice(["md", "table", "json"]), default="md", show_default=True
)
@click.option("--all-metrics", is_flag=True, help="Table: show passing step metrics too.")
def report_render(path: str, fmt: str, all_metrics: bool) -> int:
    """Render a JSON report as Markdown (a PR comment), a console table or JSON."""
    from perfguard import report as rep

    report = rep.read_report(path)
    if fmt == "md":
        click.echo(rep.render_markdown(report), nl=False)
    elif fmt == "json":
        click.echo(rep.render_json(report), nl=False)
    else:
        rep.render_table(report, console(), all_metrics=all_metrics)
    return EXIT_OK


@cli.command("merge", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Merged report.")
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the merged Markdown report here.",
)
def merge_command(paths: tuple[str, ...], out: str, markdown_path: str | None) -> int:
    """Combine the reports of shards (disjoint case sets) into one; exits with its code."""
    from perfguard import report as rep

    merged = rep.merge([rep.read_report(p) for p in paths], sources=list(paths))
    rep.write_report(out, merged)
    if markdown_path:
        rep.write_markdown(markdown_path, rep.render_markdown(merged))
    console().print(escape(rep.summary_line(merged)))
    return merged.exit_code


# ---- report plot ---------------------------------------------------------------------------------


@report_group.command("plot", context_settings=CONTEXT_SETTINGS)
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
@click.option("--case", "case_ids", multiple=True, help="Only these cases (repeatable).")
def report_plot(path: str, out: str, case_ids: tuple[str, ...]) -> int:
    """Draw a report's per-stage medians against their baselines (extra `plots`)."""
    from perfguard import report as rep
    from perfguard.plots import plot_report_stages

    report = rep.read_report(path)
    rows = [
        {
            "case": case.case_id,
            "metric": m.metric,
            "median": None if m.measured is None else m.measured.median,
            "baseline": None if m.baseline is None else m.baseline.median,
            "bound": m.bound,
            "verdict": m.verdict,
        }
        for case in report.cases
        if not case_ids or case.case_id in case_ids
        for m in case.metrics
        if m.metric.startswith("stage:") and m.measured is not None
    ]
    title = f"{os.path.basename(path)}: {report.verdict} ({report.judgement.profile})"
    click.echo(str(plot_report_stages(rows, title=title, out=out)))
    return EXIT_OK


# ---- history -------------------------------------------------------------------------------------


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        default="perfguard-history.sqlite",
        show_default=True,
        envvar="PERFGUARD_HISTORY_DB",
        type=click.Path(dir_okay=False),
        help="SQLite archive (env: PERFGUARD_HISTORY_DB).",
    )(fn)


def series_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--since", default=None, help="Only reports dated on or after (ISO).")(fn)
    fn = click.option("--metric", default=None, help="Metric name, e.g. stage:DenoisingStage.")(fn)
    return click.option("--case", "case_id", default=None, help="Case id.")(fn)


def _iso_date(value: str | None, option: str) -> str | None:
    import datetime as dt

    if value is None:
        return None
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).isoformat()
    except ValueError as exc:
        raise PerfguardError(
            f"{option}: {value!r} is not an ISO date (YYYY-MM-DD[THH:MM])"
        ) from exc


@cli.group("history", context_settings=CONTEXT_SETTINGS)
def history_group() -> None:
    """Archive reports over time and find where performance changed."""


@history_group.command("add", context_settings=CONTEXT_SETTINGS)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
@click.option("--commit", default=None, help="Commit the reports measured (default: theirs).")
@click.option("--date", default=None, help="Date of the reports (default: their creation).")
def history_add(paths: tuple[str, ...], db: str, commit: str | None, date: str | None) -> int:
    """Store reports in the archive; the same report twice is stored once."""
    from perfguard.history import add_reports

    added, skipped = add_reports(db, paths, commit=commit, date=_iso_date(date, "--date"))
    click.echo(f"{db}: {added} report(s) added, {skipped} already present")
    return EXIT_OK


@history_group.command("show", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON records.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
def history_show(
    db: str,
    case_id: str | None,
    metric: str | None,
    since: str | None,
    as_json: bool,
    as_csv: bool,
) -> int:
    """A metric over commits: median, spread, baseline and verdict per report."""
    from perfguard.history import load

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    if as_json:
        click.echo(frame.to_json(orient="records", indent=2))
        return EXIT_OK
    if as_csv:
        click.echo(frame.to_csv(index=False), nl=False)
        return EXIT_OK
    table = Table(title=escape(f"{db}: {len(frame)} row(s)"))
    cols = (
        "date",
        "commit",
        "case",
        "metric",
        "n",
        "median",
        "iqr",
        "baseline",
        "ratio",
        "verdict",
    )
    for col in cols:
        table.add_column(col, justify="right" if col in ("n", "median", "iqr", "ratio") else "left")

    def cell(value: Any, digits: int = 3) -> str:
        if value is None or (isinstance(value, float) and value != value):
            return "-"
        return f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    for r in frame.itertuples(index=False):
        table.add_row(
            escape(str(r.date)[:19]),
            escape(str(r.commit_sha or "-")[:10]),
            escape(str(r.case)),
            escape(str(r.metric)),
            cell(r.n),
            cell(r.median),
            cell(r.iqr),
            cell(r.baseline),
            cell(r.ratio, 4),
            escape(cell(r.verdict)),
        )
    console().print(table)
    return EXIT_OK


@history_group.command("changes", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options
@click.option("--min-ratio", default=0.02, show_default=True, help="Smallest change reported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history_changes(
    db: str,
    case_id: str | None,
    metric: str | None,
    since: str | None,
    min_ratio: float,
    as_json: bool,
) -> int:
    """Change points per case and metric: the commit, the size and the direction."""
    from perfguard.history import changes, load

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    found = changes(frame, min_ratio=min_ratio)
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        return EXIT_OK
    table = Table(title=f"{len(found)} change point(s)")
    for col in ("case", "metric", "commit", "date", "before", "after", "change"):
        table.add_column(col)
    for c in found:
        table.add_row(
            escape(c["case"]),
            escape(c["metric"]),
            escape(str(c["commit"] or "-")[:10]),
            escape(str(c["date"])[:19]),
            f"{c['before']:.3f}",
            f"{c['after']:.3f}",
            f"{(c['ratio'] - 1) * 100:+.1f}% {c['direction']}",
        )
    console().print(table)
    return EXIT_OK


@history_group.command("plot", context_settings=CONTEXT_SETTINGS)
@db_option
@click.option("--case", "case_id", required=True, help="Case id.")
@click.option("--metric", required=True, help="Metric name, e.g. stage:DenoisingStage.")
@click.option("--since", default=None, help="Only reports dated on or after (ISO).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
def history_plot(db: str, case_id: str, metric: str, since: str | None, out: str) -> int:
    """Draw a metric's series with its change points marked (extra `plots`)."""
    from perfguard.history import changes, load
    from perfguard.plots import plot_trend

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    series = frame.dropna(subset=["median"]).reset_index(drop=True)
    found = changes(series)
    click.echo(str(plot_trend(series, found, case=case_id, metric=metric, out=out)))
    return EXIT_OK
