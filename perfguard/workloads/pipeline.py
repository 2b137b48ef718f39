"""Staged text-to-image pipelines around the real Qwen-Image and GLM-Image DiTs.

Each call runs sglang's stages, each marked on the ambient stage timer:

| stage                        | what runs                                                   |
|------------------------------|-------------------------------------------------------------|
| `InputValidationStage`       | shape and argument checks                                   |
| `TextEncodingStage`          | stand-in text encoder, cond and negative prompts (padded)   |
| `PriorTokenGenerationStage`  | GLM-Image only: stand-in AR prior, one token per step (1)   |
| `LatentPreparationStage`     | seeded Gaussian latents (packed 2x2 for Qwen-Image)         |
| `TimestepPreparationStage`   | flow-matching sigmas with the resolution-dependent shift     |
| `DenoisingStage`             | Euler steps, each timed (`step(i)`): cond pass, then uncond   |
| `DecodingStage`              | stand-in VAE decoder                                        |

(1) sglang folds prior-token generation into `GlmImageBeforeDenoisingStage`; perfguard
times it on its own so a change in the prior does not hide in another stage's figure.

The DiT is the real model; the encoders and the decoder are stand-ins (`standins.py`).

Serial CFG runs the cond pass then the uncond pass with the *same* timestep tensor object
(computed once per step), which is what lets Qwen-Image's modulation cache hit; batched
CFG (`serial_cfg = false`) concatenates both into one pass. With `torch.distributed`
initialised on two ranks, CFG runs in parallel (rank 0 cond, rank 1 uncond, then an
all-gather), as sglang does with `--enable-cfg-parallel`.

With `options.cuda_graph` the guided prediction is captured once, in step 0 of the
pipeline's first call (a warm-up run unless `--warmup 0`, whose step 0 then carries the
capture), and replayed on every later step and call (`_GraphedPrediction`).

Runs are seeded and deterministic: the same case and seed give the same output tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from perfguard.cases import Case
from perfguard.platform import Platform
from perfguard.timer import stage, step
from perfguard.workloads.graphs import breakable_cuda_graph
from perfguard.workloads.presets import build_model, get_preset
from perfguard.workloads.standins import (
    StandInPriorTokenModel,
    StandInTextEncoder,
    StandInVaeDecoder,
)

VAE_SCALE = 8
NEGATIVE_PROMPT_TOKENS = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Stand-in sizes per preset: (text hidden, text layers, prior hidden, decoder channels,
# decoder layers). Chosen so the DiT dominates a case, as it does in real serving.
_STANDIN_SIZES = {
    "tiny": (32, 1, 32, 8, 1),
    "small": (64, 2, 64, 16, 1),
    "full": (1024, 4, 512, 64, 2),
}


@dataclass
class _Text:
    embeds: torch.Tensor  # [B, T, D]
    mask: torch.Tensor | None  # [B, T] bool, None when no row is padded
    lengths: list[int]


def _seeded_init(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Initialise a stand-in's weights from `seed` without touching the global RNG.

    Weights are N(0, 1 / fan_in), fan_in being everything but the output dimension (a
    conv's `in * k * k`): activations keep their scale through the layers, so the decoder
    neither saturates its tanh nor overflows float16 at the `full` sizes.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.dim() > 1:
                fan_in = param[0].numel()
                param.copy_(torch.randn(param.shape, generator=gen) * (1.0 / fan_in) ** 0.5)
            elif name.endswith("weight"):
                param.fill_(1.0)
            else:
                param.zero_()
    return module


class T2IPipeline:
    """The stages shared by both workloads; subclasses supply the DiT-specific parts."""

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        self.case = case
        self.platform = platform
        self.device = device
        self.dtype = DTYPES[case.dtype]
        sizes = _STANDIN_SIZES[case.preset]
        text_layers = case.options.get("text_encoder_layers", sizes[1])
        dec_layers = case.options.get("decoder_layers", sizes[4])
        self.transformer = build_model(
            case.workload,
            case.preset,
            device=device,
            dtype=self.dtype,
            seed=case.seed,
            toggles={name: case.toggle(name) for name in self.toggle_names},
        )
        self.text_encoder = self._standin(
            StandInTextEncoder(self.text_dim, hidden=sizes[0], num_layers=text_layers), 1
        )
        self.vae_decoder = self._standin(
            StandInVaeDecoder(self.latent_channels, channels=sizes[3], num_layers=dec_layers), 2
        )
        self._graph: _GraphedPrediction | None = None
        self.cfg_group = _cfg_parallel_group(case)

    toggle_names: tuple[str, ...] = ()
    text_dim: int = 0
    latent_channels: int = 16
    size_multiple = VAE_SCALE * 2  # a 2x2 patch of latents

    def set_toggles(self, toggles: dict[str, bool]) -> None:
        """Switch optimizations on this built pipeline, sharing its weights.

        The toggles choose code paths, not weights, so an A/B run builds the model once and
        flips them between runs (`perfguard.ab`): two copies of Qwen-Image at `full` would
        not fit one 80 GB device. Toggles of the other workload are ignored, as in
        `build_model`. A captured CUDA graph keeps the path it recorded, which is the
        capture-safe one for every toggle.
        """
        mine = {k: bool(v) for k, v in toggles.items() if k in self.toggle_names}
        self.case = self.case.with_toggles(**toggles)
        for name, value in mine.items():
            setattr(self.transformer, name, value)

    def _standin(self, module: torch.nn.Module, salt: int) -> torch.nn.Module:
        return _seeded_init(module, self.case.seed * 1000 + salt).to(self.device, self.dtype).eval()

    # ---- the stages ----------------------------------------------------------------------
    def __call__(self) -> torch.Tensor:
        with torch.inference_mode():
            with stage("InputValidationStage"):
                self.validate()
            with stage("TextEncodingStage"):
                cond = self.encode(self.case.prompt_lengths, salt=11)
                uncond = (
                    self.encode((NEGATIVE_PROMPT_TOKENS,) * self.case.batch, salt=13)
                    if self.case.cfg
                    else None
                )
            self.prepare_conditioning(cond)
            with stage("LatentPreparationStage"):
                latents = self.prepare_latents()
            with stage("TimestepPreparationStage"):
                timesteps, sigmas = self.prepare_timesteps()
            with stage("DenoisingStage"):
                for i in range(len(timesteps)):
                    with step(i):
                        latents = self.denoise_step(latents, timesteps[i], sigmas, i, cond, uncond)
            with stage("DecodingStage"):
                image = self.decode(latents)
        return image

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

    def encode(self, lengths: tuple[int, ...], salt: int) -> _Text:
        """Seeded token ids per row, right-padded to the longest row, through the encoder."""
        gen = torch.Generator().manual_seed(self.case.seed * 7919 + salt)
        longest = max(lengths)
        ids = torch.randint(1, self.text_encoder.vocab, (len(lengths), longest), generator=gen)
        valid = torch.arange(longest)[None, :] < torch.tensor(lengths)[:, None]
        ids = ids.masked_fill(~valid, 0).to(self.device)
        embeds = self.text_encoder(ids)
        mask = valid.to(self.device) if min(lengths) < longest else None
        if mask is not None:
            embeds = embeds * mask.unsqueeze(-1).to(embeds.dtype)  # padded rows carry zeros
        return _Text(embeds, mask, list(lengths))

    def prepare_conditioning(self, cond: _Text) -> None:
        """Workload-specific conditioning computed before latents (GLM's prior tokens)."""

    def prepare_latents(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.case.seed)
        h, w = self.case.height // VAE_SCALE, self.case.width // VAE_SCALE
        latents = torch.randn(self.case.batch, self.latent_channels, h, w, generator=gen)
        return self.pack(latents.to(self.device, self.dtype))

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        return latents

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        return latents

    @property
    def image_seq_len(self) -> int:
        return (self.case.height // (VAE_SCALE * 2)) * (self.case.width // (VAE_SCALE * 2))

    def prepare_timesteps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Shifted flow-matching schedule: `timesteps` [steps] and `sigmas` [steps + 1]."""
        sigmas = self.base_sigmas()
        mu = self.shift_mu()
        # FlowMatchEulerDiscreteScheduler's exponential time shift.
        shifted = math.exp(mu) / (math.exp(mu) + (1.0 / sigmas - 1.0))
        sigmas = torch.cat([shifted, torch.zeros(1, dtype=torch.float64)]).to(torch.float32)
        return self.schedule_timesteps(sigmas).to(self.device), sigmas.to(self.device)

    def base_sigmas(self) -> torch.Tensor:
        raise NotImplementedError

    def schedule_timesteps(self, sigmas: torch.Tensor) -> torch.Tensor:
        """The loop's `t` per step: the shifted sigmas times 1000, which is what diffusers'
        `set_timesteps` derives when a pipeline passes it sigmas only (Qwen-Image)."""
        return sigmas[:-1] * 1000.0

    def shift_mu(self) -> float:
        raise NotImplementedError

    def denoise_step(
        self,
        latents: torch.Tensor,
        t: torch.Tensor,
        sigmas: torch.Tensor,
        i: int,
        cond: _Text,
        uncond: _Text | None,
    ) -> torch.Tensor:
        # One timestep tensor per step, shared by the cond and uncond passes.
        timestep = self.model_timestep(t.expand(latents.shape[0]).to(latents.dtype))
        if self._graph is not None or (self.case.options.get("cuda_graph") and i == 0):
            if self._graph is None:
                self._graph = _GraphedPrediction(self, latents, timestep, cond, uncond)
            noise_pred = self._graph(latents, timestep, cond, uncond)
        else:
            noise_pred = self.guided_prediction(latents, timestep, cond, uncond)
        # Flow-matching Euler step, computed in float32 and cast back as diffusers'
        # FlowMatchEulerDiscreteScheduler.step does, so the rounding matches the reference.
        dt = (sigmas[i + 1] - sigmas[i]).to(torch.float32)
        return (latents.to(torch.float32) + dt * noise_pred.to(torch.float32)).to(latents.dtype)

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

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def predict(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: _Text, drop_prior: bool | None
    ) -> torch.Tensor:
        raise NotImplementedError

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.vae_decoder(self.unpack(latents)).to(torch.float32)


class QwenImagePipeline(T2IPipeline):
    """Qwen-Image: packed 2x2 latents, masked joint attention, true-CFG norm rescale."""

    toggle_names = ("qwen_modulation_cache", "qwen_varlen_host_meta")

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        config = get_preset(case.workload, case.preset)
        self.text_dim = config["joint_attention_dim"]
        self.latent_channels = config["in_channels"] // 4  # 2x2 patches packed
        super().__init__(case, platform, device)
        h, w = case.height // (VAE_SCALE * 2), case.width // (VAE_SCALE * 2)
        self.img_shapes = [[(1, h, w)]] * case.batch

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

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        b, c, h, w = latents.shape
        latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return latents.reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, latents: torch.Tensor) -> torch.Tensor:
        b = latents.shape[0]
        h, w = self.case.height // VAE_SCALE, self.case.width // VAE_SCALE
        latents = latents.view(b, h // 2, w // 2, self.latent_channels, 2, 2).permute(
            0, 3, 1, 4, 2, 5
        )
        return latents.reshape(b, self.latent_channels, h, w)

    def base_sigmas(self) -> torch.Tensor:
        steps = self.case.steps
        return torch.linspace(1.0, 1.0 / steps, steps, dtype=torch.float64)

    def shift_mu(self) -> float:
        # diffusers' QwenImagePipeline calculate_shift(seq, 256, 4096, 0.5, 1.15).
        m = (1.15 - 0.5) / (4096 - 256)
        return self.image_seq_len * m + (0.5 - m * 256)

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t / 1000.0

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


class GlmImagePipeline(T2IPipeline):
    """GLM-Image: prior tokens from the AR stand-in; uncond drops them (`prior_token_drop`)."""

    toggle_names = ("glm_prior_drop_inplace",)
    size_multiple = VAE_SCALE * 4  # the prior grid is 32x downsampled

    def __init__(self, case: Case, platform: Platform, device: torch.device) -> None:
        config = get_preset(case.workload, case.preset)
        self.text_dim = config["text_embed_dim"]
        self.latent_channels = config["in_channels"]
        super().__init__(case, platform, device)
        prior_hidden = _STANDIN_SIZES[case.preset][2]
        self.prior_model = self._standin(
            StandInPriorTokenModel(
                config["prior_vq_quantizer_codebook_size"], self.text_dim, hidden=prior_hidden
            ),
            3,
        )
        b = case.batch
        self.target_size = torch.tensor([[case.height, case.width]] * b, device=device)
        self.crop_coords = torch.zeros(b, 2, device=device)
        # Allocated once and refilled in place on every call: a captured CUDA graph reads
        # them at the addresses it saw at capture (`_GraphedPrediction`).
        prior_len = (case.height // (VAE_SCALE * 2)) * (case.width // (VAE_SCALE * 2))
        self.prior_token_ids = torch.zeros(b, prior_len, dtype=torch.long, device=device)
        self.drop_cond = torch.zeros(b, prior_len, dtype=torch.bool, device=device)
        self.drop_uncond = torch.ones(b, prior_len, dtype=torch.bool, device=device)

    def encode(self, lengths: tuple[int, ...], salt: int) -> _Text:
        text = super().encode(lengths, salt)
        # GLM-Image passes no attention mask: padded glyph rows are zeros (see `encode`).
        return _Text(text.embeds, None, text.lengths)

    def prepare_conditioning(self, cond: _Text) -> None:
        with stage("PriorTokenGenerationStage"):
            grid_h = self.case.height // (VAE_SCALE * 4)
            grid_w = self.case.width // (VAE_SCALE * 4)
            self.prior_token_ids.copy_(self.prior_model(cond.embeds, grid_h, grid_w))

    def _int_timesteps(self) -> torch.Tensor:
        """diffusers' `linspace(1000, 1, steps + 1)[:-1]` truncated to integers."""
        ts = torch.linspace(1000.0, 1.0, self.case.steps + 1, dtype=torch.float64)[:-1]
        return ts.to(torch.int64).to(torch.float64)

    def base_sigmas(self) -> torch.Tensor:
        return self._int_timesteps() / 1000.0

    def schedule_timesteps(self, sigmas: torch.Tensor) -> torch.Tensor:
        # GlmImagePipeline passes its integer timesteps along with the sigmas; set_timesteps
        # shifts the sigmas but keeps given timesteps as they are, so the DiT sees the
        # *unshifted* `t - 1` while the Euler step walks the shifted sigmas.
        return self._int_timesteps().to(torch.float32)

    def shift_mu(self) -> float:
        # diffusers' GlmImagePipeline calculate_shift(seq, 256, 0.25, 0.75).
        return (self.image_seq_len / 256) ** 0.5 * 0.75 + 0.25

    def model_timestep(self, t: torch.Tensor) -> torch.Tensor:
        return t - 1

    def predict(
        self, latents: torch.Tensor, timestep: torch.Tensor, text: _Text, drop_prior: bool | None
    ) -> torch.Tensor:
        reps = latents.shape[0] // self.case.batch
        if drop_prior is None:  # batched CFG: cond rows keep the prior, uncond rows drop it
            drop = torch.cat([self.drop_cond, self.drop_uncond])
        else:
            drop = self.drop_uncond if drop_prior else self.drop_cond
        return self.transformer(
            hidden_states=latents,
            encoder_hidden_states=text.embeds,
            prior_token_id=self.prior_token_ids.repeat(reps, 1),
            prior_token_drop=drop,
            timestep=timestep,
            target_size=self.target_size.repeat(reps, 1),
            crop_coords=self.crop_coords.repeat(reps, 1),
            return_dict=False,
        )[0]


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


def _static_text(text: _Text) -> _Text:
    mask = None if text.mask is None else text.mask.clone()
    return _Text(text.embeds.clone(), mask, list(text.lengths))


def _refill_text(static: _Text, text: _Text) -> None:
    static.embeds.copy_(text.embeds)
    if static.mask is not None and text.mask is not None:
        static.mask.copy_(text.mask)


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
        self.static_cond = _static_text(cond)
        self.static_uncond = None if uncond is None else _static_text(uncond)

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
        _refill_text(self.static_cond, cond)
        if self.static_uncond is not None and uncond is not None:
            _refill_text(self.static_uncond, uncond)
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
