"""The decision on one metric, one case and one check: slower, same or can't tell.

Everything that decides lives here, so that "how a regression is decided" is one file:
the per-metric verdict and its answer (`perfguard.decision.answer`), which verdicts are
over their bound (the gate confirms the case) or already clear (it stops sampling), the
per-case verdict and the overall verdict with its exit code. The rule as a card of
numbered lines, with every constant: `perfguard.decision` (README.md, "The rule").

The band, in sglang's words: a metric whose baseline is `b` may not exceed
`max(b * (1 + rel), b + abs)`; one-sided (only slowdowns fail). The measured figure is
the median of the samples, not the mean: one preempted run moves the mean of five
samples by 20 % and the median not at all. A median over the band is a regression only
when the slowdown is also credible (`Rule.alpha`), with the interval from
`stats.log_ratio_noise`: both sides' samples and, with several processes, the spread of
the per-process medians, since on a shared runner the process is a source of variation
its own samples cannot show. One process is never enough: on the shared CPU runner
spells of ~1 s run a stage 70 % slower, so a case over its bound is confirmed in fresh
processes by the gate (`perfguard.decision.gate`) before it can be a regression.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision import answer as answers
from perfguard.decision import counters
from perfguard.decision.answer import SAME_PROCESSES, Answer
from perfguard.decision.comparison import DEFAULT_RULE, Comparison, Rule
from perfguard.decision.contention import DEFAULT_POLICY, ContentionPolicy
from perfguard.decision.estimate import PairedEstimate
from perfguard.decision.normalize import (
    NORMALIZED,
    metric_pair,
    scaled_runs,
    screened_runs,
)
from perfguard.decision.resolution import (
    DEFAULT_TIMING_GATE,
    GATE,
    RESOLVED_CLASSES,
    judged_in_full,
    resolution,
    settled,
)
from perfguard.decision.stats import (
    Noise,
    Summary,
    summarize,
)
from perfguard.decision.tolerances import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    DEFAULT_PROFILE,
    Band,
    Profile,
)
from perfguard.errors import (
    EXIT_CASE_FAILED,
    EXIT_CONTENDED,
    EXIT_OK,
    EXIT_REGRESSION,
)
from perfguard.metrics import metric_class, metric_sort_key, unit
from perfguard.results import CaseResult, component_changes

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.results import Results
    from perfguard.storage.baseline import Baseline, Scenario

# ---- verdict names -------------------------------------------------------------------------

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
MISSING_BASELINE = "missing-baseline"
MISSING_STAGE = "missing-stage"
NEW_STAGE = "new-stage"
ERROR = "error"
CONTENDED = "contended"
"""The runner stayed much slower than at baseline time, or was slower by enough to explain
a metric's excess over its bound: no verdict on the code (exit 4)."""

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
MISSING = (MISSING_BASELINE, MISSING_STAGE, NEW_STAGE)
"""Verdicts about coverage, not speed: reported, and failures only with `--fail-on-missing`."""

OVERALL_PASS = "pass"
OVERALL_FAIL = "fail"
OVERALL_ERROR = "error"
OVERALL_CONTENDED = "contended"
OVERALL_CANT_TELL = "cant_tell"
"""No figure slower, but one the check could not tell from its baseline (exit 4)."""

# ---- one metric ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricVerdict(counters.CounterVerdict):
    """The verdict on one metric of one case, with everything a reader needs to check it.

    Its first fields are a counter's verdict (`counters.CounterVerdict`). `low` / `high`
    bound median/baseline at the rule's confidence (one-sided each); `significant`:
    `low` > 1; `borderline`: the next process could flip it (reported); `clear`: more
    runs of this process would not change it (`stats.median_reach`); `noise`: where the
    interval came from.
    """

    low: float | None = None
    high: float | None = None
    significant: bool | None = None
    borderline: bool = False
    clear: bool = True
    noise: Noise | None = None
    paired: PairedEstimate | None = None
    answer: Answer | None = None
    """same / slower / can't tell, with the smallest slowdown the check could have caught
    (`perfguard.decision.answer`); None for coverage verdicts (missing, new)."""

    @property
    def metric_class(self) -> str:
        return metric_class(self.metric)

    @property
    def unit(self) -> str:
        return unit(self.metric)

    @property
    def over(self) -> bool:
        """Whether the median is over its bound, credibly or not: what the gate confirms."""
        return self.verdict == REGRESSION or (
            self.measured is not None
            and self.bound is not None
            and self.measured.median > self.bound
        )

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
        if counters.is_counter(self.metric) and self.measured and self.baseline:
            out["delta"] = self.measured.median - self.baseline.median
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
        if self.answer is not None:
            out["answer"] = self.answer.to_json()
        return out

    @classmethod
    def from_json(cls, metric: str, data: Mapping[str, Any]) -> MetricVerdict:
        band = data.get("band")
        noise = data.get("noise")
        paired = data.get("paired")
        answer = data.get("answer")

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
            noise=None if noise is None else Noise.from_json(noise),
            paired=None
            if paired is None or data.get("ratio_low") is None
            else PairedEstimate.from_json(paired, data),
            answer=None if answer is None else Answer.from_json(answer),
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
    session: float = 0.0,
    same_band: Band | None = None,
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
    reference workload now over at baseline time (`perfguard.decision.contention`): when
    the runner is slower as a whole (speed > 1) and the median divided by it would be
    within the bound, the metric is `contended` (no verdict, exit 4): the reference
    tracks the pipelines' speed on average but predicts one measurement's only to
    11-18 %, several times the minimum effect, so dividing by it would excuse real
    slowdowns (docs/noise.md). A faster runner adjusts nothing. `session` widens the
    interval by the offset one session of the runner leaves on the metric
    (`Profile.session`), once for the baseline's session and once for this one's.

    `same_band` is the band *same* is stated within (`perfguard.decision.answer`): the
    profile's own, without the noise pad that widens `band` for a noisy baseline (a
    noisier baseline must not make sameness easier); `band` when not given.
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
    if baseline.median <= 0 or measured.median <= 0:
        return _judge_on_the_band_alone(metric, measured, baseline, band)
    c = Comparison.of(metric, measured, baseline, band, rule, session)
    verdict, reason = _outcome(c, improvement_threshold, speed)
    answer = _answer(c, verdict, same_band or band)
    return MetricVerdict(
        metric,
        verdict,
        measured,
        baseline,
        band,
        c.bound,
        c.ratio,
        reason,
        low=c.low,
        high=c.high,
        significant=c.significant,
        borderline=c.borderline(),
        clear=c.clear(),
        noise=c.noise,
        answer=answer,
    )


def _answer(c: Comparison, verdict: str, same_band: Band) -> Answer:
    """The figure's answer (`perfguard.decision.answer.assess`) under the regression
    rule of `c` and the margin of `same_band`. `c.noise.dof` already counts the session
    term as known (`stats.satterthwaite`)."""
    return answers.assess(
        c.ratio,
        c.noise.se,
        c.noise.dof,
        alpha=c.rule.alpha,
        threshold=c.bound / c.b,
        margin=same_band.bound(c.b) / c.b - 1.0,
        slower=verdict == REGRESSION,
        faster=verdict == IMPROVEMENT,
        enough=c.noise.processes_baseline < 2 or c.noise.processes_current >= SAME_PROCESSES,
    )


def _judge_on_the_band_alone(
    metric: str, measured: Summary, baseline: Summary, band: Band
) -> MetricVerdict:
    """No ratio to put an interval on (a figure rounded to 0): the band alone decides."""
    b, m = baseline.median, measured.median
    bound = band.bound(b)
    verdict = REGRESSION if m > bound else PASS
    reason = f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)}" if m > bound else ""
    ratio = m / b if b > 0 else None
    answer = answers.exact(verdict == REGRESSION)  # a figure of 0: the band is all there is
    return MetricVerdict(
        metric, verdict, measured, baseline, band, bound, ratio, reason, answer=answer
    )


def _outcome(c: Comparison, improvement_threshold: float, speed: float | None) -> tuple[str, str]:
    """The verdict on a comparison and its reason."""
    m, b, bound, metric = c.m, c.b, c.bound, c.metric
    over_bound = f"median {_fmt(m, metric)} > bound {_fmt(bound, metric)}"
    if c.over and c.significant and speed is not None and speed > 1 and m / speed <= bound:
        return CONTENDED, _contended_reason(c, over_bound, speed)
    if c.over and c.significant:
        return REGRESSION, f"{over_bound} ({_figures(c)}); {_evidence(c)}"
    if m < c.band.improvement_below(b, improvement_threshold):
        return IMPROVEMENT, (
            f"median {_fmt(m, metric)} is more than {improvement_threshold:.0%} and "
            f"{c.band.abs:g} {unit(metric)} below the baseline {_fmt(b, metric)}: "
            "the baseline is stale"
        )
    if c.over:
        return PASS, f"{over_bound} ({_figures(c)}) but within noise: {_evidence(c)}"
    return PASS, ""


def _contended_reason(c: Comparison, over_bound: str, speed: float) -> str:
    """The runner's slowness explains the excess as well as the code could: no verdict."""
    return (
        f"{over_bound} ({_figures(c)}), but the "
        f"runner's reference workload is {speed:.3f}x slower than at baseline time, "
        f"which would explain it ({_fmt(c.m / speed, c.metric)} divided by it): "
        "no verdict; measure on a quiet runner or with the relative check "
        "(perfguard compare --against REF)"
    )


def _figures(c: Comparison) -> str:
    return f"baseline {_fmt(c.b, c.metric)}, rel {c.band.rel:g}, abs {c.band.abs:g}"


def _evidence(c: Comparison) -> str:
    if c.noise.se > 0:
        return f"{(1 - c.rule.alpha) * 100:.4g}% lower bound {c.low:.3f}x from the {c.noise.source}"
    return "no spread known: the band alone decides"


# ---- one case ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseVerdict:
    """The verdicts on one case's metrics, and the case's own (its worst metric's).

    `sampling` is what the gate did to reach it (runs, processes, re-runs, whether it
    stopped early), when the case was run by `perfguard.decision.gate`.
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
        """The timed metrics over their bound (credible or not); not counters: a count is
        exact, measuring it again in a fresh process (the gate's confirmation) cannot help."""
        return [m.metric for m in self.metrics if m.over and not counters.is_counter(m.metric)]

    components: Mapping[str, Any] | None = None
    counters: Mapping[str, Any] | None = None
    arguments: Mapping[str, Any] | None = None
    observed: Mapping[str, Any] | None = None  # diffusers cases: step seam, frames
    baseline_components: Mapping[str, Any] | None = None

    @property
    def component_changes(self) -> list[str]:
        """How the measured components differ from those the baseline recorded: a
        changed pipeline directory makes the figures incomparable, whatever they say."""
        return component_changes(self.baseline_components, self.components)

    work: Mapping[str, Any] | None = None  # counters.WorkJudgement: context, notes, op changes
    output: Mapping[str, Any] | None = None  # counters.OutputVerdict: output equivalence

    @property
    def output_failed(self) -> bool:
        """The output changed and neither the case nor the command allowed it."""
        return self.output is not None and counters.OutputVerdict.from_json(self.output).failed

    @property
    def answer(self) -> str | None:
        """The case's answer (`perfguard.decision.answer`): slower when anything failed
        (a figure, a counter, the output), else can't tell when a figure can't, else
        same; None for a case that did not run or ran on a contended runner."""
        if self.verdict == REGRESSION or self.output_failed:
            return answers.SLOWER
        if self.verdict in (ERROR, CONTENDED):
            return None
        return answers.worst([m.answer.answer for m in self.metrics if m.answer is not None])

    @property
    def cant_tell(self) -> list[MetricVerdict]:
        """The timed figures the check could not tell apart from the baseline."""
        return [m for m in self.metrics if m.answer and m.answer.answer == answers.CANT_TELL]

    @property
    def clear(self) -> bool:
        """Every verdict is clear: more samples would not change any of them."""
        return self.verdict != ERROR and all(m.clear for m in self.metrics)

    def to_json(self) -> dict[str, Any]:
        out = {
            "verdict": self.verdict,
            "answer": self.answer,
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
        if self.arguments is not None:
            out["arguments"] = dict(self.arguments)
        if self.observed is not None:
            out["observed"] = dict(self.observed)
        if self.baseline_components is not None:
            out["baseline_components"] = {k: dict(v) for k, v in self.baseline_components.items()}
        if self.work is not None:
            out["work"] = dict(self.work)
        if self.output is not None:
            out["output"] = dict(self.output)
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
            arguments=data.get("arguments"),
            observed=data.get("observed"),
            baseline_components=data.get("baseline_components"),
            work=data.get("work"),
            output=data.get("output"),
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
    allow_output_change: bool = False,
    timing_gate: str = DEFAULT_TIMING_GATE,
) -> CaseVerdict:
    """Judge every metric of one case's result against its baseline scenario.

    The runs are screened first (`perfguard.decision.contention.screen`): runs that the
    reference workload saw contended are dropped, and a measurement that was mostly
    contended gets the case verdict `contended` instead of a judgement on the code.

    The band of each metric uses the case registry's `tolerance_overrides` (carried in
    the result's case definition) and then the baseline scenario's, which win: the
    baseline file is hardware-specific and reviewed next to the figures it loosens.
    Metrics in `ignore_missing` are not reported missing (a source that cannot measure
    them, such as sglang's performance.log for memory).

    Work counters and output are judged by `perfguard.decision.counters` (exact): a grown
    counter or a changed output not allowed fails the case whatever the timings say.
    `timing_gate` says which timed figures get all three answers
    (`perfguard.decision.resolution`).
    """
    common = _case_fields(result, scenario)
    if result.status != "ok":
        return CaseVerdict(case_id, ERROR, error=result.error or "case failed", **common)
    if scenario is None:
        return _without_a_baseline(case_id, result, common)
    overrides = [result.case.get("tolerance_overrides") or {}, scenario.tolerance_overrides]
    work, output = counters.judge_scenario(
        result, scenario, profile, overrides, allow_output_change
    )
    common["work"] = work.to_json() or None
    common["output"] = None if output is None else output.to_json()
    raw, scr = screened_runs(result, scenario, policy)
    result, scaled = scaled_runs(raw, scenario)
    runner = scr.to_json()
    speed = scr.speed
    if scaled:
        # The runner's speed is divided out run by run: nothing is left for it to excuse.
        speed, runner["timing"] = None, NORMALIZED
    base = scenario.metrics
    steps = gated_steps(scenario.step_count, step_fractions)
    judged = list(_metrics_to_judge(result.samples, base, steps, set(ignore_missing)))
    out, exponents = [], {}
    for metric in judged:
        samples, summary, exponent = (
            metric_pair(metric, raw, result, scenario)
            if scaled
            else (result.samples.get(metric), base.get(metric), None)
        )
        if exponent is not None:
            exponents[metric] = round(exponent, 3)
        own = profile.band(metric, overrides)
        band = profile.noise_band(own, summary)
        figure_rule = rule_of(metric, judged, rule)
        judged_metric = judge_metric(
            metric,
            samples,
            summary,
            band,
            improvement_threshold=improvement_threshold,
            rule=figure_rule,
            groups=result.groups,
            speed=speed,
            session=profile.session(metric),
            same_band=own,
        )
        stored = base.get(metric)
        stored_band = band if stored is summary else profile.noise_band(own, stored)
        out.append(
            _at_resolution(
                judged_metric,
                stored,
                stored_band,
                figure_rule,
                profile.session(metric),
                timing_gate,
            )
        )
    if exponents:
        runner["reference_exponents"] = exponents
    out.extend(_exact(c) for c in work.metrics)
    kinds = [m.verdict for m in out] + ([REGRESSION] if output and output.failed else [])
    verdict = CaseVerdict(case_id, worst(kinds), tuple(out), runner=runner, **common)
    return contended(verdict, scr.reason) if scr.contended else verdict


def _at_resolution(
    m: MetricVerdict,
    stored: Summary | None,
    band: Band,
    rule: Rule,
    session: float,
    timing_gate: str,
) -> MetricVerdict:
    """`m` with its answer below resolution where `timing_gate` does not judge it in full
    on this baseline's runner (`perfguard.decision.resolution`): slower stays slower.
    The resolution is the stored figure's (`stored`, under its own `band`), as
    gen-baselines recorded it, not the figure rescaled to this check's runner speed."""
    a = m.answer
    if a is None or stored is None or m.metric_class not in RESOLVED_CLASSES:
        return m
    if timing_gate == GATE:
        return m
    res = resolution(stored, band, alpha=rule.alpha, session=session)
    if judged_in_full(timing_gate, res, a.margin):
        return m
    return dataclasses.replace(m, answer=answers.below_resolution(a, res))


def _settle(case: CaseVerdict, timing_gate: str) -> CaseVerdict:
    """`case` at its last look: a figure it still can't tell because the check never
    reached the precision *same* needs is below the resolution it did reach
    (`perfguard.decision.resolution.settled`); one it measured precisely stays can't tell."""
    metrics = []
    for m in case.metrics:
        a = m.answer
        if (
            a is not None
            and a.answer == answers.CANT_TELL
            and m.metric_class in RESOLVED_CLASSES
            and not settled(timing_gate, a.detectable, a.margin)
        ):
            m = dataclasses.replace(m, answer=answers.below_resolution(a, a.detectable))
        metrics.append(m)
    return dataclasses.replace(case, metrics=tuple(metrics))


def _exact(counter: counters.CounterVerdict) -> MetricVerdict:
    """A work counter's verdict, with its exact answer."""
    return MetricVerdict(**vars(counter), answer=answers.exact(counter.verdict == REGRESSION))


def rule_of(metric: str, judged: Sequence[str], rule: Rule) -> Rule:
    """The rule `metric` is judged by among a case's `judged` metrics: the per-step
    metrics are one family and share `rule.alpha` (Bonferroni, each at alpha / m of the
    m steps judged), the others take it whole: twenty steps at 1 % each would be twenty
    chances for noise to fail a case (docs/relative.md)."""
    if metric_class(metric) != "denoise_step":
        return rule
    m = sum(1 for name in judged if metric_class(name) == "denoise_step")
    return dataclasses.replace(rule, alpha=rule.alpha / m) if m > 1 else rule


def _case_fields(result: CaseResult, scenario: Scenario | None) -> dict[str, Any]:
    """What a case verdict carries from the run and its baseline scenario, whatever the
    verdict."""
    return {
        "output_hash": result.output_hash,
        "deterministic": result.deterministic,
        "baseline_output_hash": scenario.output_hash if scenario else None,
        "notes": scenario.check_notes if scenario else None,
        "components": result.components,
        "counters": result.counters,
        "arguments": result.arguments,
        "observed": result.observed,
        "baseline_components": scenario.components if scenario else None,
    }


def _without_a_baseline(case_id: str, result: CaseResult, common: dict[str, Any]) -> CaseVerdict:
    """A case the baseline has no scenario for: every metric `missing-baseline`."""
    metrics = tuple(
        MetricVerdict(
            m,
            MISSING_BASELINE,
            measured=summarize(result.samples[m], groups=result.groups),
            reason="no scenario",
        )
        for m in sorted(result.samples, key=metric_sort_key)
    )
    return CaseVerdict(case_id, MISSING_BASELINE, metrics, **common)


def _metrics_to_judge(
    samples: Mapping[str, Any], base: Mapping[str, Any], steps: set[int] | None, ignored: set[str]
) -> list[str]:
    """The run's and the baseline's metrics, in report order, less the steps not gated
    (`steps`; None: all) and the missing metrics in `ignored`."""
    return [
        metric
        for metric in sorted(set(samples) | set(base), key=metric_sort_key)
        if not (steps is not None and metric.startswith("step:") and int(metric[5:]) not in steps)
        and not (metric not in samples and metric in ignored)
    ]


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
    def answer(self) -> str | None:
        """The check's answer: its worst case's (None when no case has one)."""
        return answers.worst([c.answer for c in self.cases if c.answer is not None])

    @property
    def verdict(self) -> str:
        return overall(self.cases, self.fail_on_missing, self.advisory)[0]

    @property
    def exit_code(self) -> int:
        return overall(self.cases, self.fail_on_missing, self.advisory)[1]


def overall(
    cases: Iterable[CaseVerdict], fail_on_missing: bool = False, advisory: bool = False
) -> tuple[str, int]:
    """The run's verdict and exit code: fail (1) > error (3) > contended, can't tell
    (4) > pass (0).

    A regression (a *slower* answer) fails the run (exit 1) unless advisory; with
    `fail_on_missing` so do metrics or cases missing from the baseline and stages
    missing from the run. Else a case that failed to run makes it exit 3; else a case
    measured on a runner that stayed contended, or a timed figure the check could not
    tell from its baseline (*can't tell*), makes it exit 4: no verdict on the code (the
    report says what would resolve it); advisory checks report it with exit 0. Else 0:
    every figure *same* (or faster). Improvements never fail.
    """
    cases = list(cases)
    bad = {REGRESSION, *MISSING} if fail_on_missing else {REGRESSION}
    failing = any(m.verdict in bad for c in cases for m in c.metrics)
    failing = failing or any(c.output_failed for c in cases)
    if fail_on_missing and any(c.verdict == MISSING_BASELINE for c in cases):
        failing = True
    if failing and not advisory:
        return OVERALL_FAIL, EXIT_REGRESSION
    if any(c.verdict == ERROR for c in cases):
        return OVERALL_ERROR, EXIT_CASE_FAILED
    if any(c.verdict == CONTENDED for c in cases):
        return OVERALL_CONTENDED, EXIT_CONTENDED
    if not advisory and any(c.answer == answers.CANT_TELL for c in cases):
        return OVERALL_CANT_TELL, EXIT_CONTENDED
    return OVERALL_PASS, EXIT_OK


def contended(case: CaseVerdict, why: str) -> CaseVerdict:
    """`case` re-labelled `contended`: its regressions say the runner was slow, not the code.

    The metric verdicts are kept for the reader, except that a regression becomes
    `contended` with `why` in its reason: a slowdown measured on a machine that was
    itself much slower than at baseline time says nothing about the change.
    """
    metrics = tuple(
        dataclasses.replace(m, verdict=CONTENDED, reason=f"{why}; {m.reason}")
        if m.verdict == REGRESSION and not counters.is_counter(m.metric)
        else m
        for m in case.metrics
    )
    # A count or an output does not depend on how busy the runner was: they still fail.
    exact = any(m.verdict == REGRESSION and counters.is_counter(m.metric) for m in metrics)
    verdict = REGRESSION if exact or case.output_failed else CONTENDED
    return dataclasses.replace(case, verdict=verdict, metrics=metrics, error=why)


def judge_against(
    baseline: Baseline,
    profile: Profile,
    case_id: str,
    result: CaseResult,
    *,
    ignore_missing: Iterable[str] = (),
    rule: Rule = DEFAULT_RULE,
    policy: ContentionPolicy = DEFAULT_POLICY,
    allow_output_change: bool = False,
    timing_gate: str = DEFAULT_TIMING_GATE,
) -> CaseVerdict:
    """`judge_case` with the case's scenario, improvement threshold and step fractions
    taken from `baseline`: what `judge` does per case, and the gate after each look."""
    return judge_case(
        case_id,
        result,
        baseline.scenarios.get(case_id),
        profile,
        improvement_threshold=baseline.improvement_threshold,
        step_fractions=baseline.step_fractions,
        ignore_missing=ignore_missing,
        rule=rule,
        policy=policy,
        allow_output_change=allow_output_change,
        timing_gate=timing_gate,
    )


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
    allow_output_change: bool = False,
    timing_gate: str = DEFAULT_TIMING_GATE,
) -> Judgement:
    """Judge every case of `results` against `baseline` under its profile `profile_name`.

    The run is advisory when `advisory` is passed, when the profile says so, or when the
    baseline's metadata marks its platform advisory. This is the last look of a check:
    a figure it could not resolve is settled below resolution (`_settle`).
    """
    profile = baseline.profile(profile_name)
    ignored = tuple(ignore_missing)
    cases = tuple(
        judge_against(
            baseline,
            profile,
            cid,
            res,
            ignore_missing=ignored,
            rule=rule,
            policy=policy,
            allow_output_change=allow_output_change,
            timing_gate=timing_gate,
        )
        for cid, res in sorted(results.cases.items())
    )
    cases = tuple(_settle(case, timing_gate) for case in cases)
    advisory = advisory or profile.advisory or bool(baseline.metadata.get("advisory", False))
    return Judgement(profile_name, cases, fail_on_missing, advisory)


__all__ = [
    "CONTENDED", "DEFAULT_RULE", "SEVERITY", "CaseVerdict", "Judgement", "MetricVerdict",
    "Rule", "contended", "gated_steps", "judge", "judge_case", "judge_metric", "overall",
    "worst",
]  # fmt: skip
