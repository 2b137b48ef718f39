"""`perfguard explain`: which ops got slower against a base revision."""

from __future__ import annotations

from pathlib import Path

import click

from perfguard import api
from perfguard.api.options import Selection
from perfguard.cli.common import (
    CONTEXT_SETTINGS,
    console,
    echo_err,
    import_root_option,
    platform_option,
    selection_options,
)
from perfguard.errors import EXIT_CODES_HELP, EXIT_OK
from perfguard.presentation.attribution import console_lines


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
@import_root_option("--against-subdir", "The base's import root inside DIR (sglang: python).")
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
    against = api.against_of(against_value, against_subdir)
    data = api.explain(selection, against, out_dir=out_dir, runs=runs, platform=platform_name)
    out = console()
    for line in console_lines(data["attribution"], top=top):
        out.print(line, markup=False, highlight=False)
    echo_err(f"perfguard: wrote {Path(out_dir) / 'attribution.json'} (.md, .html) and traces")
    return EXIT_OK
