"""Paired verdicts for the relative check: base and head measured in alternating blocks.

Each block of the relative check (`perfguard.measurement.relative`) gives one head/base
ratio per metric; this module turns the blocks' log-ratios into DIFFERENT / SAME /
UNKNOWN (Pinpoint's three answers) with a trimmed mean and a t-interval, at a fixed
sequence of looks that share alpha (`alpha_per_look`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision import answer as answers
from perfguard.decision import counters
from perfguard.decision.estimate import DIFFERENT, SAME, UNKNOWN, PairedEstimate
from perfguard.decision.normalize import (
    NORMALIZED,
    RAW,
    aligned,
    fitted_exponent,
    is_timed,
    powered,
)
from perfguard.decision.options import RELATIVE_JUDGING, JudgeOptions
from perfguard.decision.resolution import RESOLVED_CLASSES, judged_in_full
from perfguard.decision.stats import MAX_LOG_SPREAD, summarize, t_quantile
from perfguard.decision.tolerances import Band, min_effect, relative_pad
from perfguard.decision.verdict import (
    ERROR,
    IMPROVEMENT,
    MISSING_STAGE,
    NEW_STAGE,
    PASS,
    REGRESSION,
    CaseVerdict,
    Judgement,
    MetricVerdict,
    worst,
)
from perfguard.errors import PerfguardError
from perfguard.metrics import metric_class, metric_sort_key
from perfguard.results import CaseResult, pool

PAIRED_TRIM = 0.2
"""The share of blocks trimmed from each end before averaging the per-block log ratios (Yuen's
trimmed mean, winsorized variance): 20 %, none with fewer than 5 blocks. In a 24-block
check of the smoke cases 19 blocks read 1.02-1.12 and 5 read 0.64-1.98 (a contention
episode on one side); trimmed, those few stop moving the estimate and widening the
interval fourfold (docs/measurements/2026-12-07-constants.md)."""


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
    winsorized = [min(max(x, kept[0]), kept[-1]) for x in ordered]
    wmean = math.fsum(winsorized) / n
    ss = math.fsum((x - wmean) ** 2 for x in winsorized)
    se = math.sqrt(ss / (h * (h - 1)))  # = s_w / ((1 - 2 trim) sqrt(n)), Yuen 1974
    half = min(t_quantile(alpha, h - 1) * se, MAX_LOG_SPREAD)
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
    pad: float = 0.0,
    exponent: float | None = None,
) -> MetricVerdict:
    """The verdict on one metric of a relative check (`perfguard.measurement.relative`).

    A regression needs the same things as against a stored baseline, with the paired
    estimate in place of the band: a point ratio above `1 + min_effect(metric)`, a
    one-sided lower bound above 1, and a difference above `pad` in the figure's unit
    (the stored gate's floor, `tolerances.MEASURED_FLOOR_MS`: a 5 us stage that reads
    1.3x has moved by less than the timer and dispatch jitter). Faster by more than the
    minimum effect and the pad, and credibly, is an improvement (never a failure). A
    metric still `unknown` when the check stops (`final`) passes, with the reason
    saying it was not resolved.
    `head` / `base` are every sample of each side (for the summaries); a metric only
    one side produced is `new-stage` or `missing-stage`. `exponent`: the share of the
    reference the `log_ratios` were scaled by, kept in the estimate for the report.
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
    band = Band(effect, pad)
    bound = band.bound(baseline.median)
    if len(log_ratios) < 2:
        return MetricVerdict(
            metric, PASS, measured, baseline, band, bound, None,
            f"{len(log_ratios)} block(s) with a positive figure on both sides: "
            "too few to compare",
            clear=False,
        )  # fmt: skip
    est = floored(paired_estimate(log_ratios, effect, alpha), baseline.median, pad)
    est = dataclasses.replace(est, reference_exponent=exponent)
    verdict, reason = _verdict_of(est, pad, final)
    floor = pad / baseline.median if baseline.median > 0 else 0.0
    answer = answer_of(est, verdict == REGRESSION, verdict == IMPROVEMENT, max(effect, floor))
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
        answer=answer,
    )


def answer_of(est: PairedEstimate, slower: bool, faster: bool, margin: float) -> answers.Answer:
    """A figure's answer from its paired estimate (the relative check's, `perfguard ab`'s):
    the stored check's rule (`perfguard.decision.answer.assess`), the standard error
    read off the interval."""
    return answers.assess(
        est.ratio,
        answers.log_se(est.ratio, est.low, est.alpha, est.blocks - 1),
        est.blocks - 1,
        alpha=est.alpha,
        threshold=1.0 + margin,
        margin=margin,
        slower=slower,
        faster=faster,
    )


def floored(est: PairedEstimate, base: float, pad: float) -> PairedEstimate:
    """`est` with the floor `pad` applied in the figure's unit (`base` the base's median):
    an interval that lies inside the floor is `same`; a difference that is credible as a
    ratio but within the floor is `unknown` (not shown to matter)."""
    if pad <= 0 or est.decision == SAME:
        return est
    if max(est.high - 1.0, 1.0 - est.low) * base <= pad:
        return dataclasses.replace(est, decision=SAME)
    if est.decision == DIFFERENT and abs(est.ratio - 1.0) * base <= pad:
        return dataclasses.replace(est, decision=UNKNOWN)
    return est


def _verdict_of(est: PairedEstimate, pad: float, final: bool) -> tuple[str, str]:
    """The metric verdict a paired estimate gives, and its reason."""
    effect = est.min_effect
    interval = f"{1 - est.alpha:.2%} bounds {est.low:.3f}-{est.high:.3f}x over {est.blocks} blocks"
    if est.slower:
        return REGRESSION, (
            f"{est.ratio:.3f}x the base, above 1 + {effect:g} and credibly > 1 ({interval})"
        )
    if est.decision == DIFFERENT:
        return IMPROVEMENT, (
            f"{est.ratio:.3f}x the base: faster by more than {effect:g} ({interval})"
        )
    if est.decision == SAME or not final:
        return PASS, "" if est.decision == SAME else "unresolved"
    return PASS, (
        f"can't tell: {est.ratio:.3f}x the base ({interval}) is neither credibly slower "
        f"by {effect:g} (and {pad:g} in all) nor within +-{effect:g}"
    )


LOOK_SCHEDULE = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
"""Block counts at which the verdicts are looked at: roughly geometric, so that the
number of looks, and with it the price per look (`alpha_per_look`), grows with the log of the
blocks, while an easy verdict is still seen after the first two pairs."""


def look_points(min_blocks: int, max_blocks: int) -> tuple[int, ...]:
    """The block counts at which verdicts are looked at: the minimum, the schedule's
    counts in between, and the maximum."""
    if min_blocks < 2:
        raise PerfguardError("--min-blocks must be at least 2 (a spread needs two blocks)")
    if max_blocks < min_blocks:
        raise PerfguardError("--max-blocks must be at least --min-blocks")
    inner = {n for n in LOOK_SCHEDULE if min_blocks < n < max_blocks}
    return tuple(sorted({min_blocks, *inner, max_blocks}))


LOOK_SIMULATIONS = 100_000
"""A/A checks simulated to find the level per look (`alpha_per_look`): the Monte Carlo
error of a 1 % family-wise rate is then 0.03 percentage points (one standard error)."""


def alpha_per_look(alpha: float, looks: Sequence[int], trim: float = PAIRED_TRIM) -> float:
    """The level each look tests at, so that noise alone fails a metric at some look with
    probability at most `alpha`.

    Found by simulating `LOOK_SIMULATIONS` A/A checks of normal blocks through the same
    statistic as `paired_estimate` (Yuen's trimmed mean and its t on `h - 1` degrees of
    freedom at each look), with a fixed seed so that a schedule always gets the same
    level: the largest level `a` with `P(some scheduled look crosses at a) + a <= alpha`,
    the `+ a` paying (Bonferroni) for the look a budget stop may add between two
    scheduled ones. One-sided: only a slowdown fails a check.

    Why not plain Bonferroni, `alpha / (K + 1)`: it assumes each look's test holds its
    level, and Yuen's does not on a handful of blocks: in that simulation each of the
    default looks (4, 6, 8, 12, 16, 24 blocks) crossed its nominal 0.143 % 1.0-1.5 times
    as often, so the family reached 0.87 % + 0.14 % for the budget look, over `alpha`.
    The nested looks' correlation wins back most of it: the level is 0.137 %.
    """
    return _simulated_level(float(alpha), tuple(sorted(set(looks))), trim)


@functools.lru_cache(maxsize=16)
def _simulated_level(alpha: float, looks: tuple[int, ...], trim: float) -> float:
    import numpy as np
    from scipy.special import stdtr

    rng = np.random.default_rng(20261204)
    x = rng.standard_normal((LOOK_SIMULATIONS, looks[-1]))
    smallest_p = np.ones(LOOK_SIMULATIONS)
    for n in looks:
        g = math.floor(trim * n)
        h = n - 2 * g
        if h < 2:
            continue  # `paired_estimate` never decides on fewer than two kept blocks
        ordered = np.sort(x[:, :n], axis=1)
        kept = ordered[:, g : n - g]
        winsorized = np.clip(ordered, kept[:, :1], kept[:, -1:])
        ss = ((winsorized - winsorized.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        t = kept.mean(axis=1) / np.sqrt(ss / (h * (h - 1)))
        smallest_p = np.minimum(smallest_p, stdtr(h - 1, -t))
    ordered_p = np.sort(smallest_p)
    # With a level `a` in (p[k-1], p[k]] exactly k checks cross (p < a): the best `a` for
    # each k is min(p[k], alpha - k / S), usable when it still lies above p[k-1].
    k = np.arange(LOOK_SIMULATIONS)
    best = np.minimum(ordered_p, alpha - k / LOOK_SIMULATIONS)
    usable = best > np.concatenate(([0.0], ordered_p[:-1]))
    return float(best[usable].max()) if usable.any() else 0.0


@dataclass
class Block:
    order: str
    seconds: float
    results: dict[str, dict[str, CaseResult]]


@dataclass
class RelativeOutcome:
    """Every block measured, the judgement on them, and why measuring stopped."""

    judgement: Judgement
    blocks: list[Block]
    pooled: dict[str, dict[str, CaseResult]]
    stopped: str
    looks: tuple[int, ...]
    alpha: float
    alpha_look: float
    seed: int
    elapsed_s: float
    looked_at: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "blocks": len(self.blocks),
            "order": [b.order for b in self.blocks],
            "seed": self.seed,
            "stopped": self.stopped,
            "looks": list(self.looks),
            "looked_at": list(self.looked_at),
            "alpha": self.alpha,
            "alpha_per_look": round(self.alpha_look, 6),
            "elapsed_s": round(self.elapsed_s, 1),
            "block_seconds": [round(b.seconds, 2) for b in self.blocks],
        }


def log_ratios(
    blocks: Sequence[Block], case_id: str, metric: str, timing: str = RAW
) -> list[float]:
    """`log(median head / median base)` of each block that has the metric on both sides
    (`compared`, without the share it scaled by)."""
    return compared(blocks, case_id, metric, timing)[0]


def compared(
    blocks: Sequence[Block], case_id: str, metric: str, timing: str = RAW
) -> tuple[list[float], float | None]:
    """The blocks' log ratios of `metric` (`log_ratios`) and the share of the reference
    their runs were scaled by (None: compared raw).

    With `timing` normalized, a timed metric's runs are first scaled by the reference
    time beside each, on both sides of the block: the block's two processes run seconds
    apart, but on a shared runner its spells still move one of them and not the other
    (docs/relative.md). Scaled by the share of the reference fitted on the check's own
    runs (`reference_exponent`), as the stored check scales them
    (`perfguard.decision.normalize.adjusted`): divided whole, a process whose reference
    read fast for reasons of its own, not the machine's, moved the stage's ratio by as
    much (docs/verdicts.md, det18). A block where either side's runs cannot be aligned
    with reference times compares the raw medians.
    """
    pairs = _block_pairs(blocks, case_id, metric)
    exponent = None
    if timing == NORMALIZED and is_timed(metric):
        exponent = reference_exponent(pairs, metric)
    out = []
    for head, base, h, b in pairs:
        if exponent is not None:
            hn, bn = per_reference(head, metric, exponent), per_reference(base, metric, exponent)
            if hn is not None and bn is not None:
                h, b = hn, bn
        mh, mb = statistics.median(h), statistics.median(b)
        if mh > 0 and mb > 0:
            out.append(math.log(mh / mb))
    return out, exponent


def _block_pairs(
    blocks: Sequence[Block], case_id: str, metric: str
) -> list[tuple[CaseResult, CaseResult, list[float], list[float]]]:
    """(head result, base result, head runs, base runs) of `metric` in each block that
    measured it on both sides."""
    out = []
    for block in blocks:
        head = block.results[HEAD].get(case_id)
        base = block.results[BASE].get(case_id)
        if head is None or base is None or head.status != "ok" or base.status != "ok":
            continue
        h, b = head.samples.get(metric), base.samples.get(metric)
        if h and b:
            out.append((head, base, list(h), list(b)))
    return out


def reference_exponent(
    pairs: Sequence[tuple[CaseResult, CaseResult, list[float], list[float]]], metric: str
) -> float:
    """The share of the reference `metric` follows, fitted on the runs of every block:
    `normalize.fitted_exponent` with an intercept per side (the code under test shifts
    one side), pooled over the blocks' processes; 1 (divided whole) when it cannot be
    fitted (too few runs aligned with reference readings, readings that do not vary)."""
    sides: dict[str, tuple[list[float], list[float]]] = {HEAD: ([], []), BASE: ([], [])}
    for head, base, _, _ in pairs:
        for side, res in ((HEAD, head), (BASE, base)):
            xs, refs = res.samples.get(metric) or [], res.reference or []
            if aligned(xs, refs):
                sides[side][0].extend(xs)
                sides[side][1].extend(refs)
    fitted = fitted_exponent(list(sides.values()))
    return 1.0 if fitted is None else fitted


def per_reference(result: CaseResult, metric: str, exponent: float = 1.0) -> list[float] | None:
    """Each run of `metric` scaled by the reference time beside it, `x / reference **
    exponent` (None: they do not align, or a reading is not positive)."""
    xs, refs = result.samples.get(metric) or [], result.reference or []
    if not aligned(xs, refs):
        return None
    return powered(xs, refs, 1.0, exponent)


@dataclass(frozen=True)
class Comparing:
    """How a block's two sides are compared: `timing` raw or normalized (`log_ratios`),
    and the `platform` whose floor a difference must clear (`tolerances.relative_pad`)."""

    timing: str = RAW
    platform: str = "cpu"


@dataclass(frozen=True)
class Levels:
    """The level each metric of a relative check is tested at, at each of the `looks`.

    Every metric at `alpha_look` (`alpha_per_look(alpha, looks)`), except the per-step
    metrics of a case (`step:0`, `step:1`, ...): one family of `m`, each at the level for
    `alpha / m`, since a slowdown of the code moves the stage and the step aggregates at
    the full level, and twenty steps at 1 % each would be twenty chances for noise (the
    stored gate's `verdict.rule_of` does the same).
    """

    alpha: float
    looks: tuple[int, ...]
    compare: Comparing = field(default_factory=Comparing)

    @property
    def alpha_look(self) -> float:
        return alpha_per_look(self.alpha, self.looks)

    def of(self, metric: str, steps: int) -> float:
        """The level of `metric` in a case that has `steps` per-step metrics."""
        if metric_class(metric) != "denoise_step" or steps < 2:
            return self.alpha_look
        return alpha_per_look(self.alpha / steps, self.looks)


def judge_blocks(
    case_ids: Sequence[str],
    blocks: Sequence[Block],
    *,
    levels: Levels,
    final: bool,
    errors: Mapping[str, str] | None = None,
    latched: Mapping[tuple[str, str], MetricVerdict] | None = None,
    judging: JudgeOptions = RELATIVE_JUDGING,
) -> tuple[Judgement, dict[str, dict[str, CaseResult]]]:
    """The judgement on the blocks so far, and each side's results pooled over them.

    Each metric is judged at its level (`Levels`), its sides compared as
    `levels.compare` says; the pooled results stay as measured. `judging` gives what
    fails (`fail_on_missing`, `advisory`, `allow_output_change`) and, at the last look
    (`final`), which figures the blocks could not resolve (`timing_gate`: a figure still
    can't tell whose detectable slowdown is over `resolution.RESOLVABLE` times its
    minimum effect is below the resolution the blocks reached).

    `latched` holds the verdicts already decided at an earlier look, keyed by (case,
    metric): they stand as they were decided. The work counters and the output of the
    head are judged against the base's exactly (`perfguard.decision.counters`): one
    counted run per side gives the delta, whatever the timings still leave open.
    """
    errors = errors or {}
    latched = latched or {}
    pooled: dict[str, dict[str, CaseResult]] = {BASE: {}, HEAD: {}}
    verdicts: list[CaseVerdict] = []
    for cid in sorted(case_ids):
        head_blocks = _pool_case(pooled, blocks, cid)
        if cid in errors:
            head = pooled[HEAD].get(cid)
            verdicts.append(
                CaseVerdict(
                    cid,
                    ERROR,
                    error=errors[cid],
                    output_hash=head.output_hash if head else None,
                )
            )
            continue
        head, base = pooled[HEAD][cid], pooled[BASE][cid]
        metrics = _relative_metrics(
            cid,
            head,
            base,
            blocks,
            levels=levels,
            final=final,
            latched=latched,
        )
        if final:
            metrics = [_at_resolution(m, judging.timing_gate) for m in metrics]
        verdicts.append(
            _relative_case(cid, head, base, metrics, head_blocks, judging.allow_output_change)
        )
    judgement = Judgement(PROFILE_NAME, tuple(verdicts), judging.fail_on_missing, judging.advisory)
    return judgement, pooled


def _at_resolution(m: MetricVerdict, timing_gate: str) -> MetricVerdict:
    """`m` at the relative check's last look: can't tell with a detectable slowdown the
    timing gate does not judge in full is below the resolution the blocks reached."""
    a = m.answer
    if a is None or a.answer != answers.CANT_TELL or metric_class(m.metric) not in RESOLVED_CLASSES:
        return m
    if judged_in_full(timing_gate, a.detectable, a.margin):
        return m
    return dataclasses.replace(m, answer=answers.below_resolution(a, a.detectable))


def _pool_case(pooled: dict[str, dict[str, CaseResult]], blocks: Sequence[Block], cid: str) -> int:
    """Pool each side's results of case `cid` over the blocks into `pooled`; the number
    of blocks with a head result."""
    parts = {
        side: [b.results[side][cid] for b in blocks if cid in b.results[side]]
        for side in (BASE, HEAD)
    }
    for side in (BASE, HEAD):
        if parts[side]:
            pooled[side][cid] = pool(parts[side])
    return len(parts[HEAD])


def _relative_metrics(
    cid: str,
    head: CaseResult,
    base: CaseResult,
    blocks: Sequence[Block],
    *,
    levels: Levels,
    final: bool,
    latched: Mapping[tuple[str, str], MetricVerdict],
) -> list[MetricVerdict]:
    """The verdict on each metric of either side: latched where decided before, else
    judged on the blocks' log ratios at its level."""
    names = sorted(set(head.samples) | set(base.samples), key=metric_sort_key)
    steps = sum(1 for m in names if metric_class(m) == "denoise_step")
    compare = levels.compare
    out = []
    for metric in names:
        if (cid, metric) in latched:
            out.append(latched[(cid, metric)])
            continue
        ratios, exponent = compared(blocks, cid, metric, compare.timing)
        verdict = judge_relative_metric(
            metric,
            head.samples.get(metric),
            base.samples.get(metric),
            ratios,
            alpha=levels.of(metric, steps),
            head_groups=head.groups,
            base_groups=base.groups,
            final=final,
            pad=relative_pad(metric, compare.platform),
            exponent=exponent,
        )
        out.append(verdict)
    return out


def _relative_case(
    cid: str,
    head: CaseResult,
    base: CaseResult,
    metrics: list[MetricVerdict],
    head_blocks: int,
    allow_output_change: bool,
) -> CaseVerdict:
    """The case verdict: the timing `metrics`, and the head's work counters and output
    judged against the base's exactly."""
    work, output = counters.judge_exact(
        head,
        counters.WorkCounts.from_runs(base.work or []),
        base.output_hash,
        base.output_sketch,
        overrides=[head.case.get("tolerance_overrides") or {}],
        allow_output_change=allow_output_change,
    )
    metrics = metrics + [MetricVerdict(**vars(c)) for c in work.metrics]
    kinds = [m.verdict for m in metrics] + ([REGRESSION] if output and output.failed else [])
    return CaseVerdict(
        cid,
        worst(kinds),
        tuple(metrics),
        output_hash=head.output_hash,
        baseline_output_hash=base.output_hash,
        deterministic=head.deterministic,
        work=work.to_json() or None,
        output=None if output is None else output.to_json(),
        sampling={
            "runs": head.repeats,
            "groups": len(head.groups) if head.groups else 1,
            "reruns": 0,
            "blocks": head_blocks,
            "base_runs": base.repeats,
        },
    )


BASE = "B"


HEAD = "H"


SIDES = {BASE: "base", HEAD: "head"}


PROFILE_NAME = "relative"
