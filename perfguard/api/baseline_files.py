"""`perfguard baselines ...`: inspect, compare, merge and import baseline files; nothing
is measured and torch is never imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from perfguard.decision.changes import BaselineDiff
    from perfguard.storage.baseline import Baseline
    from perfguard.storage.baseline_merge import MergeResult


def read_baseline(path: str) -> Baseline:
    """The baseline file at `path`, checked against its schema."""
    from perfguard.storage import baseline as store

    return store.load(path)


def baseline_json(baseline: Baseline, case_id: str | None = None) -> str:
    """The baseline (or its scenario `case_id`) as its file holds it."""
    from perfguard.storage.jsonio import dumps

    data = baseline.to_json()
    return dumps(data["scenarios"][case_id] if case_id else data)


def diff_baselines(a: str, b: str) -> BaselineDiff:
    """What moved from the baseline file `a` (old) to `b` (new), and how credibly
    (`perfguard.decision.changes.diff`)."""
    from perfguard.decision.changes import diff

    return diff(read_baseline(a), read_baseline(b))


def diff_json(changes: BaselineDiff) -> str:
    """A baseline diff as JSON (`baselines diff --format json`)."""
    from perfguard.storage.jsonio import dumps

    return dumps(changes.to_json())


def merge_baselines(paths: tuple[str, ...], out: str, prefer: str | None) -> MergeResult:
    """Merge the baseline files at `paths` into `out`, atomically under its lock; `prefer`
    (newest, first) resolves a case held with different figures."""
    from perfguard.storage.baseline_merge import merge_files

    return merge_files(paths, out, prefer)


def import_sglang(src: str, dst: str, platform: str | None, hardware: str | None) -> Baseline:
    """Convert sglang's perf_baselines.json at `src` into a perfguard baseline written to
    `dst` (under its lock), every figure kept."""
    from perfguard.interop.sglang import import_file
    from perfguard.storage import baseline as store

    converted = import_file(src, platform=platform, hardware=hardware)
    with store.lock(dst):
        store.save(dst, converted)
    return converted
