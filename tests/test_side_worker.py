"""The side worker runs with another revision's perfguard (a bisected commit, an older
merge base): what it imports from that perfguard must be found where that revision keeps
it."""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

import pytest

from perfguard.measurement import launch, worker_handle


def side_worker() -> Any:
    """The side worker as a side process loads it: by path, not as perfguard's module."""
    spec = importlib.util.spec_from_file_location("side_worker_by_path", launch.SIDE_WORKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_this_revision_reads_a_case_with_its_worker_handle() -> None:
    assert side_worker()._case_from_json() is worker_handle.case_from_json


def test_a_revision_before_worker_handle_reads_a_case_with_its_workers_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older = types.ModuleType("perfguard.measurement.workers")

    def case_from_json(data: dict[str, Any]) -> str:
        return f"older {data['id']}"

    older.case_from_json = case_from_json  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "perfguard.measurement.worker_handle", None)
    monkeypatch.setitem(sys.modules, "perfguard.measurement.workers", older)
    assert side_worker()._case_from_json()({"id": "a"}) == "older a"
