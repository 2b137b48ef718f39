"""perfguard's pipelines run diffusers' loops: with the same components, seed and prompts,
the latents and the image equal diffusers 0.42's `QwenImagePipeline` / `GlmImagePipeline`
(float32, at most 1e-5 apart).

diffusers gets perfguard's own text encoder, tokenizer, VAE and AR model objects, a
scheduler from the same config, and diffusers' DiT loaded with perfguard's DiT weights
(the DiTs themselves are pinned equal in test_models_vs_diffusers.py). Weights are drawn
larger than the presets' init so a mismatch in the loop cannot hide in small values.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from perfguard.device.platform import Platform  # noqa: E402
from perfguard.storage.cases import Case, load_registry, select  # noqa: E402
from perfguard.workloads.components import SCHEDULER_CONFIGS  # noqa: E402
from perfguard.workloads.presets import get_preset, init_weights_  # noqa: E402
from perfguard.workloads.registry import build_pipeline  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SMOKE = {c.workload: c for c in select(load_registry("cpu", REPO / "cases"), tags=["smoke"])}
CPU = Platform()
ATOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _pair(case: Case, diffusers_cls: type):
    pipe = build_pipeline(case, CPU)
    init_weights_(pipe.transformer, case.seed, std=0.1)
    theirs = diffusers_cls(**get_preset(case.workload, case.preset)).eval()
    theirs.load_state_dict(pipe.transformer.state_dict(), strict=True)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler.from_config(
        SCHEDULER_CONFIGS[case.workload]
    )
    return pipe, theirs, scheduler


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a.float() - b.float()).abs().max().item()


def _reference_images(
    reference: Any, pipe: Any, case: Case, output_type: str, **arguments: Any
) -> torch.Tensor:
    """diffusers' pipeline on our pipeline's prompts at the case's size, steps and seed,
    with the model's own `arguments`."""
    return reference(
        prompt=pipe.prompts,
        height=case.height,
        width=case.width,
        num_inference_steps=case.steps,
        generator=torch.Generator().manual_seed(case.seed),
        output_type=output_type,
        **arguments,
    ).images


@pytest.mark.parametrize("guidance_scale", [4.0, 1.0], ids=["true_cfg", "no_cfg"])
def test_qwen_image_latents_and_image_equal_diffusers(guidance_scale: float) -> None:
    case = replace(SMOKE["qwen_image"], steps=3, guidance_scale=guidance_scale)
    pipe, transformer, scheduler = _pair(case, diffusers.QwenImageTransformer2DModel)
    reference = diffusers.QwenImagePipeline(
        scheduler=scheduler,
        vae=pipe.vae,
        text_encoder=pipe.text_encoder,
        tokenizer=pipe.tokenizer,
        transformer=transformer,
    )
    reference.set_progress_bar_config(disable=True)

    cfg = {
        "negative_prompt": pipe.negative_prompts if case.cfg else None,
        "true_cfg_scale": case.guidance_scale,
    }
    theirs = functools.partial(_reference_images, reference, pipe, case, **cfg)

    latents = pipe.generate("latent")
    image = pipe.generate()
    assert len(set(case.prompt_lengths)) > 1  # a padded row: the masked path is compared
    assert _max_diff(latents, theirs("latent")) <= ATOL
    assert _max_diff(image, theirs("pt")) <= ATOL
    assert image.std() > 1e-3  # a real image, not a constant the comparison could pass on


def _glm_reference(case: Case):  # type: ignore[no-untyped-def]
    """diffusers' GlmImagePipeline on our pipeline's components and diffusers' own DiT
    (with our DiT's weights), and our pipeline."""
    pipe, transformer, scheduler = _pair(case, diffusers.GlmImageTransformer2DModel)
    reference = diffusers.GlmImagePipeline(
        tokenizer=pipe.tokenizer,
        processor=pipe.processor,
        text_encoder=pipe.text_encoder,
        vision_language_encoder=pipe.vision_language_encoder,
        vae=pipe.vae,
        transformer=transformer,
        scheduler=scheduler,
    )
    return reference, pipe


def test_glm_image_latents_and_image_equal_diffusers_given_the_prior_tokens() -> None:
    case = replace(SMOKE["glm_image"], steps=3, options={})  # diffusers samples the full prior
    reference, pipe = _glm_reference(case)
    reference.set_progress_bar_config(disable=True)
    image = pipe.generate()
    prior = pipe.prior_token_ids.clone()
    latents = pipe.generate("latent")

    given = {"guidance_scale": case.guidance_scale, "prior_token_ids": prior}
    theirs = functools.partial(_reference_images, reference, pipe, case, **given)

    assert _max_diff(latents, theirs("latent")) <= ATOL
    assert _max_diff(image, theirs("pt")) <= ATOL
    assert image.std() > 1e-3


def test_glm_prior_tokens_equal_diffusers_generate_prior_tokens() -> None:
    """The AR stage: the processor's target + preview grids, grid tokens + 1 sampled with
    the case's seed, the target grid taken after the preview and upsampled 2x."""
    case = replace(SMOKE["glm_image"], options={})  # diffusers samples the full prior
    reference, pipe = _glm_reference(case)
    ours = pipe.generate_prior_tokens()
    theirs, _, _ = reference.generate_prior_tokens(
        prompt=pipe.prompts,
        height=case.height,
        width=case.width,
        device=torch.device("cpu"),
        generator=torch.Generator().manual_seed(case.seed),
    )
    grid = (case.height // 16) * (case.width // 16)
    assert ours.shape == (case.batch, grid)
    assert torch.equal(ours, theirs)
    assert len(torch.unique(ours)) > 1
    other = replace(case, seed=case.seed + 1)
    assert not torch.equal(ours, build_pipeline(other, CPU).generate_prior_tokens())
