"""The report archive: one schema, one code path, in SQLite (a path) or PostgreSQL (a URL).

`perfguard history add` stores, for each report, its environment, commit, date, profile,
fault injection (if any) and, per case and metric, the sample summary (n, median, IQR, min,
max), the baseline, the bound, the ratio with its interval and the verdict. A report is
identified by the SHA-256 of its bytes, so adding it twice stores it once.

Why SQLAlchemy Core (and not psycopg with hand-written SQL): the archive must behave the
same on an embedded SQLite file and on a PostgreSQL server that many runners share. Core
gives one set of table definitions and statements for both (the dialects render the
differences: `ON CONFLICT DO NOTHING ... RETURNING`, identity columns, the schema DDL),
parses and masks URLs (`URL.render_as_string(hide_password=True)`), and maps both
drivers' failures to one exception hierarchy; there is no ORM, so every statement the
archive runs is visible in this file. psycopg 3 is the PostgreSQL driver.

Transactions and concurrency:

- One `add` is one transaction: every report is validated before the database is opened,
  and the schema set-up, the migration (if any) and every insert commit together or not
  at all. A server that dies in the middle leaves nothing of the add behind.
- Reports are inserted with `ON CONFLICT (content_hash) DO NOTHING`: when two runners add
  the same report at once, PostgreSQL makes the second wait for the first's commit and
  then skip it (and insert it, should the first roll back); no duplicate, nothing lost.
- SQLite writers open their transaction with `BEGIN IMMEDIATE`: the write lock is taken
  first, so two writers never both read and then deadlock on upgrading their locks; a
  busy archive is waited for `LOCK_TIMEOUT_S`.
- Creating or migrating the schema on PostgreSQL runs under a transaction-scoped advisory
  lock, so that runners adding to a fresh database at once do not race to create it.

This module opens an archive and adds reports to it; the schema, its version and its
migrations are `perfguard.storage.archive_schema`, reading rows back is
`perfguard.storage.archive_query`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.errors import EXIT_CASE_FAILED, PerfguardError
from perfguard.storage.archive_schema import ensure_schema, tables

if TYPE_CHECKING:  # sqlalchemy is imported when an archive is opened
    from sqlalchemy.engine import Connection, Engine

    from perfguard.decision.records import MetricVerdict
    from perfguard.storage.reports import Report

LOCK_TIMEOUT_S = 10.0
"""How long an SQLite writer waits for another writer's lock before giving up (exit 2)."""
CONNECT_TIMEOUT_S = 10
"""How long a PostgreSQL connection attempt may take before the server counts as
unreachable (exit 3)."""
_SQLITE_HEADER = b"SQLite format 3\x00"

METRIC_COLUMNS = (
    "case_id",
    "metric",
    "n",
    "median",
    "iqr",
    "min",
    "max",
    "baseline",
    "ratio",
    "verdict",
    "bound",
    "improvement_bound",
    "ratio_low",
    "ratio_high",
    "reason",
)


@dataclass(frozen=True)
class ReportRecord:
    """What the archive keeps of one report; `rows` follow `METRIC_COLUMNS`."""

    content_hash: str
    source: str
    git_commit: str | None
    date: str
    platform: str | None
    hardware: str | None
    profile: str | None
    verdict: str | None
    inject: str | None
    environment: dict[str, Any]
    rows: list[tuple[Any, ...]]


def parse_report(
    path: str | Path,
    *,
    commit: str | None = None,
    date: str | None = None,
    allow_injected: bool = False,
) -> ReportRecord:
    """Read and check one `perfguard check` report; `PerfguardError` (exit 2) if malformed.

    A report measured with `--inject` is refused unless `allow_injected`: its slowdown is
    made on purpose, and in the archive it would read as a real change at that commit.
    When allowed, the injection is stored with the report (`reports.inject`).
    """
    from perfguard.storage.jsonio import read_text
    from perfguard.storage.reports import read_report  # schema and verdict consistency checks

    path = Path(path)
    # Through the readers' guards (regular files only, the size cap), so a FIFO is refused
    # rather than read for ever; UTF-8 without a BOM, so these are the file's own bytes.
    raw = read_text(path, "JSON file").encode("utf-8")
    report = read_report(path)
    inject = report.settings.get("inject") or None
    if inject and not allow_injected:
        raise PerfguardError(
            f"{path}: settings.inject: the report was measured with a fault injection "
            f"({inject}); its slowdown is not the code's. Refused (pass --allow-injected "
            "to store it, marked as injected)"
        )
    env = dict(report.environment)
    return ReportRecord(
        content_hash=hashlib.sha256(raw).hexdigest(),
        source=str(path),
        git_commit=commit or env.get("git_commit"),
        date=date or report.created,
        platform=env.get("platform"),
        hardware=env.get("hardware"),
        profile=report.judgement.profile,
        verdict=report.verdict,
        inject=str(inject) if inject else None,
        environment=env,
        rows=[_metric_row(case.case_id, m, report) for case in report.cases for m in case.metrics],
    )


def _metric_row(case_id: str, m: MetricVerdict, report: Report) -> tuple[Any, ...]:
    """One metric's row in `METRIC_COLUMNS` order: its samples' summary, the baseline, the
    band's bounds, the ratio with its interval, the verdict and its reason."""
    s = m.measured
    return (
        case_id,
        m.metric,
        None if s is None else s.n,
        None if s is None else s.median,
        None if s is None else s.iqr,
        None if s is None else s.min,
        None if s is None else s.max,
        None if m.baseline is None else m.baseline.median,
        m.ratio,
        m.verdict,
        m.bound,
        report.improvement_bound(m),
        m.low,
        m.high,
        m.reason or None,
    )


# ---- opening an archive ----------------------------------------------------------------------


@dataclass(frozen=True)
class Location:
    """Where an archive is: an SQLite file or a PostgreSQL URL, and how to name it in a
    message (a URL without its password)."""

    kind: str  # "sqlite" | "postgresql"
    target: str  # the file path, or the URL for SQLAlchemy
    label: str

    @property
    def is_sqlite(self) -> bool:
        return self.kind == "sqlite"


def locate(db: str | Path) -> Location:
    """Parse `--db`: a path (SQLite) or `postgresql://user:pass@host:port/name` (also
    `postgres://` and `postgresql+psycopg://`). Another scheme is an error (exit 2)."""
    text = str(db)
    if "://" not in text:
        return Location("sqlite", text, text)
    scheme = text.split("://", 1)[0].lower()
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if scheme == "sqlite":
        path = text.split("://", 1)[1].removeprefix("/")
        return Location("sqlite", path, path)
    if scheme not in ("postgresql", "postgres", "postgresql+psycopg"):
        shown = text.split("://", 1)[0] + "://..."
        raise PerfguardError(
            f"--db {shown}: unsupported archive scheme {scheme!r} "
            "(give a file path for SQLite or a postgresql:// URL)"
        )
    try:
        url = make_url("postgresql+psycopg://" + text.split("://", 1)[1])
    except ArgumentError as exc:
        raise PerfguardError(f"--db: not a valid postgresql:// URL ({exc})") from exc
    label = url.set(drivername="postgresql").render_as_string(hide_password=True)
    return Location("postgresql", url.render_as_string(hide_password=False), label)


def _sqlite_engine(path: Path, *, readonly: bool) -> Engine:
    from sqlalchemy import create_engine, event
    from sqlalchemy.pool import NullPool

    def creator() -> sqlite3.Connection:
        if readonly:
            target, uri = path.resolve().as_uri() + "?mode=ro", True
        else:
            target, uri = str(path), False
        # isolation_level=None: the driver issues no BEGIN of its own; the `begin` hook
        # below opens each transaction the way the archive needs.
        conn = sqlite3.connect(target, uri=uri, timeout=LOCK_TIMEOUT_S, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        return conn

    engine = create_engine("sqlite://", creator=creator, poolclass=NullPool)

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def _engine(loc: Location, *, readonly: bool) -> Engine:
    if loc.is_sqlite:
        return _sqlite_engine(Path(loc.target), readonly=readonly)
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise PerfguardError(
            f"{loc.label}: a PostgreSQL archive needs psycopg: pip install 'perfguard[history]'"
        ) from exc
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    return create_engine(
        loc.target,
        poolclass=NullPool,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S, "application_name": "perfguard"},
    )


def _check_sqlite_file(path: Path) -> None:
    try:
        if path.is_file() and path.stat().st_size > 0:
            with path.open("rb") as fh:
                if fh.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                    raise PerfguardError(
                        f"{path}: not an SQLite database (not a perfguard history); left unchanged"
                    )
    except OSError as exc:
        raise PerfguardError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def database_error(loc: Location, exc: BaseException, *, writing: bool) -> PerfguardError:
    """A driver's error as the one line a user can act on, naming the archive (a URL
    without its password). An unreachable server is exit 3 (the infrastructure failed);
    everything else (a wrong password, a missing database, a file that is not an
    archive, a lock held too long) is exit 2."""
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split())
    left = "; left unchanged" if writing else ""
    if loc.is_sqlite:
        if "locked" in text or "busy" in text:
            return PerfguardError(
                f"{loc.label}: the history database is locked by another process "
                f"(waited {LOCK_TIMEOUT_S:g} s){left}"
            )
        if not writing:
            return PerfguardError(f"{loc.label}: not a perfguard history database: {text}")
        return PerfguardError(
            f"{loc.label}: not a usable perfguard history database ({text}){left}"
        )
    low = text.lower()
    if "password" in low or "authentication" in low:
        return PerfguardError(f"{loc.label}: authentication failed ({_first_clause(text)}){left}")
    if "does not exist" in low and "database" in low:
        return PerfguardError(f"{loc.label}: {_first_clause(text)}{left}")
    lost = (
        "server closed the connection",
        "terminating connection",
        "connection has been closed",
        "consuming input failed",
        "the connection is lost",
        "connection already closed",
    )
    if writing and any(s in low for s in lost):
        return PerfguardError(
            f"{loc.label}: the connection to the server was lost during the add "
            f"({_first_clause(text)}); the add is one transaction, so its reports are stored "
            "whole or not at all: add them again (each is stored once)",
            exit_code=EXIT_CASE_FAILED,
        )
    connecting = ("connection refused", "could not connect", "timeout expired", "connection failed")
    if any(s in low for s in connecting) or "could not translate host" in low:
        return PerfguardError(
            f"{loc.label}: cannot reach the history server ({_first_clause(text)}); "
            f"exit {EXIT_CASE_FAILED}: the server, not the data, failed",
            exit_code=EXIT_CASE_FAILED,
        )
    return PerfguardError(f"{loc.label}: history database error ({_first_clause(text)}){left}")


def _first_clause(text: str) -> str:
    """The driver's message without its multi-line detail and without any password it may
    echo (libpq quotes the connection string in some messages)."""
    return text.split(" DETAIL:")[0].split(" HINT:")[0][:300]


@contextmanager
def connected(loc: Location, *, write: bool) -> Iterator[Connection]:
    """A transaction on the archive, its driver errors mapped by `database_error`."""
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    engine = _engine(loc, readonly=not write)
    try:
        with engine.begin() as conn:
            yield conn
    except PerfguardError:
        raise
    except (DBAPIError, SQLAlchemyError, sqlite3.Error) as exc:
        raise database_error(loc, exc, writing=write) from exc
    except UnicodeDecodeError as exc:  # a damaged page: a text field that is not UTF-8
        raise PerfguardError(
            f"{loc.label}: damaged history database: a text field is not UTF-8 ({exc.reason})"
        ) from exc
    finally:
        engine.dispose()


# ---- writing ---------------------------------------------------------------------------------


BeforeMetrics = Callable[["Connection", ReportRecord], None]
_before_metrics: BeforeMetrics | None = None
"""A test seam: called after a report's row is inserted and before its metrics are, inside
the transaction (the fault tests kill the server there)."""


def add_reports(
    db: str | Path,
    paths: Sequence[str | Path],
    *,
    commit: str | None = None,
    date: str | None = None,
    allow_injected: bool = False,
) -> tuple[int, int]:
    """Archive reports; returns (added, already present). All or nothing, one transaction."""
    records = [
        parse_report(p, commit=commit, date=date, allow_injected=allow_injected) for p in paths
    ]  # validate first: a malformed report never opens the database
    return add_records(db, records)


def add_records(db: str | Path, records: Sequence[ReportRecord]) -> tuple[int, int]:
    """Store parsed reports (`parse_report`) in one transaction: (added, already present)."""
    loc = locate(db)
    if loc.is_sqlite:
        _check_sqlite_file(Path(loc.target))
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    insert = sqlite_insert if loc.is_sqlite else pg_insert
    _, _, reports, metrics = tables()
    added = skipped = 0
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with connected(loc, write=True) as conn:
        ensure_schema(conn, loc)
        for rec in records:
            # Only a report already stored (same bytes) is skipped: the conflict target is
            # the content hash alone, so a row that breaks any other constraint still fails.
            stmt = (
                insert(reports)
                .values(
                    content_hash=rec.content_hash,
                    source=rec.source,
                    git_commit=rec.git_commit,
                    date=rec.date,
                    platform=rec.platform,
                    hardware=rec.hardware,
                    profile=rec.profile,
                    verdict=rec.verdict,
                    inject=rec.inject,
                    environment=json.dumps(rec.environment, sort_keys=True),
                    added_at=now,
                )
                .on_conflict_do_nothing(index_elements=["content_hash"])
                .returning(reports.c.id)
            )
            report_id = conn.execute(stmt).scalar_one_or_none()
            if report_id is None:
                skipped += 1
                continue
            if _before_metrics is not None:
                _before_metrics(conn, rec)
            if rec.rows:
                conn.execute(
                    metrics.insert(),
                    [
                        {"report_id": report_id, **dict(zip(METRIC_COLUMNS, row, strict=True))}
                        for row in rec.rows
                    ],
                )
            added += 1
    return added, skipped
