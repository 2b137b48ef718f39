"""Merging baseline files: the shards of one refresh, or two files that overlap, into one.

`gen-baselines --shard k/n` lets each shard job measure its share of the cases into its
own file; `merge` joins them. Scenarios are deduplicated by case id: a case that several
inputs hold with the same figures is one scenario, and a case they hold with different
figures is a conflict. A conflict is an error by default, naming both files, the case and
the first metric that differs, because silently keeping one of two measurements (as
sglang's case registry does with duplicate ids) hides that one was thrown away. `prefer`
resolves conflicts explicitly: `newest` keeps the scenario measured last (its `updated`
stamp; an undated, imported one ranks below any dated one), which is what a refresh
wants; `first` keeps the first input's.

Only files whose figures are comparable merge: the same platform, hardware slug, thread
policy, tolerance profiles (with improvement threshold and step sampling) and schema
version. A merged file is judged with one set of bands, so a file measured elsewhere or
under other settings would be judged with bands that were never meant for it.

Human input is never lost: every input's `notes` and `tolerance_overrides` of a case are
kept (an override of the same key with different values in two inputs is an error).
Each scenario the inputs did not all agree on records the file it was taken from
(`source`); merging a file with itself gives the same file back, byte for byte.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.metrics import metric_sort_key
from perfguard.storage.baseline import Baseline, Scenario, lock, parse, save
from perfguard.storage.jsonio import read_json

PREFER_NEWEST = "newest"
PREFER_FIRST = "first"
PREFER_CHOICES = (PREFER_NEWEST, PREFER_FIRST)

_HUMAN_INPUT = ("notes", "tolerance_overrides", "source")
"""Scenario fields that are not figures: merged across inputs rather than compared."""


@dataclass(frozen=True)
class MergeInput:
    """One input file: its path as given, the parsed baseline, and the file's JSON."""

    path: str
    baseline: Baseline
    data: Mapping[str, Any]


@dataclass(frozen=True)
class Conflict:
    """A case held with different figures by several inputs, and what resolved it."""

    case_id: str
    kept: str
    dropped: tuple[str, ...]
    metric: str


@dataclass(frozen=True)
class MergeResult:
    baseline: Baseline
    inputs: tuple[str, ...]
    collapsed: tuple[str, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)


def read_input(path: str | os.PathLike[str]) -> MergeInput:
    """Read and validate one input; a file that is not a baseline is a one-line error."""
    data = read_json(path)
    return MergeInput(str(path), parse(data, str(path)), data)


# ---- comparability -------------------------------------------------------------------------


def _thread_policy(data: Mapping[str, Any]) -> Any:
    """The file's recorded thread policy (`metadata.threads`), or None when not recorded."""
    return data.get("metadata", {}).get("threads")


def _scenario_threads(scenario: Mapping[str, Any]) -> Any:
    """A scenario's intra-op thread count: its own `threads`, else its case's, else None."""
    if scenario.get("threads") is not None:
        return scenario["threads"]
    case = scenario.get("case")
    return case.get("threads") if isinstance(case, Mapping) else None


def _comparable_fields(item: MergeInput) -> list[tuple[str, Any]]:
    """The fields two inputs must agree on, as (name, value); None means "not recorded"."""
    b = item.baseline
    return [
        ("schema_version", item.data.get("schema_version")),
        ("metadata.platform", b.platform),
        ("metadata.hardware", b.hardware),
        ("metadata.threads", _thread_policy(item.data)),
        ("metadata.advisory", bool(b.metadata.get("advisory", False))),
        ("tolerances", {n: p.to_json() for n, p in sorted(b.profiles.items())}),
        ("improvement_threshold", b.improvement_threshold),
        ("sampling.step_fractions", b.step_fractions),
    ]


_UNKNOWN_WHEN_ABSENT = ("metadata.threads",)
"""Fields that older files do not record: absent means unknown, so it is not compared.

Assuming the CPU default of one thread for a file written before threads were recorded
would be a guess; the figures of two files are incomparable only when both say which
thread count they used and the counts differ.
"""


def check_comparable(inputs: Sequence[MergeInput]) -> None:
    """Raise (exit 2) naming the first field on which an input disagrees with the first.

    The thread policy is compared only where both files record it
    (`_UNKNOWN_WHEN_ABSENT`); every other field is compared as read, absent included.
    """
    first = inputs[0]
    reference = dict(_comparable_fields(first))
    for item in inputs[1:]:
        for name, value in _comparable_fields(item):
            ref = reference[name]
            if ref == value or (name in _UNKNOWN_WHEN_ABSENT and None in (ref, value)):
                continue
            where, value, ref = _first_mismatch(name, value, ref)
            raise PerfguardError(
                f"{item.path}: {where}: {value!r} != {ref!r} ({first.path}): baselines "
                "measured under different settings cannot be merged"
            )


def _first_mismatch(name: str, a: Any, b: Any) -> tuple[str, Any, Any]:
    """The dotted path of the first difference between two JSON-like values, with both."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            if a.get(key) != b.get(key):
                return _first_mismatch(f"{name}.{key}", a.get(key), b.get(key))
    return name, a, b


# ---- scenarios -----------------------------------------------------------------------------


def _figures(scenario: Scenario) -> dict[str, Any]:
    data = scenario.to_json()
    for key in _HUMAN_INPUT:
        data.pop(key, None)
    return data


def _first_difference(a: Scenario, b: Scenario) -> str:
    """The first metric (in metric order) whose summary differs, else the first other field."""
    for metric in sorted(set(a.metrics) | set(b.metrics), key=metric_sort_key):
        sa, sb = a.metrics.get(metric), b.metrics.get(metric)
        if (sa is None) != (sb is None) or (sa and sb and sa.to_json(3) != sb.to_json(3)):
            return metric
    fa, fb = _figures(a), _figures(b)
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            return key
    return "?"  # pragma: no cover - only called on scenarios whose figures differ


def _timestamp(value: Any, where: str) -> _dt.datetime:
    try:
        stamp = _dt.datetime.fromisoformat(str(value))
    except ValueError:
        raise PerfguardError(f"{where}: {value!r} is not an ISO 8601 time") from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=_dt.timezone.utc)
    return stamp


def _updated(item: MergeInput, case_id: str) -> tuple[bool, _dt.datetime]:
    """When a scenario was measured, as a sort key: (dated, its `updated` or its file's).

    A scenario that carries its own time (every one `gen-baselines` writes) is newer than
    one that does not (an imported figure): the file's `updated` says when any case in
    it was last written, not this one, so it only orders scenarios that are both undated.
    """
    own = item.baseline.scenarios[case_id].updated
    if own is not None:
        return True, _timestamp(own, f"{item.path}: $.scenarios.{case_id}.updated")
    file_time = item.baseline.metadata.get("updated")
    return False, _timestamp(file_time, f"{item.path}: $.metadata.updated")


def _merge_notes(holders: Sequence[tuple[MergeInput, Scenario]]) -> str | None:
    """The notes, when every input has the same; else each distinct line once, in order."""
    if len({scenario.notes for _, scenario in holders}) == 1:
        return holders[0][1].notes
    lines: list[str] = []
    for _, scenario in holders:
        for line in (scenario.notes or "").splitlines():
            if line.strip() and line not in lines:
                lines.append(line)
    return "\n".join(lines) if lines else None


def _merge_overrides(
    case_id: str, holders: Sequence[tuple[MergeInput, Scenario]]
) -> dict[str, dict[str, float]]:
    """The union of every input's overrides; one key and field with two values is an error."""
    merged: dict[str, dict[str, float]] = {}
    owner: dict[tuple[str, str], str] = {}
    for item, scenario in holders:
        for key, band in sorted(scenario.tolerance_overrides.items()):
            for part, value in sorted(band.items()):
                before = merged.get(key, {}).get(part)
                if before is not None and before != value:
                    raise PerfguardError(
                        f"{item.path}: scenarios.{case_id}.tolerance_overrides.{key}.{part} "
                        f"is {value:g} but {owner[(key, part)]} has {before:g}: resolve the "
                        "override by hand before merging"
                    )
                merged.setdefault(key, {})[part] = value
                owner.setdefault((key, part), item.path)
    return merged


def _choose(
    case_id: str, holders: Sequence[tuple[MergeInput, Scenario]], prefer: str | None
) -> tuple[int, Conflict | None]:
    """The index in `holders` of the scenario to keep, and the conflict it resolved."""
    distinct = [0]
    for i in range(1, len(holders)):
        if all(_figures(holders[i][1]) != _figures(holders[j][1]) for j in distinct):
            distinct.append(i)
    if len(distinct) == 1:
        return 0, None
    a, b = holders[distinct[0]], holders[distinct[1]]
    metric = _first_difference(a[1], b[1])
    if prefer is None:
        raise PerfguardError(
            f"{b[0].path}: scenario {case_id!r} differs from {a[0].path} (first in {metric}): "
            "choose with --prefer newest or --prefer first"
        )
    if prefer == PREFER_FIRST:
        kept = distinct[0]
    else:
        stamps = {i: _updated(holders[i][0], case_id) for i in distinct}
        latest = max(stamps.values())
        tied = [i for i in distinct if stamps[i] == latest]
        if len(tied) > 1:
            x, y = holders[tied[0]][0].path, holders[tied[1]][0].path
            raise PerfguardError(
                f"{y}: scenario {case_id!r} differs from {x} and both were updated at "
                f"{latest[1].isoformat()}: --prefer newest cannot choose; use --prefer first"
            )
        kept = tied[0]
    figures = _figures(holders[kept][1])
    dropped = tuple(dict.fromkeys(item.path for item, s in holders if _figures(s) != figures))
    return kept, Conflict(case_id, holders[kept][0].path, dropped, metric)


def merge(inputs: Sequence[MergeInput], prefer: str | None = None) -> MergeResult:
    """The merged baseline of `inputs` (in order); raises on incomparable inputs or conflicts."""
    if not inputs:
        raise PerfguardError("baselines merge needs at least one input file")
    if prefer is not None and prefer not in PREFER_CHOICES:
        raise PerfguardError(f"--prefer must be one of {', '.join(PREFER_CHOICES)}, not {prefer!r}")
    check_comparable(inputs)
    scenarios: dict[str, Scenario] = {}
    collapsed: list[str] = []
    conflicts: list[Conflict] = []
    sources: dict[str, str] = {}
    case_ids = sorted({cid for item in inputs for cid in item.baseline.scenarios})
    for cid in case_ids:
        holders = [(i, i.baseline.scenarios[cid]) for i in inputs if cid in i.baseline.scenarios]
        _check_threads(cid, holders)
        kept, conflict = _choose(cid, holders, prefer)
        item, chosen = holders[kept]
        everywhere = len(holders) == len(inputs) and conflict is None
        if conflict is not None:
            conflicts.append(conflict)
        elif len(holders) > 1:
            collapsed.append(cid)
        source = chosen.source if everywhere else item.path
        if source is not None:
            sources[cid] = source
        scenarios[cid] = replace(
            chosen,
            notes=_merge_notes(holders),
            tolerance_overrides=_merge_overrides(cid, holders),
            source=source,
        )
    base, first_created = _file_fields(inputs)
    merged = replace(
        base,
        metadata={**base.metadata, "created": first_created},
        scenarios=scenarios,
        extra=_merge_extra(inputs),
    )
    return MergeResult(
        merged,
        tuple(i.path for i in inputs),
        tuple(collapsed),
        tuple(conflicts),
        sources,
    )


def _check_threads(cid: str, holders: Sequence[tuple[MergeInput, Scenario]]) -> None:
    """Figures measured with different thread counts are not one case's: refuse them."""
    threads = {
        item.path: _scenario_threads(item.data["scenarios"][cid])
        for item, _ in holders
        if _scenario_threads(item.data["scenarios"][cid]) is not None
    }
    if len(set(map(repr, threads.values()))) > 1:
        (pa, ta), (pb, tb) = list(threads.items())[:2]
        raise PerfguardError(
            f"{pb}: scenarios.{cid}: threads {tb!r} != {ta!r} ({pa}): figures measured "
            "with different thread counts cannot be merged"
        )


def _file_fields(inputs: Sequence[MergeInput]) -> tuple[Baseline, Any]:
    """The input whose file-level fields the merge keeps, and the earliest `created`.

    The file-level fields are the most recently updated input's (its environment is that
    of the last measurement); `created` is the earliest input's.
    """
    updated = [
        _timestamp(i.baseline.metadata["updated"], f"{i.path}: $.metadata.updated") for i in inputs
    ]
    created = [
        _timestamp(i.baseline.metadata["created"], f"{i.path}: $.metadata.created") for i in inputs
    ]
    base = inputs[updated.index(max(updated))].baseline
    return base, inputs[created.index(min(created))].baseline.metadata["created"]


def _merge_extra(inputs: Sequence[MergeInput]) -> dict[str, Any]:
    """Every input's `sglang_extra`, which must agree key by key."""
    extra: dict[str, Any] = {}
    for item in inputs:
        for key, value in item.baseline.extra.items():
            if key in extra and extra[key] != value:
                raise PerfguardError(
                    f"{item.path}: sglang_extra.{key} differs from another input's: "
                    "resolve it by hand before merging"
                )
            extra[key] = value
    return extra


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def merge_files(
    paths: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    prefer: str | None = None,
) -> MergeResult:
    """Merge the baseline files at `paths` into `out`, atomically, holding `out`'s lock.

    Everything is read and checked before anything is written: a bad input, a conflict or
    an incomparable file leaves `out` exactly as it was. `out` may be one of the inputs.
    An existing `out` that is not an input must be a baseline of the same platform and
    hardware (it is replaced, as `gen-baselines` would update it); anything else there
    is refused rather than overwritten.
    """
    with lock(out):
        inputs = [read_input(p) for p in paths]
        result = merge(inputs, prefer)
        if Path(out).exists() and not any(_same_file(out, p) for p in paths):
            existing = read_input(out).baseline
            merged = result.baseline
            if (existing.platform, existing.hardware) != (merged.platform, merged.hardware):
                raise PerfguardError(
                    f"{out}: --out is a baseline of {existing.platform}/{existing.hardware}, "
                    f"not {merged.platform}/{merged.hardware}: refusing to replace it"
                )
        save(out, result.baseline)
    return result
