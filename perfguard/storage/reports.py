"""Reports: the verdicts of one check as a versioned JSON file.

A report is everything a reviewer needs without re-running anything: where the figures
came from (environment), what they were compared with (the baseline file and its
sha256), under which profile, and per case and metric the sample summary, the baseline,
the bound, the ratio and the verdict; the output hashes; the overall verdict and exit
code. `perfguard merge` joins the reports of shards that ran disjoint case sets; the
renderings are `perfguard.presentation.markdown`'s (a PR comment) and
`perfguard.presentation.render`'s (the console table).

This module builds, reads, writes and combines; it decides nothing. The overall verdict
of a merged report is recomputed by `perfguard.decision.judgement.overall`, from the same
rules as a single one.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfguard.decision.judgement import Judgement
from perfguard.decision.records import CaseVerdict, MetricVerdict
from perfguard.errors import PerfguardError
from perfguard.results import Results, utc_now
from perfguard.storage.jsonio import (
    read_json,
    validate,
    write_json_atomic,
)

REPORT_KIND = "perfguard.report"
REPORT_SCHEMA_VERSION = 1


# ---- results files -------------------------------------------------------------------------


def read_results(path: str | os.PathLike[str]) -> Results:
    """Read and validate a results file written by `perfguard run --out` (or `check --out`)."""
    return Results.from_json(_read_checked(path, "results"))


def _read_checked(path: str | os.PathLike[str], schema_name: str) -> dict[str, Any]:
    """Read `path` (`read_json` already refuses NaN, Infinity and `1e400`) and validate it
    against `schema_name`."""
    data = read_json(path)
    validate(data, schema_name, str(path))
    return data


def write_results(path: str | os.PathLike[str], results: Results) -> None:
    data = results.to_json()
    validate(data, "results", f"{path} (about to be written)")
    write_json_atomic(path, data)


# ---- model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Report:
    """A check's verdicts with the context needed to trust them."""

    judgement: Judgement
    environment: Mapping[str, Any]
    baseline: Mapping[str, Any]
    profile: Mapping[str, Any]
    settings: Mapping[str, Any]
    improvement_threshold: float
    created: str = field(default_factory=utc_now)
    merged_from: tuple[Mapping[str, Any], ...] = ()
    against: Mapping[str, Any] | None = None
    """A relative check's base revision and schedule (`perfguard.measurement.relative`); None for a
    check against a stored baseline."""
    settled: Mapping[str, Any] | None = None
    """A stored check whose open cases a relative check settled (`check --settle`, `settle`):
    that check's base revision and settings, and the stored verdicts it replaced."""
    attribution: Mapping[str, Any] | None = None
    """Per-op time attribution of the cases whose timings regressed, or asked for
    (`perfguard.decision.attribution.Attribution.to_json()`); None when none was made."""

    @property
    def relative(self) -> bool:
        return self.against is not None

    @property
    def verdict(self) -> str:
        return self.judgement.verdict

    @property
    def exit_code(self) -> int:
        return self.judgement.exit_code

    @property
    def cases(self) -> tuple[CaseVerdict, ...]:
        return self.judgement.cases

    def improvement_bound(self, m: MetricVerdict) -> float | None:
        """The median below which `m` would be an improvement at this report's threshold
        (the lower end of its band); None without a band or a baseline."""
        if m.band is None or m.baseline is None:
            return None
        return m.band.improvement_below(m.baseline.median, self.improvement_threshold)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": REPORT_KIND,
            "schema_version": REPORT_SCHEMA_VERSION,
            "created": self.created,
            "environment": dict(self.environment),
            "baseline": dict(self.baseline),
            "profile": {**self.profile, "name": self.judgement.profile},
            "improvement_threshold": self.improvement_threshold,
            "settings": {
                **self.settings,
                "fail_on_missing": self.judgement.fail_on_missing,
                "advisory": self.judgement.advisory,
            },
            "cases": {c.case_id: c.to_json() for c in self.judgement.cases},
            "counts": self.judgement.counts,
            "answer": self.judgement.answer,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
        }
        if self.merged_from:
            out["merged_from"] = [dict(m) for m in self.merged_from]
        if self.against is not None:
            out["against"] = dict(self.against)
        if self.settled is not None:
            out["settled"] = dict(self.settled)
        if self.attribution is not None:
            out["attribution"] = dict(self.attribution)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        settings = dict(data["settings"])
        judgement = Judgement(
            profile=str(data["profile"]["name"]),
            cases=tuple(CaseVerdict.from_json(k, v) for k, v in sorted(data["cases"].items())),
            fail_on_missing=bool(settings.pop("fail_on_missing", False)),
            advisory=bool(settings.pop("advisory", False)),
        )
        profile = {k: v for k, v in data["profile"].items() if k != "name"}
        return cls(
            judgement=judgement,
            environment=dict(data["environment"]),
            baseline=dict(data["baseline"]),
            profile=profile,
            settings=settings,
            improvement_threshold=float(data["improvement_threshold"]),
            created=str(data["created"]),
            merged_from=tuple(data.get("merged_from", ())),
            against=dict(data["against"]) if data.get("against") is not None else None,
            settled=dict(data["settled"]) if data.get("settled") is not None else None,
            attribution=dict(data["attribution"]) if data.get("attribution") else None,
        )


def read_report(path: str | os.PathLike[str]) -> Report:
    data = _read_checked(path, "report")
    report = Report.from_json(data)
    if (report.verdict, report.exit_code) != (data["verdict"], data["exit_code"]):
        raise PerfguardError(
            f"{path}: $.verdict: says {data['verdict']!r} (exit {data['exit_code']}) but its "
            f"cases give {report.verdict!r} (exit {report.exit_code})"
        )
    return report


def write_report(path: str | os.PathLike[str], report: Report) -> dict[str, Any]:
    """Write `report` (validated first, atomically); the JSON it wrote."""
    data = report.to_json()
    validate(data, "report", f"{path} (about to be written)")
    write_json_atomic(path, data)
    return data


def merge(reports: Sequence[Report], sources: Sequence[str] | None = None) -> Report:
    """One report from the reports of shards that checked disjoint case sets.

    The shards must have used the same baseline file (same sha256), profile and
    failure settings; a case in two shards is an error rather than a silent pick.
    """
    if not reports:
        raise PerfguardError("merge: no report given")
    names = list(sources or [f"report {i + 1}" for i in range(len(reports))])
    first = reports[0]
    seen: dict[str, str] = {}
    for name, rep in zip(names, reports, strict=True):
        for attr, label in (
            (lambda r: r.baseline.get("sha256"), "baseline file (sha256)"),
            (lambda r: r.judgement.profile, "profile"),
            (lambda r: r.judgement.fail_on_missing, "--fail-on-missing"),
            (lambda r: r.judgement.advisory, "advisory"),
            (lambda r: r.environment.get("platform"), "platform"),
            (lambda r: r.relative, "kind (relative check or stored baseline)"),
            (lambda r: (r.against or {}).get("commit"), "base commit"),
        ):
            if attr(rep) != attr(first):
                raise PerfguardError(
                    f"merge: {name} differs from {names[0]} in its {label}: "
                    f"{attr(rep)!r} vs {attr(first)!r}"
                )
        for case in rep.cases:
            if case.case_id in seen:
                raise PerfguardError(
                    f"merge: case {case.case_id!r} is in both {seen[case.case_id]} and {name}: "
                    "shards must check disjoint case sets"
                )
            seen[case.case_id] = name
    cases = tuple(sorted((c for r in reports for c in r.cases), key=lambda c: c.case_id))
    judgement = dataclasses.replace(first.judgement, cases=cases)
    parts: list[Mapping[str, Any]] = []
    for name, rep in zip(names, reports, strict=True):
        if rep.merged_from:
            parts.extend(rep.merged_from)
            continue
        parts.append(
            {
                "source": name,
                "created": rep.created,
                "hostname": rep.environment.get("hostname"),
                "git_commit": rep.environment.get("git_commit"),
                "cases": [c.case_id for c in rep.cases],
                "verdict": rep.verdict,
                "exit_code": rep.exit_code,
                "settings": dict(rep.settings),
            }
        )
    return dataclasses.replace(
        first,
        judgement=judgement,
        created=utc_now(),
        merged_from=tuple(parts),
        settled=_merged_settled(reports),
    )


def _merged_settled(reports: Sequence[Report]) -> Mapping[str, Any] | None:
    """The shards' settled cases together, under the first settling check's base."""
    settled = [r.settled for r in reports if r.settled is not None]
    if not settled:
        return None
    cases = {cid: case for s in settled for cid, case in s["cases"].items()}
    unresolved = {cid: case for s in settled for cid, case in s.get("unresolved", {}).items()}
    return {**settled[0], "cases": cases, "unresolved": unresolved}


def render_json(report: Report) -> str:
    from perfguard.storage.jsonio import dumps

    return dumps(report.to_json())


# ---- building ------------------------------------------------------------------------------


def build(
    judgement: Judgement,
    *,
    environment: Mapping[str, Any],
    baseline_info: Mapping[str, Any],
    profile: Mapping[str, Any],
    settings: Mapping[str, Any],
    improvement_threshold: float,
) -> Report:
    """Assemble a report (the CLI passes what it knows about the run and the baseline)."""
    return Report(
        judgement=judgement,
        environment=dict(environment),
        baseline=dict(baseline_info),
        profile=dict(profile),
        settings=dict(settings),
        improvement_threshold=improvement_threshold,
    )


def build_against(
    judgement: Judgement,
    results: Results,
    baseline: Any,
    baseline_path: str | os.PathLike[str],
    *,
    settings: Mapping[str, Any],
) -> Report:
    """The report of `judgement` against the baseline file it was judged with: records the
    file's path and hash, and the profile the judgement used (`check` and the pytest
    plugin both report this way)."""
    from perfguard.storage.baseline import file_sha256

    return build(
        judgement,
        environment=results.environment,
        baseline_info={
            "path": str(baseline_path),
            "sha256": file_sha256(baseline_path),
            "platform": baseline.platform,
            "hardware": baseline.hardware,
            "updated": baseline.metadata.get("updated"),
        },
        profile=baseline.profile(judgement.profile).to_json(),
        settings=settings,
        improvement_threshold=baseline.improvement_threshold,
    )


def build_relative(
    judgement: Judgement,
    *,
    environment: Mapping[str, Any],
    against: Mapping[str, Any],
    settings: Mapping[str, Any],
) -> Report:
    """The report of a relative check (`perfguard.measurement.relative`): `baseline` names the base
    checkout instead of a file, and `profile.rel` holds the minimum effect per metric
    class, which is the threshold both for a regression and for an improvement."""
    from perfguard.decision.tolerances import MIN_EFFECT

    report = build(
        judgement,
        environment=environment,
        baseline_info={
            "path": str(against.get("dir")),
            "kind": "relative",
            "commit": against.get("commit"),
        },
        profile={
            "rel": dict(MIN_EFFECT),
            "abs": {},
            "description": "relative check: rel is each class's minimum effect "
            "(perfguard.decision.tolerances.MIN_EFFECT); no bands, no pads",
        },
        settings=settings,
        improvement_threshold=MIN_EFFECT["e2e"],
    )
    return dataclasses.replace(report, against=dict(against))
