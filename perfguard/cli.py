"""The `perfguard` command line: parses flags, calls the library, renders the result.

Library modules do the work and raise `PerfguardError` for anything the user got wrong;
`main()` is the one place that turns it into a one-line message and an exit code.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfguard import __version__
from perfguard.cases import Case, load_registry, select
from perfguard.errors import EXIT_CODES_HELP, EXIT_USAGE, PerfguardError
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
    return cases


# ---- group -------------------------------------------------------------------------------------


@click.group(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="perfguard")
def cli() -> None:
    """perfguard: stage-level performance baselines and a CI gate for diffusion serving."""


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and map `PerfguardError` to its one-line message and code."""
    try:
        rv = cli.main(args=argv, prog_name="perfguard", standalone_mode=False)
    except PerfguardError as exc:
        click.echo(f"perfguard: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("perfguard: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


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
        table.add_row(key, str(value))
    console().print(table)


# ---- list-cases --------------------------------------------------------------------------------


@cli.command("list-cases", context_settings=CONTEXT_SETTINGS)
@platform_option
@selection_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of case objects.")
def list_cases(
    platform_name: str | None,
    cases_dir: str | None,
    case_ids: tuple[str, ...],
    match: str | None,
    tags: tuple[str, ...],
    as_json: bool,
) -> None:
    """List the cases selected for this platform, with the file each came from."""
    platform = probe(platform_name)
    cases = select(load_registry(platform.name, cases_dir), case_ids, match, tags)
    if as_json:
        click.echo(json.dumps([c.to_json() for c in cases], indent=2, sort_keys=True))
        return
    table = Table(title=f"cases for {platform.name} ({len(cases)})")
    for col in ("id", "workload", "preset", "size", "steps", "batch", "devices", "tags", "file"):
        table.add_column(col)
    for c in cases:
        table.add_row(
            c.id,
            c.workload,
            c.preset,
            f"{c.width}x{c.height}",
            str(c.steps),
            str(c.batch),
            str(c.num_devices),
            ",".join(c.tags),
            c.source,
        )
    console().print(table)


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
        unit = "MB" if comp.metric == "peak_memory" else "ms"
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
