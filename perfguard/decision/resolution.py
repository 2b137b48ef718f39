"""What a runner can resolve, and how much of the timing a check judges on it.

A baseline records its runner's noise. From it follows the *resolution* of each timed
figure: the smallest slowdown a check against that baseline catches with 80 % probability
(`answer.POWER`), were the check's processes as spread as the baseline's and as many as
the check may take (`CHECK_PROCESSES` by default). On the 2-core CPU runner, its
processes spread about 1 %, baselines recorded +4.1-4.7 % on e2e and the denoising stage;
on simulated runners spread 13-29 % checks caught +49-136 %
(docs/measurements/2026-12-07-noisy-runner.md). On CPU the session term
(`tolerances.SESSION_SD`) alone keeps the 3 % figures' resolution near +4 %: there they
are judged in full only on the quietest runners; a GPU's figures have no such floor.

Where the resolution is wider than 4/3 of the figure's minimum effect (`RESOLVABLE`), a
check of unchanged code cannot be expected to call the figure *same*: it would be *can't
tell* on many checks, and a gate that is yellow on every PR is one people turn off. The
timing gate (`[tool.perfguard]` `timing-gate`) says what a check does then:

- `auto` (the default): a figure the runner resolves gets the three answers; one it
  does not is judged only for *slower* (a credible slowdown fails on any runner) and
  otherwise reads *below resolution*, which neither fails nor asks for more processes;
- `gate`: every figure gets the three answers, whatever the runner resolves;
- `advise`: every timed figure is judged only for *slower*, as `auto` does below
  resolution.

Work counters and the output are exact on every runner and always decide.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from perfguard.decision.answer import catches, step_count, step_level
from perfguard.decision.stats import (
    MEDIAN_SE_FACTOR,
    Summary,
    log_spread,
    process_spread,
    satterthwaite,
)
from perfguard.decision.tolerances import Band, shared_server
from perfguard.metrics import TIMED_CLASSES, metric_class

AUTO, GATE, ADVISE = "auto", "gate", "advise"
TIMING_GATES = (AUTO, GATE, ADVISE)
DEFAULT_TIMING_GATE = AUTO

RESOLVABLE = 4.0 / 3.0
"""A figure is judged in full where its resolution is within this many times its minimum
effect (+4 % on the 3 % figures): there a check of unchanged code calls it *same* 9 times
in 10. Derived, not fitted: *same* needs the one-sided 95 % upper bound within d, which
holds 90 % of the time when se <= d / (z_0.95 + z_0.9), and the resolution is
(t_0.001 + z_0.8) se, so the bound is 3.932 / 2.927 = 1.34 d
(docs/measurements/2026-12-07-noisy-runner.md)."""

CHECK_PROCESSES = 9
"""The processes a default stored check may take on one case: its first measurement and
`options.DEFAULT_MAX_RERUNS` (8) fresh ones. A baseline records the resolution that many
reach; a check uses its own budget (`--rigorous` takes more, and resolves more)."""


def resolution(
    baseline: Summary,
    band: Band,
    *,
    alpha: float,
    session_sd: float = 0.0,
    processes: int = CHECK_PROCESSES,
) -> float | None:
    """The smallest slowdown (ratio - 1) a check of `processes` fresh processes catches
    with `POWER` against `baseline` under `band` and the one-sided level `alpha`, its
    processes spread as the baseline's. The noise model is the check's own
    (`stats.log_ratio_noise`), with the check's side assumed, not measured. None when
    the baseline shows no spread (one sample, a count)."""
    b = baseline.median
    if b <= 0:
        return None
    own = log_spread(baseline)
    kb = len(baseline.processes) if baseline.processes else 1
    within, dof = 0.0, 0
    if own is not None:
        per_process = max(1.0, baseline.n / kb)
        within = MEDIAN_SE_FACTOR * own * math.sqrt(1 / baseline.n + 1 / (per_process * processes))
        dof = baseline.n - 1
    between = 0.0
    spread = process_spread(baseline)
    if spread is not None:
        sd, between_dof = spread
        between = sd * math.sqrt(1 / kb + 1 / processes)
        dof = between_dof + processes - 1
    if within <= 0 and between <= 0:
        return None
    se = math.sqrt(max(within, between) ** 2 + 2.0 * session_sd**2)
    dof = satterthwaite(se, math.sqrt(2.0) * session_sd, dof)
    return catches(se, dof, alpha=alpha, threshold=band.bound(b) / b)


def resolvable(figure_resolution: float | None, margin: float) -> bool:
    """Whether a check may say *same* of a figure with minimum effect `margin`: its
    resolution is within `RESOLVABLE` times the margin (unknown counts as yes)."""
    return figure_resolution is None or figure_resolution <= RESOLVABLE * margin


def judged_in_full(timing_gate: str, figure_resolution: float | None, margin: float) -> bool:
    """Whether a timed figure gets all three answers under `timing_gate`."""
    if timing_gate not in TIMING_GATES:
        raise ValueError(
            f"timing gate must be one of {', '.join(TIMING_GATES)}, not {timing_gate!r}"
        )
    if timing_gate == GATE:
        return True
    return timing_gate == AUTO and resolvable(figure_resolution, margin)


def by_class(figures: Iterable[tuple[str, float | None]]) -> dict[str, float]:
    """Per timed class, the median resolution of its figures (e2e and the denoising stage
    are one figure each): what `baselines show` and a check's first lines quote."""
    found: dict[str, list[float]] = {}
    for metric, value in figures:
        cls = metric_class(metric)
        if value is not None and cls in TIMED_CLASSES:
            found.setdefault(cls, []).append(value)
    return {cls: round(statistics.median(found[cls]), 4) for cls in TIMED_CLASSES if cls in found}


def describe(classes: Mapping[str, Any]) -> str:
    """`e2e +12%, denoise_stage +38%, ...` in class order."""
    return ", ".join(f"{cls} +{float(classes[cls]):.0%}" for cls in TIMED_CLASSES if cls in classes)


def of_scenario(scenario: Any, profile: Any) -> dict[str, float]:
    """Per timed class, what a default check against `scenario` resolves under `profile`
    (`by_class`): the figure `gen-baselines` records and `baselines show` prints. The
    steps share the stored level as the check's do (Bonferroni over the steps)."""
    from perfguard.decision.comparison import STORED_ALPHA

    metrics: Mapping[str, Summary] = scenario.metrics
    steps = step_count(metrics)
    overrides = [scenario.tolerance_overrides or {}]
    shared = shared_server(scenario.case)
    figures = []
    for name, summary in metrics.items():
        if metric_class(name) not in TIMED_CLASSES:
            continue
        alpha = step_level(name, STORED_ALPHA, steps)
        band = profile.noise_band(profile.band(name, overrides), summary)
        session_sd = profile.session_sd_of(name, shared_server=shared)
        figures.append((name, resolution(summary, band, alpha=alpha, session_sd=session_sd)))
    return by_class(figures)
