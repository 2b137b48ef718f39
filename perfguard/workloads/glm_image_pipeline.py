"""GLM-Image's stages: the ByT5 glyph encoder, the AR prior
(`GlmImageForConditionalGeneration`), the DiT whose uncond pass drops the prior,
`AutoencoderKL` decoding (see `pipeline.py` for the stages both models share)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import stage
from perfguard.storage.cases import Case
from perfguard.workloads.components import (
    glm_components,
)
from perfguard.workloads.pipeline import (
    VAE_SCALE,
    T2IPipeline,
    _Text,
    _words,
)
from perfguard.workloads.presets import get_preset


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
        self.register_modules(  # processor, vision_language_encoder, tokenizer, text_encoder, vae
            **glm_components(
                case.preset,
                text_dim=self.text_dim,
                latent_channels=self.latent_channels,
                codebook_size=self.codebook_size,
                device=device,
                dtype=self.dtype,
                seed=case.seed,
            )
        )
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
