"""The decision on one metric and one case: slower, same or can't tell.

The per-metric verdict and its answer (`perfguard.decision.answer`), which verdicts are
over their bound (the gate confirms the case) or already clear (it stops sampling), and
the per-case verdict; the check's overall verdict and exit code put the cases together
(`perfguard.decision.judgement`). The rule as a card of numbered lines, with every
constant: `perfguard.decision` (README.md, "The rule").

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
from perfguard.decision.answer import SAME_PROCESSES, Answer, Criteria
from perfguard.decision.comparison import DEFAULT_RULE, Comparison, Rule
from perfguard.decision.contention import ContentionPolicy, Screen
from perfguard.decision.judgement import Judgement, contended
from perfguard.decision.normalize import metric_pair, scaled_runs, screened_runs
from perfguard.decision.options import JudgeOptions, Judging
from perfguard.decision.records import (
    CONTENDED,
    ERROR,
    IMPROVEMENT,
    MISSING_BASELINE,
    MISSING_STAGE,
    NEW_STAGE,
    PASS,
    REGRESSION,
    CaseVerdict,
    CounterVerdict,
    MetricVerdict,
    _fmt,
    worst,
)
from perfguard.decision.resolution import (
    GATE,
    judged_in_full,
    resolution,
)
from perfguard.decision.stats import (
    Summary,
    summarize,
)
from perfguard.decision.tolerances import (
    DEFAULT_IMPROVEMENT_THRESHOLD,
    DEFAULT_PROFILE,
    Band,
    Profile,
    shared_server,
)
from perfguard.metrics import NORMALIZED, TIMED_CLASSES, metric_sort_key, unit
from perfguard.results import CaseResult

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.results import Results
    from perfguard.storage.baseline import Baseline, Scenario


@dataclass(frozen=True)
class Figure:
    """One metric of a case as measured: its `samples` (None or empty: not produced), the
    processes they came from (`groups`: consecutive samples per process or re-run, so
    that their medians' spread enters the noise), and its `baseline` summary (None: not
    in the baseline)."""

    metric: str
    samples: Sequence[float] | None
    baseline: Summary | None
    groups: Sequence[int] | None = None


@dataclass(frozen=True)
class Standard:
    """What one figure is held to: its `band` (the profile's, its pad raised for a noisy
    baseline), the band *same* is stated within (`same_band`: the profile's own, without
    that pad: a noisier baseline must not make sameness easier), the evidence `rule`,
    the offset one session of the runner leaves on it (`session_sd`, `Profile.session_sd_of`:
    counted once for the baseline's session and once for this one's), and the
    baseline's `improvement_threshold`."""

    band: Band
    same_band: Band
    rule: Rule = DEFAULT_RULE
    session_sd: float = 0.0
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD


def judge_metric(
    metric: str,
    samples: Sequence[float] | None,
    baseline: Summary | None,
    band: Band,
    *,
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD,
    rule: Rule = DEFAULT_RULE,
    groups: Sequence[int] | None = None,
    session_sd: float = 0.0,
) -> MetricVerdict:
    """`judge_figure` on `samples` against `baseline` under `band` (*same* stated within
    it too) and `rule`: the keyword form of one metric's verdict."""
    standard = Standard(band, band, rule, session_sd, improvement_threshold)
    return judge_figure(Figure(metric, samples, baseline, groups), standard)


def judge_figure(figure: Figure, standard: Standard, speed: float | None = None) -> MetricVerdict:
    """Compare the median of `figure`'s samples with its baseline's under `standard`.

    Samples missing mean the run did not produce the metric (`missing-stage`); no
    baseline means the baseline does not have it (`new-stage`). Otherwise:

    - regression: the median is above `band.bound(b)` and the slowdown is credible (the
      rule's lower confidence bound on median/b is above 1);
    - improvement: the median is below `band.improvement_below(b, t)` (the baseline is
      stale: never a failure);
    - pass: anything else, including a median above the bound that noise explains.

    `speed` is the runner's reference workload now over at baseline time
    (`perfguard.decision.contention`): when the runner is slower as a whole (speed > 1)
    and the median divided by it would be within the bound, the metric is `contended`
    (no verdict, exit 4): the reference tracks the pipelines' speed on average but
    predicts one measurement's only to 11-18 %, several times the minimum effect, so
    dividing by it would excuse real slowdowns (docs/noise.md). A faster runner adjusts
    nothing.
    """
    metric, baseline, band = figure.metric, figure.baseline, standard.band
    if not figure.samples:
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
    measured = summarize(figure.samples, groups=figure.groups)
    if baseline is None:
        return MetricVerdict(metric, NEW_STAGE, measured=measured, reason="not in the baseline")
    if baseline.median <= 0 or measured.median <= 0:
        return _judge_on_the_band_alone(metric, measured, baseline, band)
    c = Comparison.of(metric, measured, baseline, band, standard.rule, standard.session_sd)
    verdict, reason = _outcome(c, standard.improvement_threshold, speed)
    return _compared(c, verdict, reason, _answer(c, verdict, standard.same_band))


def _compared(c: Comparison, verdict: str, reason: str, answer: Answer) -> MetricVerdict:
    """The verdict on a figure compared with its baseline, with the comparison's figures."""
    return MetricVerdict(
        c.metric,
        verdict,
        c.measured,
        c.baseline,
        c.band,
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
    criteria = Criteria(c.rule.alpha, c.bound / c.b, same_band.bound(c.b) / c.b - 1.0)
    return answers.assess(
        c.ratio,
        c.noise.se,
        c.noise.dof,
        criteria,
        slower=verdict == REGRESSION,
        faster=verdict == IMPROVEMENT,
        enough_processes=c.noise.processes_baseline < 2
        or c.noise.processes_current >= SAME_PROCESSES,
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


DEFAULT_JUDGING = JudgeOptions()
"""A check's judging with every default (`perfguard.decision.options`)."""


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
    judging: JudgeOptions = DEFAULT_JUDGING,
    improvement_threshold: float = DEFAULT_IMPROVEMENT_THRESHOLD,
    step_fractions: Sequence[float] | None = None,
    ignore_missing: Iterable[str] = (),
) -> CaseVerdict:
    """`judge_scenario` under `judging` with `profile`, the improvement threshold and the
    gated steps' fractions given: the keyword form of one case's verdict."""
    resolved = Judging(judging, profile, improvement_threshold, step_fractions)
    return judge_scenario(resolved, case_id, result, scenario, ignore_missing)


def judge_scenario(
    judging: Judging,
    case_id: str,
    result: CaseResult,
    scenario: Scenario | None,
    ignore_missing: Iterable[str] = (),
) -> CaseVerdict:
    """Judge every metric of one case's result against its baseline scenario under
    `judging` (its rule, contention policy, output allowance and timing gate, and the
    profile they resolved to).

    The runs are screened first (`contention.screen`): contended runs are dropped, and a
    measurement mostly contended gets `contended` instead of a judgement on the code. A
    metric's band takes the case registry's `tolerance_overrides`, then the scenario's
    (the reviewed, hardware-specific file wins). Metrics in `ignore_missing` are not
    reported missing (sglang's performance.log has no memory). Work counters and output
    are exact (`counters`): a grown counter or a changed output not allowed fails the
    case whatever the timings say.
    """
    common = _case_fields(result, scenario)
    if result.status != "ok":
        return CaseVerdict(case_id, ERROR, error=result.error or "case failed", **common)
    if scenario is None:
        return _without_a_baseline(case_id, result, common)
    overrides = [result.case.get("tolerance_overrides") or {}, scenario.tolerance_overrides]
    allowed = judging.options.allow_output_change
    work, output = counters.judge_scenario(result, scenario, judging.profile, overrides, allowed)
    common |= {"work": work.to_json() or None, "output": output and output.to_json()}
    runs = Runs.of(result, scenario, judging.options.policy)
    steps = gated_steps(scenario.step_count, judging.step_fractions)
    judged = _metrics_to_judge(runs.result.samples, scenario.metrics, steps, set(ignore_missing))
    out, exponents = _judge_timed(judging, runs, scenario, judged, overrides)
    out.extend(_exact(c) for c in work.metrics)
    server = (runs.result.observed or {}).get("server")
    out.extend(_exact(c) for c in counters.judge_failures(server, scenario.server))
    kinds = [m.verdict for m in out] + ([REGRESSION] if output and output.failed else [])
    verdict = CaseVerdict(
        case_id, worst(kinds), tuple(out), runner=runs.runner(exponents), **common
    )
    return contended(verdict, runs.screen.reason) if runs.screen.contended else verdict


@dataclass(frozen=True)
class Runs:
    """A case's runs as its timings are judged: `raw`, the runs the contention screen
    kept (`screen` says which it dropped and how fast the runner was), and `result`,
    those runs scaled by the reference beside each where the baseline is normalized
    (`scaled`)."""

    raw: CaseResult
    result: CaseResult
    scaled: bool
    screen: Screen

    @classmethod
    def of(cls, result: CaseResult, scenario: Scenario, policy: ContentionPolicy) -> Runs:
        raw, screen = screened_runs(result, scenario, policy)
        scaled, is_scaled = scaled_runs(raw, scenario)
        return cls(raw, scaled, is_scaled, screen)

    @property
    def speed(self) -> float | None:
        """The runner's speed the verdict may excuse a slowdown by: none once it is
        divided out run by run."""
        return None if self.scaled else self.screen.speed

    def figure(self, metric: str, scenario: Scenario) -> tuple[Figure, float | None]:
        """`metric`'s figure and, where one was fitted, the reference's exponent."""
        samples, summary, exponent = (
            metric_pair(metric, self.raw, self.result, scenario)
            if self.scaled
            else (self.result.samples.get(metric), scenario.metrics.get(metric), None)
        )
        return Figure(metric, samples, summary, self.result.groups), exponent

    def runner(self, exponents: Mapping[str, float]) -> dict[str, Any]:
        """What the case verdict records of the runner: the screen, the timing, the
        reference's fitted exponents."""
        runner = self.screen.to_json()
        if self.scaled:
            runner["timing"] = NORMALIZED
        if exponents:
            runner["reference_exponents"] = dict(exponents)
        return runner


def _judge_timed(
    judging: Judging,
    runs: Runs,
    scenario: Scenario,
    judged: Sequence[str],
    overrides: Sequence[Any],
) -> tuple[list[MetricVerdict], dict[str, float]]:
    """The verdict on each of the `judged` metrics, and the reference's exponent fitted
    for each that has one."""
    shared = shared_server(runs.result.case)
    out, exponents = [], {}
    for metric in judged:
        figure, exponent = runs.figure(metric, scenario)
        if exponent is not None:
            exponents[metric] = round(exponent, 3)
        own = judging.profile.band(metric, overrides)
        standard = Standard(
            judging.profile.noise_band(own, figure.baseline),
            own,
            rule_of(metric, judged, judging.options.rule),
            judging.profile.session_sd_of(metric, shared_server=shared),
            judging.improvement_threshold,
        )
        verdict = judge_figure(figure, standard, runs.speed)
        out.append(_at_resolution(verdict, scenario.metrics.get(metric), judging, standard))
    return out, exponents


def _at_resolution(
    m: MetricVerdict, stored: Summary | None, judging: Judging, standard: Standard
) -> MetricVerdict:
    """`m` with its answer below resolution where the timing gate does not judge it in
    full on this baseline's runner (`perfguard.decision.resolution`): slower stays
    slower. The resolution is the stored figure's (`stored`, under the band *same* is
    stated within, padded for it), as gen-baselines recorded it, not the figure rescaled
    to this check's runner speed."""
    a = m.answer
    gate = judging.options.timing_gate
    if a is None or stored is None or m.metric_class not in TIMED_CLASSES or gate == GATE:
        return m
    res = resolution(
        stored,
        judging.profile.noise_band(standard.same_band, stored),
        alpha=standard.rule.alpha,
        session_sd=standard.session_sd,
        processes=1 + judging.options.max_reruns,
    )
    if judged_in_full(gate, res, a.margin):
        return m
    return dataclasses.replace(m, answer=answers.below_resolution(a, res))


def _exact(counter: CounterVerdict) -> MetricVerdict:
    """A work counter's verdict, with its exact answer."""
    return MetricVerdict(**vars(counter), answer=answers.exact(counter.verdict == REGRESSION))


def rule_of(metric: str, judged: Sequence[str], rule: Rule) -> Rule:
    """The rule `metric` is judged by among a case's `judged` metrics: the per-step
    metrics share `rule.alpha` (`answer.step_level`), the others take it whole."""
    level = answers.step_level(metric, rule.alpha, answers.step_count(judged))
    return rule if level == rule.alpha else dataclasses.replace(rule, alpha=level)


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


def judge_with(
    judging: JudgeOptions | Judging,
    results: Results,
    baseline: Baseline,
    ignore_missing: Iterable[str] = (),
) -> Judgement:
    """Judge every case of `results` against `baseline` under `judging`, passed whole:
    the options, or the options already resolved against this baseline (`Judging`, as
    `JudgeOptions.against` gives it; a check resolves them once and passes that on).

    The run is advisory when `judging.advisory` says so, when the profile does, or when
    the baseline's metadata marks its platform advisory.
    """
    resolved = judging if isinstance(judging, Judging) else judging.against(baseline)
    options, ignored = resolved.options, tuple(ignore_missing)
    cases = tuple(
        judge_scenario(resolved, cid, res, baseline.scenarios.get(cid), ignored)
        for cid, res in sorted(results.cases.items())
    )
    profile = resolved.profile
    advisory = options.advisory or profile.advisory or bool(baseline.metadata.get("advisory"))
    return Judgement(options.profile, cases, options.fail_on_missing, advisory)


def judge(
    results: Results,
    baseline: Baseline,
    profile_name: str = DEFAULT_PROFILE,
    *,
    ignore_missing: Iterable[str] = (),
    **judging: Any,
) -> Judgement:
    """`judge_with` under the options `JudgeOptions(profile=profile_name, **judging)`
    (`fail_on_missing`, `advisory`, `rule`, `policy`, `allow_output_change`,
    `timing_gate`): the keyword form of a check's judgement."""
    options = JudgeOptions(profile=profile_name, **judging)
    return judge_with(options, results, baseline, ignore_missing)
