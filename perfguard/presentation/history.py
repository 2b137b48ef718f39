"""A report archive in SQLite (standard library), read back through pandas.

`perfguard history add` stores, for each report, its environment, commit, date, profile
and, per case and metric, the sample summary (n, median, IQR, min, max), the baseline and
the verdict. A report is identified by the SHA-256 of its bytes, so adding it twice
stores it once. All reports of one `add` are validated before anything is written, and
written in one transaction: a malformed report leaves the archive as it was.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from perfguard.errors import PerfguardError

SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY,
    content_hash TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL,
    git_commit TEXT,
    date TEXT NOT NULL,
    platform TEXT,
    hardware TEXT,
    profile TEXT,
    verdict TEXT,
    environment TEXT NOT NULL,
    added_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now'))
);
CREATE TABLE IF NOT EXISTS metrics (
    report_id INTEGER NOT NULL REFERENCES reports(id) ON DELETE CASCADE,
    case_id TEXT NOT NULL,
    metric TEXT NOT NULL,
    n INTEGER,
    median REAL,
    iqr REAL,
    min REAL,
    max REAL,
    baseline REAL,
    ratio REAL,
    verdict TEXT,
    PRIMARY KEY (report_id, case_id, metric)
);
CREATE INDEX IF NOT EXISTS metrics_by_series ON metrics(case_id, metric);
"""


@dataclass(frozen=True)
class ReportRecord:
    """What the archive keeps of one report."""

    content_hash: str
    source: str
    git_commit: str | None
    date: str
    platform: str | None
    hardware: str | None
    profile: str | None
    verdict: str | None
    environment: dict[str, Any]
    rows: list[
        tuple[Any, ...]
    ]  # (case, metric, n, median, iqr, min, max, baseline, ratio, verdict)


def parse_report(
    path: str | Path, *, commit: str | None = None, date: str | None = None
) -> ReportRecord:
    """Read and check one `perfguard check` report; `PerfguardError` (exit 2) if malformed."""
    from perfguard.storage.reports import read_report  # schema and verdict consistency checks

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PerfguardError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    report = read_report(path)
    env = dict(report.environment)
    rows = []
    for case in report.cases:
        for m in case.metrics:
            s = m.measured
            rows.append(
                (
                    case.case_id,
                    m.metric,
                    None if s is None else s.n,
                    None if s is None else s.median,
                    None if s is None else s.iqr,
                    None if s is None else s.min,
                    None if s is None else s.max,
                    None if m.baseline is None else m.baseline.median,
                    m.ratio,
                    m.verdict,
                )
            )
    return ReportRecord(
        content_hash=hashlib.sha256(raw).hexdigest(),
        source=str(path),
        git_commit=commit or env.get("git_commit"),
        date=date or report.created,
        platform=env.get("platform"),
        hardware=env.get("hardware"),
        profile=report.judgement.profile,
        verdict=report.verdict,
        environment=env,
        rows=rows,
    )


LOCK_TIMEOUT_S = 10.0
"""How long `history add` waits for another writer's lock before giving up (exit 2)."""
_SQLITE_HEADER = b"SQLite format 3\x00"


def _database_error(path: Path, exc: sqlite3.Error) -> PerfguardError:
    """A `sqlite3` error as the one line a user can act on; the file is left as it was."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return PerfguardError(
            f"{path}: the history database is locked by another process "
            f"(waited {LOCK_TIMEOUT_S:g} s); left unchanged"
        )
    return PerfguardError(
        f"{path}: not a usable perfguard history database ({text}); left unchanged"
    )


def connect(db: str | Path) -> sqlite3.Connection:
    """Open (or create) the archive for writing, refusing any file that is not one.

    A file that is not SQLite, or an SQLite database with other tables, is an error that
    leaves it untouched: creating perfguard's tables in someone else's database (the
    wrong `--db`) would change a file the user never meant to give us.
    """
    path = Path(db)
    try:
        if path.is_file() and path.stat().st_size > 0:
            with path.open("rb") as fh:
                if fh.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                    raise PerfguardError(
                        f"{path}: not an SQLite database (not a perfguard history); left unchanged"
                    )
    except OSError as exc:
        raise PerfguardError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        conn = sqlite3.connect(str(path), timeout=LOCK_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise _database_error(path, exc) from exc
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and not {"reports", "metrics"} <= tables:
            raise PerfguardError(
                f"{path}: not a perfguard history database (its tables: "
                f"{', '.join(sorted(tables))}); left unchanged"
            )
        conn.executescript(SCHEMA)
    except sqlite3.Error as exc:
        conn.close()
        raise _database_error(path, exc) from exc
    except BaseException:
        conn.close()
        raise
    return conn


def add_reports(
    db: str | Path,
    paths: Sequence[str | Path],
    *,
    commit: str | None = None,
    date: str | None = None,
) -> tuple[int, int]:
    """Archive reports; returns (added, already present). All or nothing."""
    records = [parse_report(p, commit=commit, date=date) for p in paths]  # validate first
    added = skipped = 0
    try:
        with closing(connect(db)) as conn, conn:
            for rec in records:
                # Only a report already stored (same bytes) is skipped; `INSERT OR IGNORE` would
                # also skip, silently, a row that breaks any other constraint.
                cur = conn.execute(
                    "INSERT INTO reports (content_hash, source, git_commit, date, platform,"
                    " hardware, profile, verdict, environment) VALUES (?,?,?,?,?,?,?,?,?)"
                    " ON CONFLICT (content_hash) DO NOTHING",
                    (
                        rec.content_hash,
                        rec.source,
                        rec.git_commit,
                        rec.date,
                        rec.platform,
                        rec.hardware,
                        rec.profile,
                        rec.verdict,
                        json.dumps(rec.environment, sort_keys=True),
                    ),
                )
                if cur.rowcount == 0:
                    skipped += 1
                    continue
                report_id = cur.lastrowid
                conn.executemany(
                    "INSERT INTO metrics (report_id, case_id, metric, n, median, iqr, min, max,"
                    " baseline, ratio, verdict) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    [(report_id, *row) for row in rec.rows],
                )
                added += 1
    except sqlite3.Error as exc:  # e.g. locked between the checks and the write
        raise _database_error(Path(db), exc) from exc
    except UnicodeDecodeError as exc:
        raise PerfguardError(
            f"{db}: damaged history database: a text field is not UTF-8; left unchanged"
        ) from exc
    return added, skipped


def load(
    db: str | Path,
    *,
    case: str | None = None,
    metric: str | None = None,
    since: str | None = None,
) -> pd.DataFrame:
    """One row per report, case and metric, oldest first (by date, then insertion).

    The database is opened read-only: reading the wrong file is an error that leaves the
    file as it was, rather than one that adds perfguard's tables to it.
    """
    path = Path(db)
    if not path.is_file():
        raise PerfguardError(f"{path}: no such history database (create it with `history add`)")
    where, params = [], []
    if case:
        where.append("m.case_id = ?")
        params.append(case)
    if metric:
        # A bare stage name (`DenoisingStage`, as users type it) matches its stage.
        names = metric_names(metric)
        where.append(f"m.metric IN ({', '.join('?' * len(names))})")
        params.extend(names)
    if since:
        where.append("r.date >= ?")
        params.append(since)
    sql = (
        "SELECT r.date, r.git_commit AS commit_sha, r.platform, r.hardware, r.profile,"
        " m.case_id AS 'case', m.metric, m.n, m.median, m.iqr, m.min, m.max, m.baseline,"
        " m.ratio, m.verdict, r.id AS report_id"
        " FROM metrics m JOIN reports r ON r.id = m.report_id"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY r.date, r.id, m.case_id, m.metric"
    )
    try:
        with closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            if not {"reports", "metrics"} <= tables:
                raise PerfguardError(f"{path}: not a perfguard history database (no tables)")
            frame = pd.read_sql_query(sql, conn, params=params)
            if frame.empty and (case or metric or since):
                raise PerfguardError(f"{path}: {_no_match(conn, case, metric, since)}")
            return frame
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        raise PerfguardError(f"{path}: not a perfguard history database: {exc}") from exc
    except UnicodeDecodeError as exc:  # a damaged page: a text field that is not UTF-8
        raise PerfguardError(
            f"{path}: damaged history database: a text field is not UTF-8 ({exc.reason})"
        ) from exc


def metric_names(metric: str) -> list[str]:
    """The stored names a `--metric` filter matches: itself and, for a bare name such as
    `DenoisingStage`, `stage:DenoisingStage`."""
    return [metric] if ":" in metric else [metric, f"stage:{metric}"]


def _no_match(
    conn: sqlite3.Connection, case: str | None, metric: str | None, since: str | None
) -> str:
    """Why a filter found nothing, with what the archive does hold (a filter that matches
    nothing is an error, not an empty table a script would read as "no change")."""
    asked = [
        f"{k} {v!r}" for k, v in (("--case", case), ("--metric", metric), ("--since", since)) if v
    ]
    parts = [f"no rows match {' '.join(asked)}"]
    for column, value in (("case_id", case), ("metric", metric)):
        if value:
            known = [
                r[0] for r in conn.execute(f"SELECT DISTINCT {column} FROM metrics ORDER BY 1")
            ]
            shown = ", ".join(known[:12]) + (
                f", ... ({len(known)} in all)" if len(known) > 12 else ""
            )
            parts.append(
                f"{'cases' if column == 'case_id' else 'metrics'} stored: {shown or 'none'}"
            )
    return "; ".join(parts)


def changes(
    frame: pd.DataFrame,
    *,
    min_size: int = 3,
    beta: float = 8.0,
    min_ratio: float = 0.02,
) -> list[dict[str, Any]]:
    """Change points of every (case, metric) series in `frame` (see `changepoints`)."""
    from perfguard.presentation.changepoints import detect

    out: list[dict[str, Any]] = []
    for (case_id, metric), series in frame.groupby(["case", "metric"], sort=True):
        series = series.dropna(subset=["median"]).reset_index(drop=True)
        for change in detect(
            series["median"].tolist(), min_size=min_size, beta=beta, min_ratio=min_ratio
        ):
            row = series.iloc[change.index]
            out.append(
                {
                    "case": case_id,
                    "metric": metric,
                    "commit": row["commit_sha"],
                    "date": row["date"],
                    "index": change.index,
                    "before": change.before,
                    "after": change.after,
                    "ratio": change.ratio,
                    "direction": change.direction,
                }
            )
    return out
