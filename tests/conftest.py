"""Shared fixtures: a clean platform environment for every test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_platform_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """A PERFGUARD_* variable set in the developer's shell must not change test outcomes."""
    for var in ("PERFGUARD_PLATFORM", "PERFGUARD_INJECT", "PERFGUARD_CASES", "PERFGUARD_FACTORY"):
        monkeypatch.delenv(var, raising=False)
