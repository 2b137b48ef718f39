"""Shared fixtures: a clean platform environment for every test, and the CLI in process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

PG = Callable[..., tuple[int, str, str]]


@pytest.fixture(autouse=True)
def _no_platform_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PERFGUARD_* variable set in the developer's shell must not change test outcomes."""
    for var in ("PERFGUARD_PLATFORM", "PERFGUARD_INJECT", "PERFGUARD_CASES", "PERFGUARD_FACTORY"):
        monkeypatch.delenv(var, raising=False)


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
