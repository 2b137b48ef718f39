"""A baseline is only as good as its session: gen-baselines does not write a case measured
on a busy runner (exit 4, the file as it was), unless --allow-busy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import perfguard.decision.contention
from perfguard.decision.contention import BUSY_SPREAD, busy_session
from perfguard.results import CaseResult
from tests.fake_pipeline import BEHAVIOUR, CHECK, GEN
from tests.helpers import PG, noisy


def _processes(medians: list[float], reference: list[float] | None = None) -> CaseResult:
    samples = [x for i, m in enumerate(medians) for x in noisy(m, 0.005, 5, seed=i)]
    res = CaseResult(
        case_id="c", samples={"e2e": samples}, repeats=len(samples), groups=[5] * len(medians)
    )
    if reference is not None:
        res.reference = reference
    return res


def test_a_session_whose_processes_spread_over_the_threshold_is_busy() -> None:
    quiet = [20.0 * (1 + 0.01 * ((i % 3) - 1)) for i in range(10)]  # within +-1 %
    assert busy_session(_processes(quiet), None) is None
    wild = [20.0, 24.0, 18.0, 26.0, 21.0, 17.5, 23.0, 19.0, 25.0, 20.5]  # ~13 %
    why = busy_session(_processes(wild), None)
    assert why is not None and "spread by" in why and f"{BUSY_SPREAD:.0%}" in why


def test_a_session_whose_reference_ran_slow_against_the_last_baseline_is_busy() -> None:
    quiet = [20.0] * 10
    assert busy_session(_processes(quiet, [1.0] * 50), 0.9) is None  # 1.11x: within 1.3x
    why = busy_session(_processes(quiet, [1.5] * 50), 1.0)
    assert why is not None and "1.50x the baseline it replaces" in why
    assert busy_session(_processes(quiet, [1.5] * 50), None) is None  # no earlier baseline


def test_gen_baselines_does_not_write_a_busy_case_and_exits_4(
    fake: Path, pg: PG, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PERFGUARD_ALLOW_BUSY")
    assert pg(*GEN)[0] == 0
    before = fake.read_bytes()

    def busy(result: Any, earlier: float | None) -> str | None:
        spread = "its processes' e2e medians spread by 9.0% (over 5%)"
        return spread if result.case_id == "alpha" else None

    monkeypatch.setattr(perfguard.decision.contention, "busy_session", busy)
    BEHAVIOUR.slow["DecodingStage"] = 2.0  # so a case written again reads differently
    code, out, _ = pg(*GEN)
    assert code == 4 and "alpha: the runner was busy" in out and "not written: alpha" in out
    after = json.loads(fake.read_text())
    old = json.loads(before)
    assert after["scenarios"]["alpha"] == old["scenarios"]["alpha"]  # kept as it was
    new_beta = after["scenarios"]["beta"]["stages"]["DecodingStage"]["median"]
    assert new_beta > 1.5 * old["scenarios"]["beta"]["stages"]["DecodingStage"]["median"]
    code, out, _ = pg(*GEN, "--allow-busy")
    assert code == 0 and "alpha: warning: the runner was busy" in out and "marked busy" in out
    stored = json.loads(fake.read_text())["scenarios"]
    assert stored["alpha"] != old["scenarios"]["alpha"]
    # Stored anyway, and marked: every later check says so in the case's notes.
    assert stored["alpha"]["busy"].startswith("its processes' e2e medians spread by 9.0%")
    assert "busy" not in stored["beta"]
    report = fake.parent / "r.json"
    pg(*CHECK, "--report", str(report))
    cases = json.loads(report.read_text())["cases"]
    assert cases["alpha"]["notes"].startswith("baseline measured on a busy runner (its")
    assert not cases["beta"].get("notes")
