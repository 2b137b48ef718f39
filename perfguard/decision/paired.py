"""Paired verdicts for the relative check: base and head measured in alternating blocks.

Each block of the relative check (`perfguard.measurement.relative`) gives one head/base
ratio per metric; this module judges each metric on the blocks' log ratios
(`perfguard.decision.estimate`: a trimmed mean and its t-interval) by the one rule of a
timed figure (`perfguard.decision.answer`), at a fixed sequence of looks that share
alpha (`perfguard.decision.looks`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision import answer as answers
from perfguard.decision import counters
from perfguard.decision.estimate import DIFFERENT, SAME, UNKNOWN, PairedEstimate, paired_estimate
from perfguard.decision.judgement import Judgement
from perfguard.decision.looks import alpha_per_look
from perfguard.decision.normalize import aligned, fitted_exponent, scaled_to_reference
from perfguard.decision.options import RELATIVE_JUDGING, JudgeOptions
from perfguard.decision.records import (
    ERROR,
    IMPROVEMENT,
    MISSING_STAGE,
    NEW_STAGE,
    PASS,
    REGRESSION,
    CaseVerdict,
    MetricVerdict,
    worst,
)
from perfguard.decision.resolution import judged_in_full
from perfguard.decision.stats import summarize
from perfguard.decision.tolerances import Band, min_effect, relative_pad
from perfguard.decision.work_counts import WorkCounts
from perfguard.metrics import NORMALIZED, RAW, is_timed, metric_sort_key
from perfguard.results import CaseResult, pool


@dataclass(frozen=True)
class PairedFigure:
    """One metric of a relative check: every sample of each side (for the summaries),
    with the processes they came from, and the blocks' log ratios head / base with the
    share of the reference they were scaled by (`exponent`; None: compared raw)."""

    head: Sequence[float] | None
    base: Sequence[float] | None
    log_ratios: Sequence[float]
    head_groups: Sequence[int] | None = None
    base_groups: Sequence[int] | None = None
    exponent: float | None = None


def judge_relative_metric(
    metric: str,
    head: Sequence[float] | None,
    base: Sequence[float] | None,
    log_ratios: Sequence[float],
    *,
    alpha: float,
    final: bool = True,
    pad: float = 0.0,
) -> MetricVerdict:
    """`judge_paired` on the samples of each side and the blocks' log ratios: the keyword
    form of one metric's relative verdict."""
    return judge_paired(
        metric, PairedFigure(head, base, log_ratios), alpha=alpha, final=final, pad=pad
    )


def judge_paired(
    metric: str, figure: PairedFigure, *, alpha: float, final: bool = True, pad: float = 0.0
) -> MetricVerdict:
    """The verdict on one metric of a relative check (`perfguard.measurement.relative`).

    A regression needs the same things as against a stored baseline, with the paired
    estimate in place of the band: a point ratio above `1 + min_effect(metric)`, a
    one-sided lower bound above 1, and a difference above `pad` in the figure's unit
    (the stored gate's floor, `tolerances.MEASURED_FLOOR_MS`: a 5 us stage that reads
    1.3x has moved by less than the timer and dispatch jitter). Faster by more than the
    minimum effect and the pad, and credibly, is an improvement (never a failure). A
    metric whose decision is still `unknown` when the check stops (`final`) passes, with
    the reason saying it was not resolved; it is `clear` once its decision is `same` or
    `different` (`PairedEstimate.decision`). Its answer is the one rule's
    (`PairedEstimate.answer`), which asks of a *same* what the stored check's does.
    A metric only one side produced is `new-stage` or `missing-stage`.
    """
    if not figure.head or not figure.base:
        return _one_side_only(metric, figure)
    measured = summarize(figure.head, groups=figure.head_groups)
    baseline = summarize(figure.base, groups=figure.base_groups)
    band = Band(min_effect(metric), pad)
    bound = band.bound(baseline.median)
    if len(figure.log_ratios) < 2:
        return MetricVerdict(
            metric, PASS, measured, baseline, band, bound, None,
            f"{len(figure.log_ratios)} block(s) with a positive figure on both sides: "
            "too few to compare",
            clear=False,
        )  # fmt: skip
    est = floored(paired_estimate(figure.log_ratios, band.rel, alpha), baseline.median, pad)
    est = dataclasses.replace(est, reference_exponent=figure.exponent)
    verdict, reason = _verdict_of(est, pad, final)
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
        answer=est.answer,
    )


def _one_side_only(metric: str, figure: PairedFigure) -> MetricVerdict:
    """A metric one side did not produce: `missing-stage` or `new-stage`."""
    if figure.head:
        measured = summarize(figure.head, groups=figure.head_groups)
        return MetricVerdict(
            metric, NEW_STAGE, measured=measured, reason="not produced by the base revision"
        )
    if not figure.base:
        raise ValueError(f"{metric}: neither side produced it")
    return MetricVerdict(
        metric,
        MISSING_STAGE,
        baseline=summarize(figure.base, groups=figure.base_groups),
        reason="produced by the base revision but not by this one",
    )


def floored(est: PairedEstimate, base: float, pad: float) -> PairedEstimate:
    """`est` with the timer floor `pad` (in the figure's unit; `base` the base's median)
    as a ratio of the base: a difference must clear it as well as the minimum effect,
    and an interval within it is the same (`PairedEstimate.margin`)."""
    if pad <= 0 or base <= 0:
        return est
    return dataclasses.replace(est, floor=pad / base)


def _verdict_of(est: PairedEstimate, pad: float, final: bool) -> tuple[str, str]:
    """The metric verdict a paired estimate's decision gives, and its reason."""
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
    (`perfguard.decision.normalize.fitted_pair`): divided whole, a process whose reference
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
    return scaled_to_reference(xs, refs, 1.0, exponent)


@dataclass(frozen=True)
class BlockComparison:
    """How a block's two sides are compared: `timing` raw or normalized (`log_ratios`),
    and the `platform` whose floor a difference must clear (`tolerances.relative_pad`)."""

    timing: str = RAW
    platform: str = "cpu"


@dataclass(frozen=True)
class LookLevels:
    """The level each metric of a relative check is tested at, at each of the `looks`.

    Every metric at `alpha_look` (`alpha_per_look(alpha, looks)`), except the per-step
    metrics of a case (`step:0`, `step:1`, ...): one family of `m`, each at the level for
    `alpha / m` (`answer.step_level`, as the stored check splits its level), since a
    slowdown of the code moves the stage and the step aggregates at the full level.
    """

    alpha: float
    looks: tuple[int, ...]
    comparison: BlockComparison = field(default_factory=BlockComparison)

    @property
    def alpha_look(self) -> float:
        return alpha_per_look(self.alpha, self.looks)

    def of(self, metric: str, steps: int) -> float:
        """The level of `metric` in a case that has `steps` per-step metrics."""
        return alpha_per_look(answers.step_level(metric, self.alpha, steps), self.looks)


def judge_blocks(
    case_ids: Sequence[str],
    blocks: Sequence[Block],
    *,
    levels: LookLevels,
    final: bool,
    errors: Mapping[str, str] | None = None,
    latched: Mapping[tuple[str, str], MetricVerdict] | None = None,
    judging: JudgeOptions = RELATIVE_JUDGING,
) -> tuple[Judgement, dict[str, dict[str, CaseResult]]]:
    """The judgement on the blocks so far, and each side's results pooled over them.

    Each metric is judged at its level (`LookLevels`), its sides compared as
    `levels.comparison` says; the pooled results stay as measured. `judging` gives what
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
    if a is None or a.answer != answers.CANT_TELL or not is_timed(m.metric):
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
    levels: LookLevels,
    final: bool,
    latched: Mapping[tuple[str, str], MetricVerdict],
) -> list[MetricVerdict]:
    """The verdict on each metric of either side: latched where decided before, else
    judged on the blocks' log ratios at its level."""
    names = sorted(set(head.samples) | set(base.samples), key=metric_sort_key)
    steps = answers.step_count(names)
    comparison = levels.comparison
    out = []
    for metric in names:
        if (cid, metric) in latched:
            out.append(latched[(cid, metric)])
            continue
        ratios, exponent = compared(blocks, cid, metric, comparison.timing)
        figure = PairedFigure(
            head.samples.get(metric),
            base.samples.get(metric),
            ratios,
            head.groups,
            base.groups,
            exponent,
        )
        verdict = judge_paired(
            metric,
            figure,
            alpha=levels.of(metric, steps),
            final=final,
            pad=relative_pad(metric, comparison.platform),
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
        WorkCounts.from_runs(base.work or []),
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
