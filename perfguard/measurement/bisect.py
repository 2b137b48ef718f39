"""`perfguard bisect GOOD BAD`: the first commit where a selected metric regressed.

Like asv's `find`, it walks the first-parent commits of GOOD..BAD, each checked out in
a temporary `git worktree` of its own (`perfguard.measurement.commit_range`), and halves
the range at each step: about log2(N) + 2 measured commits for N (GOOD, BAD, then the
halvings). A commit whose code cannot be imported, whose registry cannot be read or
whose case fails to run is skipped and listed, and the nearest untried commit of the
range is measured instead, as asv steps over commits that do not build.

How a commit is judged:

- Work counters (the default, and any `ops:` / `flops:` / `alloc:` / `syncs:` metric):
  exactly, one counted run per commit and case (`perfguard.measurement.commit_counts`).
- Timings (`stage:...`, `step_...`, `e2e`): through the relative check's paired
  comparison (`perfguard.measurement.relative`) of the commit against GOOD, both measured
  in this session in interleaved blocks of fresh processes; a commit is bad when the
  metric is a regression at the relative check's level, and the first bad commit gets
  the per-op attribution of `perfguard.measurement.explain` against GOOD.

Before the halving, BAD is measured against GOOD: when BAD is not worse there is
nothing to find, and the command says so (exit 2) rather than bisecting noise.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfguard.decision.records import REGRESSION
from perfguard.decision.work_counts import WorkCounts
from perfguard.errors import PerfguardError
from perfguard.measurement.checkout import git
from perfguard.measurement.commit_counts import (
    Counter,
    check_metric,
    judge_work_step,
    preload_for,
    work_of,
)
from perfguard.measurement.commit_range import (
    BAD,
    GOOD,
    SKIPPED,
    Commit,
    checked_out,
    commit_cases,
    commit_range,
    refuse_dirty,
    resolve,
    subject_of,
)
from perfguard.metrics import is_work_metric
from perfguard.storage.cases import Selection

Echo = Callable[[str], None]


@dataclass
class Step:
    """One measured commit: its verdict (`good`, `bad`, `skipped`), the figure that
    decided it, and (work) the counters that grew or (timings) the paired estimate."""

    commit: Commit
    verdict: str
    figure: str
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit.sha,
            "subject": self.commit.subject,
            "verdict": self.verdict,
            "figure": self.figure,
            "seconds": round(self.seconds, 3),
            **({"details": self.details} if self.details else {}),
        }


def is_timed(metric: str | None) -> bool:
    return metric is not None and not is_work_metric(metric)


def next_index(lo: int, hi: int, tried: set[int]) -> int | None:
    """The untried index nearest the middle of (lo, hi), or None when all were tried."""
    mid = (lo + hi) // 2
    for offset in range(hi - lo):
        for i in (mid - offset, mid + offset + 1):
            if lo < i < hi and i not in tried:
                return i
    return None


def elapsed(t0: float) -> float:
    return time.monotonic() - t0


# ---- the session -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BisectOptions:
    """What `bisect` looks for and how it measures.

    `metric` None judges every work counter of the selected cases; a work metric
    (`ops:DenoisingStage`) judges that counter; a timed one (`stage:DenoisingStage`,
    `step_avg`, `e2e`) is judged by the paired comparison against GOOD, with `measure`
    (`MeasureOptions`) and the relative check's `budget_s` / `min_blocks` /
    `max_blocks` per commit. `cases_dir` is the registry's path inside each commit,
    `subdir` its import root (sglang: `python`)."""

    metric: str | None = None
    cases_dir: str | None = None
    subdir: str | None = None
    measure: Any = None
    budget_s: float = 120.0
    min_blocks: int = 4
    max_blocks: int = 12
    attribute: bool = True
    traces_dir: str | None = None
    """Where the first bad commit's attribution writes both sides' Chrome traces."""

    @property
    def schedule(self) -> Any:
        """The blocks of each commit's paired comparison (`relative.Schedule`)."""
        from perfguard.measurement.relative import Schedule

        return Schedule(self.min_blocks, self.max_blocks, self.budget_s)


class Session:
    """One bisect: the repository, GOOD's side measured once (work) or kept checked out
    (timings), and every step so far."""

    def __init__(
        self, repo: Path, platform: str, selection: Selection, options: BisectOptions, echo: Echo
    ) -> None:
        self.repo, self.platform, self.selection, self.options = repo, platform, selection, options
        self.echo = echo
        self.steps: list[Step] = []
        self.good_counts: dict[str, WorkCounts] = {}
        self.stack = contextlib.ExitStack()
        self.good_dir: Path | None = None
        self.counter: Counter | None = None

    def import_dir(self, root: Path) -> Path:
        return root / self.options.subdir if self.options.subdir else root

    # work -------------------------------------------------------------------------------
    def count(self, commit: Commit) -> dict[str, WorkCounts]:
        with checked_out(commit.sha, self.repo) as root:
            cases = commit_cases(root, self.platform, self.selection, self.options.cases_dir)
            if self.counter is None:
                self.counter = Counter(preload_for(cases))
                self.stack.callback(self.counter.close)
            return work_of(self.counter.count(self.import_dir(root), cases, self.platform))

    # timings ----------------------------------------------------------------------------
    def compare(self, commit: Commit) -> tuple[str, str, dict[str, Any]]:
        """The paired comparison of `commit` against GOOD on the metric (timings)."""
        from perfguard.decision.options import RELATIVE_JUDGING
        from perfguard.decision.paired import BASE, HEAD, BlockComparison
        from perfguard.measurement import base_revision, paired_blocks, relative
        from perfguard.measurement.options import MeasureOptions
        from perfguard.metrics import timing_of

        assert self.good_dir is not None
        # Both sides fork from one warm server, as in the relative check, and each fork
        # imports its own commit's code. What a checkout runs at interpreter start-up (a
        # sitecustomize, a .pth) is the server's, not the commit's: measure with
        # `MeasureOptions(start_method="spawn")` to see a change there (slower blocks).
        measure = self.options.measure or MeasureOptions()
        metric = str(self.options.metric)
        with checked_out(commit.sha, self.repo) as root:
            sides, cases = {}, []
            for side, where in ((BASE, self.good_dir), (HEAD, root)):
                base = base_revision.probe_base(self.import_dir(where))
                own = {c.id: c for c in commit_cases(where, self.platform, self.selection,
                                                     self.options.cases_dir)}  # fmt: skip
                made = paired_blocks.base_side(measure, base, self.platform)
                encode = (lambda b, o: lambda c: base_revision.case_for_base(o.get(c.id, c), b))(
                    base, own
                )
                sides[side] = _replace(made, encode_case=encode)
                if side == BASE:
                    cases = list(own.values())
            timing = timing_of({"platform": self.platform}, None)
            with paired_blocks.process_blocks(sides, self.platform) as blocks:
                outcome = relative.run_relative(
                    cases, blocks, self.options.schedule, judging=RELATIVE_JUDGING,
                    comparison=BlockComparison(timing, self.platform),
                )  # fmt: skip
        return timed_verdict(outcome.judgement, metric)


def _replace(side: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(side, **changes)


def timed_verdict(judgement: Any, metric: str) -> tuple[str, str, dict[str, Any]]:
    """bad when the metric regressed in any case; the figure is its ratio and interval."""
    found = []
    for case in judgement.cases:
        if case.error:
            raise PerfguardError(f"{case.case_id}: {case.error}")
        for m in case.metrics:
            if m.metric == metric:
                found.append((case.case_id, m))
    if not found:
        raise PerfguardError(f"bisect: --metric {metric}: no selected case has it")
    cid, m = max(found, key=lambda cm: cm[1].ratio or 0.0)
    interval = f" [{m.low:.3f}, {m.high:.3f}]" if m.low is not None and m.high is not None else ""
    ratio = f"{m.ratio:.3f}x" if m.ratio is not None else "?"
    figure = f"{cid} {metric} {ratio}{interval} ({m.verdict})"
    details = {"case": cid, "ratio": m.ratio, "low": m.low, "high": m.high, "verdict": m.verdict}
    if any(mv.verdict == REGRESSION for _, mv in found):
        return BAD, figure, details
    if not all(mv.clear for _, mv in found):
        # The budget ran out before the comparison could tell: not evidence of "good".
        figure += ", not resolved within --budget-s"
        details["unresolved"] = True
    return GOOD, figure, details


def _measure(session: Session, commit: Commit) -> tuple[str, str, dict[str, Any]]:
    """Measure `commit` and judge it against GOOD: (verdict, figure, details); a
    commit that cannot be checked out, imported or run is `skipped` with its reason."""
    try:
        if is_timed(session.options.metric):
            return session.compare(commit)
        counts = session.count(commit)
        return judge_work_step(session.good_counts, counts, session.options.metric)
    except PerfguardError as exc:
        return SKIPPED, " ".join(str(exc).split())[:300], {}


def _step(session: Session, commit: Commit, label: str, left: str) -> Step:
    t0 = time.monotonic()
    verdict, figure, details = _measure(session, commit)
    step = Step(commit, verdict, figure, elapsed(t0), details)
    session.steps.append(step)
    session.echo(
        f"perfguard: bisect [{len(session.steps)}] {label} {commit.short} {commit.subject[:60]}: "
        f"{verdict}, {figure} ({step.seconds:.1f} s){left}"
    )
    return step


def _start(session: Session, good: Commit) -> None:
    """Measure GOOD (work: its counts; timings: its checkout, kept for the session)."""
    t0 = time.monotonic()
    if is_timed(session.options.metric):
        session.good_dir = session.stack.enter_context(checked_out(good.sha, session.repo))
        commit_cases(session.good_dir, session.platform, session.selection,
                     session.options.cases_dir)  # fmt: skip
        figure = "checked out; each commit is compared with it side by side"
    else:
        try:
            session.good_counts = session.count(good)
        except PerfguardError as exc:
            raise PerfguardError(f"bisect: GOOD {good.short} cannot be measured: {exc}") from exc
        check_metric(session.options.metric, session.good_counts)
        figure = f"{sum(len(w.counters) for w in session.good_counts.values())} counters"
    session.steps.append(Step(good, GOOD, figure, elapsed(t0)))
    session.echo(f"perfguard: bisect [1] GOOD {good.short} {good.subject[:60]}: {figure}")


def bisect(
    good_rev: str,
    bad_rev: str,
    selection: Selection,
    options: BisectOptions,
    *,
    platform: str,
    repo: str | os.PathLike[str] | None = None,
    echo: Echo,
) -> dict[str, Any]:
    """Find the first commit of GOOD..BAD (first parents) where the metric regressed;
    the bisect report (`perfguard.storage.explained.write_bisect_report`). Errors the
    user can fix (no such revision, GOOD not an ancestor, a metric no case has, BAD not
    worse than GOOD, a dirty tree named as a revision) raise `PerfguardError`."""
    top = git(["rev-parse", "--show-toplevel"], Path(repo) if repo else Path.cwd())
    if top.returncode != 0:
        raise PerfguardError(f"bisect: {repo or Path.cwd()} is not inside a git repository")
    root = Path(top.stdout.strip())
    good_sha, bad_sha = resolve(good_rev, root, "GOOD"), resolve(bad_rev, root, "BAD")
    for rev, sha in ((good_rev, good_sha), (bad_rev, bad_sha)):
        refuse_dirty(rev, sha, root)
    commits = commit_range(good_sha, bad_sha, root)
    good = Commit(good_sha, subject_of(good_sha, root))
    session = Session(root, platform, selection, options, echo)
    started = time.monotonic()
    echo(
        f"perfguard: bisect {len(commits)} commit(s) after GOOD {good.short} up to BAD "
        f"{commits[-1].short}, judging {options.metric or 'every work counter'}; "
        f"about {max(1, len(commits) - 1).bit_length() + 2} measured commit(s)"
    )
    with session.stack:
        _start(session, good)
        last = _step(session, commits[-1], "BAD", "")
        if last.verdict == SKIPPED:
            why = last.figure
            raise PerfguardError(f"bisect: BAD {last.commit.short} cannot be measured: {why}")
        if last.verdict != BAD and last.details.get("unresolved"):
            raise PerfguardError(
                f"bisect: cannot tell whether BAD {last.commit.short} is worse than GOOD "
                f"({last.figure}): raise --budget-s, or bisect a work counter"
            )
        if last.verdict != BAD:
            raise PerfguardError(
                f"bisect: BAD {last.commit.short} is not worse than GOOD ({last.figure}): "
                "nothing to find (is GOOD already slower, or the metric unchanged?)"
            )
        first = _halve(session, commits)
        report = _report(session, good, commits, first, started)
        if first is not None and is_timed(options.metric) and options.attribute:
            echo(f"perfguard: bisect: profiling {commits[first].short} against GOOD")
            details = report["first_bad"].get("details", {})
            report["first_bad"]["attribution"] = _attribution(session, commits[first], details)
    return report


def _halve(session: Session, commits: Sequence[Commit]) -> int | None:
    """Halve (lo, hi) until adjacent; a skipped commit is stepped over (the nearest
    untried one is measured). The index of the first bad commit, or None when skipped
    commits leave it undecided between them."""
    lo, hi = -1, len(commits) - 1
    tried = {hi}
    while hi - lo > 1:
        i = next_index(lo, hi, tried)
        if i is None:
            return None
        tried.add(i)
        left = hi - lo - 2
        step = _step(session, commits[i], f"{i + 1}/{len(commits)}", f"; {left} untested in range")
        if step.verdict == BAD:
            hi = i
        elif step.verdict == GOOD:
            lo = i
    # every commit strictly between lo and hi was skipped, or none is left
    between = [j for j in range(lo + 1, hi)]
    return hi if not between else None


def _report(
    session: Session, good: Commit, commits: Sequence[Commit], first: int | None, t0: float
) -> dict[str, Any]:
    from perfguard.results import utc_now
    from perfguard.storage.explained import BISECT_KIND, BISECT_SCHEMA_VERSION

    skipped = [s for s in session.steps if s.verdict == SKIPPED]
    out: dict[str, Any] = {
        "kind": BISECT_KIND,
        "schema_version": BISECT_SCHEMA_VERSION,
        "created": utc_now(),
        "good": good.sha,
        "bad": commits[-1].sha,
        "commits": len(commits),
        "metric": session.options.metric,
        "mode": "timing" if is_timed(session.options.metric) else "work",
        "measured": len(session.steps),
        "seconds": round(elapsed(t0), 3),
        "steps": [s.to_json() for s in session.steps],
        "skipped": [
            {"commit": s.commit.sha, "subject": s.commit.subject, "reason": s.figure}
            for s in skipped
        ],
        "first_bad": None,
    }
    if first is not None:
        step = next(s for s in session.steps if s.commit == commits[first])
        out["first_bad"] = {**step.to_json(), "index": first + 1}
    else:
        out["undecided"] = "the first bad commit is among the skipped ones before the bad one"
    return out


def _attribution(session: Session, commit: Commit, details: Mapping[str, Any]) -> dict[str, Any]:
    """The per-op attribution of the first bad commit against GOOD (timings), for the
    case whose metric moved most."""
    from perfguard.decision.attribution import Attribution
    from perfguard.measurement.explain import explain_case
    from perfguard.measurement.profiling import PROFILE_RUNS, ProfileSide

    assert session.good_dir is not None
    metric = str(session.options.metric)
    with checked_out(commit.sha, session.repo) as root:
        cases = {c.id: c for c in commit_cases(root, session.platform, session.selection,
                                               session.options.cases_dir)}  # fmt: skip
        case = cases[str(details.get("case"))]
        found = explain_case(
            case,
            ProfileSide("base", session.import_dir(session.good_dir)),
            ProfileSide("head", session.import_dir(root)),
            platform=session.platform,
            traces_dir=session.options.traces_dir,
            metrics=[metric],
        )
    return Attribution((found,), PROFILE_RUNS).to_json()
