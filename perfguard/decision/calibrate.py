"""What can this runner's gate see? Noise per metric, and the smallest slowdown it catches.

`perfguard calibrate` measures each selected case in K fresh processes (`--runs`) and
derives, per metric:

- `within`: the per-sample noise inside one process (1.4826 x MAD of the log samples,
  the median over the K processes): what more repeats average out;
- `between`: the spread of the per-process medians beyond what `within` explains (sd of
  their logs, less the part the samples' noise already accounts for): what only more
  processes average out, and what no test on one process's samples can see;
- the smallest slowdown that the current rule and bands catch with at least 95 %
  probability while alarming on at most 1 % of unchanged runs, for the check
  configuration given (baseline processes, check processes, repeats, re-runs);
- a suggested relative band: the tightest one (in whole percent) whose false-alarm
  rate stays within 1 %, and what it then catches.

Why simulate rather than use a formula: the rule is a band AND a credibility test AND
confirmation re-runs, with the noise estimated from the very samples it judges; a
closed form would have to idealise each step. So the simulation draws synthetic
baselines and checks from the measured noise and runs them through the real
`perfguard.decision.verdict.judge_metric`, re-runs included: whatever the rule does, the figures
describe it. Each synthetic process gets one of the measured process offsets (log
process median minus their mean, scaled so that their variance is `between`^2) and
samples drawn from the measured within-process residuals (log sample minus its
process's median, pooled): both keep their real shape. The shape matters: on the
shared CPU runner most processes agree within a few percent and an occasional one
runs far slower through an episode of contention, which a normal model of the same
variance gets wrong in both directions. Common random numbers (one seed for every band
and slowdown tried) keep the searched curves monotone. More `--runs` give the offsets
a truer shape: five processes see a 1-in-10 episode only by luck.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from perfguard.decision.comparison import DEFAULT_RULE, Rule
from perfguard.decision.contention import DEFAULT_POLICY, screen
from perfguard.decision.normalize import as_checked, normalized
from perfguard.decision.options import DEFAULT_MAX_RERUNS
from perfguard.decision.records import REGRESSION
from perfguard.decision.stats import (
    MAD_TO_SD,
    MEDIAN_SE_FACTOR,
    Summary,
    split_groups,
    summarize,
)
from perfguard.decision.tolerances import Band, Profile
from perfguard.decision.verdict import judge_metric
from perfguard.metrics import NORMALIZED, RAW, default_timing, metric_class, metric_sort_key
from perfguard.results import CaseResult

if TYPE_CHECKING:
    from perfguard.storage.baseline import Scenario

Widen = Callable[[Band, Summary], Band]
"""What a check does to a band against one baseline before judging (`Profile.noise_band`)."""

FALSE_ALARM_TARGET = 0.01
"""The share of unchanged checks a calibrated band may fail: 1 % of simulated checks."""
CATCH_TARGET = 0.95
"""How often a slowdown must be caught to count as caught: 95 % of simulated checks."""
DEFAULT_TRIALS = 400
"""Simulated checks per point: the false-alarm estimate at 1 % then has a standard error
of 0.5 %, and a whole calibration of a case stays within a few seconds."""
MIN_RUNS_TO_WRITE = math.ceil(1 / math.sqrt(FALSE_ALARM_TARGET))
"""The fewest processes (`--runs`) from which `calibrate --write` stores bands: 10. A
simulated false-alarm rate over K measured process offsets moves in steps of 1/K^2, so
below 10 processes "at most 1 %" cannot be expressed (1/16 = 6 % at K = 4); the
reasoning in full is in docs/measurements/2026-12-07-constants.md."""
MAX_SLOWDOWN = 2.0
"""The search for the smallest caught slowdown stops at +200 %: beyond, 'not caught'."""


@dataclass(frozen=True)
class MetricNoise:
    """The measured noise of one metric (log scale, i.e. about a relative figure)."""

    metric: str
    median: float
    within: float
    between: float
    process_sd: float
    processes: int
    repeats: int
    residuals: tuple[float, ...]
    offsets: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "median": round(self.median, 4),
            "within": round(self.within, 5),
            "between": round(self.between, 5),
            "process_sd": round(self.process_sd, 5),
            "processes": self.processes,
            "repeats": self.repeats,
        }


def measure_noise(result: CaseResult, metrics: Sequence[str] | None = None) -> list[MetricNoise]:
    """The noise of each metric of a result pooled from several processes (`groups`)."""
    if result.status != "ok":
        raise ValueError(f"{result.case_id}: {result.error}")
    if not result.groups or len(result.groups) < 2:
        raise ValueError(f"{result.case_id}: calibration needs samples from 2+ processes")
    names = metrics or [m for m in result.samples if not m.startswith("step:")]
    out = []
    for name in sorted(names, key=metric_sort_key):
        values = result.samples[name]
        try:
            parts = split_groups(values, result.groups)
        except ValueError:
            continue  # a metric some runs did not produce
        if min(values) <= 0:
            continue
        logs = [[math.log(x) for x in p] for p in parts]
        centres = [statistics.median(p) for p in logs]
        residuals = tuple(v - c for p, c in zip(logs, centres, strict=True) for v in p)
        within = statistics.median(
            MAD_TO_SD * statistics.median(abs(v - c) for v in p)
            for p, c in zip(logs, centres, strict=True)
        )
        n = statistics.median(len(p) for p in parts)
        process_sd = statistics.stdev(centres)
        explained = (MEDIAN_SE_FACTOR * within) ** 2 / n
        between = math.sqrt(max(0.0, process_sd**2 - explained))
        mean = sum(centres) / len(centres)
        scale = between / process_sd if process_sd > 0 else 0.0
        offsets = tuple((c - mean) * scale for c in centres)
        out.append(
            MetricNoise(
                metric=name,
                median=statistics.median(values),
                within=within,
                between=between,
                process_sd=process_sd,
                processes=len(parts),
                repeats=int(n),
                residuals=residuals,
                offsets=offsets,
            )
        )
    return out


@dataclass(frozen=True)
class CheckSetup:
    """How the checks being calibrated for are run (mirrors `check`'s flags).

    A check over its bound is confirmed in up to `max_reruns` fresh processes, one at a
    time, while it stays over (see `perfguard.decision.gate`): each confirmation draws its own
    process offset.
    """

    repeats: int = 5
    baseline_processes: int = 1
    check_processes: int = 1
    max_reruns: int = DEFAULT_MAX_RERUNS
    rule: Rule = DEFAULT_RULE
    trials: int = DEFAULT_TRIALS
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "repeats": self.repeats,
            "baseline_processes": self.baseline_processes,
            "check_processes": self.check_processes,
            "max_reruns": self.max_reruns,
            "reruns_in_fresh_processes": True,  # the gate's only kind (kept for readers)
            "alpha": self.rule.alpha,
            "trials": self.trials,
        }


class _Draws:
    """Pre-drawn random numbers for every trial, shared by every band and slowdown tried."""

    def __init__(self, noise: MetricNoise, setup: CheckSetup) -> None:
        rng = np.random.default_rng(setup.seed)
        n, t = setup.repeats, setup.trials
        res = np.asarray(noise.residuals)
        kb = setup.baseline_processes
        kc = setup.check_processes + setup.max_reruns
        off = np.asarray(noise.offsets)
        centre = math.log(noise.median)
        self.base = centre + rng.choice(off, (t, kb, 1)) + rng.choice(res, (t, kb, n))
        offsets = rng.choice(off, (t, kc, 1))  # each confirmation: a fresh process
        self.check = centre + offsets + rng.choice(res, (t, kc, n))
        groups = [n] * kb if kb > 1 else None
        self.baselines = [summarize(np.exp(b).ravel().tolist(), groups=groups) for b in self.base]


def _alarm_rate(
    noise: MetricNoise,
    band: Band,
    slowdown: float,
    setup: CheckSetup,
    draws: _Draws,
    widen: Widen | None = None,
) -> float:
    """The fraction of simulated checks that end in a regression verdict.

    `widen(band, baseline)` is what the check does to a band before it judges against
    that baseline (`Profile.noise_band`: the pad raised to a few standard errors of the
    baseline's median), applied to each simulated baseline as the check applies it to
    the stored one.
    """
    n, kc = setup.repeats, setup.check_processes
    shift = math.log1p(slowdown)
    alarms = 0
    for t, baseline in enumerate(draws.baselines):
        judged = widen(band, baseline) if widen is not None else band
        used = kc
        while True:
            current = np.exp(draws.check[t, :used] + shift).ravel().tolist()
            groups = [n] * used  # one group per process, as `results.pool` keeps them
            v = judge_metric(
                noise.metric,
                current,
                baseline,
                judged,
                rule=setup.rule,
                groups=groups if len(groups) > 1 else None,
            )
            if not v.over or used >= kc + setup.max_reruns:
                break
            used += 1
        alarms += v.verdict == REGRESSION
    return alarms / setup.trials


def _smallest(predicate: Any, lo: float, hi: float, step: float) -> float | None:
    """The smallest x on the grid lo, lo+step, ..., hi with predicate(x), by bisection
    (predicate assumed monotone); None when even hi fails."""
    steps = round((hi - lo) / step)
    if not predicate(lo + steps * step):
        return None
    a, b = 0, steps
    while a < b:
        mid = (a + b) // 2
        if predicate(lo + mid * step):
            b = mid
        else:
            a = mid + 1
    return round(lo + a * step, 6)


@dataclass(frozen=True)
class Detection:
    """What the gate sees of one metric under the current band and under the suggested one."""

    noise: MetricNoise
    band: Band
    false_alarm: float
    catches: float | None
    suggested: Band
    suggested_false_alarm: float
    suggested_catches: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "noise": self.noise.to_json(),
            "band": self.band.to_json(),
            "false_alarm": self.false_alarm,
            "catches": self.catches,
            "suggested_band": self.suggested.to_json(),
            "suggested_false_alarm": self.suggested_false_alarm,
            "suggested_catches": self.suggested_catches,
        }


def detection(
    noise: MetricNoise, band: Band, setup: CheckSetup, widen: Widen | None = None
) -> Detection:
    """False alarms and the smallest slowdown caught (>= 95 %), now and with a tighter band.

    The suggested band is the smallest relative tolerance r (whole percent, at least
    1 %) whose simulated false-alarm rate is within 1 %, with the pad lowered to at most
    r x the median: a pad stands in for jitter nobody measured, and calibration just
    measured it; kept, sglang's pads (1.2 ms on a 0.4 ms CPU stage) would hide any
    slowdown of a small stage however tight r is. `widen` is the check's own widening
    of a band against each baseline (see `_alarm_rate`), applied to the suggested band
    too, since a check applies it to stored overrides alike.
    """
    draws = _Draws(noise, setup)

    def rate(b: Band, slowdown: float) -> float:
        return _alarm_rate(noise, b, slowdown, setup, draws, widen)

    def tightened(r: float) -> Band:
        return Band(r, min(band.abs, math.ceil(r * noise.median * 1000) / 1000))

    def caught(b: Band) -> float | None:
        if rate(b, 0.0) > FALSE_ALARM_TARGET:
            return None
        return _smallest(lambda s: rate(b, s) >= CATCH_TARGET, 0.01, MAX_SLOWDOWN, 0.01)

    fa = rate(band, 0.0)
    rel = _smallest(lambda r: rate(tightened(r), 0.0) <= FALSE_ALARM_TARGET, 0.01, 1.0, 0.01)
    suggested = tightened(rel) if rel is not None else Band(max(band.rel, 1.0), band.abs)
    return Detection(
        noise=noise,
        band=band,
        false_alarm=fa,
        catches=caught(band),
        suggested=suggested,
        suggested_false_alarm=rate(suggested, 0.0),
        suggested_catches=caught(suggested),
    )


def suggested_overrides(
    detections: Sequence[Detection], existing: Mapping[str, Mapping[str, float]]
) -> dict[str, dict[str, float]]:
    """`existing` tolerance overrides with each metric's suggested `rel` written in.

    Metric-keyed, so they win over class-keyed overrides and the profile's floors (see
    `Profile.band`); both `rel` and `abs` are written, since the suggestion is a band.
    """
    out = {k: dict(v) for k, v in existing.items()}
    for d in detections:
        out[d.noise.metric] = {**out.get(d.noise.metric, {}), **d.suggested.to_json()}
    return out


@dataclass(frozen=True)
class CaseCalibration:
    """Every selected metric's detection figures for one case, and the setup they assume."""

    case_id: str
    setup: CheckSetup
    detections: tuple[Detection, ...] = ()
    error: str | None = None
    timing: str = RAW

    def to_json(self) -> dict[str, Any]:
        return {
            "setup": self.setup.to_json(),
            "timing": self.timing,
            "error": self.error,
            "metrics": {d.noise.metric: d.to_json() for d in self.detections},
        }


def as_judged(
    result: CaseResult, scenario: Scenario | None, platform: str
) -> tuple[CaseResult, str]:
    """`result` as a check would judge it against `scenario` (`verdict.as_checked`), and
    its timing; with no scenario yet, screened at its own quiet level and, where the
    platform's default timing is normalized, scaled to its own reference median: the
    noise calibrate measures is then the noise the check sees."""
    if result.status != "ok":
        return result, RAW
    if scenario is not None:
        checked, _, scaled = as_checked(result, scenario)
        return checked, NORMALIZED if scaled else RAW
    screened, _ = screen(result, None, DEFAULT_POLICY)
    scaled = None
    if default_timing(platform) == NORMALIZED and result.reference:
        scaled = normalized(screened, statistics.median(result.reference))
    return (screened, RAW) if scaled is None else (scaled, NORMALIZED)


def calibrate_case(
    result: CaseResult,
    profile: Profile,
    setup: CheckSetup,
    *,
    scenario: Scenario | None = None,
    all_metrics: bool = False,
    timing: str = RAW,
) -> CaseCalibration:
    """Noise and detection figures for one case measured in several processes.

    `timing` says which figures `result` holds: `normalized` when the caller scaled its
    runs by the reference beside each (`perfguard.decision.normalize`), as a check
    against a normalized baseline judges them; it is reported with the figures.

    Bands come from `profile` with the case's registry overrides and the baseline
    scenario's (as `check` resolves them). The baseline's processes are the scenario's
    (`gen-baselines --processes`), else `setup.baseline_processes`. Peak memory is left
    out (it is not timing noise), and so are the per-step metrics unless `all_metrics`.
    """
    import dataclasses

    if result.status != "ok":
        return CaseCalibration(result.case_id, setup, error=result.error or "case failed")
    if not result.groups or len(result.groups) < 2:
        return CaseCalibration(
            result.case_id, setup,
            error="calibration needs samples from 2+ processes, and fewer were left after "
            "the contention screen: run it with more --runs, or on a quieter runner",
        )  # fmt: skip
    if scenario is not None:
        stored = [len(s.processes) for s in scenario.metrics.values() if s.processes]
        if stored:
            setup = dataclasses.replace(setup, baseline_processes=max(stored))
    overrides = [result.case.get("tolerance_overrides") or {}]
    if scenario is not None:
        overrides.append(scenario.tolerance_overrides)
    names = [
        m
        for m in result.samples
        if metric_class(m) != "peak_memory" and (all_metrics or not m.startswith("step:"))
    ]
    detections = tuple(
        detection(noise, profile.band(noise.metric, overrides), setup, profile.noise_band)
        for noise in measure_noise(result, names)
    )
    return CaseCalibration(result.case_id, setup, detections, timing=timing)
