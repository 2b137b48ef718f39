"""`perfguard ab`: two variants of one case, interleaved ABBA in one process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfguard.api.common import probe, select_cases
from perfguard.errors import PerfguardError
from perfguard.storage.cases import Selection

if TYPE_CHECKING:
    from perfguard.measurement.ab import ABResult

Variant = dict[str, Any]


def variants(
    toggles: Sequence[str], spec_a: str | None, spec_b: str | None
) -> tuple[Variant, Variant]:
    """Variants A and B: A without and B with the optimizations `toggles` name, or as
    `spec_a` and `spec_b` spell them (`key=value,...`); one way or the other, not both."""
    from perfguard.measurement.ab import parse_variant, toggle_variants

    if toggles and (spec_a or spec_b):
        raise PerfguardError("use either --toggle or --a/--b, not both")
    if toggles:
        return toggle_variants(toggles)
    if spec_a is not None and spec_b is not None:
        return parse_variant(spec_a), parse_variant(spec_b)
    raise PerfguardError("give --toggle NAME, or both --a and --b")


def ab(
    case_id: str,
    variant_pair: tuple[Variant, Variant],
    *,
    cases_dir: str | None = None,
    platform: str | None = None,
    pairs: int = 10,
    warmup: int = 1,
) -> ABResult:
    """Measure case `case_id` as variant A and as variant B, `pairs` A/B pairs in ABBA
    order in this process (so the drift of one process hits both), after `warmup`
    untimed runs of each; each adjacent pair is a block of the paired comparison."""
    from perfguard.measurement.ab import run_ab

    chosen = probe(platform)
    selection = Selection(cases_dir=cases_dir, case_ids=(case_id,))
    (case,) = select_cases(chosen.name, selection, preflight=False)
    variant_a, variant_b = variant_pair
    return run_ab(case, variant_a, variant_b, chosen, pairs=pairs, warmup=warmup)
