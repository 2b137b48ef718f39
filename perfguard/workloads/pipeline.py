"""Staged text-to-image pipelines: the stages both models share, every component real.

The model-specific parts are one file per model, as diffusers does:
`qwen_image_pipeline.py` and `glm_image_pipeline.py`; `registry.py` maps a case's
`workload` to its pipeline.

Each call runs sglang's stages, each marked on the ambient stage timer:

| stage                        | what runs                                                     |
|------------------------------|---------------------------------------------------------------|
| `InputValidationStage`       | shape and argument checks                                     |
| `TextEncodingStage`          | Qwen-Image: Qwen2.5-VL over the prompt template, prefix       |
|                              | dropped; GLM-Image: the ByT5 glyph encoder over quoted text   |
| `PriorTokenGenerationStage`  | GLM-Image only: the AR model samples the prior tokens (1)     |
| `LatentPreparationStage`     | seeded Gaussian latents (packed 2x2 for Qwen-Image)           |
| `TimestepPreparationStage`   | the checkpoint's FlowMatchEulerDiscreteScheduler, with the    |
|                              | resolution-dependent shift                                    |
| `DenoisingStage`             | one `step(i)` per step: cond pass, uncond pass, guidance,     |
|                              | scheduler step                                                |
| `DecodingStage`              | the VAE decodes the de-normalized latents; postprocess        |

(1) sglang folds prior-token generation into `GlmImageBeforeDenoisingStage`; perfguard
times it on its own so a change in the prior does not hide in another stage's figure.

The components are those of diffusers 0.42's `QwenImagePipeline` and `GlmImagePipeline`
(`components.py`), and the loop is theirs: with the same components, seed and prompts the
latents and the image equal diffusers' (tests/test_pipeline_vs_diffusers.py). One
difference is kept on purpose: perfguard computes the model's timestep once per step and
passes that *same tensor object* to the cond and the uncond pass, as sglang does. diffusers
computes `timestep / 1000` inside each call, so Qwen-Image's modulation cache (keyed by
the timestep's identity) can never hit in diffusers' loop; the values are equal.

Serial CFG runs the cond pass then the uncond pass; batched CFG (`serial_cfg = false`)
concatenates both into one pass. With `torch.distributed` initialised on two ranks, CFG
runs in parallel (rank 0 cond, rank 1 uncond, then an all-gather), as sglang does with
`--enable-cfg-parallel`.

With `options.cuda_graph` the guided prediction is captured once, in step 0 of the
pipeline's first call (a warm-up run unless `--warmup 0`, whose step 0 then carries the
capture), and replayed on every later step and call (`_GraphedPrediction`).

Runs are seeded and deterministic: the same case and seed give the same output tensor.
A pipeline exposes `components` (role -> class and parameter count) and `counters()`
(what the optimizations did in the last call, e.g. modulation-cache hits).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import stage, step
from perfguard.storage.cases import Case
from perfguard.workloads.components import (
    SCHEDULER_CONFIGS,
    WORDS,
    component_info,
)
from perfguard.workloads.graphs import breakable_cuda_graph
from perfguard.workloads.presets import build_model

VAE_SCALE = 8
NEGATIVE_PROMPT_TOKENS = 8  # Qwen-Image's, in DiT tokens (GLM-Image's is "": one glyph token)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Text:
    embeds: torch.Tensor  # [B, T, D]
    mask: torch.Tensor | None  # [B, T] bool, None when no row is padded
    lengths: list[int]

    def clone(self) -> _Text:
        mask = None if self.mask is None else self.mask.clone()
        return _Text(self.embeds.clone(), mask, list(self.lengths))

    def refill(self, other: _Text) -> None:
        """Copy `other`'s values into this text's tensors (a CUDA graph's static inputs)."""
        self.embeds.copy_(other.embeds)
        if self.mask is not None and other.mask is not None:
            self.mask.copy_(other.mask)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class T2IPipeline:
    """The stages shared by both workloads; subclasses supply the model-specific parts."""

    toggle_names: tuple[str, ...] = ()
    text_dim: int = 0
    latent_channels: int = 16
    size_multiple = VAE_SCALE * 2  # a 2x2 patch of latents

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        self.case = case
        self.platform = platform
        self.device = device
        self.dtype = DTYPES[case.dtype]
        self.transformer = build_model(
            case.workload,
            case.preset,
            device=device,
            dtype=self.dtype,
            seed=case.seed,
            toggles={name: case.toggle(name) for name in self.toggle_names},
        )
        from diffusers.image_processor import VaeImageProcessor
        from diffusers.schedulers.scheduling_flow_match_euler_discrete import (
            FlowMatchEulerDiscreteScheduler,
        )

        self.scheduler = FlowMatchEulerDiscreteScheduler.from_config(
            SCHEDULER_CONFIGS[case.workload]
        )
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.image_scale)
        self.prompts, self.negative_prompts = self.make_prompts()
        self._graph: _GraphedPrediction | None = None
        self.cfg_group = _cfg_parallel_group(case)
        self._last_counters: dict[str, int] = {}

    image_scale = VAE_SCALE

    def register_modules(self, **modules: Any) -> None:
        """Each built component as the attribute of its role (diffusers'
        `DiffusionPipeline.register_modules`)."""
        for role, module in modules.items():
            setattr(self, role, module)

    def set_toggles(self, toggles: dict[str, bool]) -> None:
        """Switch optimizations on this built pipeline, sharing its weights.

        The toggles choose code paths, not weights, so an A/B run builds the model once and
        flips them between runs (`perfguard.measurement.ab`): two copies of Qwen-Image at
        `full` would not fit one 80 GB device. Toggles of the other workload are ignored, as in
        `build_model`. A captured CUDA graph keeps the path it recorded, which is the
        capture-safe one for every toggle.
        """
        mine = {k: bool(v) for k, v in toggles.items() if k in self.toggle_names}
        self.case = self.case.with_toggles(**toggles)
        for name, value in mine.items():
            setattr(self.transformer, name, value)

    # ---- what was measured ---------------------------------------------------------------
    @property
    def components(self) -> dict[str, dict[str, Any]]:
        """Role -> `{"class": "module.Class", "parameters": n}` for every component."""
        return {role: component_info(obj) for role, obj in self.component_objects().items()}

    COMPONENT_ROLES: tuple[str, ...] = ("transformer", "scheduler")
    """The attributes that are the pipeline's components, as diffusers names them."""

    def component_objects(self) -> dict[str, Any]:
        return {role: getattr(self, role) for role in self.COMPONENT_ROLES}

    def counters(self) -> dict[str, int]:
        """What the optimizations did in the last call (read by the runner after a run)."""
        return dict(self._last_counters)

    def _counter_totals(self) -> dict[str, int]:
        return {}

    # ---- the stages ----------------------------------------------------------------------
    def __call__(self) -> torch.Tensor:
        return self.generate()

    def generate(self, output_type: str = "pt") -> torch.Tensor:
        """One text-to-image call; `output_type="latent"` returns the final latents."""
        before = self._counter_totals()
        with torch.inference_mode():
            with stage("InputValidationStage"):
                self.validate()
            with stage("TextEncodingStage"):
                cond = self.encode(self.prompts)
                uncond = self.encode(self.negative_prompts) if self.case.cfg else None
            self.prepare_conditioning()
            with stage("LatentPreparationStage"):
                latents = self.prepare_latents()
            with stage("TimestepPreparationStage"):
                timesteps, _ = self.prepare_timesteps()
            with stage("DenoisingStage"):
                for i in range(len(timesteps)):
                    with step(i):
                        latents = self.denoise_step(latents, timesteps[i], i, cond, uncond)
            if output_type == "latent":
                out = latents
            else:
                with stage("DecodingStage"):
                    out = self.decode(latents)
        after = self._counter_totals()
        self._last_counters = {k: after[k] - before.get(k, 0) for k in after}
        return out

    def validate(self) -> None:
        c = self.case
        multiple = self.size_multiple
        if c.height % multiple or c.width % multiple:
            raise ValueError(
                f"{c.id}: height and width must be multiples of {multiple}, "
                f"got {c.width}x{c.height}"
            )
        if len(c.prompt_lengths) != c.batch:
            raise ValueError(f"{c.id}: one prompt length per batch row is required")
        if c.options.get("cuda_graph") and self.platform.name != "cuda":
            raise ValueError(f"{c.id}: options.cuda_graph needs CUDA, not {self.platform.name}")

    def make_prompts(self) -> tuple[list[str], list[str]]:
        """Seeded prompts whose encodings have the case's `prompt_lengths` (DiT tokens)."""
        raise NotImplementedError

    def encode(self, prompts: list[str]) -> _Text:
        raise NotImplementedError

    def prepare_conditioning(self) -> None:
        """Workload-specific conditioning computed before latents (GLM's prior tokens)."""

    def latent_shape(self) -> tuple[int, ...]:
        raise NotImplementedError

    def prepare_latents(self) -> torch.Tensor:
        """diffusers' `randn_tensor` from a CPU generator seeded with the case's seed (the
        same values on every device), in the pipeline's dtype, then packed."""
        from diffusers.utils.torch_utils import randn_tensor

        gen = torch.Generator().manual_seed(self.case.seed)
        latents = randn_tensor(
            self.latent_shape(), generator=gen, device=self.device, dtype=self.dtype
        )
        return self.pack(latents)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        return latents

    @property
    def image_seq_len(self) -> int:
        return (self.case.height // (VAE_SCALE * 2)) * (self.case.width // (VAE_SCALE * 2))

    def prepare_timesteps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Set the scheduler for this call: `timesteps` [steps] and `sigmas` [steps + 1]."""
        raise NotImplementedError

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def denoise_step(
        self,
        latents: torch.Tensor,
        t: torch.Tensor,
        i: int,
        cond: _Text,
        uncond: _Text | None,
    ) -> torch.Tensor:
        # One timestep tensor per step, shared by the cond and uncond passes (see above).
        timestep = self.model_timestep(t)
        model_latents = latents.to(self.dtype)
        if self._graph is not None or (self.case.options.get("cuda_graph") and i == 0):
            if self._graph is None:
                self._graph = _GraphedPrediction(self, model_latents, timestep, cond, uncond)
            noise_pred = self._graph(model_latents, timestep, cond, uncond)
        else:
            noise_pred = self.guided_prediction(model_latents, timestep, cond, uncond)
        # FlowMatchEulerDiscreteScheduler.step: x + (sigma_next - sigma) * v in float32,
        # cast to the prediction's dtype, exactly as in diffusers' loops.
        return self.scheduler.step(noise_pred, t, latents, return_dict=False)[0]

    def guided_prediction(
        self, latents: torch.Tensor, timestep: torch.Tensor, cond: _Text, uncond: _Text | None
    ) -> torch.Tensor:
        if uncond is None:
            return self.predict(latents, timestep, cond, drop_prior=False)
        if self.cfg_group is not None:
            import torch.distributed as dist

            rank = dist.get_rank(self.cfg_group)
            mine = self.predict(latents, timestep, uncond if rank else cond, drop_prior=bool(rank))
            both = [torch.empty_like(mine) for _ in range(2)]
            dist.all_gather(both, mine.contiguous(), group=self.cfg_group)
            pos, neg = both
        elif self.case.serial_cfg:
            pos = self.predict(latents, timestep, cond, drop_prior=False)
            neg = self.predict(latents, timestep, uncond, drop_prior=True)
        else:
            pos, neg = self.predict_batched(latents, timestep, cond, uncond)
        return self.combine(pos, neg)

    def predict_batched(
        self, latents: torch.Tensor, timestep: torch.Tensor, cond: _Text, uncond: _Text
    ) -> tuple[torch.Tensor, torch.Tensor]:
        both = _concat_text(cond, uncond)
        batch = latents.shape[0]
        out = self.predict(
            torch.cat([latents, latents]), torch.cat([timestep, timestep]), both, drop_prior=None
        )
        return out[:batch], out[batch:]

    def combine(self, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        return neg + self.case.guidance_scale * (pos - neg)

    def predict(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: _Text, drop_prior: bool | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def _concat_text(a: _Text, b: _Text) -> _Text:
    """Stack two prompt batches, right-padding the shorter sequence with a mask.

    The mask is padded from the batches' own masks on the device, not rebuilt from the
    host lengths: no host-to-device copy, so batched CFG stays capturable in a CUDA graph.
    """
    longest = max(a.embeds.shape[1], b.embeds.shape[1])

    def pad(t: _Text) -> tuple[torch.Tensor, torch.Tensor]:
        n = longest - t.embeds.shape[1]
        valid = t.mask
        if valid is None:  # every row attended in full (none padded, or GLM: no mask)
            valid = torch.ones(t.embeds.shape[:2], dtype=torch.bool, device=t.embeds.device)
        emb = torch.nn.functional.pad(t.embeds, (0, 0, 0, n))
        return emb, torch.nn.functional.pad(valid, (0, n), value=False)

    ea, ma = pad(a)
    eb, mb = pad(b)
    lengths = a.lengths + b.lengths
    mask = torch.cat([ma, mb])
    return _Text(torch.cat([ea, eb]), None if min(lengths) == longest else mask, lengths)


def _cfg_parallel_group(case: Case) -> Any:
    """The process group for CFG parallelism, when running on two ranks with CFG."""
    import torch.distributed as dist

    if case.cfg and dist.is_available() and dist.is_initialized() and dist.get_world_size() == 2:
        return dist.group.WORLD
    return None


class _GraphedPrediction:
    """The guided DiT prediction captured in a CUDA graph and replayed every step.

    Capture happens inside `breakable_cuda_graph()`, so the models take their
    capture-safe paths (`masked_fill` prior drop, no modulation cache). A replay reads
    every input at the address it had during capture, so the graph owns static copies of
    its inputs and each call copies this step's latents, timestep and prompt embeddings
    into them: the pipeline's tensors of a later call are new allocations, and the
    capture-time ones are freed (their memory reused) once that call returns. Inputs the
    pipeline keeps itself (GLM's prior tokens) live in buffers it refills in place.
    """

    def __init__(
        self,
        pipe: T2IPipeline,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        cond: _Text,
        uncond: _Text | None,
    ) -> None:
        self.static_latents = latents.clone()
        self.static_timestep = timestep.clone()
        self.static_cond = cond.clone()
        self.static_uncond = None if uncond is None else uncond.clone()

        def run() -> torch.Tensor:
            return pipe.guided_prediction(
                self.static_latents, self.static_timestep, self.static_cond, self.static_uncond
            )

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), breakable_cuda_graph():
            for _ in range(2):  # warm up kernels and the allocator outside capture
                run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with breakable_cuda_graph(), torch.cuda.graph(self.graph):
            self.static_out = run()

    def __call__(
        self, latents: torch.Tensor, timestep: torch.Tensor, cond: _Text, uncond: _Text | None
    ) -> torch.Tensor:
        self.static_latents.copy_(latents)
        self.static_timestep.copy_(timestep)
        self.static_cond.refill(cond)
        if self.static_uncond is not None and uncond is not None:
            self.static_uncond.refill(uncond)
        self.graph.replay()
        return self.static_out.clone()
