"""`perfguard bisect GOOD BAD`: the first commit where a selected metric regressed.

Like asv's `find`, it walks the first-parent commits of GOOD..BAD, each checked out in
a temporary `git worktree` of its own (the user's tree and index are never touched;
every worktree is removed on every way out, Ctrl-C and SIGTERM included), and halves the
range at each step: about log2(N) + 2 measured commits for N (GOOD, BAD, then the
halvings). A commit whose code cannot be imported, whose registry cannot be read or
whose case fails to run is skipped and listed, and the nearest untried commit of the
range is measured instead, as asv steps over commits that do not build.

Each commit's side imports its own perfguard and code (its import directory first on
`PYTHONPATH` and as its working directory, as the relative check's base does), and its
cases come from its own registry (`cases/` of that commit), so a regression made in a
case definition is found like one made in the code.

How a commit is judged:

- Work counters (the default, and any `ops:` / `flops:` / `alloc:` / `syncs:` metric):
  exactly, one counted run per commit and case, no repeats: counts do not depend on the
  runner's speed. A commit is bad when a selected counter of a selected case counts more
  than at GOOD; the report names the ops whose counts changed.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfguard.decision.counters import WorkCounts, judge_counter, op_changes
from perfguard.decision.verdict import REGRESSION
from perfguard.errors import PerfguardError
from perfguard.measurement.checkout import git, temporary_worktree
from perfguard.metrics import is_work_metric, metric_sort_key
from perfguard.storage.cases import Case, Selection

Echo = Callable[[str], None]
COUNT_TIMEOUT_S = 600.0

GOOD, BAD, SKIPPED = "good", "bad", "skipped"


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:12]


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


# ---- the range -------------------------------------------------------------------------------


def resolve(rev: str, repo: Path, what: str) -> str:
    """The commit `rev` names in `repo`; one line and exit 2 when there is none."""
    found = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], repo)
    if found.returncode != 0 or not found.stdout.strip():
        raise PerfguardError(f"bisect: {what} {rev}: no such commit in {repo}")
    return found.stdout.strip()


def commit_range(good: str, bad: str, repo: Path) -> list[Commit]:
    """The first-parent commits after GOOD up to BAD, oldest first (BAD last)."""
    if git(["merge-base", "--is-ancestor", good, bad], repo).returncode != 0:
        raise PerfguardError(
            f"bisect: GOOD {good[:12]} is not an ancestor of BAD {bad[:12]}: "
            "name the older revision first"
        )
    listed = git(["log", "--first-parent", "--reverse", "--format=%H %s", f"{good}..{bad}"], repo)
    commits = []
    for line in listed.stdout.splitlines():
        sha, _, subject = line.partition(" ")
        commits.append(Commit(sha, subject))
    if not commits:
        raise PerfguardError(f"bisect: GOOD and BAD are the same commit ({good[:12]})")
    return commits


def subject_of(sha: str, repo: Path) -> str:
    return git(["log", "-1", "--format=%s", sha], repo).stdout.strip()


def refuse_dirty(rev: str, sha: str, repo: Path) -> None:
    """A revision naming the checked-out commit of a tree with uncommitted changes:
    bisect measures commits, so those changes would be left out; say so (exit 2)."""
    head = git(["rev-parse", "HEAD"], repo).stdout.strip()
    if sha != head:
        return
    status = git(["status", "--porcelain", "--untracked-files=no"], repo).stdout.strip()
    if status:
        raise PerfguardError(
            f"bisect: {rev} is the checked-out commit of {repo}, whose working tree has "
            "uncommitted changes that bisect would not measure: commit or stash them "
            "yourself, or name a commit"
        )


# ---- one commit's side -----------------------------------------------------------------------


@contextlib.contextmanager
def checked_out(sha: str, repo: Path) -> Iterator[Path]:
    """A temporary worktree of `sha` (always removed), its path."""
    with temporary_worktree(sha, repo) as path:
        yield path


def commit_cases(
    root: Path, platform: str, selection: Selection, cases_dir: str | None
) -> list[Case]:
    """The selected cases of the commit checked out at `root`, from its own registry."""
    from perfguard.storage.cases import load_registry

    where = root / (cases_dir or "cases")
    chosen = Selection(
        cases_dir=str(where), case_ids=selection.case_ids, match=selection.match,
        tags=selection.tags,
    )  # fmt: skip
    cases = chosen.of(load_registry(platform, str(where)))
    if not cases:
        raise PerfguardError(f"no case of {where} matches the selection")
    return cases


class Counter:
    """Counts commits in side workers (`launch.SIDE_WORKER`, its `count` request) forked
    from one warm server that imports the heavy libraries once and no perfguard module,
    as the relative check's shared server does (`launch.SharedFork`): each commit's
    worker imports that commit's perfguard from its checkout (its import root, first on
    `sys.path`, and its working directory), makes one counted run of each case
    (`MeasureOptions(counters_only=True)`: a warm-up, whose output is kept, and the
    counted run) and exits. A commit then costs its perfguard's import, its builds and
    its runs, not an interpreter's start and torch's import (seconds each on a 2-core
    runner). Where forking is not available (`launch.default_start_method`), or the
    server could not start, each commit's worker is a fresh interpreter."""

    def __init__(self, preload: Sequence[str]) -> None:
        from perfguard.measurement.launch import (
            WarmServer,
            child_environment,
            default_start_method,
            import_root,
        )

        self.server: Any = None
        if default_start_method() == "forkserver":
            # No $PYTHONPATH: nothing the server imports may come from a checkout.
            env = child_environment(unset=("PYTHONPATH",))
            root = import_root()
            self.server = WarmServer(env, "count server", preload=preload, root=root, cwd=root)

    def _forks(self) -> Any:
        """The warm server, once it has imported its modules; None: spawn instead."""
        from perfguard.measurement.workers import STARTUP_TIMEOUT_S

        if self.server is not None and (
            not self.server.alive or self.server.start(STARTUP_TIMEOUT_S) is not None
        ):
            self.server.kill()
            self.server = None
        return self.server

    def count(self, import_dir: Path, cases: Sequence[Case], platform: str) -> dict[str, Any]:
        """One counted run of each case with the commit's own perfguard: case -> result
        JSON. A commit that cannot import or run raises `PerfguardError` (it is skipped)."""
        from perfguard.measurement.launch import SharedFork, child_environment
        from perfguard.measurement.profiling import side_request

        where = str(import_dir)
        env = child_environment(import_dir=import_dir)
        server = self._forks()
        request = {"kind": "count", "platform": platform, "cases": [c.to_json() for c in cases]}
        try:
            data = side_request(
                request, env=env, cwd=where, root=where, label="the counted run",
                timeout_s=COUNT_TIMEOUT_S,
                server=SharedFork(server, env, where, where) if server is not None else None,
            )  # fmt: skip
        except TimeoutError as exc:
            raise PerfguardError(f"the counted run took over {COUNT_TIMEOUT_S:g} s") from exc
        except PerfguardError as exc:
            raise PerfguardError(str(exc)[:300]) from exc
        source = data.get("perfguard_file")
        if not source or not Path(source).resolve().is_relative_to(import_dir.resolve()):
            raise PerfguardError(f"perfguard was imported from {source}, not from {import_dir}")
        results: dict[str, Any] = data["cases"]
        failed = [
            f"{cid}: {r.get('error')}" for cid, r in results.items() if r.get("status") != "ok"
        ]
        if failed:
            raise PerfguardError(failed[0][:300])
        return results

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


# ---- judging work ----------------------------------------------------------------------------


def work_of(results: Mapping[str, Mapping[str, Any]]) -> dict[str, WorkCounts]:
    out = {}
    for cid, result in results.items():
        counts = WorkCounts.from_runs(result.get("work") or [])
        if counts is not None:
            out[cid] = counts
    return out


def chosen_counters(counts: Mapping[str, WorkCounts], metric: str | None) -> list[tuple[str, str]]:
    """(case, counter) pairs judged: `metric` where a case has it, else every counter."""
    pairs = []
    for cid, wc in sorted(counts.items()):
        for m in sorted(wc.counters, key=metric_sort_key):
            if metric is None or m == metric:
                pairs.append((cid, m))
    return pairs


def judge_work_step(
    good: Mapping[str, WorkCounts], current: Mapping[str, WorkCounts], metric: str | None
) -> tuple[str, str, dict[str, Any]]:
    """Exact: bad when any judged counter counts more than at GOOD. (verdict, figure,
    details with the grown counters and, per case, the ops whose counts changed.)"""
    grown: dict[str, dict[str, list[int]]] = {}
    for cid, m in chosen_counters(good, metric):
        if cid not in current or m not in current[cid].counters:
            continue
        verdict = judge_counter(m, current[cid].counters[m], good[cid].counters[m], 0.0, 0.0)
        if verdict.verdict == REGRESSION:
            grown.setdefault(cid, {})[m] = [good[cid].counters[m][1], current[cid].counters[m][1]]
    if not grown:
        return GOOD, "counts as GOOD" if metric is None else f"{metric} as GOOD", {}
    ops = {
        cid: op_changes(good[cid].op_counts, current[cid].op_counts)
        for cid in grown
        if cid in current
    }
    cid, metrics = next(iter(sorted(grown.items())))
    m, (before, after) = next(iter(sorted(metrics.items(), key=lambda kv: metric_sort_key(kv[0]))))
    more = sum(len(v) for v in grown.values()) - 1
    figure = f"{cid} {m} {before:,} -> {after:,} (+{after - before:,})" + (
        f", {more} more counter(s) grew" if more else ""
    )
    return BAD, figure, {"grown": grown, "op_changes": ops}


def check_metric(metric: str | None, counts: Mapping[str, WorkCounts]) -> None:
    """A work metric no selected case has at GOOD is the user's mistake (exit 2)."""
    if metric is None:
        return
    if not any(metric in wc.counters for wc in counts.values()):
        known = sorted({m for wc in counts.values() for m in wc.counters}, key=metric_sort_key)
        raise PerfguardError(
            f"bisect: --metric {metric}: no selected case counts it at GOOD "
            f"(it counts {', '.join(known[:8])}{', ...' if len(known) > 8 else ''})"
        )


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


def preload_for(cases: Sequence[Case]) -> list[str]:
    """What the count server imports before it forks: torch and the libraries the cases'
    workloads import (`perfguard.workloads.modules`), never perfguard itself."""
    from perfguard.workloads.modules import BY_WORKLOAD, RUNNER_LIBRARIES

    names = ["torch", *RUNNER_LIBRARIES]
    for case in cases:
        names += [n for n in BY_WORKLOAD.get(case.workload, ()) if n not in names]
    return names


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
        from perfguard.decision.gate import RELATIVE_JUDGING
        from perfguard.decision.normalize import timing_of
        from perfguard.decision.paired import BASE, HEAD, Comparing
        from perfguard.measurement import relative
        from perfguard.measurement.options import MeasureOptions

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
                base = relative.probe_base(self.import_dir(where))
                own = {c.id: c for c in commit_cases(where, self.platform, self.selection,
                                                     self.options.cases_dir)}  # fmt: skip
                made = relative.base_side(measure, base, self.platform)
                encode = (lambda b, o: lambda c: relative.case_for_base(o.get(c.id, c), b))(
                    base, own
                )
                sides[side] = _replace(made, encode_case=encode)
                if side == BASE:
                    cases = list(own.values())
            timing = timing_of({"platform": self.platform}, None)
            with relative.process_blocks(sides, self.platform) as blocks:
                outcome = relative.run_relative(
                    cases, blocks, self.options.schedule, judging=RELATIVE_JUDGING,
                    compare=Comparing(timing, self.platform),
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
