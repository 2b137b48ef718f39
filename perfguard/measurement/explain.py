"""Why a timing moved: profile a case on both sides and attribute the change to its ops.

`explain_cases` profiles each case once per side (a few profiled runs in one process a
side, `perfguard.measurement.profiling`) and compares the op tables
(`perfguard.decision.attribution`). `attribute_report` is what a check calls after
its verdict: only the cases whose timed metrics regressed are profiled, so a passing
check pays nothing, and the profiled runs are never among the timed runs it judged.

Where each side's code comes from: the head is this process's (its perfguard and the
code its cases import, with `--inject` applied); the base is a directory (a checkout),
imported first as the relative check's base is (`launch.child_environment`), or a
revision checked out in a temporary worktree (`checkout.temporary_worktree`, always
removed). The stored check's base is the revision its baseline names
(`stored_base_ref`), where this repository has it.

The two sides are profiled at the same time, one process each: the profiled processes
are mostly interpreter start and pipeline build (~20 s of a smoke case's ~22 s on the
2-core runner), which then overlap, and the comparison is between op tables, not
between the sides' speeds, so sharing the cores moves both alike. A Chrome trace of
each side's first profiled run is written to `traces_dir` when one is given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from perfguard.decision.attribution import Attribution, CaseAttribution, attribute, stages_of, timed
from perfguard.decision.records import REGRESSION
from perfguard.errors import PerfguardError
from perfguard.measurement.profiling import PROFILE_RUNS, ProfileSide, profile_case
from perfguard.storage.cases import Case

Echo = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def trace_path(traces_dir: str | os.PathLike[str] | None, case_id: str, side: str) -> Path | None:
    """`<dir>/<case>.<side>.trace.json` (a Chrome trace), or None without a directory."""
    if traces_dir is None:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", case_id)
    return Path(traces_dir) / f"{safe}.{side}.trace.json"


def _side_info(side: ProfileSide, data: Mapping[str, Any]) -> dict[str, Any]:
    from perfguard.measurement.checkout import commit_of

    commit = commit_of(side.import_dir or Path.cwd())[0]
    return {
        "label": side.label,
        "dir": str(side.import_dir) if side.import_dir else None,
        "commit": commit,
        "perfguard": data.get("perfguard"),
        "activities": data.get("activities"),
        "trace": data.get("trace"),
    }


def explain_case(
    case: Case,
    base: ProfileSide,
    head: ProfileSide,
    *,
    platform: str,
    traces_dir: str | os.PathLike[str] | None = None,
    runs: int = PROFILE_RUNS,
    metrics: Sequence[str] = (),
    factory: str | None = None,
) -> CaseAttribution:
    """One case's attribution: both sides profiled at once, the stages `metrics` name
    (every stage when they name none, or e2e); `factory` (`module:function`) builds
    the pipeline instead of perfguard's workloads. A side that fails is the case's error."""
    if traces_dir is not None:
        Path(traces_dir).mkdir(parents=True, exist_ok=True)

    def one(side: ProfileSide, name: str) -> dict[str, Any]:
        return profile_case(
            case, side, platform=platform, trace=trace_path(traces_dir, case.id, name),
            runs=runs, factory=factory,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {"base": pool.submit(one, base, "base"), "head": pool.submit(one, head, "head")}
        data: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        for name, future in futures.items():
            try:
                data[name] = future.result()
            except PerfguardError as exc:
                errors.append(str(exc))
    if errors:
        return CaseAttribution(case_id=case.id, metrics=tuple(metrics), error="; ".join(errors))
    sides = {"base": _side_info(base, data["base"]), "head": _side_info(head, data["head"])}
    return attribute(
        case.id,
        data["base"]["runs"],
        data["head"]["runs"],
        stages=stages_of(metrics),
        metrics=metrics,
        sides=sides,
    )


def explain_cases(
    cases: Sequence[Case],
    base: ProfileSide,
    head: ProfileSide,
    *,
    platform: str,
    traces_dir: str | os.PathLike[str] | None = None,
    runs: int = PROFILE_RUNS,
    metrics: Mapping[str, Sequence[str]] | None = None,
    echo: Echo | None = None,
) -> Attribution:
    """Every case's attribution, one case at a time (`explain_case`)."""
    out: list[CaseAttribution] = []
    for case in cases:
        if echo is not None:
            echo(f"perfguard: {case.id}: profiling {base.label} and {head.label}, {runs} runs each")
        chosen = tuple((metrics or {}).get(case.id, ()))
        found = explain_case(
            case, base, head, platform=platform, traces_dir=traces_dir, runs=runs, metrics=chosen
        )
        out.append(found)
    return Attribution(cases=tuple(out), runs=runs)


Slow = Mapping[str, Sequence[str]]
"""Case id -> its timed metrics a report calls regressions (`regressed_timings`)."""


def regressed_timings(report: Any) -> dict[str, list[str]]:
    """case id -> its timed metrics the report calls regressions (work and memory are
    judged exactly or per stage and need no profile)."""
    out: dict[str, list[str]] = {}
    for case in report.cases:
        slow = [m.metric for m in case.metrics if m.verdict == REGRESSION and timed(m.metric)]
        if slow:
            out[case.case_id] = slow
    return out


@contextlib.contextmanager
def base_side(against: Any) -> Iterator[ProfileSide]:
    """The profiled base side of `against` (a `RelativeOptions`: a directory or a ref, and
    the import root inside it, sglang: `python`), its code checked out while it is used
    (a ref: in a temporary worktree, always removed)."""
    with base_directory(against.directory, against.ref) as root:
        yield ProfileSide("base", root / against.subdir if against.subdir else root)


@contextlib.contextmanager
def base_directory(directory: str | None, ref: str | None) -> Iterator[Path]:
    """The base's code: `directory`, or a temporary worktree of `ref` (always removed)."""
    from perfguard.measurement.checkout import temporary_worktree

    if ref is not None:
        with temporary_worktree(ref) as path:
            yield path
    elif directory is not None:
        yield Path(directory).resolve()
    else:
        raise PerfguardError("an attribution needs a base: --against DIR|REF")


@dataclasses.dataclass(frozen=True)
class Profiling:
    """How a check's attribution profiles its regressed cases: on `platform`, the head
    with the check's `inject`, `runs` profiled runs a side, Chrome traces into
    `traces_dir` (None: none written), progress told to `echo`."""

    platform: str
    inject: Mapping[str, float] = dataclasses.field(default_factory=dict)
    traces_dir: str | os.PathLike[str] | None = None
    runs: int = PROFILE_RUNS
    echo: Echo | None = None


def attribute_report(
    report: Any, cases: Sequence[Case], against: Any, how: Profiling, slow: Slow
) -> Any:
    """`report` with the attribution of its regressed timings `slow`
    (`regressed_timings`); itself when none of `cases` regressed (nothing is profiled).
    The base is `against` (a `RelativeOptions`: a directory or a ref, and its import
    subdirectory); the head is this process's code with the check's injection."""
    todo = [c for c in cases if c.id in slow]
    if not todo:
        return report
    head = ProfileSide("head", None, dict(how.inject))
    with base_side(against) as side:
        found = explain_cases(
            todo, side, head, platform=how.platform, traces_dir=how.traces_dir, runs=how.runs,
            metrics=slow, echo=how.echo,
        )  # fmt: skip
    return dataclasses.replace(report, attribution=found.to_json())


def stored_base_ref(baseline_path: str) -> tuple[str | None, str]:
    """The revision the stored baseline at `baseline_path` was measured at, if this
    repository has it: (commit, why not)."""
    from perfguard.measurement.checkout import git
    from perfguard.storage.jsonio import read_json

    try:
        commit = read_json(baseline_path).get("metadata", {}).get("git_commit")
    except (OSError, PerfguardError, ValueError) as exc:
        return None, f"{baseline_path}: cannot read the baseline's revision ({exc})"
    if not commit:
        return None, f"{baseline_path} names no git commit: its side cannot be profiled"
    found = git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], Path.cwd())
    if found.returncode != 0:
        return None, f"the baseline's revision {commit[:12]} is not in this repository"
    return found.stdout.strip(), ""


def attribute_stored(report: Any, cases: Sequence[Case], how: Profiling, slow: Slow) -> Any:
    """A stored check's `attribute_report`: the base is the baseline's revision, in a
    temporary worktree; where the repository lacks it, each regressed case says so."""
    from perfguard.measurement.relative import RelativeOptions

    ref, why = stored_base_ref(str(report.baseline.get("path")))
    if ref is None:
        return unattributed(report, why, how.runs, slow)
    return attribute_report(report, cases, RelativeOptions(ref=ref), how, slow)


ENV_ATTRIBUTION = "PERFGUARD_ATTRIBUTION"
"""`0` turns the check's attribution of regressed timings off (default on)."""
ENV_TRACES_DIR = "PERFGUARD_TRACES_DIR"
"""Where a check's attribution writes its Chrome traces (default: none written)."""


def attribute_regressions(
    report: Any,
    cases: Sequence[Case],
    options: Any,
    against: Any = None,
    *,
    platform: str,
    traces_dir: str | os.PathLike[str] | None = None,
    echo: Echo | None = _stderr,
) -> Any:
    """What a check calls after its verdict: `report` with the per-op attribution of
    every case whose timed metric regressed (`report` itself when none did, or with
    `$PERFGUARD_ATTRIBUTION=0`). `options` is the check's `MeasureOptions` (its
    injection applies to the head); `against` the relative check's `RelativeOptions`
    (the base is its directory or ref), None for a stored check (the base is the
    baseline's revision, `attribute_stored`). Traces go to `traces_dir`, else
    `$PERFGUARD_TRACES_DIR`, else nowhere. A side that cannot be profiled is that
    case's `error` in the section, never the check's failure."""
    slow = regressed_timings(report)
    if os.environ.get(ENV_ATTRIBUTION, "1").strip() == "0" or not slow:
        return report
    how = Profiling(
        platform,
        inject=dict(getattr(options, "inject", None) or {}),
        traces_dir=traces_dir or os.environ.get(ENV_TRACES_DIR) or None,
        echo=echo,
    )
    try:
        if against is None:
            return attribute_stored(report, cases, how, slow)
        return attribute_report(report, cases, against, how, slow)
    except PerfguardError as exc:  # a base that cannot be checked out again, say
        return unattributed(report, str(exc), PROFILE_RUNS, slow)


def unattributed(report: Any, why: str, runs: int, slow: Slow) -> Any:
    """`report` whose attribution says, for each regressed case (`slow`), why it has none."""
    failed = [CaseAttribution(case_id=c, metrics=tuple(m), error=why) for c, m in slow.items()]
    return dataclasses.replace(report, attribution=Attribution(tuple(failed), runs).to_json())


ATTRIBUTION_KIND = "perfguard-attribution"
ATTRIBUTION_FILE_VERSION = 1


def explain(
    selection: Any,
    against: Any,
    *,
    out_dir: str | os.PathLike[str],
    runs: int = PROFILE_RUNS,
    options: Any = None,
    platform: str | None = None,
    echo: Echo = _stderr,
) -> dict[str, Any]:
    """`perfguard explain`: profile the selected cases on the base (`against`, a
    `RelativeOptions`: a directory or a ref) and on this checkout, and write into
    `out_dir` the attribution of every stage as JSON (`attribution.json`), Markdown
    (`attribution.md`) and HTML (`attribution.html`), beside each side's Chrome trace.
    Returns what `attribution.json` holds. Nothing is judged: this answers "where did the
    time go" for any case, regressed or not."""
    from perfguard.device.platform import fingerprint, probe
    from perfguard.presentation.attribution import markdown_lines, standalone_html
    from perfguard.results import utc_now
    from perfguard.storage.cases import load_registry
    from perfguard.storage.explained import validate_attribution
    from perfguard.storage.jsonio import write_json_atomic, write_text_atomic

    if runs < 2:
        raise PerfguardError(f"--runs {runs}: the noise rule needs at least 2 profiled runs a side")
    chosen = probe(platform)
    cases = selection.of(load_registry(chosen.name, selection.cases_dir))
    if not cases:
        raise PerfguardError("no case matches the selection (see `perfguard list-cases`)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inject = dict(getattr(options, "inject", None) or {})
    head = ProfileSide("head", None, inject)
    with base_side(against) as base:
        found = explain_cases(cases, base, head, platform=chosen.name, traces_dir=out, runs=runs,
                              echo=echo)  # fmt: skip
    section = found.to_json()
    validate_attribution(section, str(out / "attribution.json"))
    data = {
        "kind": ATTRIBUTION_KIND,
        "schema_version": ATTRIBUTION_FILE_VERSION,
        "created": utc_now(),
        "environment": fingerprint(chosen),
        "against": {"dir": against.directory, "ref": against.ref, "subdir": against.subdir},
        "attribution": section,
    }
    write_json_atomic(out / "attribution.json", data)
    write_text_atomic(out / "attribution.md", "\n".join(markdown_lines(section)) + "\n")
    write_text_atomic(out / "attribution.html", standalone_html(section, "perfguard explain"))
    return data
