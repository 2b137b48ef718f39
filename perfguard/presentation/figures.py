"""How one figure of a report reads: values with units, ratios, intervals, answers.

The console table, the PR Markdown and the baseline diff format a figure the same way,
so a number reads alike wherever a reader meets it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from perfguard.decision.answer import UNRESOLVED
from perfguard.decision.estimate import UNKNOWN
from perfguard.decision.records import PASS, REGRESSION, MetricVerdict
from perfguard.metrics import unit


def fmt_value(value: float | None, metric: str) -> str:
    if value is None:
        return "-"
    return f"{value:.3f} {unit(metric)}" if value < 100 else f"{value:.1f} {unit(metric)}"


def fmt_count(n: int | None) -> str:
    """A parameter count the way model cards give it: 88.8K, 20.4B."""
    if n is None:
        return "?"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


def components_line(components: Mapping[str, Any]) -> str:
    """`role Class (params), ...`: what the case measured, in one line.

    A part without parameters (a tokenizer, a scheduler: 0) shows its class alone, and
    `(?)` means a count not known (a diffusers case listed before it ran).
    """

    def count(c: Mapping[str, Any]) -> str:
        n = c.get("parameters")
        return "" if n == 0 else f" ({fmt_count(n)})"

    return ", ".join(
        f"{role} {str(c.get('class', '?')).rsplit('.', 1)[-1]}{count(c)}"
        for role, c in sorted(components.items())
    )


def arguments_line(arguments: Mapping[str, Any]) -> str:
    """`name=value, ...`: what a diffusers pipeline's `__call__` was given."""
    return ", ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in sorted(arguments.items())
    )


def counters_line(counters: Mapping[str, Sequence[int]]) -> str:
    """`name value` per counter; `min-max` when the runs disagree."""
    parts = []
    for name, values in sorted(counters.items()):
        lo, hi = (min(values), max(values)) if values else (0, 0)
        parts.append(f"{name} {lo}" if lo == hi else f"{name} {lo}-{hi}")
    return ", ".join(parts)


def fmt_ratio(ratio: float | None) -> str:
    """A ratio with three significant digits in its change from 1 (1.032x, 0.951x).

    The rule compares ratios near 1 with 1 and with 1 + a 3 % minimum effect: at two
    decimals a +3.2 % e2e read 1.03x, and an interval whose lower end was 1.004 (credible)
    read 1.00, as if it were not. Ratios of 10 and over keep three significant digits.
    """
    return "-" if ratio is None else f"{_ratio_digits(ratio)}x"


def _ratio_digits(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 10 else f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


_fmt_bound = _ratio_digits


def fmt_evidence(m: MetricVerdict) -> str:
    """The ratio with the rule's confidence interval, when the verdict has one.

    Shown only where the band was exceeded or the verdict was borderline: that is where
    a reader asks "is this noise?", and elsewhere the interval is clutter.
    """
    text = fmt_ratio(m.ratio)
    # A median above its bound is a regression or, when noise explains it, borderline.
    if m.low is not None and m.high is not None and (m.verdict == REGRESSION or m.borderline):
        text += f" ({_fmt_bound(m.low)}-{_fmt_bound(m.high)})"
    elif (
        m.paired is not None
        and m.low is not None
        and m.high is not None
        and (m.verdict != PASS or m.paired.decision == UNKNOWN)
    ):
        # A relative check: the interval is what decided, whichever way it went.
        text += f" ({_fmt_bound(m.low)}-{_fmt_bound(m.high)})"
    return text


def fmt_answer(m: MetricVerdict) -> str:
    """`same`, `slower`, `can't tell` with the slowdown the check could catch: `(>= +8%)`."""
    if m.answer is None:
        return "-"
    if m.answer.resolution is not None and m.answer.answer == UNRESOLVED:
        return f"{m.answer.label} (resolves +{m.answer.resolution:.0%})"
    if m.answer.detectable is None:
        return m.answer.label
    return f"{m.answer.label} (catches +{m.answer.detectable:.0%})"
