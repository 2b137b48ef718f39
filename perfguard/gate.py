"""The check flow: measure, judge, keep sampling while unclear, re-run borderline cases.

`perfguard.verdict` decides; this module only acts on what it decides, in two ways:

- adaptive sampling: after the minimum `--repeats` runs of a case, the gate asks the
  verdict module after each further run whether every metric's verdict is already
  clear (its confidence interval lies wholly on one side of its bound) and stops
  measuring as soon as it is, or at `--max-repeats`. A case far from its bands costs
  the minimum; one near them gets the samples it needs.
- confirmation re-runs: a case with a borderline verdict (band exceeded but not
  credible; credible but within 1.2x of the band; credible and just inside it; a
  regression seen in one process) is measured again, up to `--max-reruns` times, and
  the samples are pooled with the earlier ones. Only the borderline case is re-run,
  never the whole selection.

Where a re-run happens decides what it is worth. In a fresh process (`--isolate`,
`--processes`, `--devices`) it is a new group, and the verdict gains a process: the
drift between processes is the largest noise on a shared runner, and only more
processes average it out. In process it is a fresh pipeline in the same process, which
we measured to agree with the first within ~3 % (two processes: ~10 %): its samples
extend the current group, which spreads them over more time (a burst of contention
then moves the median less) but adds no process. `rerun_in_new_process` says which.

Measuring is the caller's (`measure`: the CLI runs cases in process or in workers); the
gate works the same on fake measurements, which is how its behaviour is tested.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from perfguard.baseline import Baseline
from perfguard.cases import Case
from perfguard.runner import CaseResult, Results, pool
from perfguard.verdict import DEFAULT_RULE, CaseVerdict, Judgement, Rule, judge, judge_case

DEFAULT_MAX_REPEATS = 20
"""Adaptive sampling's cap on runs per measurement: 4x the default minimum of 5, enough
to halve the standard error of a median when a verdict is close to its bound."""

DEFAULT_MAX_RERUNS = 2
"""Confirmation re-runs per borderline case, at most three measurements in all: in fresh
processes, three processes for the verdict to average; in process, three times the
samples spread over three times as long."""

Until = Callable[[CaseResult], bool]
Measure = Callable[[Sequence[Case], Callable[[Case], Until | None]], Results]
"""`measure(cases, until_for)`: run `cases`, consulting `until_for(case)` (None: no
adaptive stop) after each run beyond the minimum; a `Results` with one result per case."""


@dataclass(frozen=True)
class GateOutcome:
    """The pooled results (every sample of every attempt) and the judgement on them."""

    results: Results
    judgement: Judgement


def _judge_one(
    case_id: str, result: CaseResult, baseline: Baseline, profile_name: str, rule: Rule
) -> CaseVerdict:
    return judge_case(
        case_id,
        result,
        baseline.scenarios.get(case_id),
        baseline.profile(profile_name),
        improvement_threshold=baseline.improvement_threshold,
        step_fractions=baseline.step_fractions,
        rule=rule,
    )


def run_gate(
    cases: Sequence[Case],
    baseline: Baseline,
    profile_name: str,
    measure: Measure,
    *,
    adaptive: bool = True,
    max_reruns: int = DEFAULT_MAX_RERUNS,
    rule: Rule = DEFAULT_RULE,
    fail_on_missing: bool = False,
    advisory: bool = False,
    ignore_missing: Iterable[str] = (),
    max_repeats: int | None = None,
    on_rerun: Callable[[str, int, list[str]], None] | None = None,
    rerun_in_new_process: bool = False,
) -> GateOutcome:
    """Measure `cases`, re-run the borderline ones, and judge the pooled samples.

    `adaptive` passes `measure` a stop predicate per case (clear verdicts), so that it can
    stop early; `max_repeats` only labels whether a measurement stopped early.
    `on_rerun(case_id, attempt, metrics)` is told before each re-run, with the
    borderline metrics that asked for it.
    """
    if max_reruns < 0:
        raise ValueError("max_reruns must be >= 0")
    ignored = tuple(ignore_missing)
    earlier: dict[str, CaseResult] = {}
    fresh = rerun_in_new_process

    def until_for(case: Case) -> Until | None:
        if not adaptive or case.id not in baseline.scenarios:
            return None
        before = earlier.get(case.id)

        def clear(result: CaseResult) -> bool:
            pooled = result if before is None else pool([before, result], fresh)
            return _judge_one(case.id, pooled, baseline, profile_name, rule).clear

        return clear

    results = measure(cases, until_for)
    first_runs = {cid: r.repeats for cid, r in results.cases.items()}
    reruns = dict.fromkeys(results.cases, 0)
    notes: dict[str, str] = {}
    by_id = {c.id: c for c in cases}
    for attempt in range(1, max_reruns + 1):
        todo: list[Case] = []
        for cid, res in sorted(results.cases.items()):
            if res.status != "ok" or cid in notes or cid not in by_id:
                continue
            verdict = _judge_one(cid, res, baseline, profile_name, rule)
            if verdict.borderline:
                if on_rerun is not None:
                    on_rerun(cid, attempt, verdict.borderline)
                todo.append(by_id[cid])
        if not todo:
            break
        earlier = {c.id: results.cases[c.id] for c in todo}
        more = measure(todo, until_for)
        for case in todo:
            extra = more.cases.get(case.id)
            if extra is None or extra.status != "ok":
                why = "no result" if extra is None else extra.error
                notes[case.id] = f"re-run {attempt} failed ({why}); verdict from earlier runs"
                continue
            results.cases[case.id] = pool([results.cases[case.id], extra], fresh)
            reruns[case.id] += 1
        earlier = {}
    judgement = judge(
        results,
        baseline,
        profile_name,
        fail_on_missing=fail_on_missing,
        advisory=advisory,
        ignore_missing=ignored,
        rule=rule,
    )
    verdicts = []
    for cv in judgement.cases:
        res = results.cases[cv.case_id]
        sampling: dict[str, Any] = {
            "runs": res.repeats,
            "groups": len(res.groups) if res.groups else 1,
            "reruns": reruns.get(cv.case_id, 0),
        }
        if adaptive and max_repeats is not None and res.status == "ok":
            sampling["stopped_early"] = first_runs.get(cv.case_id, 0) < max_repeats
        if cv.case_id in notes:
            sampling["note"] = notes[cv.case_id]
        verdicts.append(dataclasses.replace(cv, sampling=sampling))
    return GateOutcome(results, dataclasses.replace(judgement, cases=tuple(verdicts)))
