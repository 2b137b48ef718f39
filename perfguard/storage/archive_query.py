"""Reading the history archive: one row per report, case and metric, filtered.

The archive is read in a read-only transaction (an SQLite file is opened read-only), so
reading the wrong file leaves it as it was; an older archive is read as it is, with the
columns it lacks read as empty. A filter that matches nothing is an error that names what
the archive does hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.errors import PerfguardError
from perfguard.storage.archive import connected, locate
from perfguard.storage.archive_schema import refuse_newer, schema_version, tables

if TYPE_CHECKING:
    from sqlalchemy import Select, Table
    from sqlalchemy.engine import Connection

_FRAME = (
    ("reports", "date", "date"),
    ("reports", "git_commit", "commit_sha"),
    ("reports", "platform", "platform"),
    ("reports", "hardware", "hardware"),
    ("reports", "profile", "profile"),
    ("reports", "inject", "inject"),
    ("metrics", "case_id", "case"),
    ("metrics", "metric", "metric"),
    ("metrics", "n", "n"),
    ("metrics", "median", "median"),
    ("metrics", "iqr", "iqr"),
    ("metrics", "min", "min"),
    ("metrics", "max", "max"),
    ("metrics", "baseline", "baseline"),
    ("metrics", "bound", "bound"),
    ("metrics", "improvement_bound", "improvement_bound"),
    ("metrics", "ratio", "ratio"),
    ("metrics", "ratio_low", "ratio_low"),
    ("metrics", "ratio_high", "ratio_high"),
    ("metrics", "verdict", "verdict"),
    ("metrics", "reason", "reason"),
    ("reports", "verdict", "report_verdict"),
    ("reports", "id", "report_id"),
    ("reports", "content_hash", "content_hash"),
)
"""(table, column, name in the frame) for each column a history row holds, in order."""

FRAME_COLUMNS = tuple(name for _, _, name in _FRAME)


@dataclass(frozen=True)
class Filter:
    """The rows a history command looks at (None: any)."""

    case: str | None = None
    metrics: tuple[str, ...] | None = None
    since: str | None = None
    metric_asked: str | None = None  # as typed, for the "no rows match" message


def read_rows(db: str | Path, flt: Filter = Filter()) -> list[tuple[Any, ...]]:
    """One tuple per report, case and metric (`FRAME_COLUMNS`), oldest first (by date, then
    insertion). The archive is read in a read-only transaction (an SQLite file is opened
    read-only): reading the wrong file leaves it as it was."""
    loc = locate(db)
    if loc.is_sqlite and not Path(loc.target).is_file():
        raise PerfguardError(
            f"{loc.label}: no such history database (create it with `history add`)"
        )
    with connected(loc, write=False) as conn:
        version = schema_version(conn, loc.label)
        if version is None:
            raise PerfguardError(f"{loc.label}: not a perfguard history database (no tables)")
        refuse_newer(version, loc.label)
        rows = [tuple(r) for r in conn.execute(_filtered(_frame_select(conn), flt))]
        if not rows and (flt.case or flt.metrics or flt.since):
            raise PerfguardError(f"{loc.label}: {_no_match(conn, flt)}")
        return rows


def _frame_select(conn: Connection) -> Select[Any]:
    """The frame's columns from `metrics` joined to `reports`; a column the archive's
    version lacks is selected as NULL under its name."""
    from sqlalchemy import inspect, literal, select

    _, _, reports, metrics = tables()
    by_name: dict[str, Table] = {"reports": reports, "metrics": metrics}
    have = {t: {c["name"] for c in inspect(conn).get_columns(t)} for t in ("reports", "metrics")}
    columns = [
        by_name[table].c[column].label(name) if column in have[table] else literal(None).label(name)
        for table, column, name in _FRAME
    ]
    return select(*columns).select_from(metrics.join(reports, reports.c.id == metrics.c.report_id))


def _filtered(stmt: Select[Any], flt: Filter) -> Select[Any]:
    """`stmt` restricted to the filter's case, metrics and dates, oldest first."""
    _, _, reports, metrics = tables()
    if flt.case:
        stmt = stmt.where(metrics.c.case_id == flt.case)
    if flt.metrics:
        stmt = stmt.where(metrics.c.metric.in_(flt.metrics))
    if flt.since:
        stmt = stmt.where(reports.c.date >= flt.since)
    return stmt.order_by(reports.c.date, reports.c.id, metrics.c.case_id, metrics.c.metric)


def _no_match(conn: Connection, flt: Filter) -> str:
    """Why a filter found nothing, with what the archive does hold (a filter that matches
    nothing is an error, not an empty table a script would read as "no change")."""
    from sqlalchemy import select

    _, _, _, metrics = tables()
    asked = [
        f"{k} {v!r}"
        for k, v in (("--case", flt.case), ("--metric", flt.metric_asked), ("--since", flt.since))
        if v
    ]
    parts = [f"no rows match {' '.join(asked)}"]
    for column, value, name in (
        (metrics.c.case_id, flt.case, "cases"),
        (metrics.c.metric, flt.metric_asked, "metrics"),
    ):
        if value:
            known = [r[0] for r in conn.execute(select(column).distinct().order_by(column))]
            shown = ", ".join(known[:12]) + (
                f", ... ({len(known)} in all)" if len(known) > 12 else ""
            )
            parts.append(f"{name} stored: {shown or 'none'}")
    return "; ".join(parts)
