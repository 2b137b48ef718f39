"""A/B runs: ABBA order, variant parsing, and ratio estimates on real and fake pipelines."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from perfguard.decision.stats import summarize
from perfguard.device.platform import Platform
from perfguard.device.timer import stage
from perfguard.errors import PerfguardError
from perfguard.measurement.ab import (
    ABResult,
    abba_order,
    apply_variant,
    parse_variant,
    run_ab,
    toggle_variants,
)
from perfguard.storage.cases import load_registry, select
from tests.fake_pipeline import SteppedClock

REPO = Path(__file__).resolve().parent.parent
CASE = select(load_registry("cpu", REPO / "cases"), ids=["qwen_image_t2i_smoke"])[0]


def _factory(case, platform):  # type: ignore[no-untyped-def]
    slow = 1.3 if case.toggle("qwen_modulation_cache") else 1.0

    def pipeline() -> torch.Tensor:
        with stage("DenoisingStage"):
            platform.work(4.0 * slow)
        with stage("DecodingStage"):
            platform.work(2.0)
        return torch.zeros(1)

    return pipeline


def test_abba_order_alternates_blocks() -> None:
    assert "".join(abba_order(4)) == "ABBAABBA"
    assert "".join(abba_order(3)) == "ABBAAB"


def test_variant_parsing_and_errors() -> None:
    assert parse_variant("qwen_modulation_cache=off, serial_cfg=true, steps=8") == {
        "qwen_modulation_cache": False,
        "serial_cfg": True,
        "steps": 8,
    }
    for bad in ("nonsense", "turbo=1", "steps=many", "qwen_varlen_host_meta=maybe"):
        with pytest.raises(PerfguardError):
            parse_variant(bad)
    with pytest.raises(PerfguardError):
        toggle_variants(["turbo"])
    assert toggle_variants(["qwen_varlen_host_meta"]) == (
        {"qwen_varlen_host_meta": False},
        {"qwen_varlen_host_meta": True},
    )


def test_apply_variant_sets_toggles_and_fields() -> None:
    case = apply_variant(CASE, {"qwen_modulation_cache": False, "batch": 3})
    assert not case.toggle("qwen_modulation_cache") and case.batch == 3
    assert len(case.prompt_lengths) == 3


def test_a_real_slowdown_has_a_ci_above_one_and_identity_brackets_one() -> None:
    res = run_ab(
        CASE, *toggle_variants(["qwen_modulation_cache"]), SteppedClock(), pairs=8, factory=_factory
    )
    by = {c.metric: c for c in res.comparisons()}
    slow = by["stage:DenoisingStage"]
    assert slow.estimate.low > 1.1 and slow.answer.answer == "slower"
    same = by["stage:DecodingStage"]
    # Identical variants: the interval holds 1 and is narrow (3 % noise, 8 pairs). The
    # old bounds (low < 1.15, high > 0.87) held for an interval of [1.1, 1.2] too.
    assert same.estimate.low < 1.0 < same.estimate.high
    assert same.estimate.high - same.estimate.low < 0.1
    assert same.answer.answer in ("same", "cant_tell") and same.answer.detectable is not None
    assert res.order == abba_order(8)


def test_ab_on_a_real_case_keeps_outputs_identical() -> None:
    res = run_ab(CASE, *toggle_variants(["qwen_varlen_host_meta"]), Platform(), pairs=2)
    doc = res.to_json()
    assert doc["outputs_identical"] and doc["order"] == "ABBA"
    assert {c["metric"] for c in doc["comparisons"]} >= {"e2e", "stage:DenoisingStage"}


def test_pairs_are_judged_by_the_paired_engine_with_three_answers() -> None:
    """ABBA pairs as blocks: a 20 % slowdown is slower, identical figures the same."""
    a = [10.0, 10.2, 9.9, 10.1, 10.05, 9.95, 10.0, 10.1]
    res = ABResult(
        "c",
        {},
        {},
        samples_a={"e2e": a, "step_avg": a},
        samples_b={"e2e": [x * 1.2 for x in a], "step_avg": [x * 1.001 for x in a]},
    )
    by = {c.metric: c for c in res.comparisons()}
    assert by["e2e"].estimate.ratio == pytest.approx(1.2) and by["e2e"].answer.answer == "slower"
    assert by["step_avg"].answer.answer == "same" and by["step_avg"].estimate.blocks == 8
    assert summarize(a).n == 8 and summarize([5.0]).iqr == 0.0
    assert summarize(a).rel_iqr == pytest.approx(summarize(a).iqr / summarize(a).median)
