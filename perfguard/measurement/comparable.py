"""Refuse to compare figures measured under different settings (threads, reference).

A check compares like with like: the thread policy a case would run with, and the
reference workload's version, must be the baseline's. These checks need the measurement
layer's thread policy and reference workload, so they live here, not in the baseline file
module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from perfguard.decision.normalize import normalized
from perfguard.device import reference
from perfguard.device.threads import case_threads
from perfguard.errors import PerfguardError
from perfguard.storage.baseline import Baseline


def check_comparable(results: Any, baseline: Baseline, source: str) -> None:
    """Refuse to compare figures measured under different thread or reference settings.

    A figure measured with 2 intra-op threads is another figure than one measured with
    1 (on the 2-core runner their between-process noise differs 4x), and a reference
    workload that changed cannot tell whether the runner is slower. Both are a
    `PerfguardError` (exit 2) naming the case and both settings; a scenario that
    recorded neither (an imported or older baseline) is compared as before.
    """
    for cid, res in sorted(results.cases.items()):
        scenario = baseline.scenarios.get(cid)
        if scenario is None or res.status != "ok":
            continue
        if scenario.threads and res.threads and scenario.threads != res.threads:
            raise PerfguardError(
                f"{source}: case {cid!r}: the baseline was measured with "
                f"{_threads(scenario.threads)}, this run with {_threads(res.threads)}: "
                "set the case's `threads` (or --threads) to match, or regenerate the baseline"
            )
        if (
            scenario.reference_version
            and res.reference
            and scenario.reference_version != reference.version()
        ):
            raise PerfguardError(
                f"{source}: case {cid!r}: the baseline's reference workload is version "
                f"{scenario.reference_version}, this perfguard's is {reference.version()}: "
                "regenerate the baseline"
            )
        if scenario.normalized and normalized(res, scenario.reference.median) is None:
            raise PerfguardError(
                f"{source}: case {cid!r}: the baseline's timings are normalized by the "
                "reference workload beside each run (timing: normalized), and these "
                "results have no reference time for every run to normalize by: measure "
                "with `perfguard run`/`check`, or make the baseline with --timing raw"
            )


def check_threads(
    cases: Iterable[Any],
    platform: str,
    baseline: Baseline,
    source: str,
    override: int | None = None,
) -> None:
    """Before anything runs: each case's intra-op thread count must be its baseline's.

    `check_comparable` checks what was measured; this checks what would be, so a check
    that cannot be compared costs nothing. Same error, exit 2.
    """
    for case in cases:
        scenario = baseline.scenarios.get(case.id)
        if scenario is None or not scenario.threads:
            continue
        want = case_threads(case, platform, override)
        if scenario.threads.get("intra_op") != want:
            raise PerfguardError(
                f"{source}: case {case.id!r}: the baseline was measured with "
                f"{scenario.threads.get('intra_op')} intra-op thread(s), this run would use "
                f"{want}: set the case's `threads` (or --threads) to match, or "
                "regenerate the baseline"
            )


def _threads(t: Mapping[str, int]) -> str:
    return f"{t.get('intra_op')} intra-op / {t.get('inter_op')} inter-op thread(s)"
