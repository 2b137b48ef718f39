"""The pytest plugin: a project's own tests timed by stage and gated like `perfguard check`."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

# The inner sessions run in this process (`runpytest` inline) and restore sys.modules after
# each; a C extension imported there for the first time cannot be imported again (torch:
# "bad call flags", then a segfault). Imported here, it stays loaded across them.
import scipy.special  # noqa: F401  (the verdict's t quantiles: numpy.fft, a C extension)
import torch  # noqa: F401

import perfguard.measurement.work  # noqa: F401  (the counted run's imports, likewise)
from perfguard.presentation.markdown import render_markdown
from perfguard.storage.reports import read_report, read_results

pytest_plugins = ["pytester"]

USER_TESTS = """
import os
import time

import pytest
import torch

from perfguard.device.timer import stage

DELAY = float(os.environ.get("PG_DELAY_S", "0.005"))


def pipeline():
    with stage("TextEncodingStage"):
        time.sleep(0.001)
    with stage("DecodingStage"):
        time.sleep(DELAY)
    return torch.ones(3)


@pytest.mark.perfguard(case="my_pipeline", repeats=3)
def test_pipeline_speed(perfguard_timer):
    out = perfguard_timer.measure(pipeline)
    assert out.sum() == 3


def test_by_hand(perfguard_timer):
    for _ in range(2):
        with perfguard_timer.run():
            with perfguard_timer.stage("InputValidationStage"):
                time.sleep(0.001)
"""


@pytest.fixture(autouse=True)
def _steady_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference workload reads 1 ms in every run: the stages here sleep, which no
    machine speed scales, so normalizing them by a busy runner's reading would only add
    noise (the screen itself: `test_a_slow_reference_reading_is_a_contended_runner`)."""
    from perfguard.device.reference import Reference

    monkeypatch.setattr(Reference, "time_ms", lambda self: 1.0)


@pytest.fixture
def user(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_user=USER_TESTS)
    return pytester


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    (ep,) = [e for e in entry_points(group="pytest11") if e.name == "perfguard"]
    assert ep.value == "perfguard.pytest_plugin"


def test_fixture_records_stages_and_e2e_as_a_results_file(user: pytest.Pytester) -> None:
    out = user.runpytest("--perfguard-results", "results.json", "--perfguard-platform", "cpu")
    out.assert_outcomes(passed=2)
    results = read_results(user.path / "results.json")
    mine = results.cases["my_pipeline"]
    assert mine.repeats == 3 and mine.warmup == 1
    assert len(mine.samples["e2e"]) == 3
    assert {"stage:TextEncodingStage", "stage:DecodingStage"} <= set(mine.samples)
    assert mine.output_hash and mine.deterministic is True
    assert mine.output_sketch  # compared by PSNR where the hash differs, as in `check`
    assert mine.case["source"].endswith("test_user.py::test_pipeline_speed")
    by_hand = results.cases["test_by_hand"]  # no marker: the test's name is the case id
    assert len(by_hand.samples["stage:InputValidationStage"]) == 2
    # CPU peak memory is the tensor storage of one tracked run (torch.ones(3): 12 bytes),
    # not the process's resident set; a run by hand cannot be re-run, so it has none.
    assert mine.samples["peak_memory"] == [12 / 2**20]
    assert "peak_memory" not in by_hand.samples


def test_baseline_gate_passes_then_fails_a_slowdown_like_perfguard_check(
    user: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = ("--perfguard-platform", "cpu", "--perfguard-baseline", "base.json")
    made = user.runpytest(*cpu, "--perfguard-update-baseline")
    made.assert_outcomes(passed=2)
    made.stdout.fnmatch_lines(["*stored 2 case(s) in base.json*"])
    assert set(json.loads((user.path / "base.json").read_text())["scenarios"]) == {
        "my_pipeline",
        "test_by_hand",
    }

    # The stages sleep on the real clock, whose jitter on a loaded runner exceeds the 3 %
    # minimum effect of a measured profile; this test is about the plugin gating like
    # `check`, so the baseline (as a reviewer would) widens every class to 50 %.
    data = json.loads((user.path / "base.json").read_text())
    wide = {c: {"rel": 0.5} for c in ("e2e", "denoise_stage", "non_denoise_stage",
                                      "denoise_step", "denoise_agg")}  # fmt: skip
    for scenario in data["scenarios"].values():
        scenario["tolerance_overrides"] = wide
    (user.path / "base.json").write_text(json.dumps(data))
    same = user.runpytest(*cpu, "--perfguard-report", "ok.json")
    assert same.ret == 0  # never slower; on a loaded runner a sleep's jitter may be can't tell
    ok = read_report(user.path / "ok.json")
    assert ok.exit_code in (0, 4)
    same.stdout.fnmatch_lines(["*perfguard PASS*" if ok.exit_code == 0 else "*CAN'T TELL*"])

    monkeypatch.setenv("PG_DELAY_S", "0.08")  # DecodingStage 5 ms -> 80 ms
    slow = user.runpytest(*cpu, "--perfguard-report", "slow.json")
    slow.assert_outcomes(passed=2)  # the tests pass; the gate fails the session
    assert slow.ret == 1
    slow.stdout.fnmatch_lines(["*perfguard FAIL*", "*my_pipeline*DecodingStage*regression*"])
    report = read_report(user.path / "slow.json")  # the same report schema as `check`
    assert report.exit_code == 1
    assert "Regressions" in render_markdown(report)


def test_a_failing_measured_test_is_reported_as_a_case_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_breaks(perfguard_timer):
            with perfguard_timer.run():
                pass
            raise RuntimeError("out of memory in decode")
        """
    )
    out = pytester.runpytest("--perfguard-results", "r.json", "--perfguard-platform", "cpu")
    out.assert_outcomes(failed=1)
    case = read_results(pytester.path / "r.json").cases["test_breaks"]
    assert case.status == "error"
    assert "out of memory in decode" in (case.error or "")


def test_two_tests_cannot_measure_the_same_case(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.perfguard(case="same")
        def test_a(perfguard_timer):
            pass

        @pytest.mark.perfguard(case="same")
        def test_b(perfguard_timer):
            pass
        """
    )
    out = pytester.runpytest("--perfguard-platform", "cpu")
    out.assert_outcomes(passed=1, errors=1)
    out.stdout.fnmatch_lines(["*'same' is measured by both*test_a*and*test_b*"])


def test_a_session_that_measures_nothing_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_plain():\n    assert True\n")
    out = pytester.runpytest("--perfguard-baseline", str(Path("missing.json")))
    out.assert_outcomes(passed=1)
    assert out.ret == 0
    assert "perfguard:" not in out.stdout.str()
    assert not (pytester.path / "missing.json").exists()


WORK_TESTS = """
import os

import pytest
import torch

from perfguard.device.timer import stage

EXTRA = os.environ.get("PG_EXTRA_MATMUL") == "1"


def pipeline():
    x = torch.ones(16, 16)
    with stage("DenoisingStage"):
        x = x @ x
        if EXTRA:
            x = x @ x
    return x.sum()


@pytest.mark.perfguard(case="counted", repeats=3)
def test_counted(perfguard_timer):
    perfguard_timer.measure(pipeline)
"""


def test_measure_counts_work_and_reads_the_reference_as_perfguard_run_does(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(test_counted_user=WORK_TESTS)
    cpu = ("--perfguard-platform", "cpu", "--perfguard-baseline", "base.json")
    made = pytester.runpytest(*cpu, "--perfguard-update-baseline", "--perfguard-results", "r.json")
    made.assert_outcomes(passed=1)
    case = read_results(pytester.path / "r.json").cases["counted"]
    assert len(case.reference) == case.repeats == 3  # one reading per timed run
    (work,) = case.work
    assert "DenoisingStage" in json.dumps(work) and case.work_error is None

    monkeypatch.setenv("PG_EXTRA_MATMUL", "1")  # one more matmul: work, exactly
    slow = pytester.runpytest(*cpu, "--perfguard-report", "slow.json")
    assert slow.ret == 1
    report = read_report(pytester.path / "slow.json")
    (verdict,) = report.cases
    answers = {m.metric: m.answer.answer for m in verdict.metrics}
    # The extra matmul is counted in its stage, exactly: never can't tell.
    assert answers["ops:DenoisingStage"] == answers["flops:DenoisingStage"] == "slower"
    assert answers["syncs:DenoisingStage"] == "same"
    assert verdict.answer == "slower"


def test_a_slow_reference_reading_is_a_contended_runner(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin screens contention as `perfguard check` does: a session whose reference
    workload reads twice its baseline's gets no verdict on time, and says so."""
    from perfguard.device.reference import Reference

    pytester.makepyfile(test_counted_user=WORK_TESTS)
    cpu = ("--perfguard-platform", "cpu", "--perfguard-baseline", "base.json")
    pytester.runpytest(*cpu, "--perfguard-update-baseline").assert_outcomes(passed=1)
    monkeypatch.setattr(Reference, "time_ms", lambda self: 2.0)
    busy = pytester.runpytest(*cpu, "--perfguard-report", "busy.json")
    busy.stdout.fnmatch_lines(["*perfguard CONTENDED*contended runner*"])
    assert read_report(pytester.path / "busy.json").exit_code == 4
    assert busy.ret == 0  # the tests passed; no verdict is not a failure of the session


def test_a_baseline_stored_from_a_busy_session_is_marked_busy_and_said(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--perfguard-update-baseline stores as gen-baselines does: a session whose reference
    readings say the runner was busy is stored marked busy (the plugin has no refusal
    of its own), and the session's summary says so."""
    from perfguard.device.reference import Reference

    readings = iter([1.0, 1.0])
    monkeypatch.setattr(Reference, "time_ms", lambda self: next(readings, 3.0))
    pytester.makepyfile(test_counted_user=WORK_TESTS)
    cpu = ("--perfguard-platform", "cpu", "--perfguard-baseline", "base.json")
    made = pytester.runpytest(*cpu, "--perfguard-update-baseline")
    made.assert_outcomes(passed=1)
    made.stdout.fnmatch_lines(["*perfguard: warning: counted: the runner was busy*marked busy"])
    stored = json.loads((pytester.path / "base.json").read_text())["scenarios"]["counted"]
    assert stored["busy"] and stored["dropped_runs"] == 0  # kept whole: most runs were slow
