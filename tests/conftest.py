"""Shared fixtures: a clean platform environment for every test, and the CLI in process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_pipeline import fake  # noqa: F401  (the fixture: fake pipelines, virtual clock)
from tests.helpers import PG, make_project


@pytest.fixture(scope="session")
def _lock_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("locks"))


@pytest.fixture(autouse=True)
def _no_platform_override(monkeypatch: pytest.MonkeyPatch, _lock_dir: str) -> None:
    """A PERFGUARD_* variable set in the developer's shell must not change test outcomes;
    baseline locks go to a folder of the test session, not the developer's cache."""
    for var in (
        "PERFGUARD_PLATFORM", "PERFGUARD_INJECT", "PERFGUARD_CASES", "PERFGUARD_FACTORY",
        "PERFGUARD_SERVER", "PERFGUARD_SERVER_DIR",
    ):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PERFGUARD_LOCK_DIR", _lock_dir)
    # No resident server outlives a test: commands import their own modules, as a test
    # of the resident server itself asks for (tests/test_resident.py).
    monkeypatch.setenv("PERFGUARD_SERVER_IDLE_S", "0")
    # A runner's setting of the confirmation gap: no wait in tests (the waits are
    # asserted in tests/test_verdict_noise.py), and a relative check must accept it.
    monkeypatch.setenv("PERFGUARD_CONFIRM_GAP_S", "0")
    # The suite runs on two workers: to a test's gen-baselines the other worker is another
    # process using a core, which is contention (perfguard/device/load.py), so a test of
    # plumbing that writes a baseline stores it marked busy instead of being refused. The
    # refusal itself is pinned in tests/test_busy_baseline.py and tests/test_load.py,
    # which unset this.
    monkeypatch.setenv("PERFGUARD_ALLOW_BUSY", "1")


@pytest.fixture
def no_contention_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test that accepts any outcome of a check on the real pipelines (contended,
    exit 4, included): a case the contention screen calls contended is measured again at
    once, not after `ContentionPolicy.wait_s` (10 s, twice). On a busy shared machine
    those waits were a third of such a test's time and no part of what it asserts; the
    waits themselves are asserted in tests/test_verdict_noise.py."""
    from perfguard.decision import contention

    # The default policy is one frozen instance that every JudgeOptions and
    # gen-baselines read: its field is set for this test only, and restored after.
    monkeypatch.setitem(vars(contention.DEFAULT_POLICY), "wait_s", 0.0)


@pytest.fixture
def pg(capsys: pytest.CaptureFixture[str]) -> PG:
    """Run `perfguard ARGS` in process through `main`: (exit code, stdout, stderr)."""
    from perfguard.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    return run


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A real PostgreSQL server for the session (tests/pg_server.py), stopped at the end.

    Skipped, with the reason, where PostgreSQL is not installed; under CI (which installs
    it in .ci/run) its absence is a failure, so the database tests never skip there."""
    from pg_server import find_bindir, running_server

    if find_bindir() is None:
        reason = "PostgreSQL's initdb/pg_ctl are not installed (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; .ci/run installs them")
        pytest.skip(reason)
    with running_server() as server:
        yield server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def archive_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty archive location: an SQLite path, or a fresh database on the real server."""
    if request.param == "sqlite":
        return str(tmp_path / "history.sqlite")
    return str(request.getfixturevalue("postgres_server").new_database())


@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    """Debian's headless chromium through Playwright (tests/browser.py), for the session.

    Skipped, with the reason, where chromium or playwright is missing; under CI (which
    installs both in .ci/run) that is a failure, so the browser tests never skip there."""
    import importlib.util

    from browser import browser, chromium_path

    missing = []
    if chromium_path() is None:
        missing.append("chromium (apt-get install chromium)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright (pip install -e '.[dev]')")
    if missing:
        reason = "not installed: " + ", ".join(missing)
        if os.environ.get("CI"):
            pytest.fail(reason + "; .ci/run installs them")
        pytest.skip(reason)
    with browser() as b:
        yield b


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A git repository holding the virtual-clock pipeline, the caller's working
    directory and import path (the head side), with the real case registry."""
    return make_project(tmp_path / "project", monkeypatch)
