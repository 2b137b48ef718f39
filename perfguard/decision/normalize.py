"""Timings at the baseline's runner speed: each run divided by the reference beside it.

A shared CPU runner changes speed in spells of a few runs to a minute (other tenants of
the host, its caches and memory bandwidth): on the project's 2-core runner, quiet, the
median of the qwen smoke case's `DenoisingStage` moved by 20-23 % (sd of log medians)
between fresh processes of one hour, and the reference workload
(`perfguard.device.reference`), timed right before and after every run, moved with it.
Both see the same machine at the same moment, so each run divided by the reference time
beside it keeps what the code did and drops most of what the machine did: the
between-process sd of that normalized median was 9-10 % against 20-23 % raw
(`python benchmarks/noise.py --commands cold resident`), 5.7 % against 12.9 % for its
e2e and 7.0 % against 14.8 % for the glm smoke `DenoisingStage`; inside one process,
over 5 s windows, the median of run / reference moved by 2.5 % while the runs moved by
12.3 % (`python benchmarks/spells.py`). The figures are in docs/verdicts.md.

`normalized` scales each timed run to the baseline's reference median `level`:
`x * level / reference`, so a figure still reads in milliseconds, "at the runner speed of
the baseline". A baseline made with `timing: normalized` stores its timed metrics that
way (the level is its own reference median), and a check against it normalizes its runs
to the same level before it judges them; the gate's statistics (intervals, the futility
stop, confirmations) are unchanged, they see the normalized samples. Memory and the work
counters are never scaled: they do not depend on the runner's speed.

Why the earlier objection to dividing by the runner's speed does not apply here: it
divided one measurement's median by the ratio of two reference medians, measured under
neighbours that took the core (`benchmarks/runner_speed.py`: 11-18 % scatter), and used
it only to excuse a slowdown. Here every run carries its own reference reading, the
runs a burst disturbed are still dropped first (`perfguard.decision.contention`), and
whatever scatter is left is in the normalized samples themselves, so the verdict's
interval widens with it instead of trusting it.

The default is `normalized` on CPU and `raw` on CUDA, ROCm and NPU, whose kernels do not
share the host's spells the same way and where no device has measured it yet
(`benchmarks/gpu_selfcheck.py` prints both spreads).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfguard.decision.contention import DEFAULT_POLICY, ContentionPolicy, Screen, screen
from perfguard.decision.stats import Summary, summarize
from perfguard.metrics import is_timed

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.results import CaseResult
    from perfguard.storage.baseline import Scenario


def normalized(result: Any, level: float) -> Any | None:
    """`result` with every timed run scaled to the runner speed `level`.

    Run `i` of a timed metric becomes `x[i] * level / reference[i]`. None when the runs
    cannot be aligned with reference figures (no reference, a metric that some runs did
    not produce, a reference time that is not positive): such a result cannot be
    normalized, and comparing it with a normalized baseline would compare unlike figures.
    """
    reference = list(getattr(result, "reference", None) or [])
    if not reference or level <= 0 or min(reference) <= 0:
        return None
    samples: dict[str, list[float]] = {}
    for metric, xs in result.samples.items():
        scaled = over_reference(xs, reference, level) if is_timed(metric) else list(xs)
        if scaled is None:
            return None
        samples[metric] = scaled
    return dataclasses.replace(result, samples=samples)


def aligned(xs: Sequence[float], reference: Sequence[float]) -> bool:
    """Whether runs `xs` can be scaled by the `reference` readings: one positive reading
    beside each run."""
    return bool(xs) and len(xs) == len(reference) and min(reference) > 0


def over_reference(
    xs: Sequence[float], reference: Sequence[float], level: float = 1.0
) -> list[float] | None:
    """Runs `xs` over the reference reading beside each, at `level`: run `i` as
    `xs[i] * level / reference[i]`, or None when the runs and the reference readings do
    not align or a reading is not positive (`aligned`)."""
    if not aligned(xs, reference):
        return None
    return [x * level / r for x, r in zip(xs, reference, strict=True)]


def rescaled(summary: Summary, factor: float) -> Summary:
    """`summary` in another unit: every figure times `factor` (counts unchanged)."""

    def scale(x: float | None) -> float | None:
        return None if x is None else x * factor

    return dataclasses.replace(
        summary,
        median=summary.median * factor,
        min=scale(summary.min),
        max=scale(summary.max),
        iqr=scale(summary.iqr),
        mad=scale(summary.mad),
        samples=None if summary.samples is None else tuple(x * factor for x in summary.samples),
        processes=None
        if summary.processes is None
        else tuple(x * factor for x in summary.processes),
    )


def at_speed_of(old: Any, new: Any) -> Any:
    """Scenario `old` with its timed metrics in scenario `new`'s units.

    Normalized figures are at the runner speed of their own scenario's reference
    median, so two of them compare only at one speed (`gen-baselines --tighten`,
    `baselines diff`): `old`'s are rescaled by the ratio of the two medians. Raw
    figures, and a pair of another timing, are returned unchanged: they compare as
    they always did.
    """
    if not (old.normalized and new.normalized) or not old.reference.median:
        return old
    factor = new.reference.median / old.reference.median
    metrics = {m: rescaled(s, factor) if is_timed(m) else s for m, s in old.metrics.items()}
    return dataclasses.replace(old, metrics=metrics)


# ---- the reference's share, fitted per comparison -------------------------------------------

MIN_RUNS_TO_FIT = 10
"""Runs a side needs before its reference readings are used to fit the exponent."""


def fitted_exponent(sides: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float | None:
    """How strongly a metric follows the reference workload, fitted on the runs at hand.

    `sides` are (runs, reference readings beside them) of a baseline and a check. The
    exponent is the least-squares slope of log run on log reference with an intercept
    of each side's own, so a slowdown of the code (a shift of one side) is not read as
    the runner's; clipped to [0, 1]: a metric does not get faster when the machine gets
    slower, nor slow down by more than the machine does. This is a regression
    estimator (a control variate; CUPED in A/B testing): `x * (level / reference) **
    beta` has the least variance of the family, and `beta = 1` is the division by the
    reference that `normalized` applies. None when a side has fewer than
    `MIN_RUNS_TO_FIT` runs or the readings do not vary.

    Why fit it: on the project's 2-core runner the slope changes from day to day. On a
    day of deep spells the stage followed the reference run by run (dividing halved the
    spread between processes); on a quiet one the reference moved by 8 % between
    processes on its own, the qwen smoke `DenoisingStage` slope was 0.2, and dividing
    by it tripled the spread of unchanged code's ratios (docs/verdicts.md, "The
    reference's share, fitted").
    """
    num = den = 0.0
    for xs, refs in sides:
        if len(xs) != len(refs) or len(xs) < MIN_RUNS_TO_FIT or min(min(xs), min(refs)) <= 0:
            return None
        lx = [math.log(x) for x in xs]
        lr = [math.log(r) for r in refs]
        mx, mr = statistics.fmean(lx), statistics.fmean(lr)
        num += sum((a - mx) * (b - mr) for a, b in zip(lx, lr, strict=True))
        den += sum((b - mr) ** 2 for b in lr)
    if den <= 0:
        return None
    return min(1.0, max(0.0, num / den))


def scaled_to_reference(
    xs: Sequence[float], reference: Sequence[float], level: float, exponent: float
) -> list[float]:
    """Runs `xs` scaled to the reference reading beside each by its share `exponent`:
    run `i` as `xs[i] * (level / reference[i]) ** exponent`."""
    return [x * (level / r) ** exponent for x, r in zip(xs, reference, strict=True)]


def fitted_pair(
    samples: Sequence[float],
    reference: Sequence[float],
    base: Summary,
    scenario: Any,
) -> tuple[list[float], Summary, float] | None:
    """The pair one timed metric is judged on, scaled by the reference's fitted share.

    A check's `samples` of the metric (its raw runs, `reference` beside them) and the
    baseline's `base`, both scaled by the exponent fitted on the two
    (`fitted_exponent`), at the runner speed of the baseline's reference median: the
    check's runs, the baseline's summary with its per-process medians, and the
    exponent. None when it cannot be fitted: a baseline without its runs, its
    reference readings or its processes (`Scenario.groups`, files from before it), runs
    that do not align, too few runs. The caller then divides by the reference whole
    (`normalized`), as such baselines always were.
    """
    ref = scenario.reference
    groups = getattr(scenario, "groups", None)
    if not scenario.normalized or ref is None or not ref.samples or not groups:
        return None
    level = ref.median
    stored = base.samples
    if stored is None or len(stored) != len(ref.samples) or sum(groups) != len(stored):
        return None
    if len(samples) != len(reference) or min(ref.samples) <= 0 or min(reference, default=0) <= 0:
        return None
    # The stored runs are at `level` (each multiplied by level / its reference): undo it.
    raw = [x * r / level for x, r in zip(stored, ref.samples, strict=True)]
    exponent = fitted_exponent([(raw, ref.samples), (samples, reference)])
    if exponent is None:
        return None
    scaled_base = summarize(scaled_to_reference(raw, ref.samples, level, exponent), True, groups)
    return scaled_to_reference(samples, reference, level, exponent), scaled_base, exponent


def metric_pair(
    metric: str, raw: Any, checked: Any, scenario: Any
) -> tuple[Sequence[float] | None, Summary | None, float | None]:
    """The runs and the baseline summary `metric` is judged on, and the reference's
    exponent when one was fitted: for a timed metric of a normalized baseline that
    keeps its processes, both sides scaled by the fitted share of the reference
    (`normalize.fitted_pair`); otherwise the check's `checked` runs (divided whole) and the
    stored summary."""
    samples, base = checked.samples.get(metric), scenario.metrics.get(metric)
    if base is None or samples is None or not is_timed(metric) or not scenario.normalized:
        return samples, base, None
    fitted = fitted_pair(raw.samples[metric], raw.reference or [], base, scenario)
    return (samples, base, None) if fitted is None else fitted


# ---- a result as a check judges it ---------------------------------------------------------


def as_checked(
    result: CaseResult, scenario: Scenario, policy: ContentionPolicy = DEFAULT_POLICY
) -> tuple[CaseResult, Screen, bool]:
    """`result` as a check judges it against `scenario`: the runs the contention screen
    finds contended left out, then, where the scenario is normalized, every run scaled
    to its reference median (`perfguard.decision.normalize`); what the screen found;
    whether the runs were normalized. `perfguard calibrate` measures noise on the same."""
    screened, scr = screened_runs(result, scenario, policy)
    checked, scaled = scaled_runs(screened, scenario)
    return checked, scr, scaled


def scaled_runs(screened: CaseResult, scenario: Scenario) -> tuple[CaseResult, bool]:
    """`screened`, each run scaled to its reference median if the scenario is normalized."""
    ref = scenario.reference.median if scenario.reference is not None else None
    scaled = normalized(screened, ref) if scenario.normalized and ref else None
    return (screened if scaled is None else scaled), scaled is not None


def screened_runs(
    result: CaseResult, scenario: Scenario, policy: ContentionPolicy = DEFAULT_POLICY
) -> tuple[CaseResult, Screen]:
    """`result` without the runs the contention screen finds contended, as measured."""
    ref = scenario.reference.median if scenario.reference is not None else None
    return screen(result, ref, policy)
