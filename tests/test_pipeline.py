"""Staged pipelines: sglang stage names, per-step timing, determinism, and each optimization
switch giving bit-identical outputs to its reference path."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize(
    ("guidance_scale", "serial_cfg", "passes"),
    [(1.0, True, 1), (4.0, True, 2), (4.0, False, 1)],
    ids=["no_cfg", "serial_cfg", "batched_cfg"],
)
def test_transformer_passes_per_step(guidance_scale: float, serial_cfg: bool, passes: int) -> None:
    case = replace(SMOKE["qwen_image"], guidance_scale=guidance_scale, serial_cfg=serial_cfg)
    pipe = build_pipeline(case, CPU)
    calls: list[int] = []
    pipe.transformer.register_forward_hook(lambda mod, args, out: calls.append(1))
    out = pipe()
    assert len(calls) == passes * case.steps and torch.isfinite(out).all()


@pytest.mark.parametrize("workload", ["qwen_image", "glm_image"])
def test_schedule_matches_diffusers_flow_match_scheduler(workload: str) -> None:
    """Qwen-Image hands the scheduler sigmas only, so its timesteps are the shifted sigmas
    times 1000; GLM-Image hands it integer timesteps *and* sigmas, and the scheduler keeps
    the given timesteps unshifted while it shifts the sigmas."""
    pytest.importorskip("diffusers")
    from diffusers import FlowMatchEulerDiscreteScheduler

    case = replace(SMOKE[workload], steps=30, height=256, width=512)
    pipe = build_pipeline(case, CPU)
    timesteps, sigmas = pipe.prepare_timesteps()
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, time_shift_type="exponential"
    )
    seq_len = pipe.image_seq_len
    if workload == "qwen_image":
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        mu = calculate_shift(seq_len, 256, 4096, 0.5, 1.15)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / case.steps, case.steps), mu=mu)
    else:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift

        ts = np.linspace(1000, 1.0, case.steps + 1)[:-1].astype(np.int64).astype(np.float32)
        mu = calculate_shift(seq_len, 256, 0.25, 0.75)
        scheduler.set_timesteps(timesteps=ts, sigmas=ts / 1000, mu=mu)
    torch.testing.assert_close(timesteps, scheduler.timesteps, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=1e-5, atol=1e-6)


def test_glm_prior_buffers_are_refilled_in_place() -> None:
    """A captured CUDA graph reads the prior tokens and drop masks at their capture-time
    addresses, so a later call must refill those tensors, not rebind new ones."""
    pipe = build_pipeline(SMOKE["glm_image"], CPU)
    pipe()
    buffers = (pipe.prior_token_ids, pipe.drop_cond, pipe.drop_uncond)
    ids = pipe.prior_token_ids.clone()
    pipe()
    assert all(
        a is b
        for a, b in zip(
            buffers, (pipe.prior_token_ids, pipe.drop_cond, pipe.drop_uncond), strict=True
        )
    )
    assert torch.equal(pipe.prior_token_ids, ids) and ids.any()


def test_graphed_prediction_refills_its_static_inputs_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replay reads the capture-time addresses: each call must copy this call's latents,
    timestep and prompt embeddings into the graph's own buffers. (CUDA faked on CPU: the
    capture records nothing; what is checked is what a replay would read.)"""
    from perfguard.workloads import pipeline as pl

    class _Stream:
        def wait_stream(self, other: object) -> None:
            pass

    class _Graph:
        def replay(self) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", _Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    case = SMOKE["qwen_image"]
    pipe = build_pipeline(case, CPU)
    with torch.inference_mode():
        cond = pipe.encode(case.prompt_lengths, salt=11)
        uncond = pipe.encode((8,) * case.batch, salt=13)
        latents = pipe.prepare_latents()
        t = pipe.model_timestep(pipe.prepare_timesteps()[0][:1].expand(case.batch))
        graph = pl._GraphedPrediction(pipe, latents, t, cond, uncond)
        new = [pipe.encode(case.prompt_lengths, salt=17), pipe.encode((8,) * case.batch, salt=19)]
        graph(latents + 1, t + 1, *new)
    assert torch.equal(graph.static_latents, latents + 1)
    assert torch.equal(graph.static_timestep, t + 1)
    assert graph.static_uncond is not None
    statics = (graph.static_cond, graph.static_uncond)
    for static, old, text in zip(statics, (cond, uncond), new, strict=True):
        assert not torch.equal(text.embeds, old.embeds)  # so that the check below can fail
        assert torch.equal(static.embeds, text.embeds)


def test_cuda_graph_refuses_prompts_that_batched_cfg_would_pad() -> None:
    """Batched CFG pads the prompt and the 8-token negative prompt to one length: the
    padded mask path calls nonzero(), which a CUDA graph cannot capture."""
    case = replace(
        SMOKE["qwen_image"],
        prompt_lengths=(12, 12),
        serial_cfg=False,
        options={"cuda_graph": True},
    )
    with pytest.raises(ValueError, match="padded prompts"):
        build_pipeline(case, Platform(name="cuda"))()


def test_standin_decoder_keeps_its_scale_at_full_size() -> None:
    """Seeded by fan-in (a conv's in * k * k), the `full` stand-in decoder's 8 convs neither
    blow activations up (float16 overflows at 65504) nor pin the tanh output at +-1."""
    from perfguard.workloads.pipeline import _STANDIN_SIZES, _seeded_init
    from perfguard.workloads.standins import StandInVaeDecoder

    sizes = _STANDIN_SIZES["full"]
    decoder = _seeded_init(StandInVaeDecoder(16, channels=sizes[3], num_layers=sizes[4]), 2)
    latents = torch.randn(1, 16, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = decoder.up(decoder.conv_in(latents))
        image = decoder(latents)
    assert hidden.abs().max() < 100
    assert (image.abs() > 0.99).float().mean() < 0.01


def test_cuda_graph_option_is_refused_off_cuda() -> None:
    case = replace(SMOKE["glm_image"], options={"cuda_graph": True})
    with pytest.raises(ValueError, match="cuda_graph needs CUDA"):
        build_pipeline(case, CPU)()


def test_bad_sizes_fail_input_validation() -> None:
    case = replace(SMOKE["glm_image"], height=48)
    with pytest.raises(ValueError, match="multiples of 32"):
        build_pipeline(case, CPU)()
