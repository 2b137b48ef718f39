"""Shared fixtures: a clean platform environment for every test, and the CLI in process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

PG = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="session")
def _lock_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("locks"))


@pytest.fixture(autouse=True)
def _no_platform_override(monkeypatch: pytest.MonkeyPatch, _lock_dir: str) -> None:
    """A PERFGUARD_* variable set in the developer's shell must not change test outcomes;
    baseline locks go to a folder of the test session, not the developer's cache."""
    for var in ("PERFGUARD_PLATFORM", "PERFGUARD_INJECT", "PERFGUARD_CASES", "PERFGUARD_FACTORY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PERFGUARD_LOCK_DIR", _lock_dir)


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
