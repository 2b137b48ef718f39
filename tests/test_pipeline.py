"""Staged pipelines: sglang stage names, per-step timing, determinism, and each optimization
switch giving bit-identical outputs to its reference path."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import StageTimer
from perfguard.metrics import PIPELINE_STAGES
from perfguard.storage.cases import Case, load_registry, select
from perfguard.workloads.registry import build_pipeline

REPO = Path(__file__).resolve().parent.parent
SMOKE = {c.workload: c for c in select(load_registry("cpu", REPO / "cases"), tags=["smoke"])}
CPU = Platform()


@pytest.fixture(autouse=True)
def _one_thread() -> object:
    """Tiny models: one intra-op thread is fastest, and on a shared runner several threads
    per process slow every test down (GLM-Image's AR loop most)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


COMMON_STAGES = list(PIPELINE_STAGES)


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
        cond = pipe.encode(pipe.prompts)
        uncond = pipe.encode(pipe.negative_prompts)
        latents = pipe.prepare_latents()
        timesteps, _ = pipe.prepare_timesteps()
        t = pipe.model_timestep(timesteps[0])
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
def test_schedule_is_the_checkpoints_flow_match_scheduler(workload: str) -> None:
    """Qwen-Image hands the scheduler sigmas only, so its timesteps are the shifted sigmas
    times 1000, and the checkpoint's `shift_terminal = 0.02` ends the shifted schedule at
    0.02; GLM-Image hands it integer timesteps *and* sigmas, and the scheduler keeps the
    given timesteps unshifted while it shifts the sigmas."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    case = replace(SMOKE[workload], steps=30, height=256, width=512)
    pipe = build_pipeline(case, CPU)
    timesteps, sigmas = pipe.prepare_timesteps()
    seq_len = pipe.image_seq_len
    if workload == "qwen_image":
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift

        scheduler = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True,
            time_shift_type="exponential",
            shift_terminal=0.02,
            base_shift=0.5,
            max_shift=0.9,
            max_image_seq_len=8192,
        )
        mu = calculate_shift(seq_len, 256, 8192, 0.5, 0.9)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / case.steps, case.steps), mu=mu)
        assert sigmas[-2].item() == pytest.approx(0.02)
    else:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift

        scheduler = FlowMatchEulerDiscreteScheduler(
            use_dynamic_shifting=True, time_shift_type="exponential"
        )
        ts = np.linspace(1000, 1.0, case.steps + 1)[:-1].astype(np.int64).astype(np.float32)
        mu = calculate_shift(seq_len, 256, 0.25, 0.75)
        scheduler.set_timesteps(timesteps=ts, sigmas=ts / 1000, mu=mu)
        assert timesteps[1].item() == int(1000 - 999 / 30)
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

    def reversed_words(prompts: list[str]) -> list[str]:  # same lengths, other embeddings
        return [" ".join(reversed(p.split())) for p in prompts]

    with torch.inference_mode():
        cond = pipe.encode(pipe.prompts)
        uncond = pipe.encode(pipe.negative_prompts)
        latents = pipe.prepare_latents()
        t = pipe.model_timestep(pipe.prepare_timesteps()[0][0])
        graph = pl._GraphedPrediction(pipe, latents, t, cond, uncond)
        new = [
            pipe.encode(reversed_words(pipe.prompts)),
            pipe.encode(reversed_words(pipe.negative_prompts)),
        ]
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


@pytest.mark.parametrize("workload", ["qwen_image", "glm_image"])
def test_prompts_encode_to_the_cases_prompt_lengths(workload: str) -> None:
    """`prompt_lengths` are the text tokens the DiT attends to: Qwen-Image's after the
    34-token template prefix is dropped, GLM-Image's glyph tokens (the negative prompt is
    "" for GLM-Image, one `</s>`, as in diffusers)."""
    case = SMOKE[workload]
    pipe = build_pipeline(case, CPU)
    with torch.inference_mode():
        cond = pipe.encode(pipe.prompts)
        uncond = pipe.encode(pipe.negative_prompts)
    assert cond.lengths == list(case.prompt_lengths)
    assert cond.embeds.shape == (case.batch, max(case.prompt_lengths), pipe.text_dim)
    negative = 8 if workload == "qwen_image" else 1
    assert uncond.lengths == [negative] * case.batch


def test_qwen_prompt_template_prefix_is_34_tokens() -> None:
    from perfguard.workloads.components import QWEN_PROMPT_TEMPLATE, qwen_tokenizer

    tokenizer = qwen_tokenizer()
    ids = tokenizer(QWEN_PROMPT_TEMPLATE.format("red fox"))["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    assert tokens[33:36] == ["\u010a", "red", "\u0120fox"]  # "\n" after "user", then the prompt
    assert len(ids) == 34 + 2 + 5


@pytest.mark.parametrize(
    ("workload", "lengths", "match"),
    [("qwen_image", (5,), "6..1024 tokens"), ("glm_image", (1,), "at least 2 tokens")],
)
def test_prompt_lengths_the_encoder_cannot_produce_are_refused(
    workload: str, lengths: tuple[int, ...], match: str
) -> None:
    case = replace(SMOKE[workload], batch=1, prompt_lengths=lengths)
    with pytest.raises(ValueError, match=match):
        build_pipeline(case, CPU)


@pytest.mark.parametrize(
    ("serial_cfg", "cache", "hits_per_step"),
    [(True, True, 2), (True, False, 0), (False, True, 0)],
    ids=["serial_cache", "serial_no_cache", "batched"],
)
def test_counters_report_modulation_cache_hits_per_call(
    serial_cfg: bool, cache: bool, hits_per_step: int
) -> None:
    """Serial CFG's uncond pass reuses every block's projections once per step (the tiny
    DiT has 2 blocks); the reference path and batched CFG never hit."""
    case = replace(SMOKE["qwen_image"], serial_cfg=serial_cfg).with_toggles(
        qwen_modulation_cache=cache
    )
    pipe = build_pipeline(case, CPU)
    assert pipe.counters() == {}
    for _ in range(2):  # per call, not cumulative
        pipe()
        assert pipe.counters() == {"qwen_modulation_cache_hits": hits_per_step * case.steps}


def test_glm_counters_report_in_place_drops_and_prior_tokens() -> None:
    case = replace(SMOKE["glm_image"], options={})  # the full prior, as diffusers samples it
    pipe = build_pipeline(case, CPU)
    pipe()
    # cond + uncond pass per step; tokens: 2x2 target grid + 16x16 preview + 1 (64x64).
    assert pipe.counters() == {
        "glm_prior_drops_inplace": 2 * case.steps,
        "glm_prior_tokens_generated": 4 + 256 + 1,
    }
    off = build_pipeline(case.with_toggles(glm_prior_drop_inplace=False), CPU)
    off()
    assert off.counters()["glm_prior_drops_inplace"] == 0


def test_the_glm_smoke_case_samples_its_capped_prior_and_the_pr_tier_the_full_one() -> None:
    smoke = SMOKE["glm_image"]
    assert smoke.options == {"prior_tokens": 8}
    pipe = build_pipeline(smoke, CPU)
    image = pipe()
    assert pipe.counters()["glm_prior_tokens_generated"] == 8
    assert torch.isfinite(image).all()
    # The target grid's ids are the last ones sampled: a 2x2 grid, upsampled 2x.
    assert pipe.prior_token_ids.shape == (smoke.batch, 16)
    pr = [c for c in load_registry("cpu", REPO / "cases") if "pr" in c.tags]
    assert pr and all("prior_tokens" not in c.options for c in pr)


@pytest.mark.parametrize(
    ("workload", "roles"),
    [
        (
            "qwen_image",
            {
                "text_encoder": "Qwen2_5_VLForConditionalGeneration",
                "tokenizer": "Qwen2Tokenizer",
                "transformer": "QwenImageTransformer2DModel",
                "vae": "AutoencoderKLQwenImage",
                "scheduler": "FlowMatchEulerDiscreteScheduler",
            },
        ),
        (
            "glm_image",
            {
                "vision_language_encoder": "GlmImageForConditionalGeneration",
                "processor": "GlmImageProcessor",
                "text_encoder": "T5EncoderModel",
                "tokenizer": "ByT5Tokenizer",
                "transformer": "GlmImageTransformer2DModel",
                "vae": "AutoencoderKL",
                "scheduler": "FlowMatchEulerDiscreteScheduler",
            },
        ),
    ],
)
def test_components_name_each_roles_class_and_parameters(
    workload: str, roles: dict[str, str]
) -> None:
    pipe = build_pipeline(SMOKE[workload], CPU)
    components = pipe.components
    assert {role: info["class"].rsplit(".", 1)[-1] for role, info in components.items()} == roles
    assert components["text_encoder"]["class"].startswith("transformers.")
    assert components["vae"]["class"].startswith("diffusers.")
    assert components["vae"]["parameters"] == sum(p.numel() for p in pipe.vae.parameters()) > 0
    assert components["tokenizer"]["parameters"] == 0


def test_seeded_init_keeps_vae_activations_in_range() -> None:
    """N(0, 1/fan_in) weights: the decoded image is neither saturated nor constant."""
    pipe = build_pipeline(SMOKE["qwen_image"], CPU)
    image = pipe()
    assert image.std() > 0.05 and (image == 0).float().mean() < 0.5
    assert ((image == 0) | (image == 1)).float().mean() < 0.5


def test_cuda_graph_option_is_refused_off_cuda() -> None:
    case = replace(SMOKE["glm_image"], options={"cuda_graph": True})
    with pytest.raises(ValueError, match="cuda_graph needs CUDA"):
        build_pipeline(case, CPU)()


def test_bad_sizes_fail_input_validation() -> None:
    case = replace(SMOKE["glm_image"], height=48)
    with pytest.raises(ValueError, match="multiples of 32"):
        build_pipeline(case, CPU)()


def test_cond_and_uncond_passes_get_the_same_timestep_object() -> None:
    """The one deliberate difference from diffusers' loop (which divides by 1000 inside
    each call, so its uncond pass gets a new tensor and the modulation cache never hits)."""
    case = SMOKE["qwen_image"]
    pipe = build_pipeline(case, CPU)
    seen: list[torch.Tensor] = []
    pipe.transformer.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["timestep"]), with_kwargs=True
    )
    pipe()
    assert len(seen) == 2 * case.steps
    for i in range(case.steps):
        cond, uncond = seen[2 * i], seen[2 * i + 1]
        assert cond is uncond
    assert seen[0] is not seen[2]  # a new tensor each step
