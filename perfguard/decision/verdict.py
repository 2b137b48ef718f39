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
from perfguard.decision.normalize import (
    NORMALIZED,
    metric_pair,
    scaled_runs,
    screened_runs,
)
from perfguard.decision.options import JudgeOptions
from perfguard.decision.records import (
    CONTENDED,
    ERROR,
    IMPROVEMENT,
    MISSING,
    MISSING_BASELINE,
    MISSING_STAGE,
    NEW_STAGE,
    OVERALL_CANT_TELL,
    OVERALL_CONTENDED,
    OVERALL_ERROR,
    OVERALL_FAIL,
    OVERALL_PASS,
    PASS,
    REGRESSION,
    SEVERITY,
    CaseVerdict,
    MetricVerdict,
    _fmt,
    worst,
)
from perfguard.decision.resolution import (
    GATE,
    RESOLVED_CLASSES,
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
)
from perfguard.errors import (
    EXIT_CASE_FAILED,
    EXIT_CONTENDED,
    EXIT_OK,
    EXIT_REGRESSION,
)
from perfguard.metrics import metric_class, metric_sort_key, unit
from perfguard.results import CaseResult

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.results import Results
    from perfguard.storage.baseline import Baseline, Scenario


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
    """Judge every metric of one case's result against its baseline scenario under
    `judging` (its rule, contention policy, output allowance and timing gate).

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
    allowed = judging.allow_output_change
    work, output = counters.judge_scenario(result, scenario, profile, overrides, allowed)
    common |= {"work": work.to_json() or None, "output": output and output.to_json()}
    raw, scr = screened_runs(result, scenario, judging.policy)
    result, scaled = scaled_runs(raw, scenario)
    runner = scr.to_json()
    speed = scr.speed
    if scaled:
        # The runner's speed is divided out run by run: nothing is left for it to excuse.
        speed, runner["timing"] = None, NORMALIZED
    base = scenario.metrics
    steps = gated_steps(scenario.step_count, step_fractions)
    judged = list(_metrics_to_judge(result.samples, base, steps, set(ignore_missing)))
    # A server case at a url: its rounds shared one server, whose offset no round shows.
    shared = result.case.get("workload") == "server" and bool(result.case.get("url"))
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
        figure_rule = rule_of(metric, judged, judging.rule)
        judged_metric = judge_metric(
            metric,
            samples,
            summary,
            band,
            improvement_threshold=improvement_threshold,
            rule=figure_rule,
            groups=result.groups,
            speed=speed,
            session=profile.session(metric, shared_server=shared),
            same_band=own,
        )
        stored = base.get(metric)
        out.append(
            _at_resolution(judged_metric, stored, profile, own, figure_rule, judging, shared)
        )
    if exponents:
        runner["reference_exponents"] = exponents
    out.extend(_exact(c) for c in work.metrics)
    server = (result.observed or {}).get("server")
    out.extend(_exact(c) for c in counters.judge_failures(server, scenario.server))
    kinds = [m.verdict for m in out] + ([REGRESSION] if output and output.failed else [])
    verdict = CaseVerdict(case_id, worst(kinds), tuple(out), runner=runner, **common)
    return contended(verdict, scr.reason) if scr.contended else verdict


def _at_resolution(
    m: MetricVerdict,
    stored: Summary | None,
    profile: Profile,
    own: Band,
    rule: Rule,
    judging: JudgeOptions,
    shared_server: bool = False,
) -> MetricVerdict:
    """`m` with its answer below resolution where `judging.timing_gate` does not judge it
    in full on this baseline's runner (`perfguard.decision.resolution`): slower stays
    slower. The resolution is the stored figure's (`stored`, under the band `own` padded
    for it), as gen-baselines recorded it, not the figure rescaled to this check's runner
    speed."""
    a = m.answer
    gate = judging.timing_gate
    if a is None or stored is None or m.metric_class not in RESOLVED_CLASSES or gate == GATE:
        return m
    band = profile.noise_band(own, stored)
    res = resolution(
        stored,
        band,
        alpha=rule.alpha,
        session=profile.session(m.metric, shared_server=shared_server),
        processes=1 + judging.max_reruns,
    )
    if judged_in_full(gate, res, a.margin):
        return m
    return dataclasses.replace(m, answer=answers.below_resolution(a, res))


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
        if m.verdict == REGRESSION and not counters.is_exact(m.metric)
        else m
        for m in case.metrics
    )
    # A count or an output does not depend on how busy the runner was: they still fail.
    exact = any(m.verdict == REGRESSION and counters.is_exact(m.metric) for m in metrics)
    verdict = REGRESSION if exact or case.output_failed else CONTENDED
    return dataclasses.replace(case, verdict=verdict, metrics=metrics, error=why)


def judge_against(
    baseline: Baseline,
    profile: Profile,
    case_id: str,
    result: CaseResult,
    *,
    judging: JudgeOptions = DEFAULT_JUDGING,
    ignore_missing: Iterable[str] = (),
) -> CaseVerdict:
    """`judge_case` with the case's scenario, improvement threshold and step fractions
    taken from `baseline`: what `judge` does per case, and the gate after each look."""
    return judge_case(
        case_id,
        result,
        baseline.scenarios.get(case_id),
        profile,
        judging=judging,
        improvement_threshold=baseline.improvement_threshold,
        step_fractions=baseline.step_fractions,
        ignore_missing=ignore_missing,
    )


def judge_with(
    judging: JudgeOptions,
    results: Results,
    baseline: Baseline,
    ignore_missing: Iterable[str] = (),
) -> Judgement:
    """Judge every case of `results` against `baseline` under `judging`, passed whole.

    The run is advisory when `judging.advisory` says so, when the profile does, or when
    the baseline's metadata marks its platform advisory.
    """
    profile = baseline.profile(judging.profile)
    ignored = tuple(ignore_missing)
    cases = tuple(
        judge_against(baseline, profile, cid, res, judging=judging, ignore_missing=ignored)
        for cid, res in sorted(results.cases.items())
    )
    advisory = judging.advisory or profile.advisory or bool(baseline.metadata.get("advisory"))
    return Judgement(judging.profile, cases, judging.fail_on_missing, advisory)


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


__all__ = [
    "CONTENDED",
    "DEFAULT_RULE",
    "SEVERITY",
    "CaseVerdict",
    "JudgeOptions",
    "Judgement",
    "MetricVerdict",
    "Rule",
    "contended",
    "gated_steps",
    "judge",
    "judge_case",
    "judge_metric",
    "judge_with",
    "overall",
    "worst",
]  # fmt: skip
