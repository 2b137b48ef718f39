"""`perfguard env` and `perfguard list-cases`: what this machine is, and which cases it
would run, from which registry files."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfguard.api.common import Echo, baseline_path, probe, shard, to_stderr
from perfguard.storage.cases import Case, Selection

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


def environment(platform: str | None = None, *, availability: bool = False) -> dict[str, Any]:
    """The environment fingerprint stored with baselines and reports; `availability`
    adds whether each platform can run here, and why not."""
    from perfguard.device import platform as platforms

    fp = platforms.fingerprint(probe(platform))
    if availability:
        fp["availability"] = {
            n: {"available": a.available, "reason": a.reason}
            for n, a in platforms.availability().items()
        }
    return fp


def listed_cases(
    selection: Selection,
    platform: Platform,
    *,
    baseline: str | None = None,
    echo: Echo = to_stderr,
) -> list[Case]:
    """The selected cases of the registry for `platform`; a shard is balanced by the
    baseline at `baseline` (default: the platform and hardware's) as check balances it."""
    from perfguard.storage.cases import load_registry

    cases = selection.of(load_registry(platform.name, selection.cases_dir))
    if selection.shard:
        path = baseline_path(baseline, platform.name, platform.hardware_slug())
        cases = shard(cases, selection.shard, path, echo=echo)
    return cases


def case_entries(cases: list[Case], platform: Platform) -> list[dict[str, Any]]:
    """Each case as JSON, with the components its pipeline will be built from (and a
    note where they cannot be known before building)."""
    from perfguard.measurement.runner import planned_components

    listed = []
    for case in cases:
        components, note = planned_components(case, platform)
        entry = {**case.to_json(), "components": components}
        if note:
            entry["components_note"] = note
        listed.append(entry)
    return listed


def registry_files(cases_dir: str | None, platform: str) -> tuple[list[str], list[str]]:
    """The registry files read for `platform`, and those for other platforms, as paths
    to show."""
    from perfguard.storage.cases import display_path, registry_root, scan_registry

    files = scan_registry(registry_root(cases_dir), platform)
    return [display_path(p) for p in files.read], [display_path(p) for p in files.other_platforms]
