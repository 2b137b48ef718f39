"""Qwen-Image's stages: Qwen2.5-VL text encoding over the prompt template, the DiT with
true CFG and the norm rescale, `AutoencoderKLQwenImage` decoding (see `pipeline.py`
for the stages both models share)."""

from __future__ import annotations

import random

import numpy as np
import torch

from perfguard.device.platform import Platform
from perfguard.storage.cases import Case
from perfguard.workloads.components import (
    QWEN_PROMPT_SUFFIX_TOKENS,
    QWEN_PROMPT_TEMPLATE,
    QWEN_PROMPT_TEMPLATE_START_IDX,
    qwen_components,
)
from perfguard.workloads.pipeline import (
    NEGATIVE_PROMPT_TOKENS,
    VAE_SCALE,
    T2IPipeline,
    _Text,
    _words,
)
from perfguard.workloads.presets import get_preset


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
        self.register_modules(  # tokenizer, text_encoder, vae
            **qwen_components(
                case.preset,
                text_dim=self.text_dim,
                latent_channels=self.latent_channels,
                device=device,
                dtype=self.dtype,
                seed=case.seed,
            )
        )
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
