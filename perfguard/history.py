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
    from perfguard.report import read_report  # schema and verdict consistency checks

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


def connect(db: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(db))
    conn.execute("PRAGMA foreign_keys = ON")
    conn.executescript(SCHEMA)
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
        where.append("m.metric = ?")
        params.append(metric)
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
            return pd.read_sql_query(sql, conn, params=params)
    except (sqlite3.DatabaseError, pd.errors.DatabaseError) as exc:
        raise PerfguardError(f"{path}: not a perfguard history database: {exc}") from exc


def changes(
    frame: pd.DataFrame,
    *,
    min_size: int = 3,
    beta: float = 8.0,
    min_ratio: float = 0.02,
) -> list[dict[str, Any]]:
    """Change points of every (case, metric) series in `frame` (see `changepoints`)."""
    from perfguard.changepoints import detect

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
