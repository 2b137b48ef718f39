"""The check flow: measure, screen for contention, confirm in fresh processes, judge once.

`perfguard.decision.verdict` decides; this module only acts on what it decides:

- adaptive sampling (futility only): after the minimum `--repeats` runs of a case, the
  gate asks after each further run whether every metric is already clearly within its
  band, and stops measuring as soon as it is, or at `--max-repeats`. It never stops
  early because a metric looks like a regression: a regression is only ever declared
  on the final figures, after confirmation.
- contention: a measurement whose runs the reference workload saw mostly contended
  (`perfguard.decision.contention`) is measured again after a wait (`ContentionPolicy`); a case
  that stays contended gets the verdict `contended` (exit 4), never `regression`.
- confirmation: a case with a metric over its bound after the first measurement is
  measured again in fresh processes (`--max-reruns`, default 2), one at a time, and the
  processes are pooled as groups. Confirmation stops as soon as no metric is over its
  bound any more. The process is the largest source of noise on a shared runner (a
  process can land in a slow mode for its whole life), and only more processes show
  and average it; with three of them the verdict has a between-process spread to put
  an interval on.

Why this bounds the false-alarm rate: a regression needs the one final test to reject
(median over the band and the one-sided lower confidence bound, Student's t at
`Rule.alpha` with the degrees of freedom of the noise estimate, above 1). Every earlier
look can only stop sampling for a case that is clearly fine, or ask for more data; a
stop for futility removes rejections, it never adds one. So the chance that unchanged
code fails a metric is at most `alpha`, however many looks the sampling took, instead
of growing with each look as a test repeated until it rejects would.

Measuring is the caller's (`measure` runs cases in this process or in workers,
`confirm` in fresh processes); the gate works the same on fake measurements, which is
how its behaviour is tested, and `sleep` is injectable for the same reason.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision.contention import DEFAULT_POLICY, ContentionPolicy, screen
from perfguard.decision.verdict import (
    CONTENDED,
    DEFAULT_RULE,
    CaseVerdict,
    Judgement,
    Rule,
    judge,
    judge_against,
)
from perfguard.results import CaseResult, Results, pool

if TYPE_CHECKING:
    from perfguard.storage.baseline import Baseline
    from perfguard.storage.cases import Case

DEFAULT_MAX_REPEATS = 20
"""Adaptive sampling's cap on runs per measurement: 4x the default minimum of 5, enough
to halve the standard error of a median when a verdict is close to its bound."""

DEFAULT_MAX_RERUNS = 2
"""Fresh confirmation processes for a case over its bound: with the first measurement,
three processes, the fewest whose medians give a spread (2 degrees of freedom of the
check's own; the baseline's processes add theirs)."""

Until = Callable[[CaseResult], bool]
Measure = Callable[[Sequence["Case"], Callable[["Case"], Until | None]], Results]
"""`measure(cases, until_for)`: run `cases`, consulting `until_for(case)` (None: no
adaptive stop) after each run beyond the minimum; a `Results` with one result per case."""


@dataclass(frozen=True)
class GateOutcome:
    """The pooled results (every sample of every attempt) and the judgement on them."""

    results: Results
    judgement: Judgement


def _reference(baseline: Baseline, case_id: str) -> float | None:
    scenario = baseline.scenarios.get(case_id)
    return scenario.reference.median if scenario and scenario.reference else None


def run_gate(
    cases: Sequence[Case],
    baseline: Baseline,
    profile_name: str,
    measure: Measure,
    *,
    confirm: Measure | None = None,
    adaptive: bool = True,
    max_reruns: int = DEFAULT_MAX_RERUNS,
    rule: Rule = DEFAULT_RULE,
    fail_on_missing: bool = False,
    advisory: bool = False,
    ignore_missing: Iterable[str] = (),
    max_repeats: int | None = None,
    on_event: Callable[[str, str], None] | None = None,
    policy: ContentionPolicy = DEFAULT_POLICY,
    sleep: Callable[[float], None] = time.sleep,
    allow_output_change: bool = False,
) -> GateOutcome:
    """Measure `cases`, wait out contention, confirm cases over their bounds, judge once.

    `confirm` measures in fresh processes (default: `measure`, e.g. when every
    measurement already runs in workers); `on_event(case_id, message)` is told what the
    gate does and why (a wait, a confirmation).
    """
    if max_reruns < 0:
        raise ValueError("max_reruns must be >= 0")
    confirm = confirm or measure
    tell = on_event or (lambda _cid, _msg: None)
    profile = baseline.profile(profile_name)

    def verdict_of(cid: str, result: CaseResult) -> CaseVerdict:
        return judge_against(
            baseline,
            profile,
            cid,
            result,
            rule=rule,
            policy=policy,
            allow_output_change=allow_output_change,
        )

    def until_for(case: Case) -> Until | None:
        if not adaptive or case.id not in baseline.scenarios:
            return None

        def clearly_fine(result: CaseResult) -> bool:
            v = verdict_of(case.id, result)
            return v.clear and not v.over

        return clearly_fine

    by_id = {c.id: c for c in cases}
    results = measure(cases, until_for)
    first_runs = {cid: r.repeats for cid, r in results.cases.items()}
    waits = dict.fromkeys(results.cases, 0)
    confirmations = dict.fromkeys(results.cases, 0)
    notes: dict[str, str] = {}

    # Contention: wait and measure again while the runner is busy (bounded).
    for cid in sorted(results.cases):
        if cid not in by_id:
            continue
        for _ in range(policy.waits):
            res = results.cases[cid]
            if res.status != "ok":
                break
            _, scr = screen(res, _reference(baseline, cid), policy)
            if not scr.contended:
                break
            tell(cid, f"{scr.reason}: waiting {policy.wait_s:g} s and measuring again")
            sleep(policy.wait_s)
            waits[cid] += 1
            again = measure([by_id[cid]], until_for).cases.get(cid)
            if again is not None:
                results.cases[cid] = again

    # Confirmation in fresh processes, one at a time, while a metric is over its bound.
    for attempt in range(1, max_reruns + 1):
        todo: list[Case] = []
        for cid, res in sorted(results.cases.items()):
            if res.status != "ok" or cid in notes or cid not in by_id:
                continue
            verdict = verdict_of(cid, res)
            # A case the screen found contended waits instead; a metric left without a
            # verdict by the runner's speed is over its bound and is confirmed, since a
            # fresh process at another moment may see a faster runner.
            screened = verdict.verdict == CONTENDED and verdict.error is not None
            if not screened and verdict.over:
                tell(
                    cid,
                    f"over its bound ({', '.join(verdict.over[:3])}): confirming in a fresh "
                    f"process ({attempt} of at most {max_reruns})",
                )
                todo.append(by_id[cid])
        if not todo:
            break
        more = confirm(todo, lambda _case: None)
        for case in todo:
            extra = more.cases.get(case.id)
            if extra is None or extra.status != "ok":
                why = "no result" if extra is None else extra.error
                notes[case.id] = f"confirmation {attempt} failed ({why}); verdict from earlier runs"
                continue
            _, scr = screen(extra, _reference(baseline, case.id), policy)
            if scr.contended:
                notes[case.id] = f"confirmation {attempt} ran on a contended runner; left out"
                continue
            results.cases[case.id] = pool([results.cases[case.id], extra], True)
            confirmations[case.id] += 1

    judgement = judge(
        results,
        baseline,
        profile_name,
        fail_on_missing=fail_on_missing,
        advisory=advisory,
        ignore_missing=tuple(ignore_missing),
        rule=rule,
        policy=policy,
        allow_output_change=allow_output_change,
    )
    verdicts = []
    for cv in judgement.cases:
        res = results.cases[cv.case_id]
        sampling: dict[str, Any] = {
            "runs": res.repeats,
            "groups": len(res.groups) if res.groups else 1,
            # `reruns` is the older name of `confirmations`, kept for readers of reports.
            "reruns": confirmations.get(cv.case_id, 0),
            "confirmations": confirmations.get(cv.case_id, 0),
            "contention_waits": waits.get(cv.case_id, 0),
        }
        if adaptive and max_repeats is not None and res.status == "ok":
            sampling["stopped_early"] = first_runs.get(cv.case_id, 0) < max_repeats
        if cv.case_id in notes:
            sampling["note"] = notes[cv.case_id]
        verdicts.append(dataclasses.replace(cv, sampling=sampling))
    return GateOutcome(results, dataclasses.replace(judgement, cases=tuple(verdicts)))
