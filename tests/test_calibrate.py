"""`perfguard calibrate`: noise within and between processes, what the gate catches, bands.

The library tests feed synthetic processes with known noise; the command-line test runs
the real Qwen-Image smoke case in two fresh processes and writes the suggested bands.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import pytest

from perfguard.cli import main
from perfguard.decision import calibrate as calibrate_module
from perfguard.decision.calibrate import (
    CheckSetup,
    as_judged,
    calibrate_case,
    detection,
    measure_noise,
    suggested_overrides,
)
from perfguard.decision.comparison import Rule
from perfguard.decision.stats import Summary
from perfguard.decision.tolerances import Band, default_profiles
from perfguard.results import CaseResult, pool
from perfguard.storage.baseline import Scenario

REPO = Path(__file__).resolve().parents[1]
M = "stage:DenoisingStage"
TRIALS = 100
"""Simulated checks per figure in the detection tests: the fewest whose false-alarm rate
still resolves the 1 % target (one alarm in 100; at 50 a rate is 0 % or 2 %, and the
target would mean no alarm at all). The command's default samples more (DEFAULT_TRIALS)."""


def measured(within: float, between: float, processes: int = 8, n: int = 10) -> CaseResult:
    """`processes` processes of `n` runs: offsets ~ N(0, between), samples ~ N(0, within)."""
    rng = random.Random(0)
    parts = []
    for _ in range(processes):
        centre = 20.0 * math.exp(rng.gauss(0.0, between))
        xs = [centre * math.exp(rng.gauss(0.0, within)) for _ in range(n)]
        parts.append(CaseResult("c", samples={M: xs, "e2e": [x + 2 for x in xs]}, repeats=n))
    return pool(parts)


def test_noise_is_split_into_within_and_between_processes() -> None:
    (_, denoise) = measure_noise(measured(within=0.02, between=0.06, processes=12))
    assert denoise.metric == M and denoise.processes == 12 and denoise.repeats == 10
    assert denoise.within == pytest.approx(0.02, rel=0.35)
    assert denoise.between == pytest.approx(0.06, rel=0.4)
    assert len(denoise.offsets) == 12 and abs(sum(denoise.offsets)) < 1e-9
    with pytest.raises(ValueError):
        measure_noise(CaseResult("c", samples={M: [1.0, 2.0]}, repeats=2))


def test_a_quiet_metric_gets_a_tight_band_that_catches_small_slowdowns() -> None:
    (_, noise) = measure_noise(measured(within=0.01, between=0.005))
    setup = CheckSetup(repeats=10, trials=TRIALS)
    det = detection(noise, Band(0.25, 1.2), setup)
    assert det.false_alarm <= 0.01
    assert det.catches is not None and 0.25 <= det.catches <= 0.35  # the 25 % band decides
    assert det.suggested.rel <= 0.05 and det.suggested_false_alarm <= 0.01
    assert det.suggested.abs <= det.suggested.rel * noise.median + 0.001  # pad lowered too
    assert det.suggested_catches is not None and det.suggested_catches <= 0.1


def test_more_noise_needs_a_wider_band_and_more_processes_see_more() -> None:
    quiet = measure_noise(measured(within=0.01, between=0.01))[1]
    noisy = measure_noise(measured(within=0.01, between=0.08))[1]
    setup = CheckSetup(repeats=10, trials=TRIALS)
    # At 1 % with 4 confirmations the band must widen to hold the false alarms of a noisy
    # runner; at the stored level (0.1 %, 8) the interval holds them, and the noise shows
    # as a larger smallest slowdown caught.
    lax = CheckSetup(repeats=10, trials=TRIALS, rule=Rule(alpha=0.01), max_reruns=4)
    assert (
        detection(noisy, Band(0.25, 0.0), lax).suggested.rel
        > detection(quiet, Band(0.25, 0.0), lax).suggested.rel
    )
    one = detection(noisy, Band(0.25, 0.0), setup)
    calm = detection(quiet, Band(0.25, 0.0), setup)
    assert calm.suggested_catches is not None
    assert one.suggested_catches is None or one.suggested_catches > calm.suggested_catches
    many = detection(
        noisy,
        Band(0.25, 0.0),
        CheckSetup(repeats=10, trials=TRIALS, check_processes=4, baseline_processes=8),
    )
    # More processes catch a smaller slowdown; with one process a side the between-process
    # spread has too few degrees of freedom to catch any within +200 % (None).
    assert many.suggested_catches is not None
    assert one.suggested_catches is None or many.suggested_catches < one.suggested_catches


def test_the_checks_own_widening_of_a_band_is_simulated() -> None:
    # A check raises a band's pad to a few standard errors of its baseline
    # (`Profile.noise_band`); a simulation without it would promise slowdowns the check
    # cannot catch.
    (_, noise) = measure_noise(measured(within=0.02, between=0.005))
    setup = CheckSetup(repeats=10, trials=TRIALS)
    band = Band(0.03, 0.0)
    plain = detection(noise, band, setup)
    seen: list[Summary] = []

    def widen(b: Band, baseline: Summary) -> Band:
        seen.append(baseline)
        return Band(b.rel, 0.25 * baseline.median)  # a pad of +25 %

    padded = detection(noise, band, setup, widen)
    assert seen and all(s.n == 10 for s in seen)  # every simulated baseline, as a check
    assert plain.catches is not None and plain.catches < 0.2
    assert padded.catches is not None and padded.catches >= 0.25
    assert padded.false_alarm <= plain.false_alarm
    # calibrate_case judges with its profile's own widening: a profile whose noise pad
    # is 30 standard errors (~+33 % here) moves what it says is caught. (Only the gated
    # metric's samples: calibrating e2e as well would simulate a figure nobody asserts on.)
    profile = dataclasses.replace(default_profiles("cpu")["pr_test"], noise_pad=30.0)
    runs = measured(0.02, 0.005)
    cal = calibrate_case(dataclasses.replace(runs, samples={M: runs.samples[M]}), profile, setup)
    gate = {d.noise.metric: d for d in cal.detections}[M]
    assert gate.catches == detection(noise, profile.band(M), setup, profile.noise_band).catches
    assert gate.catches != detection(noise, profile.band(M), setup).catches


def scenario(timing: str | None, reference: float | None) -> Scenario:
    ref = Summary(median=reference, n=3) if reference is not None else None
    return Scenario(metrics={}, reference=ref, timing=timing)


def test_calibrate_measures_in_the_timing_the_check_judges() -> None:
    runs = CaseResult(
        "c",
        samples={M: [18.0, 20.0, 24.0], "peak_memory": [5.0, 5.0, 5.0]},
        repeats=3,
        reference=[1.8, 2.0, 2.4],
    )
    got, timing = as_judged(runs, scenario("normalized", 2.0), "cuda")
    assert timing == "normalized" and got.samples[M] == pytest.approx([20.0, 20.0, 20.0])
    assert got.samples["peak_memory"] == [5.0, 5.0, 5.0]  # memory is not scaled
    got, timing = as_judged(runs, scenario("raw", 2.0), "cpu")
    assert timing == "raw" and got.samples[M] == [18.0, 20.0, 24.0]
    # No baseline yet: the platform's default, at the runs' own reference median.
    got, timing = as_judged(runs, None, "cpu")
    assert timing == "normalized" and got.samples[M] == pytest.approx([20.0, 20.0, 20.0])
    assert as_judged(runs, None, "cuda")[1] == "raw"
    # Runs the screen calls contended (reference > 1.3x the baseline's) are left out.
    got, _ = as_judged(runs, scenario("raw", 1.0), "cpu")
    assert got.samples[M] == [18.0, 20.0, 24.0]  # most runs contended: returned whole
    quiet = dataclasses.replace(runs, reference=[1.0, 1.0, 3.0])
    got, _ = as_judged(quiet, scenario("raw", 1.0), "cpu")
    assert got.samples[M] == [18.0, 20.0]
    # Without reference figures nothing can be normalized: raw, and said so.
    bare = dataclasses.replace(runs, reference=[])
    assert as_judged(bare, None, "cpu") == (bare, "raw")
    assert (
        calibrate_case(
            measured(0.01, 0.01),
            default_profiles("cpu")["pr_test"],
            CheckSetup(repeats=10, trials=20),
            timing="normalized",
        ).to_json()["timing"]
        == "normalized"
    )


def test_suggested_bands_are_metric_overrides_that_keep_the_others() -> None:
    cal = calibrate_case(
        measured(0.01, 0.01), default_profiles("cpu")["pr_test"], CheckSetup(repeats=10, trials=20)
    )
    assert [d.noise.metric for d in cal.detections] == ["e2e", M]
    merged = suggested_overrides(cal.detections, {"step:0": {"rel": 2.0}, M: {"abs": 9.0}})
    assert merged["step:0"] == {"rel": 2.0}
    assert set(merged[M]) == {"rel", "abs"} and merged[M]["abs"] < 9.0
    assert cal.to_json()["metrics"][M]["noise"]["processes"] == 8


def test_a_case_left_with_one_process_after_the_screen_is_an_error_not_a_crash() -> None:
    """The contention screen can drop a whole process: one left has no between-process
    noise to measure, and the case says so instead of the command crashing."""
    cal = calibrate_case(
        measured(0.01, 0.01, processes=1), default_profiles("cpu")["pr_test"], CheckSetup()
    )
    assert cal.error is not None and "2+ processes" in cal.error and not cal.detections


def test_calibrate_on_the_smoke_case_prints_noise_and_writes_bands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("perfguard.workloads.pipeline")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PERFGUARD_CASES", str(REPO / "cases"))
    monkeypatch.delenv("PERFGUARD_INJECT", raising=False)
    case = ("--platform", "cpu", "--case", "qwen_image_t2i_smoke", "--baseline", "b.json")

    def pg(*args: str) -> int:
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        return int(exc.value.code or 0)

    assert pg("gen-baselines", *case, "--repeats", "3", "--warmup", "0", "--processes", "1") == 0
    before = Path("b.json").read_bytes()
    capsys.readouterr()
    # Two processes cannot hold a band to 1 % false alarms: refused before anything runs.
    assert pg("calibrate", *case, "--runs", "2", "--write") == 2
    err = capsys.readouterr().err
    assert "calibrate --write needs --runs >= 10 (got 2)" in err and "steps of 1/2^2 = 25%" in err
    assert Path("b.json").read_bytes() == before
    # The write path itself, at the suite's budget of three processes (one may be
    # dropped whole by the contention screen, and two still measure the spread).
    monkeypatch.setattr(calibrate_module, "MIN_RUNS_TO_WRITE", 3)
    code = pg(
        "calibrate", *case, "--runs", "3", "--repeats", "4", "--trials", "50",
        "--write", "--json", "cal.json",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert "stage:DenoisingStage" in out and "suggested band" in out and "within" in out
    written = json.loads(Path("b.json").read_text())
    overrides = written["scenarios"]["qwen_image_t2i_smoke"]["tolerance_overrides"]
    assert set(overrides[M]) == {"rel", "abs"}
    report = json.loads(Path("cal.json").read_text())
    assert report["qwen_image_t2i_smoke"]["metrics"][M]["noise"]["processes"] in (2, 3)
    monkeypatch.setenv("PERFGUARD_INJECT", "DenoisingStage=+10%")
    assert pg("calibrate", *case, "--runs", "2") == 2  # never calibrate on injected time


def test_the_minimum_runs_to_write_resolve_the_false_alarm_target() -> None:
    # The simulated rate is a sum over K x K offset pairs: steps of 1/K^2 <= the target.
    k = calibrate_module.MIN_RUNS_TO_WRITE
    assert k == 10
    assert 1 / k**2 <= calibrate_module.FALSE_ALARM_TARGET < 1 / (k - 1) ** 2
