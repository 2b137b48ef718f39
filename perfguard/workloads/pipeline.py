"""Staged text-to-image pipelines: Qwen-Image and GLM-Image, every component real.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from perfguard.measurement.platform import Platform
from perfguard.measurement.timer import stage, step
from perfguard.storage.cases import Case
from perfguard.workloads.components import (
    QWEN_PROMPT_SUFFIX_TOKENS,
    QWEN_PROMPT_TEMPLATE,
    QWEN_PROMPT_TEMPLATE_START_IDX,
    SCHEDULER_CONFIGS,
    WORDS,
    component_info,
    glm_components,
    qwen_components,
)
from perfguard.workloads.graphs import breakable_cuda_graph
from perfguard.workloads.presets import build_model, get_preset

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


class QwenImagePipeline(T2IPipeline):
    """Qwen-Image (diffusers' `QwenImagePipeline`): Qwen2.5-VL prompt embeddings with the
    template prefix dropped, packed 2x2 latents, masked joint attention, true CFG with the
    norm rescale, `AutoencoderKLQwenImage` decode."""

    toggle_names = ("qwen_modulation_cache", "qwen_varlen_host_meta")
    COMPONENT_ROLES = ("text_encoder", "tokenizer", "transformer", "vae", "scheduler")
    image_scale = VAE_SCALE * 2  # diffusers' VaeImageProcessor(vae_scale_factor * 2)
    # diffusers' tokenizer_max_length: prompts are truncated to 1024 tokens after the prefix.
    tokenizer_max_length = 1024

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        config = get_preset(case.workload, case.preset)
        self.text_dim = config["joint_attention_dim"]
        self.latent_channels = config["in_channels"] // 4  # 2x2 patches packed
        super().__init__(case, platform, device)
        parts = qwen_components(
            case.preset,
            text_dim=self.text_dim,
            latent_channels=self.latent_channels,
            device=device,
            dtype=self.dtype,
            seed=case.seed,
        )
        self.tokenizer = parts["tokenizer"]
        self.text_encoder = parts["text_encoder"]
        self.vae = parts["vae"]
        z = self.vae.config.z_dim
        self.latents_mean = torch.tensor(self.vae.config.latents_mean).view(1, z, 1, 1, 1)
        self.latents_std = torch.tensor(self.vae.config.latents_std).view(1, z, 1, 1, 1)
        h, w = case.height // (VAE_SCALE * 2), case.width // (VAE_SCALE * 2)
        self.img_shapes = [[(1, h, w)]] * case.batch

    def _counter_totals(self) -> dict[str, int]:
        return {"qwen_modulation_cache_hits": self.transformer.modulation_cache_hits()}

    def validate(self) -> None:
        super().validate()
        lengths = set(self.case.prompt_lengths)
        if self.case.cfg and not self.case.serial_cfg:  # batched CFG pads both to one length
            lengths.add(NEGATIVE_PROMPT_TOKENS)
        padded = len(lengths) > 1
        if self.case.options.get("cuda_graph") and padded:
            raise ValueError(
                f"{self.case.id}: options.cuda_graph with padded prompts would capture a "
                "data-dependent nonzero(); use equal prompt lengths"
            )

    def make_prompts(self) -> tuple[list[str], list[str]]:
        # Each word is one token and the template adds 5 after the prompt, so a prompt of
        # `n - 5` words gives the DiT `n` text tokens.
        rng = random.Random(self.case.seed)
        shortest = QWEN_PROMPT_SUFFIX_TOKENS + 1
        for n in self.case.prompt_lengths:
            if not shortest <= n <= self.tokenizer_max_length:
                raise ValueError(
                    f"{self.case.id}: prompt_lengths: Qwen-Image prompts encode to "
                    f"{shortest}..{self.tokenizer_max_length} tokens, got {n}"
                )
        prompts = [_words(rng, n - QWEN_PROMPT_SUFFIX_TOKENS) for n in self.case.prompt_lengths]
        negative = _words(rng, NEGATIVE_PROMPT_TOKENS - QWEN_PROMPT_SUFFIX_TOKENS)
        return prompts, [negative] * self.case.batch

    def encode(self, prompts: list[str]) -> _Text:
        """diffusers' `QwenImagePipeline._get_qwen_prompt_embeds` + `encode_prompt`: the
        template around each prompt, Qwen2.5-VL's last hidden state, the 34-token prefix
        dropped, rows right-padded with zeros and described by a mask (None if unpadded)."""
        drop = QWEN_PROMPT_TEMPLATE_START_IDX
        tokens = self.tokenizer(
            [QWEN_PROMPT_TEMPLATE.format(p) for p in prompts],
            max_length=self.tokenizer_max_length + drop,
            padding=True,
            truncation=True,
            return_tensors="pt",
        )
        lengths = [int(n) - drop for n in tokens.attention_mask.sum(dim=1)]  # host ints
        tokens = tokens.to(self.device)
        out = self.text_encoder(
            input_ids=tokens.input_ids,
            attention_mask=tokens.attention_mask,
            output_hidden_states=True,
        )
        hidden = out.hidden_states[-1]
        mask = tokens.attention_mask.bool()
        rows = torch.split(hidden[mask], [n + drop for n in lengths], dim=0)
        rows = [r[drop:] for r in rows]
        longest = max(lengths)
        embeds = torch.stack(
            [torch.cat([r, r.new_zeros(longest - r.size(0), r.size(1))]) for r in rows]
        )
        valid = None
        if min(lengths) < longest:
            valid = (torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]).to(
                self.device
            )
        return _Text(embeds.to(self.dtype), valid, lengths)

    def latent_shape(self) -> tuple[int, ...]:
        h, w = self.case.height // VAE_SCALE, self.case.width // VAE_SCALE
        return (self.case.batch, 1, self.latent_channels, h, w)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        b, _, c, h, w = latents.shape
        latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return latents.reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        b = latents.shape[0]
        h, w = self.case.height // VAE_SCALE, self.case.width // VAE_SCALE
        latents = latents.view(b, h // 2, w // 2, self.latent_channels, 2, 2).permute(
            0, 3, 1, 4, 2, 5
        )
        return latents.reshape(b, self.latent_channels, 1, h, w)

    def prepare_timesteps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """diffusers' QwenImagePipeline: sigmas linspace(1, 1/steps), `mu` from the image
        sequence length and the scheduler config's shift bounds, then `set_timesteps`."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import (
            calculate_shift,
            retrieve_timesteps,
        )

        steps = self.case.steps
        cfg = self.scheduler.config
        mu = calculate_shift(
            self.image_seq_len,
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        sigmas = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(self.scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        self.scheduler.set_begin_index(0)
        return timesteps, self.scheduler.sigmas

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t.expand(self.case.batch).to(self.dtype) / 1000

    def predict(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: _Text, drop_prior: bool | None
    ) -> torch.Tensor:
        return self.transformer(
            hidden_states=latents,
            timestep=timestep,
            encoder_hidden_states=text.embeds,
            encoder_hidden_states_mask=text.mask,
            img_shapes=self.img_shapes * (latents.shape[0] // self.case.batch),
            txt_seq_lens=text.lengths,
            return_dict=False,
        )[0]

    def combine(self, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        comb = neg + self.case.guidance_scale * (pos - neg)
        # True-CFG rescale: keep the cond prediction's norm (diffusers' QwenImagePipeline).
        cond_norm = torch.norm(pos, dim=-1, keepdim=True)
        noise_norm = torch.norm(comb, dim=-1, keepdim=True)
        return comb * (cond_norm / noise_norm)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Unpack to `[B, C, 1, h, w]`, undo the VAE's latent normalization, decode the one
        frame, postprocess to [0, 1] (diffusers' `output_type="pt"`)."""
        vae_dtype = self.vae.dtype
        latents = self.unpack(latents).to(vae_dtype)
        mean = self.latents_mean.to(latents.device, vae_dtype)
        std = self.latents_std.to(latents.device, vae_dtype)
        latents = latents / (1.0 / std) + mean
        image = self.vae.decode(latents, return_dict=False)[0][:, :, 0]
        return self.image_processor.postprocess(image, output_type="pt").to(torch.float32)


class GlmImagePipeline(T2IPipeline):
    """GLM-Image (diffusers' `GlmImagePipeline`): the AR model samples prior tokens, the
    ByT5 glyph encoder embeds the quoted text, the uncond pass drops the prior tokens
    (`prior_token_drop`), `AutoencoderKL` decodes."""

    toggle_names = ("glm_prior_drop_inplace",)
    COMPONENT_ROLES = (
        "vision_language_encoder",
        "processor",
        "text_encoder",
        "tokenizer",
        "transformer",
        "vae",
        "scheduler",
    )
    size_multiple = VAE_SCALE * 4  # the prior grid is 32x downsampled

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        config = get_preset(case.workload, case.preset)
        self.text_dim = config["text_embed_dim"]
        self.latent_channels = config["in_channels"]
        self.codebook_size = config["prior_vq_quantizer_codebook_size"]
        super().__init__(case, platform, device)
        parts = glm_components(
            case.preset,
            text_dim=self.text_dim,
            latent_channels=self.latent_channels,
            codebook_size=self.codebook_size,
            device=device,
            dtype=self.dtype,
            seed=case.seed,
        )
        self.processor = parts["processor"]
        self.vision_language_encoder = parts["vision_language_encoder"]
        self.tokenizer = parts["tokenizer"]
        self.text_encoder = parts["text_encoder"]
        self.vae = parts["vae"]
        c = self.vae.config.latent_channels
        self.latents_mean = torch.tensor(self.vae.config.latents_mean).view(1, c, 1, 1)
        self.latents_std = torch.tensor(self.vae.config.latents_std).view(1, c, 1, 1)
        b = case.batch
        dtype = self.dtype
        self.target_size = torch.tensor([[case.height, case.width]] * b, dtype=dtype, device=device)
        self.crop_coords = torch.zeros(b, 2, dtype=dtype, device=device)
        # Allocated once and refilled in place on every call: a captured CUDA graph reads
        # them at the addresses it saw at capture (`_GraphedPrediction`).
        prior_len = (case.height // (VAE_SCALE * 2)) * (case.width // (VAE_SCALE * 2))
        self.prior_token_ids = torch.zeros(b, prior_len, dtype=torch.long, device=device)
        self.drop_cond = torch.zeros(b, prior_len, dtype=torch.bool, device=device)
        self.drop_uncond = torch.ones(b, prior_len, dtype=torch.bool, device=device)
        self.prior_tokens_generated = 0

    def _counter_totals(self) -> dict[str, int]:
        return {
            "glm_prior_drops_inplace": self.transformer.prior_drops_inplace,
            "glm_prior_tokens_generated": self.prior_tokens_generated,
        }

    def make_prompts(self) -> tuple[list[str], list[str]]:
        # One quoted glyph text per prompt: ByT5 encodes its n - 1 bytes plus `</s>`, so the
        # DiT sees n glyph tokens. The negative prompt is "" (diffusers): one token, `</s>`.
        rng = random.Random(self.case.seed)
        prompts = []
        for n in self.case.prompt_lengths:
            if n < 2:
                raise ValueError(
                    f"{self.case.id}: prompt_lengths: GLM-Image glyph texts encode to at "
                    f"least 2 tokens, got {n}"
                )
            glyph = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n - 1))
            prompts.append(f'a {_words(rng, 6)} sign that reads "{glyph}"')
        return prompts, [""] * self.case.batch

    def encode(self, prompts: list[str]) -> _Text:
        """diffusers' `GlmImagePipeline._get_glyph_embeds`: the quoted texts of each prompt
        through ByT5 (a pad token first when a prompt has an even number of texts), the
        valid positions concatenated, prompts left-padded with zeros to one length. The
        DiT takes no text mask."""
        pipe_cls = _diffusers_glm_pipeline()
        rows = []
        for texts in pipe_cls.get_glyph_texts(None, prompts):
            texts = texts or [""]
            ids = self.tokenizer(texts, max_length=2048, truncation=True).input_ids
            pad = self.tokenizer.pad_token_id
            ids = [[pad] * ((len(ids) + 1) % 2) + row for row in ids]
            longest = max(len(row) for row in ids)
            mask = torch.tensor([[1] * len(r) + [0] * (longest - len(r)) for r in ids])
            ids_t = torch.tensor([r + [pad] * (longest - len(r)) for r in ids])
            mask = mask.to(self.device)
            out = self.text_encoder(ids_t.to(self.device), attention_mask=mask)
            rows.append(out.last_hidden_state[mask.bool()].unsqueeze(0))
        longest = max(r.size(1) for r in rows)
        lengths = [r.size(1) for r in rows]
        padded = [
            torch.cat([r.new_zeros(1, longest - r.size(1), r.size(2)), r], dim=1) for r in rows
        ]
        return _Text(torch.cat(padded).to(self.dtype), None, lengths)

    def prepare_conditioning(self) -> None:
        with stage("PriorTokenGenerationStage"):
            self.prior_token_ids.copy_(self.generate_prior_tokens())

    def generate_prior_tokens(self) -> torch.Tensor:
        """diffusers' `GlmImagePipeline.generate_prior_tokens` (text-to-image): the chat
        template with the target and preview grids, `generate(do_sample=True)` for grid
        tokens + 1 tokens seeded with the case's seed, the target grid's tokens taken after
        the preview's and upsampled 2x to the DiT's grid."""
        pipe_cls = _diffusers_glm_pipeline()
        messages = [
            [{"role": "user", "content": [{"type": "text", "text": p}]}] for p in self.prompts
        ]
        inputs = self.processor.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            # diffusers passes these as plain kwargs, which transformers 5 forwards to the
            # processor with a warning per call; the same values, without the warning.
            processor_kwargs={
                "padding": len(messages) > 1,
                "target_h": self.case.height,
                "target_w": self.case.width,
                "return_tensors": "pt",
            },
        ).to(self.device)
        grids = inputs["image_grid_thw"][: int(inputs["images_per_sample"][0])]
        max_new, offset, token_h, token_w = pipe_cls._compute_generation_params(grids, True)
        cap = self.case.options.get("prior_tokens")
        if cap is not None and cap < max_new:
            # A smoke case's cap: the AR model samples `cap` tokens (the same loop, the same
            # cost per token) instead of the 16x16 preview grid plus the target grid that
            # diffusers samples at any image size; the target's ids are the last ones.
            max_new, offset = int(cap), int(cap) - token_h * token_w
        # generate() takes no generator: seed the global RNG as diffusers does, inside
        # fork_rng so the caller's RNG state is left as it was.
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.case.seed)
            outputs = self.vision_language_encoder.generate(
                **inputs,
                max_new_tokens=max_new,
                do_sample=True,
            )
        self.prior_tokens_generated += (outputs.shape[1] - inputs["input_ids"].shape[-1]) * len(
            messages
        )
        input_len = inputs["input_ids"].shape[-1]
        ids = [
            pipe_cls._upsample_token_ids(
                pipe_cls._extract_large_image_tokens(
                    outputs[i : i + 1], input_len, offset, token_h * token_w
                ),
                token_h,
                token_w,
            )
            for i in range(len(messages))
        ]
        return torch.cat(ids, dim=0)

    def latent_shape(self) -> tuple[int, ...]:
        h, w = self.case.height // VAE_SCALE, self.case.width // VAE_SCALE
        return (self.case.batch, self.latent_channels, h, w)

    def prepare_timesteps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """diffusers' GlmImagePipeline: integer timesteps linspace(1000, 1)[:-1], sigmas
        t / 1000, `mu` from the image sequence length; the scheduler shifts the sigmas and
        keeps the given timesteps, so the DiT sees the unshifted `t - 1`."""
        from diffusers.pipelines.glm_image.pipeline_glm_image import (
            calculate_shift,
            retrieve_timesteps,
        )

        steps = self.case.steps
        cfg = self.scheduler.config
        train = cfg.num_train_timesteps
        ts = np.linspace(train, 1.0, steps + 1)[:-1].astype(np.int64).astype(np.float32)
        mu = calculate_shift(
            self.image_seq_len,
            cfg.get("base_image_seq_len", 256),
            cfg.get("base_shift", 0.25),
            cfg.get("max_shift", 0.75),
        )
        timesteps, _ = retrieve_timesteps(self.scheduler, steps, self.device, ts, ts / train, mu=mu)
        return timesteps, self.scheduler.sigmas

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t.expand(self.case.batch) - 1

    def predict(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: _Text, drop_prior: bool | None
    ) -> torch.Tensor:
        reps = latents.shape[0] // self.case.batch
        if drop_prior is None:  # batched CFG: cond rows keep the prior, uncond rows drop it
            drop = torch.cat([self.drop_cond, self.drop_uncond])
        else:
            drop = self.drop_uncond if drop_prior else self.drop_cond
        out = self.transformer(
            hidden_states=latents,
            encoder_hidden_states=text.embeds,
            prior_token_id=self.prior_token_ids.repeat(reps, 1),
            prior_token_drop=drop,
            timestep=timestep,
            target_size=self.target_size.repeat(reps, 1),
            crop_coords=self.crop_coords.repeat(reps, 1),
            return_dict=False,
        )[0]
        return out.float()  # diffusers guides (and steps) GLM-Image in float32

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae_dtype = self.vae.dtype
        latents = latents.to(vae_dtype)
        mean = self.latents_mean.to(latents.device, vae_dtype)
        std = self.latents_std.to(latents.device, vae_dtype)
        image = self.vae.decode(latents * std + mean, return_dict=False)[0]
        return self.image_processor.postprocess(image, output_type="pt").to(torch.float32)


def _diffusers_glm_pipeline() -> Any:
    from diffusers.pipelines.glm_image.pipeline_glm_image import (
        GlmImagePipeline as DiffusersGlmImagePipeline,
    )

    return DiffusersGlmImagePipeline


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


_PIPELINES: dict[str, type[T2IPipeline]] = {
    "qwen_image": QwenImagePipeline,
    "glm_image": GlmImagePipeline,
}


def build_pipeline(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
    """The pipeline for `case` on `platform`'s device 0 (a worker sees its own device as 0)."""
    if case.workload not in _PIPELINES:
        raise ValueError(f"unknown workload {case.workload!r}")
    return _PIPELINES[case.workload](case, platform, platform.device(0))
