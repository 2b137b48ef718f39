"""`perfguard history ...`: the archive of reports, trends and change points (no torch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from perfguard.cli.common import CONTEXT_SETTINGS, console
from perfguard.errors import (
    EXIT_OK,
    PerfguardError,
)
from perfguard.presentation.tables import changes_table, history_table


def db_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--db",
        default="perfguard-history.sqlite",
        show_default=True,
        envvar="PERFGUARD_HISTORY_DB",
        type=click.Path(dir_okay=False),
        help="SQLite archive (env: PERFGUARD_HISTORY_DB).",
    )(fn)


def series_options(required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--case / --metric / --since, the series a history command looks at (`required`:
    --case and --metric must be given)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        since = "Only reports dated on or after (ISO)."
        fn = click.option("--since", default=None, help=since)(fn)
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


@click.group("history", context_settings=CONTEXT_SETTINGS)
def history_group() -> None:
    """Archive reports over time and find where performance changed."""


@history_group.command("add", context_settings=CONTEXT_SETTINGS)
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
@click.option("--commit", default=None, help="Commit the reports measured (default: theirs).")
@click.option("--date", default=None, help="Date of the reports (default: their creation).")
def history_add(paths: tuple[str, ...], db: str, commit: str | None, date: str | None) -> int:
    """Store reports in the archive; the same report twice is stored once."""
    from perfguard.presentation.history import add_reports

    added, skipped = add_reports(db, paths, commit=commit, date=_iso_date(date, "--date"))
    click.echo(f"{db}: {added} report(s) added, {skipped} already present")
    return EXIT_OK


@history_group.command("show", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options()
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
    from perfguard.presentation.history import load

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    if as_json:
        click.echo(frame.to_json(orient="records", indent=2))
        return EXIT_OK
    if as_csv:
        click.echo(frame.to_csv(index=False), nl=False)
        return EXIT_OK
    table = history_table(frame, f"{db}: {len(frame)} row(s)")
    console().print(table)
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
    since: str | None,
    min_ratio: float,
    as_json: bool,
) -> int:
    """Change points per case and metric: the commit, the size and the direction."""
    from perfguard.presentation.history import changes, load

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    found = changes(frame, min_ratio=min_ratio)
    if as_json:
        click.echo(json.dumps(found, indent=2, sort_keys=True))
        return EXIT_OK
    table = changes_table(found)
    console().print(table)
    return EXIT_OK


@history_group.command("plot", context_settings=CONTEXT_SETTINGS)
@db_option
@series_options(required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PNG to write.")
def history_plot(db: str, case_id: str, metric: str, since: str | None, out: str) -> int:
    """Draw a metric's series with its change points marked (extra `plots`)."""
    from perfguard.presentation.history import changes, load
    from perfguard.presentation.plots import plot_trend

    frame = load(db, case=case_id, metric=metric, since=_iso_date(since, "--since"))
    series = frame.dropna(subset=["median"]).reset_index(drop=True)
    found = changes(series)
    click.echo(str(plot_trend(series, found, case=case_id, metric=metric, out=out)))
    return EXIT_OK
