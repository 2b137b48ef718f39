"""Runner-normalized timings: each run at the baseline's runner speed (decision.normalize)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from perfguard.decision import normalize
from perfguard.decision.comparison import Rule
from perfguard.decision.contention import ContentionPolicy, screen
from perfguard.decision.tolerances import default_profiles
from perfguard.decision.verdict import judge
from perfguard.errors import PerfguardError
from perfguard.measurement.comparable import check_comparable
from perfguard.metrics import NORMALIZED, RAW, timing_of
from perfguard.results import CaseResult, Results
from perfguard.storage import baseline as store
from perfguard.storage import refresh
from perfguard.storage.baseline import Baseline
from perfguard.storage.refresh import scenario_from_result

LEVEL = 4.0  # ms: the reference workload's time on the baseline's runner


def measured(speed: list[float], slower: float = 1.0, seed: int = 0) -> CaseResult:
    """Runs of a case on a runner whose speed factor is `speed[i]` at run i (1: as fast as
    at baseline time, 1.25: 25 % slower), the code `slower` times its baseline's cost;
    the reference workload beside each run sees the same speed. 0.5 % jitter on both."""
    rng = np.random.default_rng(seed)
    f = np.array(speed)
    jitter = 1 + 0.005 * rng.standard_normal((2, len(speed)))
    return CaseResult(
        case_id="c",
        samples={
            "e2e": [float(x) for x in 100.0 * slower * f * jitter[0]],
            "stage:DenoisingStage": [float(x) for x in 60.0 * slower * f * jitter[0]],
            "peak_memory": [3.0] * len(speed),
            "ops:DenoisingStage": [1200.0] * len(speed),
        },
        reference=[float(x) for x in LEVEL * f * jitter[1]],
        repeats=len(speed),
        groups=[5] * (len(speed) // 5) if len(speed) > 5 else None,
    )


def baseline_of(result: CaseResult, timing: str) -> Baseline:
    return Baseline(
        metadata={"platform": "cpu", "hardware": "x", "created": "t", "updated": "t"},
        profiles=default_profiles("cpu"),
        scenarios={"c": scenario_from_result(result, timing=timing)},
    )


# Three baseline processes on a runner that drifts by a few percent between them.
BASELINE_SPEED = [0.97] * 5 + [1.0] * 5 + [1.04] * 5


def verdict_of(result: CaseResult, timing: str) -> tuple[str, str, dict]:
    base = baseline_of(measured(BASELINE_SPEED), timing)
    # At 1 %, the level these one-process figures were made for: at the stored 0.1 % a
    # 25 % excess over a one-process baseline is not credible, and nothing is left to excuse.
    results = Results({"platform": "cpu"}, {}, {"c": result})
    case = judge(results, base, rule=Rule(alpha=0.01)).cases[0]
    return case.verdict, metric(case, "stage:DenoisingStage").verdict, dict(case.runner or {})


def metric(case, name: str):
    (found,) = [m for m in case.metrics if m.metric == name]
    return found


def test_only_times_are_scaled_and_each_run_by_its_own_reference() -> None:
    res = CaseResult(
        case_id="c",
        samples={"e2e": [10.0, 20.0], "peak_memory": [5.0, 5.0], "syncs": [3.0, 3.0]},
        reference=[1.0, 2.0],
        repeats=2,
    )
    out = normalize.normalized(res, 4.0)
    assert out.samples == {"e2e": [40.0, 40.0], "peak_memory": [5.0, 5.0], "syncs": [3.0, 3.0]}
    assert res.samples["e2e"] == [10.0, 20.0]  # the measurement itself is left alone


@pytest.mark.parametrize(
    "reference",
    [[], [1.0], [0.0, 1.0]],
    ids=["no reference", "a run without one", "a clock that did not move"],
)
def test_runs_without_a_reference_time_each_cannot_be_normalized(reference: list) -> None:
    res = CaseResult(case_id="c", samples={"e2e": [10.0, 20.0]}, reference=reference, repeats=2)
    assert normalize.normalized(res, 4.0) is None


def test_the_platform_default_is_normalized_on_cpu_only() -> None:
    assert timing_of({"platform": "cpu"}, None) == NORMALIZED
    assert timing_of({"platform": "cuda"}, None) == RAW
    assert timing_of({"platform": "cpu"}, "raw") == RAW
    with pytest.raises(ValueError, match="timing must be one of"):
        timing_of({"platform": "cpu"}, "scaled")


def test_a_normalized_baseline_stores_its_runs_at_its_own_reference_median() -> None:
    res = measured([1.0, 1.0, 2.0])  # one run in a spell twice as slow
    scen = scenario_from_result(res, timing=NORMALIZED)
    assert scen.timing == NORMALIZED
    assert scen.reference.median == pytest.approx(LEVEL, rel=0.01)
    # Raw, the slow run is 200 ms; at the baseline's runner speed it is ~100 ms like the rest.
    assert max(scen.metrics["e2e"].samples) == pytest.approx(100.0, rel=0.03)
    assert scen.metrics["peak_memory"].median == 3.0
    raw = scenario_from_result(res, timing=RAW)
    assert raw.timing == "raw" and max(raw.metrics["e2e"].samples) > 190


def test_a_result_with_no_reference_is_stored_raw_and_says_so() -> None:
    res = dataclasses.replace(measured([1.0] * 3), reference=[0.0, 0.0, 0.0])
    assert scenario_from_result(res, timing=NORMALIZED).timing == "raw"


def test_a_slow_spell_of_the_runner_passes_unchanged_code_instead_of_no_verdict() -> None:
    spell = measured([1.15] * 10, seed=1)  # 15 % slower everywhere: under both screens
    assert verdict_of(spell, NORMALIZED)[:2] == ("pass", "pass")
    # Raw, the runner's speed can only excuse the excess: no verdict either way.
    assert verdict_of(spell, RAW)[1] == "contended"


def test_a_process_whose_reference_reads_over_the_process_screen_is_no_verdict() -> None:
    # 25 % slower everywhere: every run is under the 1.3x run screen, but the process's
    # reference median is over the 1.2x process screen, where dividing by it was measured
    # to leave the runner's mode in the figures (contention.PROCESS_RATIO).
    spell = measured([1.25] * 10, seed=1)
    verdict, _stage, runner = verdict_of(spell, NORMALIZED)
    assert verdict == "contended"
    assert runner["slow_processes"] == 2 and runner["dropped_runs"] == 10  # both processes


def test_a_real_slowdown_is_caught_in_a_slow_spell_and_in_a_fast_one() -> None:
    for speed in (1.15, 0.85):
        slow = measured([speed] * 10, slower=1.10, seed=2)
        verdict, stage, runner = verdict_of(slow, NORMALIZED)
        assert (verdict, stage) == ("regression", "regression"), speed
        assert runner["timing"] == NORMALIZED
    # Raw, a fast spell hides it: a faster runner excuses nothing, but it shows nothing.
    assert verdict_of(measured([0.85] * 10, 1.10, 2), RAW)[1] == "pass"


def test_memory_and_counters_are_judged_as_measured() -> None:
    res = measured([1.15] * 10, seed=3)
    res.samples["peak_memory"] = [3.6] * 10  # 20 % more memory: no runner speed excuses it
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    case = judge(Results({"platform": "cpu"}, {}, {"c": res}), base).cases[0]
    assert metric(case, "peak_memory").verdict == "regression"


def test_a_check_of_results_without_reference_times_against_a_normalized_baseline_is_refused() -> (
    None
):
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    res = dataclasses.replace(measured([1.0] * 5), reference=[])
    with pytest.raises(PerfguardError, match=r"r\.json: case 'c': .*timing: normalized"):
        check_comparable(Results({"platform": "cpu"}, {}, {"c": res}), base, "r.json")
    raw = baseline_of(measured(BASELINE_SPEED), RAW)
    check_comparable(Results({"platform": "cpu"}, {}, {"c": res}), raw, "r.json")


def test_tighten_compares_two_normalized_scenarios_at_one_runner_speed() -> None:
    old = scenario_from_result(measured(BASELINE_SPEED), timing=NORMALIZED)
    # The same code measured on a runner 20 % faster: its normalized figures are at that
    # runner's speed, 0.8x the old ones, which is no improvement of the code.
    faster = [0.8 * f for f in BASELINE_SPEED]
    new = scenario_from_result(measured(faster, seed=4), timing=NORMALIZED)
    merged = refresh.merge_scenario(old, new, tighten=True)
    assert merged.reference == new.reference
    # The old figure is kept, in the new scenario's units (its reference's speed).
    assert merged.metrics["e2e"].median == pytest.approx(old.metrics["e2e"].median * 0.8, rel=0.01)


def test_baselines_diff_of_a_regeneration_on_a_faster_runner_finds_no_change() -> None:
    from perfguard.decision.changes import diff

    old = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    faster = baseline_of(measured([0.8 * f for f in BASELINE_SPEED], seed=4), NORMALIZED)
    rows = [r for r in diff(old, faster).changed if r.metric == "e2e"]
    assert all(r.change not in ("slower", "faster") for r in rows)
    raw_old = baseline_of(measured(BASELINE_SPEED), RAW)
    raw_new = baseline_of(measured([0.8 * f for f in BASELINE_SPEED], seed=4), RAW)
    (row,) = [r for r in diff(raw_old, raw_new).changed if r.metric == "e2e"]
    assert row.change == "faster"  # raw, the faster runner reads as faster code


def test_the_baseline_file_says_how_it_timed_and_refuses_normalized_without_a_reference(
    tmp_path,
) -> None:
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    path = tmp_path / "b.json"
    store.save(path, base)
    data = json.loads(path.read_text())
    assert data["scenarios"]["c"]["timing"] == "normalized"
    assert store.load(path).scenarios["c"].normalized
    del data["scenarios"]["c"]["reference"]
    path.write_text(json.dumps(data))
    with pytest.raises(PerfguardError, match=r"b\.json.*scenarios.*c.*timing"):
        store.load(path)


def test_one_slow_process_of_three_is_left_out_and_the_others_are_judged() -> None:
    # The middle process's reference reads 1.25x the baseline's (each run under the 1.3x
    # run screen) and its figures 1.5x: a mode that dividing by the reference leaves in.
    res = measured([1.0] * 5 + [1.25] * 5 + [1.0] * 5, seed=4)
    res.samples["stage:DenoisingStage"][5:10] = [90.0] * 5
    res.samples["e2e"][5:10] = [150.0] * 5
    ref_median = LEVEL
    kept, scr = screen(res, ref_median)
    assert (scr.slow_processes, scr.dropped, scr.contended) == (1, 5, False)
    assert kept.groups == [5, 5] and len(kept.samples["e2e"]) == 10
    assert kept.samples["peak_memory"] == res.samples["peak_memory"][:10]
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    case = judge(Results({"platform": "cpu"}, {}, {"c": res}), base).cases[0]
    assert case.verdict == "pass" and case.runner["slow_processes"] == 1
    # Without the process screen the slow process's 1.2x normalized reading is pooled in.
    plain = ContentionPolicy(process_ratio=0)
    assert screen(res, ref_median, plain)[1].dropped == 0


def test_runs_are_dropped_whatever_peak_memory_was_measured_once_per_measurement() -> None:
    res = measured([1.0] * 4 + [2.0], seed=5)  # one run in a burst twice as slow
    res.samples["peak_memory"] = [3.0]  # the counted run's, once per measurement
    kept, scr = screen(res, LEVEL)
    assert scr.dropped == 1 and len(kept.samples["e2e"]) == 4 and len(kept.reference) == 4
    assert kept.samples["peak_memory"] == [3.0]
    odd = dataclasses.replace(res, samples={**res.samples, "e2e": res.samples["e2e"][:3]})
    assert odd.only_runs([True, True, True, True, False]) is odd  # cannot be aligned


# ---- the reference's share, fitted per comparison -------------------------------------------


def test_the_fitted_exponent_is_the_slope_within_each_side_clipped_to_zero_and_one() -> None:
    rng = np.random.default_rng(7)
    ref = np.exp(0.08 * rng.standard_normal((2, 40)))
    noise = np.exp(0.01 * rng.standard_normal((2, 40)))
    # The metric follows the reference with a slope of 0.3; the second side is 10 %
    # slower (the code), which is a shift of its own intercept, not the runner's slope.
    base = 60.0 * ref[0] ** 0.3 * noise[0]
    check = 66.0 * ref[1] ** 0.3 * noise[1]
    beta = normalize.fitted_exponent([(base, ref[0]), (check, ref[1])])
    assert beta == pytest.approx(0.3, abs=0.05)
    steep = normalize.fitted_exponent([(base**5, ref[0]), (check**5, ref[1])])  # slope 1.5
    assert steep == 1.0
    against = normalize.fitted_exponent([(1 / base, ref[0]), (1 / check, ref[1])])
    assert against == 0.0
    assert normalize.fitted_exponent([(base[:5], ref[0][:5]), (check, ref[1])]) is None
    flat = np.ones(40)
    assert normalize.fitted_exponent([(base, flat), (check, flat)]) is None


def reference_of_its_own(slower: float, seed: int, processes: int) -> CaseResult:
    """Processes whose reference workload reads up to 10 % off on its own (a mode of the
    yardstick's process, not of the runner) while the case's speed does not move."""
    rng = np.random.default_rng(seed)
    modes = np.repeat(np.exp(0.06 * rng.standard_normal(processes)), 5)
    jitter = np.exp(0.01 * rng.standard_normal((2, 5 * processes)))
    stage = 60.0 * slower * jitter[0]
    return CaseResult(
        case_id="c",
        samples={
            "e2e": [float(x) for x in stage * 100 / 60],
            "stage:DenoisingStage": [float(x) for x in stage],
        },
        reference=[float(x) for x in LEVEL * modes * jitter[1]],
        repeats=5 * processes,
        groups=[5] * processes,
    )


def judged(result: CaseResult, base: Baseline):
    return judge(Results({"platform": "cpu"}, {}, {"c": result}), base).cases[0]


def test_a_yardstick_that_moves_on_its_own_is_not_divided_into_the_figures() -> None:
    base = baseline_of(reference_of_its_own(1.0, seed=11, processes=10), NORMALIZED)
    assert base.scenarios["c"].groups == (5,) * 10
    same = judged(reference_of_its_own(1.0, seed=12, processes=9), base)
    slower = judged(reference_of_its_own(1.10, seed=12, processes=9), base)
    stage = metric(same, "stage:DenoisingStage")
    assert same.runner["reference_exponents"]["stage:DenoisingStage"] < 0.2
    assert same.verdict == "pass" and stage.low < 1.0 < stage.high
    assert metric(slower, "stage:DenoisingStage").verdict == "regression"
    # The same pair divided by the reference whole (a baseline without its processes, as
    # files were before): the yardstick's own modes widen the interval (twice, here).
    whole = dataclasses.replace(
        base, scenarios={"c": dataclasses.replace(base.scenarios["c"], groups=None)}
    )
    divided = metric(judged(reference_of_its_own(1.0, seed=12, processes=9), whole), stage.metric)
    assert "reference_exponents" not in (judged(reference_of_its_own(1.0, 12, 9), whole).runner)
    assert math.log(divided.high / divided.low) > 1.5 * math.log(stage.high / stage.low)


def test_a_runner_that_moves_the_case_with_the_reference_is_still_divided_out() -> None:
    # The baseline's processes show the case following the reference: the exponent is
    # ~1, and a check on a runner 15 % slower throughout reads as unchanged code.
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    case = judged(measured([1.15] * 10, seed=1), base)
    assert case.runner["reference_exponents"]["e2e"] > 0.8
    assert case.verdict == "pass"


def test_a_baseline_keeps_its_processes_and_refuses_groups_that_do_not_add_up(tmp_path) -> None:
    base = baseline_of(measured(BASELINE_SPEED), NORMALIZED)
    path = tmp_path / "b.json"
    store.save(path, base)
    data = json.loads(path.read_text())
    assert data["scenarios"]["c"]["groups"] == [5, 5, 5]
    assert store.load(path).scenarios["c"].groups == (5, 5, 5)
    data["scenarios"]["c"]["groups"] = [5, 5]
    path.write_text(json.dumps(data))
    with pytest.raises(PerfguardError, match=r"b\.json.*scenarios.*c.*groups.*10 runs"):
        store.load(path)


def test_the_report_says_what_share_of_the_reference_each_case_was_scaled_by() -> None:
    from perfguard.presentation.summary import runner_text

    base = baseline_of(reference_of_its_own(1.0, seed=11, processes=10), NORMALIZED)
    res = reference_of_its_own(1.0, seed=12, processes=9)
    report = judge(Results({"platform": "cpu"}, {}, {"c": res}), base)
    share = report.cases[0].runner["reference_exponents"]["stage:DenoisingStage"]
    assert f"stage:DenoisingStage: c {share:.2f}" in runner_text(report)
