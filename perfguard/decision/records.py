"""What a verdict says, as data: the verdict names, one metric's verdict and one case's,
with their JSON (`perfguard.decision.verdict` decides them; reports read them back)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from perfguard.decision import answer as answers
from perfguard.decision.answer import Answer
from perfguard.decision.estimate import PairedEstimate
from perfguard.decision.output import OutputVerdict
from perfguard.decision.stats import Noise, Summary
from perfguard.decision.tolerances import Band
from perfguard.decision.work_counts import is_exact
from perfguard.metrics import metric_class, metric_sort_key, unit
from perfguard.results import component_changes

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
class CounterVerdict:
    """The verdict on one counter (`perfguard.decision.counters`): the first fields of
    `MetricVerdict`, which extends it (a counter's verdict becomes one)."""

    metric: str
    verdict: str
    measured: Summary | None = None
    baseline: Summary | None = None
    band: Band | None = None
    bound: float | None = None
    ratio: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class MetricVerdict(CounterVerdict):
    """The verdict on one metric of one case, with everything a reader needs to check it.

    Its first fields are a counter's verdict (`CounterVerdict`). `low` / `high`
    bound median/baseline at the rule's confidence (one-sided each); `significant`:
    `low` > 1; `borderline`: the next process could flip it (reported); `clear`: more
    runs of this process would not change it (`comparison.median_reach`); `noise`: where the
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
        if is_exact(self.metric) and self.measured and self.baseline:
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
        return [m.metric for m in self.metrics if m.over and not is_exact(m.metric)]

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
    output: Mapping[str, Any] | None = None  # output.OutputVerdict: output equivalence

    @property
    def output_failed(self) -> bool:
        """The output changed and neither the case nor the command allowed it."""
        return self.output is not None and OutputVerdict.from_json(self.output).failed

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
        for name, copy in _SECTIONS:
            value = getattr(self, name)
            if value is not None:
                out[name] = copy(value)
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


def _copy_each(value: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: dict(v) for k, v in value.items()}


def _listed(value: Mapping[str, Any]) -> dict[str, list[Any]]:
    return {k: list(v) for k, v in value.items()}


_SECTIONS: tuple[tuple[str, Callable[[Mapping[str, Any]], dict[str, Any]]], ...] = (
    ("sampling", dict),
    ("runner", dict),
    ("components", _copy_each),
    ("counters", _listed),
    ("arguments", dict),
    ("observed", dict),
    ("baseline_components", _copy_each),
    ("work", dict),
    ("output", dict),
)
"""The sections of a case's verdict written only when present, in this order, as copies."""


def worst(verdicts: Iterable[str]) -> str:
    """The most severe of `verdicts` (PASS when there are none)."""
    ranks = [SEVERITY.index(v) for v in verdicts]
    return SEVERITY[min(ranks)] if ranks else PASS
