"""The decision: bands, per-metric verdicts, per-case verdicts, the overall exit code."""

from __future__ import annotations

import pytest

from perfguard.decision.comparison import Rule
from perfguard.decision.stats import Summary, summarize
from perfguard.decision.tolerances import Band, Profile, default_profiles, sglang_profiles
from perfguard.decision.verdict import gated_steps, judge, judge_metric, rule_of
from perfguard.errors import EXIT_CASE_FAILED, EXIT_OK, EXIT_REGRESSION
from perfguard.results import CaseResult, Results
from perfguard.storage.baseline import Baseline, Scenario

CUDA = sglang_profiles("cuda")["pr_test"]


def s(median: float, n: int = 5) -> Summary:
    return Summary(median=median, n=n)


def baseline_with(scenarios: dict[str, Scenario], **kw: object) -> Baseline:
    meta = {"platform": "cpu", "hardware": "x", "created": "t", "updated": "t"}
    meta.update(kw.pop("metadata", {}))  # type: ignore[arg-type]
    return Baseline(metadata=meta, profiles=sglang_profiles("cpu"), scenarios=scenarios, **kw)  # type: ignore[arg-type]


def result(samples: dict[str, list[float]], status: str = "ok", **case: object) -> CaseResult:
    return CaseResult(case_id="c", status=status, samples=samples, case=dict(case))


def results_of(**cases: CaseResult) -> Results:
    return Results(environment={"platform": "cpu", "hardware": "x"}, settings={}, cases=cases)


# ---- bands ---------------------------------------------------------------------------------


def test_bound_is_the_larger_of_the_relative_and_the_absolute_band() -> None:
    band = Band(rel=0.25, abs=20.0)
    assert band.bound(1000.0) == 1250.0  # relative dominates a large figure
    assert band.bound(10.0) == 30.0  # the pad dominates a small one


def test_a_stage_ending_in_decoding_stage_gets_sglangs_floor() -> None:
    assert CUDA.band("stage:DecodingStage") == Band(0.9, 450.0)
    assert CUDA.band("stage:Ideogram4DecodingStage") == Band(0.9, 450.0)
    assert CUDA.band("stage:TextEncodingStage") == Band(0.8, 120.0)


def test_step_zero_gets_sglangs_floor_and_other_steps_the_class_band() -> None:
    assert CUDA.band("step:0") == Band(4.0, 80.0)
    assert CUDA.band("step:1") == Band(0.3, 20.0)


def test_model_specific_denoising_stage_uses_the_denoise_stage_class() -> None:
    assert CUDA.band("stage:Ideogram4DenoisingStage") == Band(0.25, 120.0)


def test_cpu_profiles_scale_millisecond_pads_but_not_memory_pads() -> None:
    cpu = sglang_profiles("cpu")["pr_test"]
    assert cpu.abs["e2e"] == pytest.approx(0.2)
    assert cpu.abs["denoise_stage"] == pytest.approx(1.2)
    assert cpu.abs["peak_memory"] == CUDA.abs["peak_memory"] == 64.0
    assert cpu.band("stage:DecodingStage") == Band(0.9, 4.5)
    assert cpu.rel == CUDA.rel


def test_long_term_is_tighter_than_pr_test() -> None:
    profiles = sglang_profiles("cuda")
    for cls, rel in profiles["long_term"].rel.items():
        assert rel <= profiles["pr_test"].rel[cls]


def test_on_a_measured_baseline_the_two_profiles_judge_alike() -> None:
    """sglang's profiles differ (its bands stand in for noise it never measured); a
    measured baseline's bands are the minimum effects and its noise, the same for a PR
    and a nightly: the nightly differs by sampling more (`--rigorous`), not by profile."""
    for platform in ("cpu", "cuda"):
        measured = default_profiles(platform)
        pr, nightly = measured["pr_test"].to_json(), measured["long_term"].to_json()
        assert pr == nightly
    assert sglang_profiles("cuda")["pr_test"].rel != sglang_profiles("cuda")["long_term"].rel


def test_the_baselines_override_wins_over_the_registrys() -> None:
    registry = {"e2e": {"rel": 0.5, "abs": 1.0}}
    scenario = {"e2e": {"rel": 0.1}}
    assert CUDA.band("e2e", [registry, scenario]) == Band(0.1, 1.0)


def test_a_class_override_does_not_tighten_a_floored_metric_but_a_metric_override_does() -> None:
    tighten_steps = {"denoise_step": {"rel": 0.05, "abs": 1.0}}
    assert CUDA.band("step:3", [tighten_steps]) == Band(0.05, 1.0)
    assert CUDA.band("step:0", [tighten_steps]) == Band(4.0, 80.0)
    assert CUDA.band("step:0", [tighten_steps, {"step:0": {"rel": 0.5}}]) == Band(0.5, 80.0)


def test_profile_round_trips_through_json() -> None:
    assert Profile.from_json("pr_test", CUDA.to_json()) == CUDA


# ---- summaries -----------------------------------------------------------------------------


def test_summary_keeps_median_spread_and_samples() -> None:
    summary = summarize([10.0, 11.0, 12.0, 13.0, 100.0])
    assert summary.median == 12.0
    assert (summary.min, summary.max, summary.n) == (10.0, 100.0, 5)
    assert summary.iqr == pytest.approx(2.0)
    assert summary.mad == pytest.approx(1.0)
    assert summary.samples == (10.0, 11.0, 12.0, 13.0, 100.0)


def test_one_sample_has_no_spread() -> None:
    summary = summarize([7.0])
    assert (summary.median, summary.iqr, summary.mad) == (7.0, 0.0, 0.0)


# ---- one metric ----------------------------------------------------------------------------


def test_median_above_the_bound_is_a_regression_with_its_figures() -> None:
    v = judge_metric("e2e", [130.0, 131.0, 500.0], s(100.0), Band(0.25, 2.0))
    assert v.verdict == "regression"
    assert (v.bound, v.measured.median) == (125.0, 131.0)  # type: ignore[union-attr]
    assert v.ratio == pytest.approx(1.31)
    assert "bound" in v.reason


def test_one_outlier_does_not_make_a_regression() -> None:
    v = judge_metric("e2e", [100.0, 101.0, 900.0], s(100.0), Band(0.25, 2.0))
    assert v.verdict == "pass"


def test_exactly_at_the_bound_passes_the_band_is_one_sided() -> None:
    assert judge_metric("e2e", [125.0], s(100.0), Band(0.25, 2.0)).verdict == "pass"
    assert judge_metric("e2e", [1.0], s(100.0), Band(0.25, 2.0)).verdict == "improvement"


def test_faster_than_the_threshold_is_an_improvement_not_a_failure() -> None:
    v = judge_metric("e2e", [79.0], s(100.0), Band(0.25, 2.0), improvement_threshold=0.2)
    assert v.verdict == "improvement"
    assert judge_metric("e2e", [81.0], s(100.0), Band(0.25, 2.0)).verdict == "pass"


def test_a_tiny_stage_halving_is_not_an_improvement_within_the_pad() -> None:
    v = judge_metric("stage:InputValidationStage", [0.02], s(0.04), Band(0.8, 1.2))
    assert v.verdict == "pass"


def test_metric_without_samples_is_a_missing_stage_and_without_baseline_a_new_stage() -> None:
    assert judge_metric("stage:X", None, s(1.0), Band(0.8, 1.0)).verdict == "missing-stage"
    assert judge_metric("stage:X", [1.0], None, Band(0.8, 1.0)).verdict == "new-stage"


# ---- cases and overall ---------------------------------------------------------------------


def _scenario(**metrics: float) -> Scenario:
    return Scenario(metrics={k.replace("__", ":"): s(v) for k, v in metrics.items()})


def test_a_failed_case_is_an_error_and_exits_3() -> None:
    b = baseline_with({"c": _scenario(e2e=10.0)})
    j = judge(results_of(c=result({}, status="error")), b)
    assert j.cases[0].verdict == "error"
    assert j.exit_code == EXIT_CASE_FAILED


def test_a_regression_wins_over_a_failed_case() -> None:
    b = baseline_with({"a": _scenario(e2e=10.0), "c": _scenario(e2e=10.0)})
    j = judge(results_of(a=result({"e2e": [50.0]}), c=result({}, status="error")), b)
    assert (j.verdict, j.exit_code) == ("fail", EXIT_REGRESSION)


def test_missing_baselines_pass_unless_fail_on_missing() -> None:
    b = baseline_with({})
    res = results_of(c=result({"e2e": [5.0]}))
    assert judge(res, b).cases[0].verdict == "missing-baseline"
    assert judge(res, b).exit_code == EXIT_OK
    assert judge(res, b, fail_on_missing=True).exit_code == EXIT_REGRESSION


def test_missing_and_new_stages_are_reported_and_fail_only_with_fail_on_missing() -> None:
    b = baseline_with({"c": _scenario(e2e=10.0, stage__Old=1.0)})
    res = results_of(c=result({"e2e": [10.0], "stage:New": [1.0]}))
    j = judge(res, b)
    verdicts = {m.metric: m.verdict for m in j.cases[0].metrics}
    assert verdicts == {"e2e": "pass", "stage:New": "new-stage", "stage:Old": "missing-stage"}
    assert j.exit_code == EXIT_OK
    assert judge(res, b, fail_on_missing=True).exit_code == EXIT_REGRESSION


def test_advisory_from_flag_profile_or_metadata_reports_but_never_fails() -> None:
    res = results_of(c=result({"e2e": [50.0]}))
    plain = baseline_with({"c": _scenario(e2e=10.0)})
    assert judge(res, plain).exit_code == EXIT_REGRESSION
    assert judge(res, plain, advisory=True).exit_code == EXIT_OK
    marked = baseline_with({"c": _scenario(e2e=10.0)}, metadata={"advisory": True})
    j = judge(res, marked)
    assert (j.exit_code, j.advisory, j.cases[0].verdict) == (EXIT_OK, True, "regression")
    profiles = sglang_profiles("cpu")
    profiles["pr_test"] = Profile(**{**profiles["pr_test"].__dict__, "advisory": True})
    adv = Baseline(metadata=plain.metadata, profiles=profiles, scenarios=plain.scenarios)
    assert judge(res, adv).exit_code == EXIT_OK
    assert judge(res, adv, "long_term").exit_code == EXIT_REGRESSION


def test_registry_overrides_travel_with_the_result_and_the_baselines_win() -> None:
    res = results_of(c=result({"e2e": [14.0]}, tolerance_overrides={"e2e": {"rel": 0.5}}))
    assert judge(res, baseline_with({"c": _scenario(e2e=10.0)})).exit_code == EXIT_OK
    tight = Scenario(metrics={"e2e": s(10.0)}, tolerance_overrides={"e2e": {"rel": 0.1}})
    assert judge(res, baseline_with({"c": tight})).exit_code == EXIT_REGRESSION


def test_step_fractions_gate_only_the_sampled_steps() -> None:
    assert gated_steps(50, [0.0, 0.5, 1.0]) == {0, 24, 49}  # round(0.5 * 49) = 24 (banker's)
    assert gated_steps(4, None) is None
    steps = {f"step__{i}": 10.0 for i in range(5)}
    b = baseline_with({"c": _scenario(e2e=100.0, **steps)}, step_fractions=(0.0, 1.0))
    samples = {"e2e": [100.0], **{f"step:{i}": [10.0] for i in range(5)}}
    samples["step:2"] = [99.0]  # not sampled: not judged
    j = judge(results_of(c=result(samples)), b)
    assert [m.metric for m in j.cases[0].metrics] == ["e2e", "step:0", "step:4"]
    assert j.exit_code == EXIT_OK


def test_unknown_profile_is_a_usage_error() -> None:
    from perfguard.errors import PerfguardError

    with pytest.raises(PerfguardError, match="no tolerance profile 'nightly'"):
        judge(results_of(c=result({"e2e": [1.0]})), baseline_with({}), "nightly")


def test_counts_add_up_metric_verdicts_and_case_errors() -> None:
    b = baseline_with({"a": _scenario(e2e=10.0, stage__S=10.0)})
    res = results_of(a=result({"e2e": [50.0], "stage:S": [10.0]}), b=result({}, status="error"))
    counts = judge(res, b).counts
    assert (counts["regression"], counts["pass"], counts["error"]) == (1, 1, 1)


def test_the_per_step_metrics_share_alpha_and_the_others_keep_it() -> None:
    judged = ["e2e", "stage:DenoisingStage", "step:0", "step:1", "step:2", "step:3", "step_avg"]
    rule = Rule(alpha=0.01)
    assert rule_of("step:2", judged, rule).alpha == pytest.approx(0.0025)
    for metric in ("e2e", "stage:DenoisingStage", "step_avg"):
        assert rule_of(metric, judged, rule) is rule
    assert rule_of("step:0", ["e2e", "step:0"], rule) is rule  # a family of one
