"""Every optimization runs in at least one `pr` case of every platform's registry.

A toggle that is on proves nothing by itself: `qwen_varlen_host_meta` only runs when a
batch row is padded, the modulation cache only hits when serial CFG hands the same
timestep to both passes, the in-place prior drop only runs in an uncond pass outside a
CUDA graph. So each `pr` case is run here at the `tiny` preset on the CPU, with its own
batch, prompt lengths, CFG mode and toggles, and spies on the optimized code paths record
whether each one actually ran.

Cases this process cannot stand in for count for nothing: several devices (CFG-parallel
puts the cond and uncond pass on different ranks, so the cache cannot hit anyway) and
CUDA graphs (capture switches the python-side optimizations off).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from perfguard.device.platform import probe
from perfguard.storage.cases import TOGGLES, Case, load_registry, select
from perfguard.workloads import glm_image, qwen_image
from perfguard.workloads.registry import build_pipeline

CASES = Path(__file__).resolve().parent.parent / "cases"
PLATFORMS = ("cuda", "rocm", "npu", "cpu")


class _PathSpy:
    """Counts the runs of each optimized path (the real functions still do the work)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ran = dict.fromkeys(TOGGLES, 0)
        real_ranges = qwen_image.build_varlen_mask_meta_from_ranges

        def host_meta(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.ran["qwen_varlen_host_meta"] += 1
            return real_ranges(*args, **kwargs)

        monkeypatch.setattr(qwen_image, "build_varlen_mask_meta_from_ranges", host_meta)

        block = qwen_image.QwenImageTransformerBlock
        real_mod = block._modulation_params

        def modulation(module, temb, key):  # type: ignore[no-untyped-def]
            slot = module._modulation_slot
            out = real_mod(module, temb, key)
            if slot is not None and out[0] is slot.img_mod_params:  # served from the cache
                self.ran["qwen_modulation_cache"] += 1
            return out

        monkeypatch.setattr(block, "_modulation_params", modulation)

        model = glm_image.GlmImageTransformer2DModel
        real_drop = model.drop_prior_tokens

        def drop(module, embedding, prior_token_drop):  # type: ignore[no-untyped-def]
            out = real_drop(module, embedding, prior_token_drop)
            if out is embedding and bool(torch.as_tensor(prior_token_drop).any()):
                self.ran["glm_prior_drop_inplace"] += 1  # written in place, rows dropped
            return out

        monkeypatch.setattr(model, "drop_prior_tokens", drop)


def _stand_in(case: Case) -> Case | None:
    """`case` at the tiny preset on this CPU, everything that picks a code path kept."""
    if case.num_devices > 1 or case.options.get("cuda_graph"):
        return None
    return dataclasses.replace(case, preset="tiny", height=64, width=64, steps=2, dtype="float32")


def exercised(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """toggle -> the ids of the cases in which its optimized path ran."""
    platform = probe("cpu")
    out: dict[str, list[str]] = {name: [] for name in TOGGLES}
    for case in cases:
        tiny = _stand_in(case)
        if tiny is None:
            continue
        with monkeypatch.context() as patch:
            spy = _PathSpy(patch)
            build_pipeline(tiny, platform)()
        for name, runs in spy.ran.items():
            if runs:
                out[name].append(case.id)
    return out


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_optimization_runs_in_a_pr_case(
    platform: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cases = select(load_registry(platform, CASES), tags=["pr"])
    assert cases, f"{platform}: no pr case"
    ran = exercised(cases, monkeypatch)
    missing = [name for name, ids in ran.items() if not ids]
    assert not missing, f"{platform}: no pr case runs {', '.join(missing)} (ran: {ran})"


def test_the_spies_see_a_path_that_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: one unpadded prompt runs no varlen path, and a case with a
    toggle off runs the reference path instead."""
    one_prompt = Case(
        id="one_prompt", workload="qwen_image", preset="tiny", batch=1, prompt_lengths=(128,)
    )
    cache_off = dataclasses.replace(
        one_prompt, id="cache_off", toggles={"qwen_modulation_cache": False}
    )
    no_cfg_glm = Case(id="glm_no_cfg", workload="glm_image", preset="tiny", guidance_scale=1.0)
    ran = exercised([one_prompt, cache_off, no_cfg_glm], monkeypatch)
    assert ran == {
        "glm_prior_drop_inplace": [],
        "qwen_modulation_cache": ["one_prompt"],
        "qwen_varlen_host_meta": [],
    }
