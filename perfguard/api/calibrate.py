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
from perfguard.storage.cases import Selection

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


def calibrate(
    selection: Selection,
    options: MeasureOptions,
    setup: CheckSetup,
    *,
    baseline: str | None = None,
    profile: str = "pr_test",
    write: bool = False,
    all_metrics: bool = False,
    platform: Platform | None = None,
    echo: Echo = to_stderr,
) -> Calibration:
    """Measure this runner's noise per metric and what the gate can catch through it.

    Each case runs in `options.processes` fresh processes of `options.repeats` runs. Per
    metric: the noise within and between processes, the false-alarm rate of the current
    band, the smallest slowdown caught with >= 95 % probability at <= 1 % false alarms
    (simulated through the real rule for checks set up as `setup` says), and the
    tightest band that keeps false alarms within 1 %. `write` stores those bands as
    per-case tolerance overrides in the baseline.
    """
    from perfguard.decision import calibrate as calibration
    from perfguard.decision.tolerances import default_profiles
    from perfguard.device.inject import ENV_INJECT, inject_from
    from perfguard.storage import baseline as store

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
    platform = platform or probe()
    cases = select_cases(platform.name, selection, echo=echo)
    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    base = load_baseline(path) if (write or os.path.exists(path)) else None
    if base is not None:
        store.check_platform(base, platform.name, path)
    prof = base.profile(profile) if base else default_profiles(platform.name)[profile]
    if write and base is not None:  # base is None only without --write
        missing = [c.id for c in cases if c.id not in base.scenarios]
        if missing:
            raise PerfguardError(
                f"{path}: no scenario for {', '.join(missing)}: "
                "run gen-baselines for them before calibrate --write"
            )
    results = run_cases(cases, platform, options.replace(isolate=True))
    out = Calibration(path=path if base else None, profile=profile, cases=[])
    for case in cases:
        scenario = base.scenarios.get(case.id) if base else None
        result, timing = calibration.as_judged(results.cases[case.id], scenario, platform.name)
        out.cases.append(
            calibration.calibrate_case(
                result, prof, setup, scenario=scenario, all_metrics=all_metrics, timing=timing
            )
        )
    if write and base is not None:
        with store.lock(path):
            current = store.load(path)
            for cal in out.cases:
                if cal.error or not cal.detections:
                    continue
                scenario = current.scenarios[cal.case_id]
                merged = calibration.suggested_overrides(
                    cal.detections, scenario.tolerance_overrides
                )
                current = current.with_scenario(
                    cal.case_id, dataclasses.replace(scenario, tolerance_overrides=merged)
                )
            store.save(path, current.touched())
        out.written = True
    return out
