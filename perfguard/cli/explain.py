"""`perfguard explain` and `perfguard bisect`: which ops got slower, and which commit did it."""

from __future__ import annotations

from pathlib import Path

import click

from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    platform_option,
    selection_options,
)
from perfguard.errors import EXIT_CODES_HELP, EXIT_OK, PerfguardError
from perfguard.storage.cases import Selection


def against_of(value: str, subdir: str | None) -> object:
    """`--against DIR|REF`: an existing directory is a checkout, anything else a revision
    of this repository (checked out in a temporary worktree)."""
    from perfguard.measurement.relative import RelativeOptions

    if Path(value).is_dir():
        return RelativeOptions(directory=value, subdir=subdir)
    from perfguard.measurement.checkout import resolve_ref

    try:
        resolve_ref(value)
    except PerfguardError as exc:
        raise PerfguardError(f"--against {value}: not a directory, and {exc}") from exc
    return RelativeOptions(ref=value, subdir=subdir)


@click.command("explain", context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES_HELP)
@platform_option
@selection_options(shard=False)
@click.option(
    "--against",
    "against_value",
    required=True,
    metavar="DIR|REF",
    help="The base: a checkout directory, or a revision of this repository (a temporary "
    "`git worktree`, always removed).",
)
@click.option(
    "--against-subdir",
    default=None,
    metavar="SUB",
    help="The base's import root inside DIR (sglang: python).",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="perfguard-explain",
    show_default=True,
    help="Directory for attribution.json / .md / .html and each side's Chrome trace.",
)
@click.option(
    "--runs",
    type=click.IntRange(min=2),
    default=5,
    show_default=True,
    help="Profiled runs a side (the noise rule compares a change with their spread, "
    "the fastest and slowest set aside from five on).",
)
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="Rows per stage printed.")  # fmt: skip
def explain_command(
    platform_name: str | None,
    selection: Selection,
    against_value: str,
    against_subdir: str | None,
    out_dir: str,
    runs: int,
    top: int,
) -> int:
    """Where the time went: profile each selected case on the base and on this checkout
    (`torch.profiler`, a range per stage and step) and rank each stage's ops by their
    change in self time, with calls, shapes and each op's share of the stage's change.
    Nothing is judged and no timed run is profiled; a check attributes its regressed
    timings the same way by itself."""
    from perfguard import api
    from perfguard.presentation.attribution import console_lines

    against = against_of(against_value, against_subdir)
    data = api.explain(selection, against, out_dir=out_dir, runs=runs, platform=platform_name)
    out = console()
    for line in console_lines(data["attribution"], top=top):
        out.print(line, markup=False, highlight=False)
    echo_err(f"perfguard: wrote {Path(out_dir) / 'attribution.json'} (.md, .html) and traces")
    return EXIT_OK
