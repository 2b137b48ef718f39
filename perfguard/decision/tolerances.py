"""Tolerance profiles and bands: how far a metric may move before it can be a regression.

A `Band` is sglang's bound `max(b * (1 + rel), b + abs)` plus, for baselines perfguard
measured, a noise pad of a few standard errors of the baseline median; a `Profile` holds
the bands of each metric class. Baselines store their profile (`perfguard.storage.baseline`)
and verdicts apply it (`perfguard.decision.verdict`): both import this module, neither
imports the other.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision.stats import (
    MEDIAN_SE_FACTOR,
    Summary,
    log_spread,
)
from perfguard.metrics import WORK_KINDS, metric_class

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
"""CPU profiles carry 1/100 of sglang's millisecond pads: the pads are sized for seconds-long
GPU requests, and the CPU smoke cases last ~20 ms, where a 12 ms pad would hide a +50 %
slowdown. At 1/100 they keep a GPU case's proportion and stay above the ~0.1 ms of
jitter the median leaves; memory pads are not scaled
(docs/measurements/2026-12-07-constants.md)."""


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
(`compare --against`) share these figures, so "how big must it be" has one answer.
"""


WORK_TOLERANCE: dict[str, tuple[float, float]] = {kind: (0.0, 0.0) for kind in WORK_KINDS}
"""Work counters (`ops`, `flops`, `alloc`, `syncs`) are compared exactly by default.

A count has no noise (`perfguard.decision.counters`): any growth is more work. A profile
that lacks a counter class (one written before counters, an imported sglang one) gets
these; a profile or a case may loosen a class or one counter like any other band.
"""


def min_effect(metric: str) -> float:
    """`MIN_EFFECT` of `metric`'s class."""
    return MIN_EFFECT[metric_class(metric)]


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
    `session_sd` widens the verdict's interval, not the band: per metric class, the sd
    (log scale) of the offset one session of the runner leaves on a figure beyond what
    its processes show (`SESSION_SD`; `perfguard.decision.stats.log_ratio_noise`).
    """

    name: str
    rel: Mapping[str, float]
    abs: Mapping[str, float]
    floors: Mapping[str, Band] = field(default_factory=dict)
    advisory: bool = False
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    noise_pad: float = 0.0
    session_sd: Mapping[str, float] = field(default_factory=dict)

    def session_sd_of(self, metric: str, *, shared_server: bool = False) -> float:
        """`session_sd` of `metric`'s class (0 where the profile has none); with
        `shared_server` (a server case whose rounds all ran on one server it did not
        start: `url`), the class's server term (`SERVER_SESSION_SD`) where it has one."""
        cls = metric_class(metric)
        if shared_server and SERVER_PREFIX + cls in self.session_sd:
            return float(self.session_sd[SERVER_PREFIX + cls])
        return float(self.session_sd.get(cls, 0.0))

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
        if cls in WORK_TOLERANCE:
            rel = float(self.rel.get(cls, WORK_TOLERANCE[cls][0]))
            pad = float(self.abs.get(cls, WORK_TOLERANCE[cls][1]))
        else:
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
        if self.session_sd:
            out["session_sd"] = {k: float(v) for k, v in self.session_sd.items()}
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
            session_sd={k: float(v) for k, v in data.get("session_sd", {}).items()},
        )


MEASURED_REL: dict[str, dict[str, float]] = {
    # The minimum effect of interest for figures perfguard measured itself (several
    # samples, known noise): the credibility test, not a wide band, keeps noise out.
    "pr_test": dict(MIN_EFFECT),
    # Nightly, on the same runner: the same effects; the history's change points catch
    # the slow drifts that no single check can.
    "long_term": dict(MIN_EFFECT),
}


def shared_server(case: Mapping[str, Any] | None) -> bool:
    """Whether `case` (a case definition) is a server case at a `url`: its rounds all ran
    on one server it did not start, whose offset no round shows (`Profile.session_sd_of`)."""
    case = case or {}
    return case.get("workload") == "server" and bool(case.get("url"))


MEASURED_FLOOR_MS = {"cpu": 0.01, "device": 0.05}
"""The smallest pad on a time (ms): timer and dispatch jitter that no median removes.

On the CPU the clock resolves ~0.1 us and a stage boundary costs ~1 us, but Python
dispatch and scheduler jitter move a stage of a few microseconds by several of them:
10 us. Device events resolve ~0.5 us, but launch-side jitter of a stage's first kernel
is tens of microseconds: 50 us.
"""


MEASURED_MEMORY_PAD_MB = {"cpu": 0.1, "device": 64.0}
"""Peak-memory pads (MB). On CPU the figure is the tensor memory a run allocates, tracked
op by op (`perfguard.measurement.memory`), identical to the byte from run to run: 0.1 MB catches a
leaked 256 KiB buffer on a 0.5 MB smoke case. On devices the allocator rounds to
segments: 64 MB, about one rounding step on a large model."""


def relative_pad(metric: str, platform: str) -> float:
    """The floor a difference must clear in a relative check (`compare --against`), in the
    metric's unit: the stored gate's smallest pad on `platform` (`MEASURED_FLOOR_MS` for
    a time, `MEASURED_MEMORY_PAD_MB` for peak memory); 0 for anything else."""
    where = "cpu" if platform == "cpu" else "device"
    try:
        kind = metric_class(metric)
    except ValueError:
        return 0.0
    if kind == "peak_memory":
        return MEASURED_MEMORY_PAD_MB[where]
    return MEASURED_FLOOR_MS[where] if kind in DEVICE_ABS else 0.0


NOISE_PAD_K = 3.0
"""The pad scales with the measurement: k x the standard error of the difference of two
medians as noisy as the baseline's, in the figure's own unit. A stage of 20 us whose
samples jitter by 5 us gets a pad of ~6 us on 20 samples; a 0.18 ms stage that became
1.3 ms fails; a 7 ms denoising stage's pad (~0.1 ms) stays below its 3 % band."""


SESSION_SD: dict[str, dict[str, float]] = {
    "cpu": {"non_denoise_stage": 0.04, "denoise_stage": 0.007, "denoise_agg": 0.007, "e2e": 0.007}
}
"""Per platform and metric class, the sd (log scale) of the offset one session of the runner
leaves on a figure beyond its processes' spread, added to the interval once for the
baseline's session and once for the check's. On the 2-core CPU runner 36 `gen-baselines`
of 10 processes put 0.6-0.8 % on `DenoisingStage` (0.7 % here, e2e and the aggregates
alike) and 2-3.7 % on the small stages (4 %); on simulated runners the term took unchanged
code's false alarms from 2-3.5 % to 0 % (docs/measurements/2026-12-07-constants.md)."""


SERVER_PREFIX = "server:"
SERVER_SESSION_SD: dict[str, dict[str, float]] = {
    "cpu": {"e2e": 0.05, "denoise_stage": 0.05, "denoise_agg": 0.05, "non_denoise_stage": 0.06}
}
"""Per class, the sd (log scale) of the offset one server process leaves on every figure it
serves, taken instead of `SESSION_SD` for a server case at a `url`, whose rounds all
share one server (a `launch` case starts one per round and needs none). Six servers of
unchanged code on the 2-core runner put the median offset at 4.8 % on e2e's figures,
3.3 % on the denoising stage and 5.3 % on the rest: 5 % and 6 % here
(docs/measurements/2026-12-07-serving.md, 2026-12-07-constants.md)."""


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
    pads.update({kind: pad for kind, (_rel, pad) in WORK_TOLERANCE.items()})
    work_rel = {kind: rel for kind, (rel, _pad) in WORK_TOLERANCE.items()}
    note = (
        f"minimum effects of interest, pads of {NOISE_PAD_K:g} standard errors of the "
        f"baseline median above {floor:g} ms"
    )
    return {
        name: Profile(
            name,
            {**MEASURED_REL[name], **work_rel},
            dict(pads),
            {},
            description=note,
            noise_pad=NOISE_PAD_K,
            session_sd={
                **SESSION_SD.get(platform, {}),
                **{SERVER_PREFIX + k: v for k, v in SERVER_SESSION_SD.get(platform, {}).items()},
            },
        )
        for name in PROFILE_NAMES
    }
