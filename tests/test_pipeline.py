"""Staged pipelines: sglang stage names, per-step timing, determinism, and each optimization
switch giving bit-identical outputs to its reference path."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from perfguard.cases import Case, load_registry, select
from perfguard.platform import Platform
from perfguard.timer import StageTimer
from perfguard.workloads.pipeline import build_pipeline

REPO = Path(__file__).resolve().parent.parent
SMOKE = {c.workload: c for c in select(load_registry("cpu", REPO / "cases"), tags=["smoke"])}
CPU = Platform()

COMMON_STAGES = [
    "InputValidationStage",
    "TextEncodingStage",
    "LatentPreparationStage",
    "TimestepPreparationStage",
    "DenoisingStage",
    "DecodingStage",
]


def _run(case: Case) -> tuple[torch.Tensor, dict[str, float], list[float]]:
    pipe = build_pipeline(case, CPU)
    with StageTimer(CPU) as timer:
        out = pipe()
    rec = timer.record()
    return out, rec.stages_ms, rec.steps_ms


@pytest.mark.parametrize("workload", ["qwen_image", "glm_image"])
def test_every_stage_and_step_is_timed(workload: str) -> None:
    case = SMOKE[workload]
    out, stages, steps = _run(case)
    expected = list(COMMON_STAGES)
    if workload == "glm_image":
        expected.insert(2, "PriorTokenGenerationStage")
    assert list(stages) == expected
    assert len(steps) == case.steps
    assert sum(steps) <= stages["DenoisingStage"]
    assert out.shape == (case.batch, 3, case.height, case.width)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("workload", ["qwen_image", "glm_image"])
def test_same_case_and_seed_give_the_same_output(workload: str) -> None:
    case = SMOKE[workload]
    pipe = build_pipeline(case, CPU)
    first, second = pipe(), pipe()
    assert torch.equal(first, second)
    assert torch.equal(first, build_pipeline(case, CPU)())
    other_seed = build_pipeline(replace(case, seed=case.seed + 1), CPU)()
    assert not torch.equal(first, other_seed)


@pytest.mark.parametrize(
    ("workload", "toggle"),
    [
        ("qwen_image", "qwen_modulation_cache"),
        ("qwen_image", "qwen_varlen_host_meta"),
        ("glm_image", "glm_prior_drop_inplace"),
    ],
)
def test_optimized_and_reference_paths_give_bit_identical_outputs(
    workload: str, toggle: str
) -> None:
    case = SMOKE[workload]
    if workload == "qwen_image":
        assert len(set(case.prompt_lengths)) > 1, "the smoke case must pad a prompt"
    optimized = build_pipeline(case.with_toggles(**{toggle: True}), CPU)()
    reference = build_pipeline(case.with_toggles(**{toggle: False}), CPU)()
    assert torch.equal(optimized, reference)


def test_batched_cfg_matches_serial_cfg_on_a_step() -> None:
    """Batched CFG pads the negative prompt to the prompt's length under a mask, so one
    guided prediction equals the serial one up to float rounding. (Over several steps the
    random-weight model amplifies rounding, so whole outputs are not compared. GLM-Image
    takes no text mask: its zero-padded rows do take softmax weight, so it is not expected
    to match.)"""
    case = SMOKE["qwen_image"]
    pipe = build_pipeline(case, CPU)
    with torch.inference_mode():
        cond = pipe.encode(case.prompt_lengths, salt=11)
        uncond = pipe.encode((8,) * case.batch, salt=13)
        latents = pipe.prepare_latents()
        timesteps, _ = pipe.prepare_timesteps()
        t = pipe.model_timestep(timesteps[0].expand(case.batch))
        serial = pipe.guided_prediction(latents, t, cond, uncond)
        pipe.case = replace(case, serial_cfg=False)
        batched = pipe.guided_prediction(latents, t, cond, uncond)
    torch.testing.assert_close(batched, serial, rtol=1e-5, atol=1e-6)


def test_no_cfg_runs_one_pass_per_step() -> None:
    case = replace(SMOKE["qwen_image"], guidance_scale=1.0)
    out, _, steps = _run(case)
    assert len(steps) == case.steps and torch.isfinite(out).all()


def test_cuda_graph_option_is_refused_off_cuda() -> None:
    case = replace(SMOKE["glm_image"], options={"cuda_graph": True})
    with pytest.raises(ValueError, match="cuda_graph needs CUDA"):
        build_pipeline(case, CPU)()


def test_bad_sizes_fail_input_validation() -> None:
    case = replace(SMOKE["glm_image"], height=48)
    with pytest.raises(ValueError, match="multiples of 32"):
        build_pipeline(case, CPU)()
