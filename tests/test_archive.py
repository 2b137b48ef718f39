"""The archive on both backends: an SQLite file and a real PostgreSQL server.

Every test taking `archive_db` runs twice, once on SQLite and once on a fresh database of
the server started by `postgres_server` (tests/pg_server.py; marked `postgres`).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import perfguard.storage.archive as archive
from perfguard.errors import PerfguardError
from perfguard.presentation.history import changes, load
from perfguard.storage.archive import add_reports, locate
from perfguard.storage.archive_schema import MIGRATIONS, SCHEMA_VERSION
from tests.helpers import history_report as _report  # a real report made by the library

PG = Any


def _injected(path: Path, seed: int = 0) -> Path:
    """A real report whose settings say it was measured with a fault injection."""
    _report(path, 30.0, seed=seed)
    data = json.loads(path.read_text())
    data["settings"]["inject"] = "DenoisingStage=+50%"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def _one_line(err: str, *parts: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], (part, lines[0])


# ---- both backends -------------------------------------------------------------------------


def test_add_show_and_changes_work_the_same_on_both_backends(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    levels = [20.0] * 8 + [26.0] * 8
    for i, level in enumerate(levels):
        rep = _report(tmp_path / f"r{i}.json", level, seed=i)
        assert add_reports(archive_db, [rep], commit=f"c{i:02d}", date=f"2026-03-{i + 1:02d}") == (
            1,
            0,
        )
    frame = load(archive_db, case="qwen_image_t2i_smoke", metric="DenoisingStage")
    assert list(frame["commit_sha"]) == [f"c{i:02d}" for i in range(16)]
    assert frame["bound"].notna().all() and frame["ratio_low"].notna().all()
    (change,) = changes(frame)
    assert change["commit"] == "c08" and change["hardware"] == "test-cpu"
    code, out, _ = pg("history", "changes", "--db", archive_db, "--metric", "DenoisingStage")
    assert code == 0 and "c08" in out and "+30" in out
    code, out, _ = pg("history", "add", str(tmp_path / "r0.json"), "--db", archive_db)
    assert code == 0 and "0 report(s) added, 1 already present" in out
    assert "s3cret" not in out and out.startswith(locate(archive_db).label)
    assert add_reports(archive_db, [tmp_path / "r3.json"]) == (0, 1)
    assert len(load(archive_db, metric="e2e")) == 16


def test_concurrent_adds_store_every_report_once(archive_db: str, tmp_path: Path) -> None:
    """Six runners at once, each adding its own reports and one report all of them add."""
    shared = _report(tmp_path / "shared.json", 20.0, seed=999)
    own = [[_report(tmp_path / f"w{w}-{i}.json", 20.0, seed=w * 10 + i) for i in range(3)]
           for w in range(6)]  # fmt: skip
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def runner(w: int) -> None:
        try:
            barrier.wait()
            for rep in [shared, *own[w]]:
                add_reports(archive_db, [rep], commit=f"w{w}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=runner, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    frame = load(archive_db, metric="e2e")
    assert frame["report_id"].nunique() == 6 * 3 + 1
    assert frame["content_hash"].is_unique


def test_a_fault_injected_report_is_refused_unless_asked_and_marked(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    rep = _injected(tmp_path / "inj.json")
    code, out, err = pg("history", "add", str(rep), "--db", archive_db)
    assert code == 2 and out == ""
    _one_line(err, "inj.json", "settings.inject", "DenoisingStage=+50%", "--allow-injected")
    if locate(archive_db).is_sqlite:
        assert not Path(archive_db).exists()  # refused before the archive was opened
    code, out, err = pg("history", "add", str(rep), "--db", archive_db, "--allow-injected")
    assert code == 0, err
    (row,) = json.loads(pg("history", "show", "--db", archive_db, "--metric", "e2e", "--json")[1])
    assert row["inject"] == "DenoisingStage=+50%"
    code, out, _ = pg("history", "show", "--db", archive_db, "--metric", "e2e")
    assert "injected DenoisingStage=+50%" in out


def test_changes_on_a_short_series_says_how_many_reports_it_needs(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    for i in range(2):
        add_reports(archive_db, [_report(tmp_path / f"r{i}.json", 20.0, seed=i)])
    code, out, _ = pg("history", "changes", "--db", archive_db)
    assert code == 0
    assert "a series needs at least 6 reports" in out and "the longest here has 2" in out
    code, out, err = pg("history", "changes", "--db", archive_db, "--json")
    assert code == 0 and json.loads(out) == [] and "at least 6 reports" in err


def test_show_without_a_filter_prints_the_newest_report_not_every_row(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    for i in range(2):
        add_reports(
            archive_db,
            [_report(tmp_path / f"r{i}.json", 20.0 + i, seed=i)],
            commit=f"commit{i}",
            date=f"2026-05-0{i + 1}",
        )
    code, out, _ = pg("history", "show", "--db", archive_db)
    assert code == 0 and "the newest report of each hardware" in out and "--all" in out
    assert "commit1" in out and "commit0" not in out
    code, out, _ = pg("history", "show", "--db", archive_db, "--all")
    assert code == 0 and "commit0" in out and "commit1" in out
    assert "6 row(s) of 2 report(s)" in out


def test_two_hardware_are_two_series(archive_db: str, tmp_path: Path, pg: PG) -> None:
    for i in range(16):
        for hw, step in (("h100-sxm", 1.3), ("h200-sxm", 1.0)):
            rep = _report(tmp_path / f"{hw}-{i}.json", 20.0 * (step if i >= 8 else 1.0), seed=i)
            data = json.loads(rep.read_text())
            data["environment"]["hardware"] = hw
            rep.write_text(json.dumps(data))
            add_reports(archive_db, [rep], commit=f"c{i:02d}", date=f"2026-04-{i + 1:02d}")
    found = changes(load(archive_db, metric="DenoisingStage"))
    assert [(c["hardware"], c["commit"]) for c in found] == [("h100-sxm", "c08")]
    code, _, err = pg(
        "history", "plot", "--db", archive_db, "--case", "qwen_image_t2i_smoke",
        "--metric", "DenoisingStage", "--out", str(tmp_path / "p.png"),
    )  # fmt: skip
    assert code == 2 and "pass --hardware" in err and "h100-sxm" in err
    code, _, err = pg("history", "show", "--db", archive_db, "--hardware", "mi300")
    assert code == 2 and "hardware stored: h100-sxm, h200-sxm" in err


# ---- schema versions -----------------------------------------------------------------------

V1_SCHEMA = """
CREATE TABLE reports (id INTEGER PRIMARY KEY, content_hash TEXT NOT NULL UNIQUE,
    source TEXT NOT NULL, git_commit TEXT, date TEXT NOT NULL, platform TEXT, hardware TEXT,
    profile TEXT, verdict TEXT, environment TEXT NOT NULL,
    added_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%SZ', 'now')));
CREATE TABLE metrics (report_id INTEGER NOT NULL REFERENCES reports(id) ON DELETE CASCADE,
    case_id TEXT NOT NULL, metric TEXT NOT NULL, n INTEGER, median REAL, iqr REAL, min REAL,
    max REAL, baseline REAL, ratio REAL, verdict TEXT, PRIMARY KEY (report_id, case_id, metric));
CREATE INDEX metrics_by_series ON metrics(case_id, metric);
INSERT INTO reports (content_hash, source, git_commit, date, platform, hardware, profile,
    verdict, environment) VALUES ('old', 'old.json', 'c-old', '2025-01-01', 'cpu', 'test-cpu',
    'pr_test', 'pass', '{}');
INSERT INTO metrics VALUES (1, 'qwen_image_t2i_smoke', 'e2e', 5, 23.0, 0.1, 22.9, 23.2, 23.0,
    1.0, 'pass');
"""


def test_an_archive_of_the_first_schema_is_read_as_is_and_migrated_by_add(
    tmp_path: Path,
) -> None:
    db = tmp_path / "old.sqlite"
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(V1_SCHEMA)
    before = db.read_bytes()
    (row,) = load(db).to_dict("records")  # read without writing: no migration
    assert row["commit_sha"] == "c-old" and row["bound"] is None
    assert db.read_bytes() == before
    assert add_reports(db, [_report(tmp_path / "new.json", 20.0, seed=1)]) == (1, 0)
    with closing(sqlite3.connect(db)) as conn:
        (version,) = conn.execute(
            "SELECT value FROM perfguard_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert int(version) == SCHEMA_VERSION
    frame = load(db, metric="e2e")
    assert frame["commit_sha"].tolist()[0] == "c-old" and frame["commit_sha"].isna().tolist()[1]
    assert frame["bound"].isna().tolist() == [True, False]


def test_a_failed_migration_leaves_the_old_archive_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "old.sqlite"
    with closing(sqlite3.connect(db)) as conn:
        conn.executescript(V1_SCHEMA)
    before = db.read_bytes()
    steps = (*MIGRATIONS[2], "ALTER TABLE nowhere ADD COLUMN x TEXT")
    monkeypatch.setitem(MIGRATIONS, 2, steps)
    with pytest.raises(PerfguardError, match="left unchanged"):
        add_reports(db, [_report(tmp_path / "new.json", 20.0, seed=1)])
    assert db.read_bytes() == before


def test_an_archive_of_a_newer_schema_is_refused_and_left_alone(
    archive_db: str, tmp_path: Path, pg: PG
) -> None:
    add_reports(archive_db, [_report(tmp_path / "r.json", 20.0, seed=1)])
    _set_version(archive_db, SCHEMA_VERSION + 1)
    rep = _report(tmp_path / "new.json", 21.0, seed=2)
    for args in (("add", str(rep)), ("show",)):
        code, out, err = pg("history", *args, "--db", archive_db)
        assert code == 2 and out == ""
        _one_line(err, f"schema version {SCHEMA_VERSION + 1} is newer", "upgrade perfguard")
    _set_version(archive_db, SCHEMA_VERSION)
    assert len(load(archive_db, metric="e2e")) == 1


def _set_version(db: str, version: int) -> None:
    from sqlalchemy import text

    engine = archive._engine(locate(db), readonly=False)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE perfguard_meta SET value = :v WHERE key = 'schema_version'"),
            {"v": str(version)},
        )
    engine.dispose()


# ---- PostgreSQL faults ---------------------------------------------------------------------


def test_a_url_of_another_scheme_is_exit_2_naming_it_without_its_password(
    pg: PG, tmp_path: Path
) -> None:
    rep = _report(tmp_path / "r.json", 20.0, seed=0)
    code, _, err = pg("history", "add", str(rep), "--db", "mysql://u:hunter2@db/perf")
    assert code == 2 and "hunter2" not in err
    _one_line(err, "mysql://", "unsupported archive scheme 'mysql'")


@pytest.mark.postgres
def test_a_refused_connection_is_exit_3_and_a_wrong_password_exit_2(
    postgres_server: Any, pg: PG, tmp_path: Path
) -> None:
    from pg_server import free_port

    rep = _report(tmp_path / "r.json", 20.0, seed=0)
    url = f"postgresql://perfguard:hunter2@127.0.0.1:{free_port()}/perf"
    code, _, err = pg("history", "add", str(rep), "--db", url)
    assert code == 3 and "hunter2" not in err
    _one_line(err, "postgresql://perfguard:***@127.0.0.1:", "cannot reach the history server")
    db = postgres_server.new_database()
    wrong = db.replace(":s3cret-pw@", ":hunter2@")
    for args in (("add", str(rep)), ("show",)):
        code, _, err = pg("history", *args, "--db", wrong)
        assert code == 2 and "hunter2" not in err and "s3cret" not in err
        _one_line(err, "perfguard:***@", "authentication failed")
    assert postgres_server.sql("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
                               db.rsplit("/", 1)[1]) == [(0,)]  # fmt: skip


@pytest.mark.postgres
def test_a_database_that_is_not_an_archive_is_refused_and_left_alone(
    postgres_server: Any, pg: PG, tmp_path: Path
) -> None:
    db = postgres_server.new_database()
    name = db.rsplit("/", 1)[1]
    postgres_server.sql("CREATE TABLE notes (x text); INSERT INTO notes VALUES ('mine')", name)
    rep = _report(tmp_path / "r.json", 20.0, seed=0)
    code, _, err = pg("history", "add", str(rep), "--db", db)
    assert code == 2 and "s3cret" not in err
    _one_line(err, "not a perfguard history database (its tables: notes)", "left unchanged")
    tables = postgres_server.sql(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1", name
    )
    assert tables == [("notes",)]


@pytest.mark.postgres
def test_a_server_killed_in_the_middle_of_an_add_stores_it_whole_or_not_at_all(
    postgres_server: Any, pg: PG, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = postgres_server.new_database()
    first = _report(tmp_path / "first.json", 20.0, seed=0)
    assert add_reports(db, [first]) == (1, 0)
    reps = [_report(tmp_path / f"r{i}.json", 20.0, seed=i + 1) for i in range(2)]
    calls = []

    def crash(conn: Any, rec: Any) -> None:
        calls.append(rec.source)
        if len(calls) == 2:  # the first report's rows are in, the second's are not
            postgres_server.stop("immediate")

    monkeypatch.setattr(archive, "_before_metrics", crash)
    try:
        code, _, err = pg("history", "add", *map(str, reps), "--db", db)
    finally:
        postgres_server.start()
    assert code == 3 and "s3cret" not in err
    _one_line(err, "stored whole or not at all", "add them again")
    monkeypatch.setattr(archive, "_before_metrics", None)
    assert load(db, metric="e2e")["report_id"].nunique() == 1
    assert add_reports(db, reps) == (2, 0)
    assert add_reports(db, reps) == (0, 2)
    frame = load(db)
    assert frame["report_id"].nunique() == 3 and len(frame) == 9


def test_the_archive_location_comes_from_perfguard_history(
    archive_db: str, tmp_path: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFGUARD_HISTORY", archive_db)
    rep = _report(tmp_path / "r.json", 20.0, seed=0)
    code, out, err = pg("history", "add", str(rep))
    assert code == 0, err
    assert out.startswith(locate(archive_db).label) and "1 report(s) added" in out
    assert len(load(archive_db, metric="e2e")) == 1
