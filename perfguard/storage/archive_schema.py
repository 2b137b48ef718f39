"""The history archive's schema: its tables, its version and the migrations between versions.

The schema carries its version in `perfguard_meta`. An older archive is migrated (the
numbered steps in `MIGRATIONS`) inside the add's transaction; a newer one is refused, since
an older perfguard would silently drop what it does not know. Readers never write: they
read an older archive as it is, with the columns it lacks read as empty.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfguard.errors import PerfguardError

if TYPE_CHECKING:  # sqlalchemy is imported when an archive is opened
    from sqlalchemy import MetaData, Table
    from sqlalchemy.engine import Connection

    from perfguard.storage.archive import Location

SCHEMA_VERSION = 2
"""1: `reports` and `metrics` (perfguard 0.1's SQLite archive, no version table);
2: `perfguard_meta` with the version, `reports.inject`, `metrics.bound` and
`improvement_bound` (the band), `ratio_low` and `ratio_high` (the interval the verdict
was decided on), `metrics.reason` (the verdict's reason)."""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "CREATE TABLE perfguard_meta (key VARCHAR(64) NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
        "ALTER TABLE reports ADD COLUMN inject TEXT",
        "ALTER TABLE metrics ADD COLUMN bound DOUBLE PRECISION",
        "ALTER TABLE metrics ADD COLUMN improvement_bound DOUBLE PRECISION",
        "ALTER TABLE metrics ADD COLUMN ratio_low DOUBLE PRECISION",
        "ALTER TABLE metrics ADD COLUMN ratio_high DOUBLE PRECISION",
        "ALTER TABLE metrics ADD COLUMN reason TEXT",
    ),
}
"""Version -> the statements that bring an archive of the version below to it. Each
statement is plain SQL that SQLite and PostgreSQL both run; the version row is written by
`_migrate` in the same transaction."""

_ADVISORY_LOCK = 0x70657266  # "perf": serializes schema set-up between runners
_TABLES = ("reports", "metrics")


def tables() -> Any:
    """The schema as SQLAlchemy Core tables, `(metadata, meta, reports, metrics)` (built on
    first use: sqlalchemy loads lazily)."""
    global _SCHEMA
    if _SCHEMA is not None:
        return _SCHEMA
    from sqlalchemy import Column, MetaData, String, Table, Text

    md = MetaData()
    meta = Table(
        "perfguard_meta",
        md,
        Column("key", String(64), primary_key=True),
        Column("value", Text, nullable=False),
    )
    _SCHEMA = (md, meta, _reports_table(md), _metrics_table(md))
    return _SCHEMA


_SCHEMA: Any = None


def _reports_table(md: MetaData) -> Table:
    """One row per report, identified by the SHA-256 of its bytes."""
    from sqlalchemy import Column, Integer, String, Table, Text

    return Table(
        "reports",
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("content_hash", String(64), nullable=False, unique=True),
        Column("source", Text, nullable=False),
        Column("git_commit", Text),
        Column("date", Text, nullable=False),
        Column("platform", Text),
        Column("hardware", Text),
        Column("profile", Text),
        Column("verdict", Text),
        Column("environment", Text, nullable=False),
        Column("added_at", Text, nullable=False),
        Column("inject", Text),
    )


def _metrics_table(md: MetaData) -> Table:
    """One row per report, case and metric, indexed by series (case, metric)."""
    from sqlalchemy import (
        Column,
        Float,
        ForeignKey,
        Index,
        Integer,
        PrimaryKeyConstraint,
        Table,
        Text,
    )

    metrics = Table(
        "metrics",
        md,
        Column("report_id", Integer, ForeignKey("reports.id", ondelete="CASCADE"), nullable=False),
        Column("case_id", Text, nullable=False),
        Column("metric", Text, nullable=False),
        Column("n", Integer),
        Column("median", Float),
        Column("iqr", Float),
        Column("min", Float),
        Column("max", Float),
        Column("baseline", Float),
        Column("ratio", Float),
        Column("verdict", Text),
        Column("bound", Float),
        Column("improvement_bound", Float),
        Column("ratio_low", Float),
        Column("ratio_high", Float),
        Column("reason", Text),
        PrimaryKeyConstraint("report_id", "case_id", "metric"),
    )
    Index("metrics_by_series", metrics.c.case_id, metrics.c.metric)
    return metrics


def _table_names(conn: Connection) -> set[str]:
    from sqlalchemy import inspect

    return set(inspect(conn).get_table_names())


def schema_version(conn: Connection, label: str) -> int | None:
    """The archive's schema version; None for an empty database; an error for a database
    with other tables (the wrong `--db`: never add perfguard's tables to it)."""
    from sqlalchemy import select

    names = _table_names(conn)
    if not names:
        return None
    if not set(_TABLES) <= names:
        raise PerfguardError(
            f"{label}: not a perfguard history database (its tables: "
            f"{', '.join(sorted(names)[:12])}); left unchanged"
        )
    if "perfguard_meta" not in names:
        return 1
    _, meta, _, _ = tables()
    value = conn.execute(
        select(meta.c.value).where(meta.c.key == "schema_version")
    ).scalar_one_or_none()
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise PerfguardError(
            f"{label}: perfguard_meta.schema_version: {value!r} is not a schema version; "
            "left unchanged"
        ) from None


def refuse_newer(version: int, label: str) -> None:
    if version > SCHEMA_VERSION:
        raise PerfguardError(
            f"{label}: the archive's schema version {version} is newer than this perfguard's "
            f"({SCHEMA_VERSION}): upgrade perfguard to read or add to it; left unchanged"
        )


def _migrate(conn: Connection, version: int) -> None:
    """Bring an archive from `version` to `SCHEMA_VERSION`, in the caller's transaction."""
    from sqlalchemy import text

    _, meta, _, _ = tables()
    for target in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[target]:
            conn.execute(text(statement))
    conn.execute(meta.delete().where(meta.c.key == "schema_version"))
    conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))


def ensure_schema(conn: Connection, loc: Location) -> None:
    """Create the schema in an empty database or migrate an older one (same transaction)."""
    from sqlalchemy import text

    version = schema_version(conn, loc.label)
    if version == SCHEMA_VERSION:
        return
    if not loc.is_sqlite:  # the SQLite writer already holds the database's write lock
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _ADVISORY_LOCK})
        version = schema_version(conn, loc.label)  # another runner may have done it meanwhile
        if version == SCHEMA_VERSION:
            return
    if version is None:
        md, meta, _, _ = tables()
        md.create_all(conn)
        conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
        return
    refuse_newer(version, loc.label)
    _migrate(conn, version)
