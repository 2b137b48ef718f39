"""The rule on noisy machines, pinned on synthetic samples.

A regression needs the band exceeded AND a credible slowdown; the noise behind
"credible" includes the spread between processes when the data has it; borderline
verdicts make the gate re-run the case (bounded, samples pooled); adaptive sampling
stops as soon as every verdict is clear. Samples are seeded log-normal draws and the
pipelines run on a virtual clock, so nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from perfguard.decision.answer import SAME_PROCESSES
from perfguard.decision.comparison import Rule
from perfguard.decision.gate import run_gate
from perfguard.decision.options import DEFAULT_CONFIRM_GAP_S, DEFAULT_MAX_RERUNS, JudgeOptions
from perfguard.decision.records import CONTENDED, PASS, REGRESSION
from perfguard.decision.stats import log_ratio_noise, process_spread, summarize
from perfguard.decision.tolerances import (
    SERVER_SESSION_SD,
    SESSION_SD,
    Band,
    Profile,
    default_profiles,
)
from perfguard.decision.verdict import judge_case, judge_metric
from perfguard.device.platform import Platform
from perfguard.device.timer import stage
from perfguard.errors import EXIT_CONTENDED, PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import run_case, run_in_process
from perfguard.results import CaseResult, Results, pool
from perfguard.storage.baseline import Baseline, Scenario, new_baseline
from perfguard.storage.cases import Case
from perfguard.storage.jsonio import validate
from perfguard.storage.refresh import scenario_from_result
from tests.helpers import noisy

M = "stage:DenoisingStage"
BAND = Band(0.10, 0.0)


FULL = JudgeOptions(timing_gate="gate")
"""The gate's mechanics with all three answers on every figure: under the default `auto`
a CPU runner's 3 % figures are below resolution and never measured more (the session
term alone keeps their resolution near +4 %; tests/test_resolution.py)."""


def _no_wait(_seconds: float) -> None:
    """The gate's `sleep` in tests that confirm: the waits are asserted where they matter."""


def processes(medians: Sequence[float], n: int = 10, rel_sd: float = 0.01) -> list[float]:
    """`n` tight samples around each of `medians`, one process after another."""
    out: list[float] = []
    for i, m in enumerate(medians):
        out += noisy(m, rel_sd, n, seed=100 + i)
    return out


# ---- the rule on one metric ----------------------------------------------------------------


def test_a_clear_regression_is_credible_clear_and_confirmed_by_a_second_process() -> None:
    base = summarize(processes([10.0, 10.1, 9.9, 10.05]), groups=[10] * 4)
    first = noisy(15.0, 0.02, 10, seed=1)
    v = judge_metric(M, first, base, BAND)
    assert v.verdict == REGRESSION and v.significant and v.clear
    assert v.low is not None and v.low > 1.3
    assert "bound" in v.reason and "99.9% lower bound" in v.reason
    # Seen in one process only, it is confirmed by a re-run before it is reported ...
    assert v.borderline
    # ... and two processes agreeing make it final.
    both = judge_metric(M, first + noisy(15.2, 0.02, 10, seed=2), base, BAND, groups=[10, 10])
    assert both.verdict == REGRESSION and not both.borderline


def test_a_clear_a_a_passes_without_a_rerun() -> None:
    base = summarize(processes([10.0, 10.1, 9.9, 10.05]), groups=[10] * 4)
    v = judge_metric(M, noisy(10.0, 0.02, 10, seed=3), base, BAND)
    assert v.verdict == PASS and not v.borderline and v.clear and not v.significant
    assert v.low is not None and v.high is not None and v.low < 1.0 < v.high


def test_above_the_band_but_within_the_between_process_spread_is_a_borderline_pass() -> None:
    # The baseline's processes disagree by ~10 %: a check 12 % slow could be drift.
    base = summarize(processes([9.0, 10.0, 11.2, 8.8, 10.6]), groups=[10] * 5)
    v = judge_metric(M, noisy(base.median * 1.12, 0.01, 10, seed=4), base, BAND)
    assert v.measured is not None and v.bound is not None and v.measured.median > v.bound
    assert v.verdict == PASS and v.borderline and not v.significant
    assert "within noise" in v.reason
    assert v.noise is not None and v.noise.between > v.noise.within


def test_without_process_data_drift_is_credible_so_the_band_must_cover_it() -> None:
    """Why `calibrate` exists: tight samples from two processes make 7 % drift significant."""
    base = summarize(noisy(10.0, 0.01, 10, seed=5))
    drift = noisy(10.7, 0.01, 10, seed=6)
    assert judge_metric(M, drift, base, Band(0.05, 0.0)).verdict == REGRESSION
    assert judge_metric(M, drift, base, Band(0.10, 0.0)).verdict == PASS


def test_a_credible_slowdown_near_the_band_is_borderline_on_either_side() -> None:
    base = summarize(processes([10.0, 10.02, 9.98, 10.01]), groups=[10] * 4)
    just_over = processes([11.15, 11.1], rel_sd=0.005)  # +11 %: within 1.2x of a 10 % band
    v = judge_metric(M, just_over, base, BAND, groups=[10, 10])
    assert v.verdict == REGRESSION and v.significant and v.borderline
    just_inside = processes([10.92, 10.9], rel_sd=0.005)  # +9 %: above 1/1.2 of the band
    v = judge_metric(M, just_inside, base, BAND, groups=[10, 10])
    assert v.verdict == PASS and v.significant and v.borderline
    far_over = processes([13.0, 13.1], rel_sd=0.005)
    v = judge_metric(M, far_over, base, BAND, groups=[10, 10])
    assert v.verdict == REGRESSION and not v.borderline
    wide = Rule(borderline=3.5)  # "near the band" is the rule's to set
    assert judge_metric(M, far_over, base, BAND, groups=[10, 10], rule=wide).borderline


def test_one_sample_on_each_side_leaves_the_band_alone_to_decide() -> None:
    v = judge_metric(M, [13.0], summarize([10.0]), BAND)
    assert v.verdict == REGRESSION and v.low == v.high == pytest.approx(1.3)
    assert "band alone" in v.reason


def test_a_side_without_spread_borrows_the_other_sides() -> None:
    imported = summarize([10.0])  # an sglang figure: one number
    v = judge_metric(M, noisy(10.5, 0.05, 10, seed=7), imported, Band(0.01, 0.0))
    assert v.noise is not None and v.noise.within > 0
    assert v.verdict == PASS and not v.significant  # 5 % with 5 % noise is not credible


def test_the_noise_model_takes_the_larger_of_within_and_between() -> None:
    tight = summarize(processes([10.0, 11.0, 9.0]), groups=[10] * 3)
    cur = summarize(noisy(10.0, 0.01, 10, seed=8))
    noise = log_ratio_noise(tight, cur)
    spread = process_spread(tight)
    assert spread is not None and spread[1] == 2
    assert noise.between == pytest.approx(spread[0] * math.sqrt(1 / 3 + 1))
    assert noise.se == noise.between > noise.within
    assert (noise.processes_baseline, noise.processes_current) == (3, 1)
    single = log_ratio_noise(summarize(noisy(10.0, 0.01, 10, seed=9)), cur)
    assert single.between == 0 and single.se == single.within > 0


def test_a_stricter_alpha_needs_more_evidence() -> None:
    base = summarize(processes([10.0, 10.6, 9.5, 10.3]), groups=[10] * 4)
    cur = noisy(base.median * 1.11, 0.01, 10, seed=10)
    loose = judge_metric(M, cur, base, BAND, rule=Rule(alpha=0.2))
    strict = judge_metric(M, cur, base, BAND, rule=Rule(alpha=0.001))
    assert loose.verdict == REGRESSION and strict.verdict == PASS
    with pytest.raises(ValueError):
        Rule(alpha=0.7)


def test_a_session_offset_widens_the_interval_once_for_each_side() -> None:
    base = summarize(processes([10.0, 10.1, 9.9, 10.05]), groups=[10] * 4)
    cur = summarize(processes([10.8, 10.9, 10.85]), groups=[10] * 3)
    plain, wide = log_ratio_noise(base, cur), log_ratio_noise(base, cur, session_sd=0.04)
    assert wide.se == pytest.approx(math.sqrt(plain.se**2 + 2 * 0.04**2))
    assert (wide.within, wide.between, wide.between_dof) == (
        plain.within,
        plain.between,
        plain.between_dof,
    )
    # the term is known, not estimated: Welch-Satterthwaite gives the sum more degrees
    # of freedom than the processes alone (stats.satterthwaite)
    assert wide.dof > plain.dof == 5
    assert "session offset of 4.0%" in wide.source
    # An 8 % slowdown that tight processes make credible is not, once two sessions' offsets
    # of 4 % each may be in it.
    samples = processes([10.8, 10.9, 10.85])
    band = Band(0.05, 0.0)
    assert judge_metric(M, samples, base, band, groups=[10] * 3).verdict == REGRESSION
    v = judge_metric(M, samples, base, band, groups=[10] * 3, session_sd=0.04)
    assert v.verdict == PASS and not v.significant


def test_a_profiles_session_offsets_are_per_class_kept_in_the_file_and_validated() -> None:
    profile = default_profiles("cpu")["pr_test"]
    assert (
        profile.session_sd_of("stage:TextEncodingStage") == SESSION_SD["cpu"]["non_denoise_stage"]
    )
    assert profile.session_sd_of("stage:DenoisingStage") == SESSION_SD["cpu"]["denoise_stage"] > 0
    assert profile.session_sd_of("step:3") == 0.0 and profile.session_sd_of("peak_memory") == 0
    assert Profile.from_json("pr_test", profile.to_json()) == profile
    assert default_profiles("cuda")["pr_test"].session_sd == {}
    data = new_baseline({"platform": "cpu", "hardware": "amd-epyc"}).to_json()
    validate(data, "baseline", "b.json")
    stored = data["tolerances"]["pr_test"]["session_sd"]
    assert {k: v for k, v in stored.items() if not k.startswith("server:")} == SESSION_SD["cpu"]
    # A server case at a url takes the server's term (its rounds share one server).
    assert {k[7:]: v for k, v in stored.items() if k.startswith("server:")} == SERVER_SESSION_SD[
        "cpu"
    ]
    latency = "stage:c1/latency_p50"
    assert profile.session_sd_of(latency) == SESSION_SD["cpu"]["e2e"]
    assert profile.session_sd_of(latency, shared_server=True) == SERVER_SESSION_SD["cpu"]["e2e"]
    data["tolerances"]["pr_test"]["session_sd"] = {"ops": 0.1}
    with pytest.raises(PerfguardError, match=r"b\.json.*session_sd"):
        validate(data, "baseline", "b.json")


# ---- groups, pooling, baselines ------------------------------------------------------------


def _result(samples: list[float], **kw: Any) -> CaseResult:
    return CaseResult(case_id="c", samples={"e2e": samples, M: samples}, repeats=len(samples), **kw)


def test_pooled_results_keep_their_groups_and_a_baseline_keeps_process_medians() -> None:
    parts = [_result([10.0, 10.2, 9.8]), _result([11.0, 11.2]), _result([9.0, 9.5, 9.4, 9.6])]
    pooled = pool(parts)
    assert pooled.groups == [3, 2, 4] and pooled.repeats == 9
    assert pool([pooled, _result([12.0])]).groups == [3, 2, 4, 1]
    assert pool([parts[0], CaseResult("c", status="error", error="boom")]).status == "error"
    scenario = scenario_from_result(pooled)
    assert scenario.metrics[M].processes == (10.0, 11.1, 9.45)
    env = {"platform": "cpu", "hardware": "x"}
    data = new_baseline(env).with_scenario("c", scenario).to_json()
    validate(data, "baseline", "test")
    assert Baseline.from_json(data).scenarios["c"].metrics[M].processes == (10.0, 11.1, 9.45)
    assert CaseResult.from_json("c", pooled.to_json()).groups == [3, 2, 4]


def test_a_metric_that_some_runs_lack_gets_no_process_medians() -> None:
    assert summarize([1.0, 2.0, 3.0], groups=[2, 2]).processes is None


# ---- the gate: re-runs and adaptive sampling -----------------------------------------------


CASE = Case(id="c", workload="qwen_image", preset="tiny")


def _baseline(medians: Sequence[float]) -> Baseline:
    res = pool([_result(noisy(m, 0.01, 10, seed=20 + i)) for i, m in enumerate(medians)])
    env = {"platform": "cpu", "hardware": "x"}
    scenario = scenario_from_result(res)
    return new_baseline(env).with_scenario("c", scenario)


def _scripted(attempts: list[float]) -> tuple[Callable[..., Results], list[list[str]]]:
    """A `measure` whose n-th call measures the case at `attempts[n]` (10 runs)."""
    calls: list[list[str]] = []

    def measure(cases: Sequence[Case], until_for: Any) -> Results:
        calls.append([c.id for c in cases])
        level = attempts[min(len(calls) - 1, len(attempts) - 1)]
        res = _result(noisy(level, 0.01, 10, seed=len(calls)), output_hash="h")
        return Results(environment={}, settings={}, cases={"c": res})

    return measure, calls


def test_a_case_over_its_bound_in_one_slow_process_is_confirmed_and_is_not_called_slower() -> None:
    """A check that lands in a slow process is confirmed in fresh ones; pooled, it is not
    a regression, and with one process of three 70 % slow it cannot be called the same
    within 3 % either: can't tell (exit 4), with the figures that say so."""
    baseline = _baseline([10.0, 10.1, 9.9])
    measure, calls = _scripted([17.0, 10.0, 10.05])  # +70 % for one process only
    outcome = run_gate([CASE], baseline, FULL.replace(max_reruns=2), measure, sleep=_no_wait)
    (case,) = outcome.judgement.cases
    assert case.verdict == PASS and case.answer == "cant_tell"
    assert outcome.judgement.verdict == "cant_tell" and outcome.judgement.exit_code == 4
    metric = next(m for m in case.metrics if m.metric == M)
    assert metric.answer is not None and metric.answer.high is not None
    assert metric.answer.high > 1.03 and metric.answer.detectable is not None
    assert calls == [["c"], ["c"], ["c"]]
    assert case.sampling is not None and case.sampling["confirmations"] == 2
    assert case.sampling["groups"] == 3 and case.sampling["runs"] == 30
    assert outcome.results.cases["c"].groups == [10, 10, 10]


def test_a_real_regression_is_confirmed_in_fresh_processes_and_fails() -> None:
    measure, calls = _scripted([15.0])
    confirm, confirmations = _scripted([15.1, 15.05])
    baseline = _baseline([10.0, 10.1, 9.9])
    slept: list[float] = []
    outcome = run_gate(
        [CASE],
        baseline,
        FULL.replace(confirm_gap_s=5.0),
        measure,
        confirm=confirm,
        sleep=slept.append,
    )
    (case,) = outcome.judgement.cases
    assert case.verdict == REGRESSION and outcome.judgement.exit_code == 1
    # the first measurement in this process, the confirmations in fresh ones: still over
    # its bound after each, so all of the default's eight run
    assert DEFAULT_MAX_RERUNS == 8
    assert len(calls) == 1 and len(confirmations) == 8
    assert case.sampling is not None and case.sampling["confirmations"] == 8
    assert case.sampling["groups"] == 9
    metric = next(m for m in case.metrics if m.metric == M)
    # three baseline processes and nine checked: Student's t with their 2 + 8 dof (more
    # with the profile's session term, which is known, not estimated)
    assert metric.noise is not None and metric.noise.between_dof == 10
    assert metric.noise.dof >= 10
    # each confirmation waited its gap first, so that it met another moment of the runner
    assert slept == [5.0] * 8
    assert DEFAULT_CONFIRM_GAP_S == 0  # measured: docs/verdicts.md


def test_a_case_the_same_in_its_first_processes_stops_there_and_never_waits() -> None:
    """A quiet case against a quiet 10-process baseline: the same once it has
    `SAME_PROCESSES` of its own (one process borrows the baseline's spread, and stopping
    the first time one reads low would call slower code the same too often)."""
    measure, calls = _scripted([10.0])
    slept: list[float] = []
    outcome = run_gate([CASE], _baseline(TEN), FULL, measure, sleep=slept.append)
    assert outcome.judgement.exit_code == 0 and len(calls) == SAME_PROCESSES and slept == []
    assert outcome.judgement.answer == "same"


TEN = [10.0, 10.05, 9.95, 10.02, 9.98, 10.01, 9.99, 10.03, 9.97, 10.0]
"""Ten baseline processes within 0.5 % of each other: a quiet runner's baseline."""


def test_a_case_that_cannot_tell_is_measured_in_fresh_processes_until_it_can() -> None:
    """Three baseline processes and one checked leave Student's t two degrees of
    freedom: the interval is too wide to say the same within 3 %, so the gate measures
    fresh processes (not only when a figure is over its bound) and stops when it can."""
    measure, calls = _scripted([10.0])
    events: list[str] = []
    outcome = run_gate(
        [CASE],
        _baseline([10.0, 10.1, 9.9]),
        FULL,
        measure,
        sleep=_no_wait,
        on_event=lambda _cid, msg: events.append(msg),
    )
    assert outcome.judgement.answer == "same" and outcome.judgement.exit_code == 0
    assert 2 <= len(calls) <= 1 + DEFAULT_MAX_RERUNS
    assert any("can't tell yet" in e for e in events)


def test_the_confirmation_gap_is_the_options_and_zero_waits_not_at_all() -> None:
    for gap, waits in ((12.5, [12.5, 12.5]), (0.0, [])):
        events: list[str] = []
        measure, _ = _scripted([15.0])
        confirm, _ = _scripted([15.1])
        slept: list[float] = []
        run_gate(
            [CASE],
            _baseline([10.0, 10.1, 9.9]),
            FULL.replace(max_reruns=2, confirm_gap_s=gap),
            measure,
            confirm=confirm,
            sleep=slept.append,
            on_event=lambda _cid, msg, events=events: events.append(msg),
        )
        assert slept == waits
        said = "confirming in a fresh process in 12.5 s (1 of at most 2)"
        assert any(said in e for e in events) == (gap > 0)
    with pytest.raises(ValueError, match="confirm_gap_s"):
        JudgeOptions(confirm_gap_s=-1.0)
    with pytest.raises(ValueError, match="confirm_gap_s"):
        JudgeOptions(confirm_gap_s=math.nan)


def test_confirmation_stops_as_soon_as_the_case_is_the_same() -> None:
    measure, _ = _scripted([10.45])  # +4.5 %: over the 3 % bound in the first process
    confirm, confirmations = _scripted([10.0])
    outcome = run_gate(
        [CASE],
        _baseline(TEN),
        FULL.replace(max_reruns=8),
        measure,
        confirm=confirm,
        sleep=_no_wait,
    )
    assert outcome.judgement.exit_code == 0 and outcome.judgement.answer == "same"
    # pooled with quiet processes the figure comes back within 3 %, and the gate stops
    # as soon as it says so, not at the budget
    assert 1 <= len(confirmations) < 8


def test_confirmations_are_bounded_and_a_clear_pass_is_never_confirmed() -> None:
    measure, calls = _scripted([17.0, 10.0])
    run_gate([CASE], _baseline([10.0, 10.1, 9.9]), FULL.replace(max_reruns=0), measure)
    assert len(calls) == 1
    measure, calls = _scripted([10.0])
    outcome = run_gate([CASE], _baseline(TEN), FULL, measure)
    confirmations = outcome.judgement.cases[0].sampling["confirmations"]  # type: ignore[index]
    assert len(calls) == SAME_PROCESSES and confirmations == SAME_PROCESSES - 1


def _with_reference(baseline_ref: float) -> Baseline:
    b = _baseline([10.0, 10.1, 9.9])
    scenario = b.scenarios["c"]
    ref = summarize([baseline_ref] * 10)
    return b.with_scenario("c", dataclasses.replace(scenario, reference=ref))


def _contended_measure(
    plan: list[tuple[float, list[float]]],
) -> tuple[Callable[..., Results], list[int]]:
    """The n-th measurement: the case at `plan[n][0]`, the reference per run `plan[n][1]`."""
    calls: list[int] = []

    def measure(cases: Sequence[Case], until_for: Any) -> Results:
        calls.append(1)
        level, refs = plan[min(len(calls) - 1, len(plan) - 1)]
        res = _result(noisy(level, 0.01, len(refs), seed=len(calls)), output_hash="h")
        res.reference = list(refs)
        return Results(environment={}, settings={}, cases={"c": res})

    return measure, calls


def test_a_contended_measurement_is_waited_out_and_measured_again() -> None:
    busy = [3.0] * 8 + [1.0] * 2  # 8 of 10 runs beside a reference 3x slower
    quiet = [1.0] * 10
    measure, calls = _contended_measure([(22.0, busy), (10.0, quiet)])
    slept: list[float] = []
    outcome = run_gate([CASE], _with_reference(1.0), FULL, measure, sleep=slept.append)
    (case,) = outcome.judgement.cases
    assert case.verdict == PASS and outcome.judgement.exit_code == 0
    # the wait and one measurement again; then fresh processes until it can say the same
    # (`answer.SAME_PROCESSES` of its own against a baseline of several)
    assert len(calls) == 2 + (SAME_PROCESSES - 1) and slept == [10.0]
    assert case.sampling is not None and case.sampling["contention_waits"] == 1


def test_a_runner_that_stays_contended_is_contended_never_a_regression() -> None:
    busy = [2.5] * 10
    measure, calls = _contended_measure([(22.0, busy)])  # 2.2x slower: the runner's fault
    slept: list[float] = []
    outcome = run_gate([CASE], _with_reference(1.0), FULL, measure, sleep=slept.append)
    (case,) = outcome.judgement.cases
    assert case.verdict == CONTENDED and outcome.judgement.exit_code == EXIT_CONTENDED
    assert all(m.verdict != REGRESSION for m in case.metrics)
    assert "runner contended" in (case.error or "")
    assert len(calls) == 3 and slept == [10.0, 10.0]  # bounded: two waits


def _gate_confirming_in(measure: Callable[..., Results], confirm: Callable[..., Results]) -> Any:
    """The gate over `CASE` against a quiet reference, measuring with `measure` and
    confirming with `confirm`, up to two confirmations, no waits."""
    return run_gate(
        [CASE],
        _with_reference(1.0),
        FULL.replace(max_reruns=2),
        measure,
        confirm=confirm,
        sleep=_no_wait,
    )


def test_a_slowdown_whose_every_confirmation_ran_contended_is_no_verdict() -> None:
    # One process over its bound, both confirmations beside a reference 3x slower: the
    # one process cannot show the spread between processes, so no regression on it.
    quiet, busy = [1.0] * 10, [3.0] * 10
    measure, _ = _contended_measure([(15.0, quiet)])
    confirm, confirmations = _contended_measure([(15.0, busy)])
    outcome = _gate_confirming_in(measure, confirm)
    (case,) = outcome.judgement.cases
    assert len(confirmations) == 2
    assert case.verdict == CONTENDED and outcome.judgement.exit_code == EXIT_CONTENDED
    stage = next(m for m in case.metrics if m.metric == M)
    assert stage.verdict == CONTENDED and "not confirmed" in stage.reason
    assert case.sampling is not None and case.sampling["confirmations"] == 0
    # One quiet confirmation is enough for a verdict: the same slowdown fails.
    confirm, _ = _contended_measure([(15.0, busy), (15.05, quiet)])
    outcome = _gate_confirming_in(measure, confirm)
    assert outcome.judgement.cases[0].verdict == REGRESSION


def test_agreeing_baseline_processes_do_not_lend_the_samples_dof_to_one_process() -> None:
    # Three baseline processes that agree to 0.2 % and samples that jitter by 5 %: the
    # samples' spread is the larger, but the spread between processes is known from
    # two degrees of freedom only, and that is what the interval's t must use.
    base = summarize(processes([10.0, 10.02, 9.98], rel_sd=0.05), groups=[10] * 3)
    current = noisy(11.2, 0.05, 10, seed=7)
    noise = log_ratio_noise(base, summarize(current))
    assert noise.within > noise.between > 0
    assert noise.dof == 2 and "2 dof" in noise.source
    v = judge_metric(M, current, base, BAND)
    assert v.verdict == PASS and not v.significant  # at the samples' dof it was credible
    assert v.low is not None and v.low < 1.0


def test_contended_runs_are_dropped_and_the_rest_judged() -> None:
    refs = [1.0] * 8 + [3.0] * 2
    res = _result([10.0] * 8 + [30.0, 30.0])
    res.reference = refs
    case = judge_case(
        "c", res, _with_reference(1.0).scenarios["c"], _with_reference(1.0).profile("pr_test")
    )
    assert case.verdict == PASS
    assert case.runner == {"dropped_runs": 2, "runner_speed": 1.0}


def test_a_uniformly_slower_runner_does_not_read_as_slower_code() -> None:
    # A slower host of the same pool: every run 20 % slower, the reference too (below
    # the 1.3x contention ratio, so nothing is dropped). The runner explains the
    # slowdown, but the reference cannot say to 3 % how much: no verdict (exit 4), neither
    # a regression nor a pass (docs/verdicts.md).
    res = _result(noisy(12.0, 0.01, 10, seed=3))
    res.reference = [1.2] * 10
    b = _with_reference(1.0)
    # At 1 %: over this one-process baseline a 20 % slowdown is not credible at 0.1 %.
    lax = Rule(alpha=0.01)
    case = judge_case(
        "c", res, b.scenarios["c"], b.profile("pr_test"), judging=JudgeOptions(rule=lax)
    )
    metric = next(m for m in case.metrics if m.metric == M)
    assert case.verdict == CONTENDED and "reference workload is 1.200x slower" in metric.reason
    # The same slowdown on a runner as fast as at baseline time is the code's.
    res.reference = [1.0] * 10
    case = judge_case(
        "c", res, b.scenarios["c"], b.profile("pr_test"), judging=JudgeOptions(rule=lax)
    )
    assert case.verdict == REGRESSION


class VirtualClock(Platform):
    """The CPU platform on a clock that moves only when a fake pipeline says so."""

    now_ns = 0

    def mark(self) -> int:
        return VirtualClock.now_ns

    def host_ns(self) -> int:  # the reference workload sees the virtual clock too
        return VirtualClock.now_ns


def _factory(level: Callable[[int], float]) -> Callable[[Case, Platform], Callable[[], Any]]:
    """Pipelines whose DenoisingStage lasts `level(run)` ms, with 1 % seeded jitter."""
    rng = random.Random(0)
    runs = [0]

    def build(case: Case, platform: Platform) -> Callable[[], Any]:
        def pipeline() -> torch.Tensor:
            with stage("DenoisingStage"):
                ms = level(runs[0]) * math.exp(rng.gauss(0.0, 0.01))
                VirtualClock.now_ns += int(ms * 1e6)
            runs[0] += 1
            return torch.zeros(1)

        return pipeline

    return build


def _adaptive_measure(
    factory: Callable[[Case, Platform], Callable[[], Any]],
) -> Callable[[Sequence[Case], Any], Results]:
    """The gate's `measure`: 5 runs a case on the virtual clock, up to 20 when told."""

    def measure(cases: Sequence[Case], until_for: Any) -> Results:
        return run_in_process(
            cases,
            VirtualClock(),
            MeasureOptions(repeats=5, warmup=0, max_repeats=20, progress=False),
            until_for=until_for,
            factory=factory,
        )

    return measure


def test_run_case_stops_when_told_and_never_before_the_minimum_nor_after_the_maximum() -> None:
    seen: list[int] = []

    def until(res: CaseResult) -> bool:
        seen.append(res.repeats)
        return res.repeats >= 7

    res = run_case(
        CASE,
        VirtualClock(),
        MeasureOptions(repeats=5, max_repeats=20),
        until=until,
        factory=_factory(lambda i: 10.0),
    )
    assert res.repeats == 7 and seen == [5, 6, 7]
    res = run_case(
        CASE,
        VirtualClock(),
        MeasureOptions(repeats=5, max_repeats=9),
        until=lambda r: False,
        factory=_factory(lambda i: 10.0),
    )
    assert res.repeats == 9


@pytest.mark.parametrize(
    ("level", "runs"),
    [(10.0, 5), (11.0, 20)],  # far from the 10 % band: stop at once; at the bound: keep going
    ids=["clear-stops-early", "unclear-samples-to-the-cap"],
)
def test_adaptive_sampling_stops_as_soon_as_every_verdict_is_clear(level: float, runs: int) -> None:
    baseline = _baseline([10.0])
    baseline = baseline.with_scenario(
        "c",
        Scenario(
            metrics={M: baseline.scenarios["c"].metrics[M]},
            tolerance_overrides={M: {"rel": 0.1, "abs": 0.0}},
        ),
    )
    measure = _adaptive_measure(_factory(lambda i: level))

    outcome = run_gate([CASE], baseline, FULL.replace(max_reruns=0), measure, max_repeats=20)
    (case,) = outcome.judgement.cases
    assert case.sampling is not None and case.sampling["runs"] == runs
    assert case.sampling["stopped_early"] is (runs < 20)


def test_the_report_shows_the_evidence_and_the_reruns_and_round_trips() -> None:
    from perfguard.presentation.markdown import render_markdown
    from perfguard.storage.reports import Report, build

    measure, _ = _scripted([15.0, 15.1])
    baseline = _baseline([10.0, 10.1, 9.9])
    outcome = run_gate([CASE], baseline, FULL.replace(max_reruns=2), measure, sleep=_no_wait)
    report = build(
        outcome.judgement,
        environment={"platform": "cpu", "hardware": "x"},
        baseline_info={"path": "b.json", "sha256": "0" * 64},
        profile=baseline.profile("pr_test").to_json(),
        settings={"source": "run"},
        improvement_threshold=0.2,
    )
    data = report.to_json()
    validate(data, "report", "test")
    metric = data["cases"]["c"]["metrics"][M]
    assert metric["significant"] and metric["ratio_low"] > 1 and metric["noise"]["se"] > 0
    assert data["cases"]["c"]["sampling"] == {
        "runs": 30,
        "groups": 3,
        "reruns": 2,
        "confirmations": 2,
        "contention_waits": 0,
    }
    md = render_markdown(report)
    assert "confidence bounds" in md
    assert "c: over a bound, re-measured in 2 fresh processes: regression confirmed" in md
    again = Report.from_json(data).to_json()
    assert again["cases"] == data["cases"]


# ---- the futility stop on realistic noise ----------------------------------------------------


def test_unchanged_code_is_clear_after_the_minimum_runs_though_processes_drift() -> None:
    """Was: with a 3-process baseline (t at 2 dof is 6.96) the interval never fit inside a
    3 % band, so unchanged code always ran to --max-repeats. More runs of this process
    cannot shrink the baseline's or the between-process part: only the median's own
    reach decides whether sampling may stop."""
    band = Band(0.03, 0.0)
    base = summarize(processes([10.0, 10.25, 9.8], n=5, rel_sd=0.01), groups=[5] * 3)
    v = judge_metric(M, noisy(10.05, 0.01, 5, seed=11), base, band)
    assert v.verdict == PASS and v.clear and not v.over
    assert v.noise is not None and v.noise.between > v.noise.within  # the old escape failed
    assert v.high is not None and v.high * base.median > v.bound  # the interval is wider


def test_a_median_near_its_bound_or_over_it_is_not_a_reason_to_stop() -> None:
    band = Band(0.03, 0.0)
    base = summarize(processes([10.0, 10.25, 9.8], n=5, rel_sd=0.01), groups=[5] * 3)
    near = judge_metric(M, noisy(10.25, 0.01, 5, seed=12), base, band)  # 0.5 % under the bound
    assert not near.over and not near.clear
    slow = judge_metric(M, noisy(11.0, 0.01, 5, seed=13), base, band)  # +10 %
    assert slow.over  # the gate never stops a case over its bound: it confirms it


def test_a_figure_that_more_runs_cannot_move_is_clear_either_way() -> None:
    """Memory peaks come from one untimed run per build: one sample, no spread."""
    v = judge_metric("peak_memory", [3.42], summarize([3.42]), Band(0.0, 0.1))
    assert v.clear and not v.over


def test_the_gate_stops_unchanged_code_at_the_minimum_on_a_drifting_baseline() -> None:
    res = pool([_result(noisy(m, 0.01, 5, seed=40 + i)) for i, m in enumerate([10.0, 10.25, 9.8])])
    baseline = new_baseline({"platform": "cpu", "hardware": "x"}).with_scenario(
        "c", dataclasses.replace(scenario_from_result(res), tolerance_overrides={M: {"rel": 0.03}})
    )
    measure = _adaptive_measure(_factory(lambda i: 10.0))

    outcome = run_gate([CASE], baseline, FULL.replace(max_reruns=0), measure, max_repeats=20)
    (case,) = outcome.judgement.cases
    assert {m.metric: m.verdict for m in case.metrics}[M] == PASS
    assert case.sampling is not None and case.sampling["runs"] == 5
    assert case.sampling["stopped_early"] is True
