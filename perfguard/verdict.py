"""The decision: is a measured metric a regression, an improvement, or within its band?

Everything that decides lives here, so that "how a regression is decided" is one file:
the tolerance profiles and their defaults, how a metric's band is resolved from the
profile and the overrides, the evidence a regression needs (`Rule`), the per-metric
verdict, which verdicts are borderline (re-run the case) or already clear (stop
sampling), the per-case verdict and the overall verdict with its exit code. Baselines
(`perfguard.baseline`) store figures and profiles; reports (`perfguard.report`) render
verdicts; `perfguard.gate` runs, re-runs and stops sampling as these functions say;
`perfguard.stats` computes the statistics; none of them decides anything.

The band, in sglang's words: a metric whose baseline is `b` may not exceed
`max(b * (1 + rel), b + abs)`. It is one-sided (only slowdowns fail). The relative part
scales with the figure; the absolute pad stops tiny figures (a 0.04 ms input
validation) from failing on timer and scheduler jitter that no relative tolerance can
absorb.

The measured figure is the median of the samples, compared with the baseline's median.
The median, not the mean, because one preempted run (a page-fault storm, a noisy
neighbour) moves the mean of five samples by 20 % and the median not at all.

A median above the band is a regression only when the slowdown is also credible: the
lower end of a one-sided (1 - alpha) confidence bound on median/baseline must exceed 1
(`Rule.alpha`, 1 % by default). The interval comes from `stats.log_ratio_noise`: the
spread of both sides' samples and, when either side was measured in several processes,
the spread of the per-process medians, because on a shared runner the process is a
source of variation that the samples of one process cannot show. Without that
information the bands themselves must cover the drift between processes; `perfguard
calibrate` measures it and suggests bands that do.

Borderline verdicts (band exceeded but not credible; credible but within 1.2x of the
band; credible and just inside it; a regression seen in one process only) are re-run by
the gate with fresh measurements pooled in. The last one is there because on the shared
CPU runner we measured episodes of ~1 s in which the same stage runs 70 % slower, with
no other process visible in the guest: a check whose samples all fall into one looks
exactly like a regression, and only a second measurement at another time tells them
apart. A real regression is confirmed at the cost of one more measurement; a check
that passes never pays it. Verdicts whose confidence interval lies wholly on one side
of the bound are "clear", and the gate stops sampling a case once all its verdicts are.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfguard.contention import DEFAULT_POLICY, ContentionPolicy, screen
from perfguard.errors import EXIT_CASE_FAILED, EXIT_CONTENDED, EXIT_OK, EXIT_REGRESSION
from perfguard.metrics import METRIC_CLASSES, metric_class, metric_sort_key, unit
from perfguard.stats import (
    MEDIAN_SE_FACTOR,
    Noise,
    Summary,
    log_ratio_noise,
    log_spread,
    summarize,
    t_quantile,
)

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.baseline import Baseline, Scenario
    from perfguard.runner import CaseResult, Results

# ---- verdict names -------------------------------------------------------------------------

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
MISSING_BASELINE = "missing-baseline"
MISSING_STAGE = "missing-stage"
NEW_STAGE = "new-stage"
ERROR = "error"
CONTENDED = "contended"
"""The runner stayed much slower than at baseline time: no verdict on the code (exit 4)."""

SEVERITY = (
    REGRESSION,
    ERROR,
    CONTENDED,
    MISSING_BASELINE,
    MISSING_STAGE,
    NEW_STAGE,
    IMPROVEMENT,
    PASS,
)
"""Verdicts from worst to best: a case's verdict is its worst metric's; tables sort by it."""
VERDICTS = SEVERITY
MISSING = (MISSING_BASELINE, MISSING_STAGE, NEW_STAGE)
"""Verdicts about coverage, not speed: reported, and failures only with `--fail-on-missing`."""

OVERALL_PASS = "pass"
OVERALL_FAIL = "fail"
OVERALL_ERROR = "error"
OVERALL_CONTENDED = "contended"

# ---- default tolerance profiles --------------------------------------------------------------

PROFILE_NAMES = ("pr_test", "long_term")
DEFAULT_PROFILE = "pr_test"

DEFAULT_REL: dict[str, dict[str, float]] = {
    # sglang's pr_test profile (perf_baselines/h100.json); peak memory is ours: allocator
    # peaks are reproducible to a few percent, 5 % catches a leaked activation buffer.
    "pr_test": {
        "e2e": 0.25,
        "denoise_stage": 0.25,
        "non_denoise_stage": 0.8,
        "denoise_step": 0.3,
        "denoise_agg": 0.2,
        "peak_memory": 0.05,
    },
    # sglang's long_term profile (tighter: nightly runs on a quiet, pinned machine);
    # 2 % on memory is sglang's `runtime_peak_vram` tolerance.
    "long_term": {
        "e2e": 0.15,
        "denoise_stage": 0.1,
        "non_denoise_stage": 0.5,
        "denoise_step": 0.25,
        "denoise_agg": 0.15,
        "peak_memory": 0.02,
    },
}

DEVICE_ABS: dict[str, float] = {
    # sglang's absolute pads (ms): 20 for e2e, steps and aggregates, 120 for stages.
    # Peak memory (MB): 64, about one allocator segment-rounding step on a large model.
    "e2e": 20.0,
    "denoise_stage": 120.0,
    "non_denoise_stage": 120.0,
    "denoise_step": 20.0,
    "denoise_agg": 20.0,
    "peak_memory": 64.0,
}

CPU_PAD_SCALE = 0.01
"""CPU profiles carry 1/100 of sglang's millisecond pads.

A pad exists for jitter that does not scale with the figure: timer resolution and
scheduling on tiny stages. sglang sized its pads (20 ms, 120 ms) for seconds-long GPU
requests timed through an HTTP server. perfguard times in-process, and the CPU smoke
cases last ~20 ms, 1/100 to 1/500 of a GPU case: kept as they are, the pads would be
larger than the stages they guard (a 12 ms pad on a 20 ms denoising stage hides a +50 %
slowdown) and the gate would be blind. At 1/100 (0.2 ms e2e / steps / aggregates, 1.2 ms
stages, 4.5 ms decoding, 0.8 ms step 0) they keep the proportion they have on a GPU case
and stay above what the median of the repeats leaves of that jitter (~0.1 ms).
Memory pads (MB) are not scaled: they are about allocator granularity, not time.
"""

DEVICE_FLOORS: dict[str, tuple[float, float]] = {
    # sglang: a stage whose name ends in DecodingStage gets max(tol, 0.9) and 450 ms (VAE
    # decode is bursty: tiling, cudnn autotune); step 0 gets 4.0 and 80 ms (first-step
    # compilation and cache warm-up land there).
    "stage:*DecodingStage": (0.9, 450.0),
    "step:0": (4.0, 80.0),
}

DEFAULT_IMPROVEMENT_THRESHOLD = 0.2
MIN_EFFECT: dict[str, float] = {
    "e2e": 0.03,
    "denoise_stage": 0.03,
    "denoise_agg": 0.03,
    "denoise_step": 0.10,
    "non_denoise_stage": 0.20,
    "peak_memory": 0.05,
}
"""The smallest slowdown worth failing a PR for, per metric class (the effect of interest).

A regression must be at least this much slower in its point estimate *and* credibly
slower at the rule's confidence; the stored-baseline gate and the relative check
(`check --against`) share these figures, so "how big must it be" has one answer.
"""


def min_effect(metric: str) -> float:
    """`MIN_EFFECT` of `metric`'s class."""
    return MIN_EFFECT[metric_class(metric)]


"""sglang's `improvement_reporting.threshold`: 20 % faster than the baseline is stale."""


@dataclass(frozen=True)
class Band:
    """A one-sided tolerance band around a baseline figure: `max(b*(1+rel), b+abs)`."""

    rel: float
    abs: float

    def bound(self, baseline: float) -> float:
        return max(baseline * (1.0 + self.rel), baseline + self.abs)

    def improvement_below(self, baseline: float, threshold: float) -> float:
        """Faster than this is an improvement: `min(b*(1-threshold), b-abs)`.

        sglang uses `b*(1-threshold)` alone; requiring the absolute pad as well keeps
        sub-millisecond stages, whose figures halve and double with jitter, from asking
        for a new baseline on every run. The band is then symmetric in its pad.
        """
        return min(baseline * (1.0 - threshold), baseline - self.abs)

    def to_json(self) -> dict[str, float]:
        return {"rel": self.rel, "abs": self.abs}


Overrides = Mapping[str, Mapping[str, float]]
"""`{"e2e": {"rel": 0.5}, "stage:DecodingStage": {"abs": 30}}`: class or metric -> band part."""


@dataclass(frozen=True)
class Profile:
    """A named set of tolerances: one relative tolerance and one pad per metric class.

    `floors` widen known-noisy metrics (glob on the metric name, e.g. `step:0`): the band
    of a matching metric is at least that wide. `advisory` profiles report but never fail.
    `extra` keeps fields with no perfguard meaning (an imported sglang profile's `load`).
    """

    name: str
    rel: Mapping[str, float]
    abs: Mapping[str, float]
    floors: Mapping[str, Band] = field(default_factory=dict)
    advisory: bool = False
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    noise_pad: float = 0.0

    def noise_band(self, band: Band, baseline: Summary | None) -> Band:
        """`band` with its pad raised to `noise_pad` standard errors of `baseline`.

        The standard error is that of the difference of two medians as noisy as the
        baseline's (sqrt(2) x sqrt(pi/2) x sd / sqrt(n)), in the figure's unit. Profiles
        without `noise_pad` (sglang's, imported ones) return `band` unchanged.
        """
        if not self.noise_pad or baseline is None or baseline.median <= 0:
            return band
        spread = log_spread(baseline)
        if spread is None:
            return band
        se = math.sqrt(2.0) * MEDIAN_SE_FACTOR * spread / math.sqrt(baseline.n)
        return Band(band.rel, max(band.abs, round(self.noise_pad * se * baseline.median, 4)))

    def band(self, metric: str, overrides: Sequence[Overrides] = ()) -> Band:
        """The band for `metric` under this profile and `overrides` (lowest priority first).

        Resolution, each step overriding the previous one field by field:
        1. the profile's class figures (`rel[class]`, `abs[class]`);
        2. class-keyed overrides (`"denoise_step": {...}`), in the order given;
        3. the profile's floors (only ever widen: `max` of each field), so that a class
           override tightening all steps does not tighten the known-noisy step 0 too;
        4. metric-keyed overrides (`"step:0": {...}`): the last word, in the order given.
        """
        cls = metric_class(metric)
        rel, pad = float(self.rel[cls]), float(self.abs[cls])
        for ov in overrides:
            part = ov.get(cls)
            if part:
                rel, pad = float(part.get("rel", rel)), float(part.get("abs", pad))
        for pattern, floor in sorted(self.floors.items()):
            if fnmatch.fnmatchcase(metric, pattern):
                rel, pad = max(rel, floor.rel), max(pad, floor.abs)
        for ov in overrides:
            part = ov.get(metric)
            if part and metric != cls:
                rel, pad = float(part.get("rel", rel)), float(part.get("abs", pad))
        return Band(rel, pad)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rel": {k: float(v) for k, v in self.rel.items()},
            "abs": {k: float(v) for k, v in self.abs.items()},
            "floors": {k: b.to_json() for k, b in self.floors.items()},
            "advisory": self.advisory,
        }
        if self.description:
            out["description"] = self.description
        if self.noise_pad:
            out["noise_pad"] = self.noise_pad
        if self.extra:
            out["sglang_extra"] = dict(self.extra)
        return out

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> Profile:
        return cls(
            name=name,
            rel={k: float(v) for k, v in data["rel"].items()},
            abs={k: float(v) for k, v in data["abs"].items()},
            floors={
                k: Band(float(v["rel"]), float(v["abs"])) for k, v in data.get("floors", {}).items()
            },
            advisory=bool(data.get("advisory", False)),
            description=str(data.get("description", "")),
            extra=dict(data.get("sglang_extra", {})),
            noise_pad=float(data.get("noise_pad", 0.0)),
        )


MEASURED_REL: dict[str, dict[str, float]] = {
    # The minimum effect of interest for figures perfguard measured itself (several
    # samples, known noise): the credibility test, not a wide band, keeps noise out.
    "pr_test": dict(MIN_EFFECT),
    # Nightly, on the same runner: the same effects; the history's change points catch
    # the slow drifts that no single check can.
    "long_term": dict(MIN_EFFECT),
}

MEASURED_FLOOR_MS = {"cpu": 0.01, "device": 0.05}
"""The smallest pad on a time (ms): timer and dispatch jitter that no median removes.

On the CPU the clock resolves ~0.1 us and a stage boundary costs ~1 us, but Python
dispatch and scheduler jitter move a stage of a few microseconds by several of them:
10 us. Device events resolve ~0.5 us, but launch-side jitter of a stage's first kernel
is tens of microseconds: 50 us.
"""

MEASURED_MEMORY_PAD_MB = {"cpu": 0.1, "device": 64.0}
"""Peak-memory pads (MB). On CPU the figure is the tensor memory a run allocates, tracked
op by op (`perfguard.memory`), identical to the byte from run to run: 0.1 MB catches a
leaked 256 KiB buffer on a 0.5 MB smoke case. On devices the allocator rounds to
segments: 64 MB, about one rounding step on a large model."""
NOISE_PAD_K = 3.0
"""The pad scales with the measurement: k x the standard error of the difference of two
medians as noisy as the baseline's, in the figure's own unit. A stage of 20 us whose
samples jitter by 5 us gets a pad of ~6 us on 20 samples; a 0.18 ms stage that became
1.3 ms fails; a 7 ms denoising stage's pad (~0.1 ms) stays below its 3 % band."""


def pad_scale(platform: str) -> float:
    """How much of sglang's millisecond pads a platform's default profiles carry."""
    return CPU_PAD_SCALE if platform == "cpu" else 1.0


def sglang_profiles(platform: str) -> dict[str, Profile]:
    """sglang's `pr_test` and `long_term` profiles, with pads scaled for `platform`.

    What imported sglang figures (one sample, no noise) are judged with, and what a
    baseline made before noise-derived bands carries in its file.
    """
    scale = pad_scale(platform)
    pads = {c: (v if c == "peak_memory" else round(v * scale, 3)) for c, v in DEVICE_ABS.items()}
    floors = {p: Band(rel, round(pad * scale, 3)) for p, (rel, pad) in DEVICE_FLOORS.items()}
    note = (
        f"sglang's defaults; millisecond pads scaled by {scale:g} for {platform}"
        if scale != 1.0
        else "sglang's defaults"
    )
    return {
        name: Profile(name, dict(DEFAULT_REL[name]), dict(pads), dict(floors), description=note)
        for name in PROFILE_NAMES
    }


def default_profiles(platform: str) -> dict[str, Profile]:
    """The profiles written into a baseline perfguard measures itself on `platform`.

    Relative parts are the minimum effect of interest (`MIN_EFFECT`: 3 % on e2e, the
    denoising stage and the step aggregates), pads scale with the baseline's own noise
    (`NOISE_PAD_K`) above a timer-jitter floor, and there are no sglang floors: their
    job (bursty decoding, a first step with compilation in it) is done by the noise pad
    and the credibility test, from the figures of this runner. See docs/verdicts.md.
    """
    floor = MEASURED_FLOOR_MS["cpu" if platform == "cpu" else "device"]
    where = "cpu" if platform == "cpu" else "device"
    memory = MEASURED_MEMORY_PAD_MB[where]
    pads = {c: (memory if c == "peak_memory" else floor) for c in DEVICE_ABS}
    note = (
        f"minimum effects of interest, pads of {NOISE_PAD_K:g} standard errors of the "
        f"baseline median above {floor:g} ms"
    )
    return {
        name: Profile(
            name,
            dict(MEASURED_REL[name]),
            dict(pads),
            {},
            description=note,
            noise_pad=NOISE_PAD_K,
        )
        for name in PROFILE_NAMES
    }


# ---- the evidence a regression needs -------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """How much evidence a verdict needs, and which verdicts are worth a second look.

    `alpha` is the one-sided false-alarm rate of the credibility test: a median above
    its band is a regression only when the (1 - alpha) lower confidence bound of
    median/baseline is above 1. 1 %, so that noise alone fails about one metric in a
    hundred that already sit above their band, not one in twenty.

    `borderline` (1.2) is how close to the band a credible slowdown counts as
    borderline: its excess over the baseline is within 1.2x of the band's allowance, or
    above 1/1.2 of it while still inside. Such a verdict could flip with the next
    process's drift, so the gate re-runs the case (`--max-reruns`) before reporting it.
    """

    alpha: float = 0.01
    borderline: float = 1.2

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"alpha must be in (0, 0.5), not {self.alpha}")
        if self.borderline < 1:
            raise ValueError(f"borderline must be >= 1, not {self.borderline}")

    def quantile(self, noise: Noise) -> float:
        """Student's t at `alpha` with the degrees of freedom that estimated `noise`."""
        return t_quantile(self.alpha, noise.dof)

    def to_json(self) -> dict[str, float]:
        return {"alpha": self.alpha, "borderline": self.borderline}


DEFAULT_RULE = Rule()


# ---- one metric ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricVerdict:
    """The verdict on one metric of one case, with everything a reader needs to check it.

    `low` / `high` bound median/baseline at the rule's confidence (one-sided each);
    `significant` says whether `low` > 1 (slower beyond noise); `borderline` asks the
    gate for a re-run; `clear` says more runs of the same process would not change the
    verdict (the bound lies outside [low, high] x baseline, or the between-process
    spread dominates the interval); `noise` is where the interval came from.
    """

    metric: str
    verdict: str
    measured: Summary | None = None
    baseline: Summary | None = None
    band: Band | None = None
    bound: float | None = None
    ratio: float | None = None
    reason: str = ""
    low: float | None = None
    high: float | None = None
    significant: bool | None = None
    borderline: bool = False
    clear: bool = True
    noise: Noise | None = None
    paired: PairedEstimate | None = None

    @property
    def metric_class(self) -> str:
        return metric_class(self.metric)

    @property
    def unit(self) -> str:
        return unit(self.metric)

    def to_json(self) -> dict[str, Any]:
        baseline = None
        if self.baseline is not None:
            baseline = {k: v for k, v in self.baseline.to_json().items() if k != "samples"}
        out: dict[str, Any] = {
            "class": self.metric_class,
            "unit": self.unit,
            "verdict": self.verdict,
            "measured": None if self.measured is None else self.measured.to_json(),
            "baseline": baseline,
            "band": None if self.band is None else self.band.to_json(),
            "bound": None if self.bound is None else round(self.bound, 3),
            "ratio": None if self.ratio is None else round(self.ratio, 4),
            "reason": self.reason,
        }
        if self.low is not None and self.high is not None:
            out["ratio_low"] = round(self.low, 4)
            out["ratio_high"] = round(self.high, 4)
        if self.significant is not None:
            out["significant"] = self.significant
        if self.borderline:
            out["borderline"] = True
        if self.noise is not None:
            out["noise"] = self.noise.to_json()
        if self.paired is not None:
            out["paired"] = self.paired.to_json()
        return out

    @classmethod
    def from_json(cls, metric: str, data: Mapping[str, Any]) -> MetricVerdict:
        band = data.get("band")
        noise = data.get("noise")
        paired = data.get("paired")

        def opt(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        return cls(
            metric=metric,
            verdict=str(data["verdict"]),
            measured=None if data.get("measured") is None else Summary.from_json(data["measured"]),
            baseline=None if data.get("baseline") is None else Summary.from_json(data["baseline"]),
            band=None if band is None else Band(float(band["rel"]), float(band["abs"])),
            bound=opt("bound"),
            ratio=opt("ratio"),
            reason=str(data.get("reason", "")),
            low=opt("ratio_low"),
            high=opt("ratio_high"),
            significant=data.get("significant"),
            borderline=bool(data.get("borderline", False)),
            noise=None
            if noise is None
            else Noise(
                se=float(noise["se"]),
                within=float(noise["within"]),
                between=float(noise["between"]),
                processes_baseline=int(noise["processes_baseline"]),
                processes_current=int(noise["processes_current"]),
                between_dof=int(noise.get("dof", 0)),
                within_dof=int(noise.get("dof", 0)),
            ),
            paired=None
            if paired is None or data.get("ratio_low") is None
            else PairedEstimate(
                blocks=int(paired["blocks"]),
                ratio=float(data["ratio"]),
                low=float(data["ratio_low"]),
                high=float(data["ratio_high"]),
                min_effect=float(paired["min_effect"]),
                alpha=float(paired["alpha"]),
                decision=str(paired["decision"]),
            ),
        )


def _fmt(value: float, metric: str) -> str:
    return f"{value:.3f} {unit(metric)}"


def judge_metric(
    metric: str,
    samples: Sequence[float] | None,
    baseline: Summary | None,
    band: Band,
    *,
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD,
    rule: Rule = DEFAULT_RULE,
    groups: Sequence[int] | None = None,
    speed: float | None = None,
) -> MetricVerdict:
    """Compare the median of `samples` with `baseline.median` under `band` and `rule`.

    `samples` None (or empty) means the run did not produce the metric (`missing-stage`);
    `baseline` None means the baseline does not have it (`new-stage`). Otherwise:

    - regression: the median is above `band.bound(b)` and the slowdown is credible (the
      rule's lower confidence bound on median/b is above 1);
    - improvement: the median is below `band.improvement_below(b, t)` (the baseline is
      stale: never a failure);
    - pass: anything else, including a median above the bound that noise explains.

    `groups` gives the number of consecutive samples from each process (or re-run), so
    that their medians' spread enters the noise estimate. `speed` is the runner's
    reference workload now over at baseline time (`perfguard.contention`): when the
    runner is slower as a whole (speed > 1), a regression must also hold with the
    median divided by it, so that a slower host or a capped clock does not read as
    slower code. A faster runner adjusts nothing: it must not hide a real slowdown.
    """
    if not samples:
        if baseline is None:
            raise ValueError(f"{metric}: neither samples nor a baseline")
        return MetricVerdict(
            metric,
            MISSING_STAGE,
            baseline=baseline,
            band=band,
            bound=band.bound(baseline.median),
            reason="in the baseline but not produced by this run",
        )
    measured = summarize(samples, groups=groups)
    if baseline is None:
        return MetricVerdict(metric, NEW_STAGE, measured=measured, reason="not in the baseline")
    b, m = baseline.median, measured.median
    bound = band.bound(b)
    if b <= 0 or m <= 0:
        # No ratio to put an interval on (a figure rounded to 0): the band alone decides.
        verdict = REGRESSION if m > bound else PASS
        reason = f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)}" if m > bound else ""
        ratio = m / b if b > 0 else None
        return MetricVerdict(metric, verdict, measured, baseline, band, bound, ratio, reason)
    noise = log_ratio_noise(baseline, measured)
    ratio = m / b
    spread = math.exp(rule.quantile(noise) * noise.se)
    low, high = ratio / spread, ratio * spread
    significant = low > 1.0
    allowance = bound - b
    excess = (m - b) / allowance if allowance > 0 else math.inf
    over = m > bound
    one_process = noise.processes_current == 1
    borderline = (over and (not significant or excess <= rule.borderline or one_process)) or (
        significant and not over and excess > 1.0 / rule.borderline
    )
    # More runs of this process cannot narrow an interval that the between-process
    # spread dominates: then the verdict is as clear as this process can make it.
    clear = not (low * b <= bound < high * b) or noise.within < noise.between / 2
    figures = f"baseline {_fmt(b, metric)}, rel {band.rel:g}, abs {band.abs:g}"
    evidence = (
        f"{1 - rule.alpha:.0%} lower bound {low:.3f}x from the {noise.source}"
        if noise.se > 0
        else "no spread known: the band alone decides"
    )
    if over and significant and speed is not None and speed > 1 and m / speed <= bound:
        verdict = PASS
        reason = (
            f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)}, but the runner's "
            f"reference workload is {speed:.3f}x slower than at baseline time: "
            f"{_fmt(m / speed, metric)} adjusted, within the bound"
        )
    elif over and significant:
        verdict = REGRESSION
        reason = f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)} ({figures}); {evidence}"
    elif m < band.improvement_below(b, improvement_threshold):
        verdict = IMPROVEMENT
        reason = (
            f"median {_fmt(m, metric)} is more than {improvement_threshold:.0%} and "
            f"{band.abs:g} {unit(metric)} below the baseline {_fmt(b, metric)}: "
            "the baseline is stale"
        )
    elif over:
        verdict = PASS
        reason = (
            f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)} ({figures}) but within "
            f"noise: {evidence}"
        )
    else:
        verdict = PASS
        reason = ""
    return MetricVerdict(
        metric,
        verdict,
        measured,
        baseline,
        band,
        bound,
        ratio,
        reason,
        low=low,
        high=high,
        significant=significant,
        borderline=borderline,
        clear=clear,
        noise=noise,
    )


# ---- one case ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseVerdict:
    """The verdicts on one case's metrics, and the case's own (its worst metric's).

    `sampling` is what the gate did to reach it (runs, processes, re-runs, whether it
    stopped early), when the case was run by `perfguard.gate`.
    """

    case_id: str
    verdict: str
    metrics: tuple[MetricVerdict, ...] = ()
    error: str | None = None
    output_hash: str | None = None
    baseline_output_hash: str | None = None
    deterministic: bool | None = None
    notes: str | None = None
    sampling: Mapping[str, Any] | None = None
    runner: Mapping[str, Any] | None = None

    @property
    def over(self) -> list[str]:
        """The metrics whose median is over their bound (credible or not)."""
        return [
            m.metric
            for m in self.metrics
            if m.verdict == REGRESSION
            or (m.measured is not None and m.bound is not None and m.measured.median > m.bound)
        ]

    components: Mapping[str, Any] | None = None
    counters: Mapping[str, Any] | None = None

    @property
    def borderline(self) -> list[str]:
        """The metrics whose verdict asks for a re-run of the case."""
        return [m.metric for m in self.metrics if m.borderline]

    @property
    def clear(self) -> bool:
        """Every verdict is clear: more samples would not change any of them."""
        return self.verdict != ERROR and all(m.clear for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        out = {
            "verdict": self.verdict,
            "error": self.error,
            "output_hash": self.output_hash,
            "baseline_output_hash": self.baseline_output_hash,
            "deterministic": self.deterministic,
            "notes": self.notes,
            "metrics": {m.metric: m.to_json() for m in self.metrics},
        }
        if self.sampling is not None:
            out["sampling"] = dict(self.sampling)
        if self.runner is not None:
            out["runner"] = dict(self.runner)
        if self.components is not None:
            out["components"] = {k: dict(v) for k, v in self.components.items()}
        if self.counters is not None:
            out["counters"] = {k: list(v) for k, v in self.counters.items()}
        return out

    @classmethod
    def from_json(cls, case_id: str, data: Mapping[str, Any]) -> CaseVerdict:
        metrics = [MetricVerdict.from_json(k, v) for k, v in data.get("metrics", {}).items()]
        return cls(
            case_id=case_id,
            verdict=str(data["verdict"]),
            metrics=tuple(sorted(metrics, key=lambda m: metric_sort_key(m.metric))),
            error=data.get("error"),
            output_hash=data.get("output_hash"),
            baseline_output_hash=data.get("baseline_output_hash"),
            deterministic=data.get("deterministic"),
            notes=data.get("notes"),
            sampling=data.get("sampling"),
            runner=data.get("runner"),
            components=data.get("components"),
            counters=data.get("counters"),
        )


def worst(verdicts: Iterable[str]) -> str:
    """The most severe of `verdicts` (PASS when there are none)."""
    ranks = [SEVERITY.index(v) for v in verdicts]
    return SEVERITY[min(ranks)] if ranks else PASS


def gated_steps(step_count: int, step_fractions: Sequence[float] | None) -> set[int] | None:
    """The step indices sglang's `sampling.step_fractions` selects: `round(f * max_step)`.

    Checking every one of 50 steps at 30 % each is 50 chances for noise to fail a run;
    sglang samples a few. None (the default) gates every step.
    """
    if step_fractions is None or step_count == 0:
        return None
    max_step = step_count - 1
    return {round(f * max_step) for f in step_fractions}


def judge_case(
    case_id: str,
    result: CaseResult,
    scenario: Scenario | None,
    profile: Profile,
    *,
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD,
    step_fractions: Sequence[float] | None = None,
    ignore_missing: Iterable[str] = (),
    rule: Rule = DEFAULT_RULE,
    policy: ContentionPolicy = DEFAULT_POLICY,
) -> CaseVerdict:
    """Judge every metric of one case's result against its baseline scenario.

    The runs are screened first (`perfguard.contention.screen`): runs that the
    reference workload saw contended are dropped, and a measurement that was mostly
    contended gets the case verdict `contended` instead of a judgement on the code.

    The band of each metric uses the case registry's `tolerance_overrides` (carried in
    the result's case definition) and then the baseline scenario's, which win: the
    baseline file is hardware-specific and reviewed next to the figures it loosens.
    Metrics in `ignore_missing` are not reported missing (a source that cannot measure
    them, such as sglang's performance.log for memory).
    """
    common = {
        "output_hash": result.output_hash,
        "deterministic": result.deterministic,
        "baseline_output_hash": scenario.output_hash if scenario else None,
        "notes": scenario.notes if scenario else None,
        "components": result.components,
        "counters": result.counters,
    }
    if result.status != "ok":
        return CaseVerdict(case_id, ERROR, error=result.error or "case failed", **common)
    samples = result.samples
    if scenario is None:
        metrics = tuple(
            MetricVerdict(
                m,
                MISSING_BASELINE,
                measured=summarize(samples[m], groups=result.groups),
                reason="no scenario",
            )
            for m in sorted(samples, key=metric_sort_key)
        )
        return CaseVerdict(case_id, MISSING_BASELINE, metrics, **common)
    ref = scenario.reference.median if scenario.reference is not None else None
    result, scr = screen(result, ref, policy)
    samples = result.samples
    overrides = [result.case.get("tolerance_overrides") or {}, scenario.tolerance_overrides]
    base = scenario.metrics
    steps = gated_steps(scenario.step_count, step_fractions)
    ignored = set(ignore_missing)
    out: list[MetricVerdict] = []
    for metric in sorted(set(samples) | set(base), key=metric_sort_key):
        if steps is not None and metric.startswith("step:") and int(metric[5:]) not in steps:
            continue
        if metric not in samples and metric in ignored:
            continue
        band = profile.noise_band(profile.band(metric, overrides), base.get(metric))
        out.append(
            judge_metric(
                metric,
                samples.get(metric),
                base.get(metric),
                band,
                improvement_threshold=improvement_threshold,
                rule=rule,
                groups=result.groups,
                speed=scr.speed,
            )
        )
    verdict = CaseVerdict(
        case_id, worst(m.verdict for m in out), tuple(out), runner=scr.to_json(), **common
    )
    return contended(verdict, scr.reason) if scr.contended else verdict


# ---- overall -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """Every case's verdict under one profile, and what that means for the exit code.

    `advisory` (from the flag, the profile or the baseline's metadata) reports
    regressions without failing: a platform whose runners are too noisy to gate on yet,
    as sglang treats its AMD runners. It does not hide cases that cannot run (exit 3):
    a crash is a broken setup, not a noisy figure.
    """

    profile: str
    cases: tuple[CaseVerdict, ...]
    fail_on_missing: bool = False
    advisory: bool = False

    @property
    def counts(self) -> dict[str, int]:
        """Metric verdicts by kind, plus case errors under `error`."""
        out = dict.fromkeys(SEVERITY, 0)
        for case in self.cases:
            if case.verdict == ERROR:
                out[ERROR] += 1
            for m in case.metrics:
                out[m.verdict] += 1
        return out

    @property
    def verdict(self) -> str:
        return overall(self.cases, self.fail_on_missing, self.advisory)[0]

    @property
    def exit_code(self) -> int:
        return overall(self.cases, self.fail_on_missing, self.advisory)[1]

    def failing(self) -> list[tuple[CaseVerdict, MetricVerdict]]:
        """The metric verdicts that count as failures (before advisory is applied)."""
        bad = {REGRESSION, *MISSING} if self.fail_on_missing else {REGRESSION}
        return [(c, m) for c in self.cases for m in c.metrics if m.verdict in bad]


def overall(
    cases: Iterable[CaseVerdict], fail_on_missing: bool = False, advisory: bool = False
) -> tuple[str, int]:
    """The run's verdict and exit code: fail (1) > error (3) > contended (4) > pass (0).

    A regression fails the run (exit 1) unless advisory; with `fail_on_missing` so do
    metrics or cases missing from the baseline and stages missing from the run. Else a
    case that failed to run makes it exit 3; else a case measured on a runner that
    stayed contended makes it exit 4 (no verdict on the code: re-run on a quiet
    runner); else 0. Improvements never fail.
    """
    cases = list(cases)
    bad = {REGRESSION, *MISSING} if fail_on_missing else {REGRESSION}
    failing = any(m.verdict in bad for c in cases for m in c.metrics)
    if fail_on_missing and any(c.verdict == MISSING_BASELINE for c in cases):
        failing = True
    if failing and not advisory:
        return OVERALL_FAIL, EXIT_REGRESSION
    if any(c.verdict == ERROR for c in cases):
        return OVERALL_ERROR, EXIT_CASE_FAILED
    if any(c.verdict == CONTENDED for c in cases):
        return OVERALL_CONTENDED, EXIT_CONTENDED
    return OVERALL_PASS, EXIT_OK


def contended(case: CaseVerdict, why: str) -> CaseVerdict:
    """`case` re-labelled `contended`: its regressions say the runner was slow, not the code.

    The metric verdicts are kept for the reader, except that a regression becomes
    `contended` with `why` in its reason: a slowdown measured on a machine that was
    itself much slower than at baseline time says nothing about the change.
    """
    metrics = tuple(
        dataclasses.replace(m, verdict=CONTENDED, reason=f"{why}; {m.reason}")
        if m.verdict == REGRESSION
        else m
        for m in case.metrics
    )
    note = case.notes
    return dataclasses.replace(case, verdict=CONTENDED, metrics=metrics, error=why, notes=note)


def judge(
    results: Results,
    baseline: Baseline,
    profile_name: str = DEFAULT_PROFILE,
    *,
    fail_on_missing: bool = False,
    advisory: bool = False,
    ignore_missing: Iterable[str] = (),
    rule: Rule = DEFAULT_RULE,
    policy: ContentionPolicy = DEFAULT_POLICY,
) -> Judgement:
    """Judge every case of `results` against `baseline` under its profile `profile_name`.

    The run is advisory when `advisory` is passed, when the profile says so, or when the
    baseline's metadata marks its platform advisory.
    """
    profile = baseline.profile(profile_name)
    ignored = tuple(ignore_missing)
    cases = tuple(
        judge_case(
            cid,
            res,
            baseline.scenarios.get(cid),
            profile,
            improvement_threshold=baseline.improvement_threshold,
            step_fractions=baseline.step_fractions,
            ignore_missing=ignored,
            rule=rule,
            policy=policy,
        )
        for cid, res in sorted(results.cases.items())
    )
    advisory = advisory or profile.advisory or bool(baseline.metadata.get("advisory", False))
    return Judgement(profile_name, cases, fail_on_missing, advisory)


# ---- the relative check: paired blocks against a base revision ---------------------------

SAME = "same"
DIFFERENT = "different"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class PairedEstimate:
    """head/base for one metric from per-block log ratios, and what it lets us say.

    `ratio` is the geometric mean of the blocks' median ratios, `low` / `high` its
    one-sided (1 - alpha) bounds from a t-interval over the blocks (n - 1 degrees of
    freedom); `decision` is Pinpoint's three answers: `different` (a regression: ratio
    above 1 + min_effect and low above 1; or an improvement: ratio below 1 / (1 +
    min_effect) and high below 1), `same` (the interval lies within +-min_effect), or
    `unknown` (measure more).
    """

    blocks: int
    ratio: float
    low: float
    high: float
    min_effect: float
    alpha: float
    decision: str

    @property
    def slower(self) -> bool:
        return self.decision == DIFFERENT and self.ratio > 1.0

    def to_json(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "decision": self.decision,
            "min_effect": self.min_effect,
            "alpha": round(self.alpha, 6),
        }


PAIRED_TRIM = 0.2
"""The share of blocks trimmed from each end before averaging the per-block log ratios.

On the shared CPU runner a contention episode now and then lands on one side of a block
only: in a 24-block check of the smoke cases, 19 blocks had `DenoisingStage` ratios
within 1.02-1.12 and 5 were 0.64-1.98. A plain mean and t-interval let those few blocks
move the estimate and widen the interval fourfold; Yuen's trimmed mean with its
winsorized variance (Wilcox, "Introduction to Robust Estimation") keeps the 20 % at
either end out of the estimate and in the interval's width only, at the price of
fewer degrees of freedom. With fewer than 5 blocks nothing is trimmed.
"""


def paired_estimate(
    log_ratios: Sequence[float], effect: float, alpha: float, trim: float = PAIRED_TRIM
) -> PairedEstimate:
    """The paired decision on `log_ratios` (one `log(head / base)` per block) at `alpha`.

    Why per-block ratios: each block runs a fresh base process and a fresh head process
    next to each other, so the drift of the machine (frequency, neighbours, memory
    layout of that moment) is common to both and cancels in the ratio, where pooled
    samples would carry it as noise. Why an interval over blocks and not over runs:
    the runs of one process share that process's drift, so the block, not the run, is
    the independent unit (as in Laaber et al.'s RMIT and pyperf's process-level view).
    The estimate is Yuen's trimmed mean (`PAIRED_TRIM`) with a t-interval on `h - 1`
    degrees of freedom, `h` the blocks kept.
    """
    n = len(log_ratios)
    if n == 0:
        raise ValueError("no blocks")
    ordered = sorted(log_ratios)
    g = math.floor(trim * n)
    kept = ordered[g : n - g]
    h = len(kept)
    mean = math.fsum(kept) / h
    ratio = math.exp(mean)
    if h < 2:
        return PairedEstimate(n, ratio, 0.0, math.inf, effect, alpha, UNKNOWN)
    from scipy import stats as _st

    winsorized = [min(max(x, kept[0]), kept[-1]) for x in ordered]
    wmean = math.fsum(winsorized) / n
    ss = math.fsum((x - wmean) ** 2 for x in winsorized)
    se = math.sqrt(ss / (h * (h - 1)))  # = s_w / ((1 - 2 trim) sqrt(n)), Yuen 1974
    half = float(_st.t.ppf(1.0 - alpha, h - 1)) * se
    low, high = math.exp(mean - half), math.exp(mean + half)
    slower = ratio > 1.0 + effect and low > 1.0
    faster = ratio < 1.0 / (1.0 + effect) and high < 1.0
    if slower or faster:
        decision = DIFFERENT
    elif low > 1.0 / (1.0 + effect) and high < 1.0 + effect:
        decision = SAME
    else:
        decision = UNKNOWN
    return PairedEstimate(n, ratio, low, high, effect, alpha, decision)


def judge_relative_metric(
    metric: str,
    head: Sequence[float] | None,
    base: Sequence[float] | None,
    log_ratios: Sequence[float],
    *,
    alpha: float,
    head_groups: Sequence[int] | None = None,
    base_groups: Sequence[int] | None = None,
    final: bool = True,
) -> MetricVerdict:
    """The verdict on one metric of a relative check (`perfguard.relative`).

    A regression needs the same two things as against a stored baseline, with the
    paired estimate in place of the band: a point ratio above `1 + min_effect(metric)`
    and a one-sided lower bound above 1. Faster by more than the minimum effect, and
    credibly, is an improvement (never a failure). A metric still `unknown` when the
    check stops (`final`) passes, with the reason saying it was not resolved.
    `head` / `base` are every sample of each side (for the summaries); a metric only
    one side produced is `new-stage` or `missing-stage`.
    """
    if not head:
        if not base:
            raise ValueError(f"{metric}: neither side produced it")
        return MetricVerdict(
            metric,
            MISSING_STAGE,
            baseline=summarize(base, groups=base_groups),
            reason="produced by the base revision but not by this one",
        )
    measured = summarize(head, groups=head_groups)
    if not base:
        return MetricVerdict(
            metric, NEW_STAGE, measured=measured, reason="not produced by the base revision"
        )
    baseline = summarize(base, groups=base_groups)
    effect = min_effect(metric)
    band = Band(effect, 0.0)
    bound = band.bound(baseline.median)
    if len(log_ratios) < 2:
        return MetricVerdict(
            metric, PASS, measured, baseline, band, bound, None,
            f"{len(log_ratios)} block(s) with a positive figure on both sides: "
            "too few to compare",
            clear=False,
        )  # fmt: skip
    est = paired_estimate(log_ratios, effect, alpha)
    interval = f"{1 - alpha:.2%} bounds {est.low:.3f}-{est.high:.3f}x over {est.blocks} blocks"
    if est.decision == DIFFERENT and est.ratio > 1.0:
        verdict = REGRESSION
        reason = f"{est.ratio:.3f}x the base, above 1 + {effect:g} and credibly > 1 ({interval})"
    elif est.decision == DIFFERENT:
        verdict = IMPROVEMENT
        reason = f"{est.ratio:.3f}x the base: faster by more than {effect:g} ({interval})"
    elif est.decision == SAME:
        verdict = PASS
        reason = ""
    else:
        verdict = PASS
        reason = (
            f"unresolved: {est.ratio:.3f}x the base ({interval}) is neither credibly slower "
            f"by {effect:g} nor within +-{effect:g}: passed with a note"
            if final
            else "unresolved"
        )
    return MetricVerdict(
        metric,
        verdict,
        measured,
        baseline,
        band,
        bound,
        est.ratio,
        reason,
        low=est.low,
        high=est.high,
        significant=est.low > 1.0,
        clear=est.decision != UNKNOWN,
        paired=est,
    )


__all__ = [
    "CONTENDED",
    "CPU_PAD_SCALE",
    "DEFAULT_IMPROVEMENT_THRESHOLD",
    "DEFAULT_PROFILE",
    "DEFAULT_REL",
    "DEFAULT_RULE",
    "DEVICE_ABS",
    "DEVICE_FLOORS",
    "METRIC_CLASSES",
    "MIN_EFFECT",
    "PAIRED_TRIM",
    "PROFILE_NAMES",
    "SEVERITY",
    "VERDICTS",
    "Band",
    "CaseVerdict",
    "Judgement",
    "MetricVerdict",
    "PairedEstimate",
    "Profile",
    "Rule",
    "Summary",
    "contended",
    "default_profiles",
    "gated_steps",
    "judge",
    "judge_case",
    "judge_metric",
    "judge_relative_metric",
    "min_effect",
    "overall",
    "paired_estimate",
    "sglang_profiles",
    "summarize",
    "worst",
]
