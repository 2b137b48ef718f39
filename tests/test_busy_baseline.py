"""A baseline is only as good as its session: gen-baselines does not write a case measured
on a contended runner (exit 4 after waiting, the file as it was), unless --allow-busy. A
runner that is only noisy is recorded, never refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import perfguard.decision.contention
import perfguard.device.load
from perfguard.decision.contention import FOREIGN_LOAD, ContentionPolicy, busy_session
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


def test_a_session_whose_processes_spread_is_noisy_not_busy() -> None:
    """Spread is the runner's nature (13-29 % on an idle 2-core VM): recorded as the
    baseline's resolution, never a refusal."""
    quiet = [20.0 * (1 + 0.01 * ((i % 3) - 1)) for i in range(10)]  # within +-1 %
    assert busy_session(_processes(quiet), None) is None
    wild = [20.0, 24.0, 18.0, 26.0, 21.0, 17.5, 23.0, 19.0, 25.0, 20.5]  # ~13 %
    assert busy_session(_processes(wild), None) is None


def test_a_session_beside_another_process_s_load_is_busy() -> None:
    quiet = [20.0] * 10
    assert busy_session(_processes(quiet), None, foreign_load=0.08) is None
    why = busy_session(_processes(quiet), None, foreign_load=0.97)
    assert why is not None and "0.97 core(s)" in why and f"over {FOREIGN_LOAD:g}" in why
    assert busy_session(_processes(quiet), None, foreign_load=None) is None  # not on Linux


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
    # The suite's other worker is real load on this machine: read none here.
    monkeypatch.setattr(perfguard.device.load.LoadMeter, "read", lambda self: 0.0)
    assert pg(*GEN)[0] == 0
    before = fake.read_bytes()
    seen: list[str] = []

    def busy(result: Any, earlier: float | None, load: float | None = None) -> str | None:
        seen.append(result.case_id)
        spread = "other processes used 0.97 core(s) on average while it measured (over 0.5)"
        return spread if result.case_id == "alpha" else None

    monkeypatch.setattr(perfguard.decision.contention, "busy_session", busy)
    monkeypatch.setattr(
        perfguard.decision.contention, "DEFAULT_POLICY", ContentionPolicy(waits=2, wait_s=0.0)
    )
    BEHAVIOUR.slow["DecodingStage"] = 2.0  # so a case written again reads differently
    code, out, _ = pg(*GEN)
    assert code == 4 and "alpha: the runner was busy" in out and "not written: alpha" in out
    # Contention passes: it waited and measured alpha again, twice, before refusing.
    assert seen == ["alpha", "beta", "alpha", "alpha"]
    assert "waiting 0 s and measuring again (2 of 2)" in out and "after waiting 2 x 0 s" in out
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
    assert stored["alpha"]["busy"].startswith("other processes used 0.97 core(s)")
    assert "busy" not in stored["beta"]
    report = fake.parent / "r.json"
    pg(*CHECK, "--report", str(report))
    cases = json.loads(report.read_text())["cases"]
    assert cases["alpha"]["notes"].startswith("baseline measured on a busy runner (other")
    assert not cases["beta"].get("notes")


def test_a_session_the_screen_finds_mostly_contended_is_stored_whole_and_marked(
    tmp_path: Path,
) -> None:
    """Most runs beside a reference over 1.3x the session's own lower quartile: on a
    runner spread by 29 % the noise alone does that, so it is recorded, marked, never
    refused."""
    from perfguard.storage.refresh import record_measured

    res = _processes([20.0] * 10, reference=[1.0] * 15 + [2.0] * 35)
    done = record_measured(tmp_path / "b.json", res, {"platform": "cpu", "hardware": "h"}, None)
    assert done.stored is res and done.busy is None and done.contended
    stored = json.loads((tmp_path / "b.json").read_text())["scenarios"]["c"]
    assert stored["busy"].startswith("runner contended: 35 of 50 runs")
    assert stored["e2e"]["n"] == 50
