"""A check's judgement: every case's verdict, the check's answer and its exit code.

The verdict on one metric and one case is `perfguard.decision.verdict`'s; this module
puts the cases together: the worst case decides (slower over a case that failed to run
over can't tell over same), and a case measured on a contended runner is relabelled
(`contended`). Exit codes: `perfguard.errors`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from perfguard.decision import answer as answers
from perfguard.decision.records import (
    CONTENDED,
    ERROR,
    MISSING,
    MISSING_BASELINE,
    OVERALL_CANT_TELL,
    OVERALL_CONTENDED,
    OVERALL_ERROR,
    OVERALL_FAIL,
    OVERALL_PASS,
    REGRESSION,
    SEVERITY,
    CaseVerdict,
)
from perfguard.decision.work_counts import is_exact
from perfguard.errors import (
    EXIT_CASE_FAILED,
    EXIT_CONTENDED,
    EXIT_OK,
    EXIT_REGRESSION,
)


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
        if m.verdict == REGRESSION and not is_exact(m.metric)
        else m
        for m in case.metrics
    )
    # A count or an output does not depend on how busy the runner was: they still fail.
    exact = any(m.verdict == REGRESSION and is_exact(m.metric) for m in metrics)
    verdict = REGRESSION if exact or case.output_failed else CONTENDED
    return dataclasses.replace(case, verdict=verdict, metrics=metrics, error=why)
