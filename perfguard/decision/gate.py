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
  measured again in fresh processes (`--max-reruns`, default 8), one at a time, each
  after an optional gap (`--confirm-gap-s`, default 0) so that it samples another moment
  of the runner, and the processes are pooled as groups. Confirmation stops as soon as no
  metric is over its bound any more. A confirmation the contention screen finds
  contended is left out and the next one is tried (it counts against `--max-reruns`);
  a case whose every confirmation was left out so cannot be a `regression` on its one
  process (one process cannot show the between-process spread the verdict needs): its
  timed regressions become `contended` (exit 4), as a contended first measurement
  would. The process is the largest source of noise on a shared runner (a process can
  land in a slow mode for its whole life), and only more processes show and average
  it; with three of them the verdict has a between-process spread to put an interval
  on.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.decision.contention import screen
from perfguard.decision.judgement import Judgement, contended
from perfguard.decision.options import JudgeOptions, Judging
from perfguard.decision.records import CONTENDED, REGRESSION, CaseVerdict
from perfguard.decision.verdict import judge_scenario, judge_with
from perfguard.results import CaseResult, Results, pool

if TYPE_CHECKING:
    from perfguard.storage.baseline import Baseline
    from perfguard.storage.cases import Case

DEFAULT_MAX_REPEATS = 20
"""Adaptive sampling's cap on runs per measurement: 4x the default minimum of 5, enough
to halve the standard error of a median when a verdict is close to its bound."""

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
    judging: JudgeOptions | Judging,
    measure: Measure,
    *,
    confirm: Measure | None = None,
    max_repeats: int | None = None,
    on_event: Callable[[str, str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> GateOutcome:
    """Measure `cases`, wait out contention, confirm cases over their bounds, judge once.

    `confirm` measures in fresh processes (default: `measure`, e.g. when every
    measurement already runs in workers); `max_repeats` is the first measurement's cap
    on runs when it samples adaptively, asking the gate after each run whether to stop
    (None: it does not); `on_event(case_id, message)` is told what the gate does and why
    (a wait, a confirmation). `judging`: the check's options, or those options already
    resolved against `baseline` (`JudgeOptions.against`); either way resolved once.
    """
    adaptive = max_repeats is not None
    if not isinstance(judging, Judging):
        judging = judging.against(baseline)
    gate = _Gate(baseline, judging, {c.id: c for c in cases}, on_event, adaptive)
    results = measure(cases, gate.until_for)
    first_runs = {cid: r.repeats for cid, r in results.cases.items()}
    gate.wait_out_contention(results, measure, sleep)
    gate.confirm(results, confirm or measure, sleep)
    judgement = judge_with(judging, results, baseline)
    verdicts = []
    for cv in judgement.cases:
        unconfirmed = gate.unconfirmed(cv.case_id)
        if unconfirmed and cv.verdict == REGRESSION:
            # The gate asked for a fresh process to confirm what one process showed and
            # the runner never gave it a quiet one: no verdict on the code.
            cv = contended(cv, unconfirmed)
        res = results.cases[cv.case_id]
        sampling = gate.sampling(cv.case_id, res)
        if max_repeats is not None and res.status == "ok":
            sampling["stopped_early"] = first_runs.get(cv.case_id, 0) < max_repeats
        if cv.case_id in gate.notes:
            sampling["note"] = gate.notes[cv.case_id]
        verdicts.append(dataclasses.replace(cv, sampling=sampling))
    return GateOutcome(results, dataclasses.replace(judgement, cases=tuple(verdicts)))


class _Gate:
    """What `run_gate` keeps between its steps: the verdict it asks after each
    measurement, and per case the waits, confirmations and notes."""

    def __init__(
        self,
        baseline: Baseline,
        judging: Judging,
        by_id: dict[str, Case],
        on_event: Callable[[str, str], None] | None,
        adaptive: bool,
    ) -> None:
        self.baseline, self.resolved, self.by_id = baseline, judging, by_id
        self.judging, self.adaptive = judging.options, adaptive
        self.tell = on_event or (lambda _cid, _msg: None)
        self.waits: dict[str, int] = {}
        self.confirmations: dict[str, int] = {}
        self.notes: dict[str, str] = {}
        self.contended_confirmation: dict[str, str] = {}
        """The screen's reason for the last confirmation of a case it left out."""
        self.failed: set[str] = set()
        """Cases whose confirmation failed to run: not confirmed again."""

    def verdict_of(self, cid: str, result: CaseResult) -> CaseVerdict:
        return judge_scenario(self.resolved, cid, result, self.baseline.scenarios.get(cid))

    def until_for(self, case: Case) -> Until | None:
        if not self.adaptive or case.id not in self.baseline.scenarios:
            return None

        def clearly_fine(result: CaseResult) -> bool:
            v = self.verdict_of(case.id, result)
            return v.clear and not v.over

        return clearly_fine

    def wait_out_contention(
        self, results: Results, measure: Measure, sleep: Callable[[float], None]
    ) -> None:
        """Wait and measure again while the runner is busy (bounded)."""
        policy = self.judging.policy
        self.waits = dict.fromkeys(results.cases, 0)
        for cid in sorted(results.cases):
            if cid not in self.by_id:
                continue
            for _ in range(policy.waits):
                res = results.cases[cid]
                if res.status != "ok":
                    break
                _, scr = screen(res, _reference(self.baseline, cid), policy)
                if not scr.contended:
                    break
                self.tell(cid, f"{scr.reason}: waiting {policy.wait_s:g} s and measuring again")
                sleep(policy.wait_s)
                self.waits[cid] += 1
                again = measure([self.by_id[cid]], self.until_for).cases.get(cid)
                if again is not None:
                    results.cases[cid] = again

    def over_bounds(self, results: Results, attempt: int) -> list[Case]:
        """The cases to measure in a fresh process: a metric over its bound (to confirm),
        or one the check can't tell from its baseline (to resolve)."""
        todo: list[Case] = []
        max_reruns, gap = self.judging.max_reruns, self.judging.confirm_gap_s
        for cid, res in sorted(results.cases.items()):
            if res.status != "ok" or cid in self.failed or cid not in self.by_id:
                continue
            verdict = self.verdict_of(cid, res)
            # A case the screen found contended waits instead; a metric left without a
            # verdict by the runner's speed is over its bound and is confirmed, since a
            # fresh process at another moment may see a faster runner.
            screened = verdict.verdict == CONTENDED and verdict.error is not None
            after = f" in {gap:g} s" if gap > 0 else ""
            if not screened and verdict.over:
                self.tell(
                    cid,
                    f"over its bound ({', '.join(verdict.over[:3])}): confirming in a fresh "
                    f"process{after} ({attempt} of at most {max_reruns})",
                )
                todo.append(self.by_id[cid])
            elif not screened and verdict.cant_tell:
                # Neither the same nor slower: only another process can narrow the
                # between-process part of the interval, so measure while budget remains.
                names = ", ".join(m.metric for m in verdict.cant_tell[:3])
                self.tell(
                    cid,
                    f"can't tell yet ({names}): measuring in a fresh process{after} "
                    f"({attempt} of at most {max_reruns})",
                )
                todo.append(self.by_id[cid])
        return todo

    def confirm(self, results: Results, confirm: Measure, sleep: Callable[[float], None]) -> None:
        """Confirmation in fresh processes, one at a time, while a metric is over its
        bound, each after `confirm_gap_s` (another moment of the runner)."""
        self.confirmations = dict.fromkeys(results.cases, 0)
        policy = self.judging.policy
        gap = self.judging.confirm_gap_s
        for attempt in range(1, self.judging.max_reruns + 1):
            todo = self.over_bounds(results, attempt)
            if not todo:
                break
            if gap > 0:
                sleep(gap)
            more = confirm(todo, lambda _case: None)
            for case in todo:
                extra = more.cases.get(case.id)
                if extra is None or extra.status != "ok":
                    why = "no result" if extra is None else extra.error
                    self.notes[case.id] = (
                        f"confirmation {attempt} failed ({why}); verdict from earlier runs"
                    )
                    self.failed.add(case.id)
                    continue
                _, scr = screen(extra, _reference(self.baseline, case.id), policy)
                if scr.contended:
                    self.notes[case.id] = (
                        f"confirmation {attempt} ran on a contended runner; left out"
                    )
                    self.contended_confirmation[case.id] = scr.reason
                    continue
                results.cases[case.id] = pool([results.cases[case.id], extra], True)
                self.confirmations[case.id] += 1

    def unconfirmed(self, cid: str) -> str | None:
        """Why `cid` has no confirmation though it asked for one: every confirmation ran
        on a contended runner (None when one ran quiet, or none was left out)."""
        why = self.contended_confirmation.get(cid)
        if why is None or self.confirmations.get(cid, 0):
            return None
        return (
            f"over its bound in one process; every confirmation ran on a contended runner "
            f"(last: {why}): not confirmed"
        )

    def sampling(self, cid: str, res: CaseResult) -> dict[str, Any]:
        """How a case was sampled, for its verdict's `sampling`."""
        return {
            "runs": res.repeats,
            "groups": len(res.groups) if res.groups else 1,
            # `reruns` is the older name of `confirmations`, kept for readers of reports.
            "reruns": self.confirmations.get(cid, 0),
            "confirmations": self.confirmations.get(cid, 0),
            "contention_waits": self.waits.get(cid, 0),
        }
