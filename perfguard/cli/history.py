"""`perfguard history ...`: the archive of reports, trends, change points, the site (no torch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from perfguard import api
from perfguard.cli.common import CONTEXT_SETTINGS, console
from perfguard.errors import (
    EXIT_OK,
    PerfguardError,
)
from perfguard.presentation.tables import changes_table, history_table

DB_HELP = (
    "The archive: an SQLite file path, or a postgresql://user:password@host:port/db URL "
    "(env: PERFGUARD_HISTORY). An unreachable server is exit 3."
)


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        default="perfguard-history.sqlite",
        show_default=True,
        # PERFGUARD_HISTORY_DB is the older name, still read.
        envvar=["PERFGUARD_HISTORY", "PERFGUARD_HISTORY_DB"],
        metavar="PATH|URL",
        help=DB_HELP,
    )(fn)


def series_options(required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--case / --metric / --hardware / --since, the series a history command looks at
    (`required`: --case and --metric must be given)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        since = "Only reports dated on or after (ISO)."
        fn = click.option("--since", default=None, help=since)(fn)
        hardware = "Only reports of this hardware slug (a series is per hardware)."
        fn = click.option("--hardware", default=None, help=hardware)(fn)
        metric = "Metric name, e.g. stage:DenoisingStage."
        fn = click.option("--metric", default=None, required=required, help=metric)(fn)
        return click.option("--case", "case_id", default=None, required=required, help="Case id.")(
            fn
        )

    return decorate


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


def _load(db: str, case_id: str | None, metric: str | None, hardware: str | None, since: Any):
    """The archive's rows for the asked series; an unknown --hardware is an error naming
    the hardware stored."""
    from perfguard.presentation.history import load

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    if hardware is not None:
        known = sorted({str(h) for h in frame["hardware"].dropna()})
        frame = frame[frame["hardware"] == hardware].reset_index(drop=True)
        if frame.empty:
            raise PerfguardError(
                f"{api.archive_label(db)}: no rows match --hardware {hardware!r}; "
                f"hardware stored: {', '.join(known) or 'none'}"
            )
    return frame


@click.group("history", context_settings=CONTEXT_SETTINGS)
def history_group() -> None:
    """Archive reports over time, find where performance changed, publish a site."""


@history_group.command("add", context_settings=CONTEXT_SETTINGS)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
@click.option("--commit", default=None, help="Commit the reports measured (default: theirs).")
@click.option("--date", default=None, help="Date of the reports (default: their creation).")
@click.option(
    "--allow-injected",
    is_flag=True,
    help="Store reports measured with --inject (refused otherwise), marked as injected.",
)
def history_add(
    paths: tuple[str, ...], db: str, commit: str | None, date: str | None, allow_injected: bool
) -> int:
    """Store reports in the archive in one transaction; the same report twice is stored once."""
    added, skipped = api.add_reports(
        db, paths, commit=commit, date=_iso_date(date, "--date"), allow_injected=allow_injected
    )
    click.echo(f"{api.archive_label(db)}: {added} report(s) added, {skipped} already present")
    return EXIT_OK


@history_group.command("show", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options()
@click.option("--all", "show_all", is_flag=True, help="Table: every row of every report matched.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records (every row matched).")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV (every row matched).")
def history_show(
    db: str,
    case_id: str | None,
    metric: str | None,
    hardware: str | None,
    since: str | None,
    show_all: bool,
    as_json: bool,
    as_csv: bool,
) -> int:
    """A metric over commits: median, spread, baseline and verdict per report.

    With no --case, --metric, --hardware or --since the table shows the newest report of
    each hardware (--all: every row); --json and --csv always give every row matched."""
    from perfguard.presentation.history import latest_report

    frame = _load(db, case_id, metric, hardware, since)
    if as_json:
        click.echo(frame.to_json(orient="records", indent=2))
        return EXIT_OK
    if as_csv:
        click.echo(frame.to_csv(index=False), nl=False)
        return EXIT_OK
    label = api.archive_label(db)
    reports = frame["report_id"].nunique()
    if show_all or case_id or metric or hardware or since:
        title = f"{label}: {len(frame)} row(s) of {reports} report(s)"
    else:
        frame = latest_report(frame)
        title = (
            f"{label}: the newest report of each hardware ({reports} report(s) stored; "
            "--case/--metric for a series, --all for every row)"
        )
    console().print(history_table(frame, title))
    return EXIT_OK


@history_group.command("changes", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options()
@click.option("--min-ratio", default=0.02, show_default=True, help="Smallest change reported.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def history_changes(
    db: str,
    case_id: str | None,
    metric: str | None,
    hardware: str | None,
    since: str | None,
    min_ratio: float,
    as_json: bool,
) -> int:
    """Change points per series (hardware, case, metric): the commit, the size, the direction.

    A series shorter than a change point needs (two levels of 3 reports) is said so."""
    from perfguard.presentation.history import changes, short_series

    frame = _load(db, case_id, metric, hardware, since)
    found = changes(frame, min_ratio=min_ratio)
    short = short_series(frame)
    note = None
    if short is not None:
        longest, needed = short
        note = (
            f"no change point can be found yet: a series needs at least {needed} reports "
            f"(two levels of {needed // 2}); the longest here has {longest}"
        )
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        if note:
            click.echo(note, err=True)
        return EXIT_OK
    if note:
        click.echo(note)
        return EXIT_OK
    console().print(changes_table(found))
    return EXIT_OK


@history_group.command("plot", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options(required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
def history_plot(
    db: str, case_id: str, metric: str, hardware: str | None, since: str | None, out: str
) -> int:
    """Draw one series with its baseline, bound and change points (extra `plots`)."""
    from perfguard.presentation.history import changes
    from perfguard.presentation.plots import plot_trend

    frame = _load(db, case_id, metric, hardware, since)
    series = frame.dropna(subset=["median"]).reset_index(drop=True)
    kinds = sorted(
        {f"{p}/{h}" for p, h in zip(series["platform"], series["hardware"], strict=True)}
    )
    if len(kinds) > 1:
        raise PerfguardError(
            f"--case {case_id} --metric {metric}: the series runs on {len(kinds)} hardware "
            f"({', '.join(kinds)}): pass --hardware to draw one"
        )
    found = changes(series)
    click.echo(str(plot_trend(series, found, case=case_id, metric=metric, out=out)))
    return EXIT_OK


@history_group.command("publish", context_settings=CONTEXT_SETTINGS)
@db_option
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory to write the static site to (replaced whole, atomically).",
)
@click.option("--since", default=None, help="Only reports dated on or after (ISO).")
@click.option("--title", default="perfguard history", show_default=True, help="Site title.")
def history_publish(db: str, out: str, since: str | None, title: str) -> int:
    """Write a static site of the archive: per case, every stage and counter over commits.

    Works from file:// and on GitHub Pages; plotly.js is bundled (no request leaves the
    site)."""
    from perfguard.presentation.site import publish

    summary = publish(db, out, since=_iso_date(since, "--since"), title=title)
    click.echo(summary)
    return EXIT_OK
