"""`perfguard calibrate`: measure the runner's noise and the gate's false-alarm rate and power."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.api.common import (
    Echo,
    baseline_path,
    load_baseline,
    probe,
    run_cases,
    select_cases,
    to_stderr,
)
from perfguard.errors import PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.storage.baseline import Baseline
from perfguard.storage.cases import Case, Selection

if TYPE_CHECKING:
    from perfguard.decision.calibrate import CaseCalibration, CheckSetup
    from perfguard.device.platform import Platform


@dataclass
class Calibration:
    """`calibrate`'s figures: one `CaseCalibration` per case, and what was written."""

    path: str | None
    profile: str
    cases: list[CaseCalibration]
    written: bool = False

    @property
    def failed(self) -> bool:
        return any(c.error for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"baseline": self.path, "profile": self.profile}
        for cal in self.cases:
            out[cal.case_id] = cal.to_json()
        return out


@dataclass(frozen=True)
class CalibrateOptions:
    """What calibrate reads and writes: the baseline file (default: this platform and
    hardware's), its tolerance profile, whether to store the suggested bands in it
    (`write`), and whether the per-step metrics are calibrated too."""

    baseline: str | None = None
    profile: str = "pr_test"
    write: bool = False
    all_metrics: bool = False


def check_setup_from(flags: dict[str, Any]) -> CheckSetup:
    """Pop the flags of the checks calibrated for out of `flags` into a `CheckSetup`;
    their repeats are the measurement's (`flags["options"]`)."""
    from perfguard.api.options import popped
    from perfguard.decision.calibrate import CheckSetup

    flags.pop("check_isolate")
    names = ("baseline_processes", "check_processes", "max_reruns", "trials")
    return CheckSetup(repeats=flags["options"].repeats, **popped(flags, *names))


def calibrate(
    selection: Selection,
    options: MeasureOptions,
    setup: CheckSetup,
    calibrating: CalibrateOptions = CalibrateOptions(),
    *,
    platform: Platform | None = None,
    echo: Echo = to_stderr,
) -> Calibration:
    """Measure this runner's noise per metric and what the gate can catch through it.

    Each case runs in `options.processes` fresh processes of `options.repeats` runs. Per
    metric: the noise within and between processes, the false-alarm rate of the current
    band, the smallest slowdown caught with >= 95 % probability at <= 1 % false alarms
    (simulated through the real rule for checks set up as `setup` says), and the
    tightest band that keeps false alarms within 1 %. `calibrating.write` stores those
    bands as per-case tolerance overrides in the baseline.
    """
    from perfguard.decision import calibrate as calibration

    _refuse(options, calibrating.write)
    platform = platform or probe()
    cases = select_cases(platform.name, selection, echo=echo)
    path, base, prof = _calibrated_baseline(cases, platform, calibrating)
    profile = calibrating.profile
    results = run_cases(cases, platform, options.replace(isolate=True))
    out = Calibration(path=path if base else None, profile=profile, cases=[])
    for case in cases:
        scenario = base.scenarios.get(case.id) if base else None
        result, timing = calibration.as_judged(results.cases[case.id], scenario, platform.name)
        out.cases.append(
            calibration.calibrate_case(
                result,
                prof,
                setup,
                scenario=scenario,
                all_metrics=calibrating.all_metrics,
                timing=timing,
            )
        )
    if calibrating.write and base is not None:
        _write_overrides(path, out.cases)
        out.written = True
    return out


def _refuse(options: MeasureOptions, write: bool) -> None:
    """Calibrate measures the runner as it is: no fault injection; and a band written
    needs enough processes to resolve a 1 % false-alarm rate."""
    from perfguard.decision import calibrate as calibration
    from perfguard.device.inject import ENV_INJECT, inject_from

    runs = options.processes
    if options.inject or inject_from(None):
        raise PerfguardError(f"calibrate refuses fault injection (${ENV_INJECT} is set)")
    if write and runs < calibration.MIN_RUNS_TO_WRITE:
        raise PerfguardError(
            f"calibrate --write needs --runs >= {calibration.MIN_RUNS_TO_WRITE} (got {runs}): "
            f"from {runs} processes the simulated false-alarm rate moves in steps of "
            f"1/{runs}^2 = {1 / runs**2:.0%}, too coarse to hold a band to "
            f"{calibration.FALSE_ALARM_TARGET:.0%}"
        )


def _calibrated_baseline(
    cases: list[Case], platform: Platform, calibrating: CalibrateOptions
) -> tuple[str, Baseline | None, Any]:
    """The baseline's path, the baseline (None when there is none and nothing is to be
    written) and the tolerance profile judged by; writing needs a scenario for every
    case, checked before measuring."""
    from perfguard.decision.tolerances import default_profiles
    from perfguard.storage import baseline as store

    path = baseline_path(calibrating.baseline, platform.name, platform.hardware_slug())
    write = calibrating.write
    base = load_baseline(path) if (write or os.path.exists(path)) else None
    if base is not None:
        store.check_platform(base, platform.name, path)
    profile = calibrating.profile
    prof = base.profile(profile) if base else default_profiles(platform.name)[profile]
    if write and base is not None:  # base is None only without --write
        missing = [c.id for c in cases if c.id not in base.scenarios]
        if missing:
            raise PerfguardError(
                f"{path}: no scenario for {', '.join(missing)}: "
                "run gen-baselines for them before calibrate --write"
            )
    return path, base, prof


def _write_overrides(path: str, calibrated: list[CaseCalibration]) -> None:
    """Store each calibrated case's suggested bands as its tolerance overrides, under the
    baseline's lock."""
    from perfguard.decision import calibrate as calibration
    from perfguard.storage import baseline as store

    with store.lock(path):
        current = store.load(path)
        for cal in calibrated:
            if cal.error or not cal.detections:
                continue
            scenario = current.scenarios[cal.case_id]
            merged = calibration.suggested_overrides(cal.detections, scenario.tolerance_overrides)
            current = current.with_scenario(
                cal.case_id, dataclasses.replace(scenario, tolerance_overrides=merged)
            )
        store.save(path, current.touched())
