"""Qwen-Image MMDiT transformer (``QwenImageTransformer2DModel``), diffusers 0.42 compatible.

A plain ``torch.nn.Module`` re-implementation of
``diffusers.models.transformers.transformer_qwenimage``: same constructor arguments, same
parameter names (a diffusers state dict of the same config loads with ``strict=True``) and
the same numerics (float32 max abs diff ~1e-6 at tiny configs). ``zero_cond_t``,
``use_additional_t_cond`` and ``controlnet_block_samples`` are supported; not ported:
``use_layer3d_rope`` (Qwen-Image-Layered) and the ``guidance`` input (diffusers 0.42 cannot
run it either) are rejected, gradient checkpointing / LoRA / context parallel are omitted.

Inputs of :meth:`QwenImageTransformer2DModel.forward` (as the diffusers pipeline passes them):

* ``hidden_states``: ``[B, I, in_channels]`` packed latents, ``I = (H/16) * (W/16)`` for a
  ``H x W`` image (VAE /8, then 2x2 patches: ``in_channels = 4 * latent_channels``).
* ``encoder_hidden_states``: ``[B, T, joint_attention_dim]`` text-encoder states, right
  padded to the longest prompt ``T``.
* ``encoder_hidden_states_mask``: ``[B, T]`` (long 0/1 or bool) or ``None``. The pipeline
  passes ``None`` when nothing is padded.
* ``timestep``: ``[B]`` float in ``[0, 1]`` (the pipeline passes ``t.expand(B) / 1000``).
* ``img_shapes``: ``[[(1, H/16, W/16)]] * B`` -- per sample a list of ``(frame, h, w)``.
* ``txt_seq_lens`` (keyword only, sglang): ``B`` valid text lengths, each in ``[0, T]``
  (python, numpy or tensor ints); the valid tokens are the prefix ``[0, len)``. When given
  it lets the model build the varlen metadata on the host (no device sync); it is trusted
  over the mask. Invalid lengths are ignored and the mask is used, as diffusers does.
* ``additional_t_cond``: ``[B]`` long in ``{0, 1}`` (only with ``use_additional_t_cond``).

Output: ``[B, I, patch_size**2 * out_channels]`` (``.sample`` or ``[0]`` with
``return_dict=False``), the same packed layout as ``hidden_states``.

Optimizations (attributes, default on; the reference path sits beside each one):

* ``qwen_modulation_cache`` -- with serial CFG the cond and uncond passes of a step get the
  *same* timestep tensor object, so every block's ``img_mod(temb)`` / ``txt_mod(temb)`` is
  identical; the second pass reuses the first pass's projections. To hit, pass one timestep
  tensor object to both passes (e.g. ``t_in = t.expand(B) / 1000`` computed once per step).
* ``qwen_varlen_host_meta`` -- build the varlen attention metadata from ``txt_seq_lens`` on
  the host instead of from the mask on the device (``nonzero`` syncs).
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch import nn

from perfguard.workloads.attention import (
    FeedForward,
    RMSNorm,
    TimestepEmbedding,
    Timesteps,
    Transformer2DModelOutput,
    VarlenMeta,
    apply_rotary_emb_complex,
    build_varlen_mask_meta,
    build_varlen_mask_meta_from_ranges,
    dense_attention,
    init_config,
    joint_txt_img_ranges,
    varlen_attention,
)
from perfguard.workloads.graphs import is_in_breakable_cuda_graph, is_stream_capturing
from perfguard.workloads.modulation_cache import ModulationKey, ModulationSlot, tensor_version

# ----------------------------------------------------------------------------------------
# Helpers: timestep embedding, RoPE, when the modulation cache may hit
# ----------------------------------------------------------------------------------------


class QwenTimestepProjEmbeddings(nn.Module):
    def __init__(self, embedding_dim: int, use_additional_t_cond: bool = False) -> None:
        super().__init__()
        self.time_proj = Timesteps(
            num_channels=256, flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000
        )
        self.timestep_embedder = TimestepEmbedding(in_channels=256, time_embed_dim=embedding_dim)
        self.use_additional_t_cond = use_additional_t_cond
        if use_additional_t_cond:
            self.addition_t_embedding = nn.Embedding(2, embedding_dim)

    def forward(
        self,
        timestep: torch.Tensor,
        hidden_states: torch.Tensor,
        addition_t_cond: torch.Tensor | None = None,
    ) -> torch.Tensor:
        timesteps_proj = self.time_proj(timestep)
        conditioning = self.timestep_embedder(timesteps_proj.to(dtype=hidden_states.dtype))
        if self.use_additional_t_cond:
            if addition_t_cond is None:
                raise ValueError("use_additional_t_cond=True requires `additional_t_cond`.")
            conditioning = conditioning + self.addition_t_embedding(addition_t_cond).to(
                dtype=hidden_states.dtype
            )
        return conditioning


class QwenEmbedRope(nn.Module):
    """3-axis (frame, height, width) RoPE with centred ("scale_rope") image positions.

    diffusers builds the 4096-position complex tables in ``__init__``; here they are built
    lazily on first use (on the CPU, with the same ops) and cached per device, because the
    model is constructed on the meta device. Nothing is registered as a buffer, exactly as
    in diffusers, so the state dict is unaffected.
    """

    _MAX_POSITIONS = 4096

    def __init__(self, theta: int, axes_dim: list[int], scale_rope: bool = False) -> None:
        super().__init__()
        if any(d % 2 for d in axes_dim):
            raise ValueError(f"axes_dims_rope must be even, got {axes_dim}")
        self.theta = theta
        self.axes_dim = list(axes_dim)
        self.scale_rope = scale_rope
        self._tables: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._video_freqs: dict[tuple[int, int, int, int, torch.device], torch.Tensor] = {}

    def _rope_params(self, index: torch.Tensor, dim: int) -> torch.Tensor:
        exponent = torch.arange(0, dim, 2, device="cpu").to(torch.float32).div(dim)
        freqs = torch.outer(index, 1.0 / torch.pow(self.theta, exponent))
        return torch.polar(torch.ones_like(freqs), freqs)

    def _device_tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._tables:
            pos_index = torch.arange(self._MAX_POSITIONS, device="cpu")
            neg_index = torch.arange(self._MAX_POSITIONS, device="cpu").flip(0) * -1 - 1
            pos = torch.cat([self._rope_params(pos_index, d) for d in self.axes_dim], dim=1)
            neg = torch.cat([self._rope_params(neg_index, d) for d in self.axes_dim], dim=1)
            self._tables[device] = (pos.to(device), neg.to(device))
        return self._tables[device]

    def _compute_video_freqs(
        self, frame: int, height: int, width: int, idx: int, device: torch.device
    ) -> torch.Tensor:
        cache_key = (frame, height, width, idx, device)
        if cache_key in self._video_freqs:
            return self._video_freqs[cache_key]
        pos_freqs, neg_freqs = self._device_tables(device)
        split = [d // 2 for d in self.axes_dim]
        freqs_pos = pos_freqs.split(split, dim=1)
        freqs_neg = neg_freqs.split(split, dim=1)
        shape = (frame, height, width, -1)
        freqs_frame = freqs_pos[0][idx : idx + frame].view(frame, 1, 1, -1).expand(*shape)
        if self.scale_rope:
            freqs_height = torch.cat(
                [freqs_neg[1][-(height - height // 2) :], freqs_pos[1][: height // 2]], dim=0
            )
            freqs_width = torch.cat(
                [freqs_neg[2][-(width - width // 2) :], freqs_pos[2][: width // 2]], dim=0
            )
        else:
            freqs_height = freqs_pos[1][:height]
            freqs_width = freqs_pos[2][:width]
        freqs_height = freqs_height.view(1, height, 1, -1).expand(*shape)
        freqs_width = freqs_width.view(1, 1, width, -1).expand(*shape)
        freqs = torch.cat([freqs_frame, freqs_height, freqs_width], dim=-1)
        freqs = freqs.reshape(frame * height * width, -1).clone().contiguous()
        self._video_freqs[cache_key] = freqs
        return freqs

    def forward(
        self,
        video_fhw: Any,
        max_txt_seq_len: int,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(img_freqs [I, D/2], txt_freqs [T, D/2])`` complex64.

        ``video_fhw`` is diffusers' ``img_shapes``: a per-sample list (only the first entry
        is used, batches must share image sizes) of a list of ``(frame, height, width)``.
        """
        if isinstance(video_fhw, list):
            video_fhw = video_fhw[0]
        if not isinstance(video_fhw, list):
            video_fhw = [video_fhw]
        vid_freqs = []
        max_vid_index = 0
        for idx, (frame, height, width) in enumerate(video_fhw):
            vid_freqs.append(self._compute_video_freqs(frame, height, width, idx, device))
            if self.scale_rope:
                max_vid_index = max(height // 2, width // 2, max_vid_index)
            else:
                max_vid_index = max(height, width, max_vid_index)
        pos_freqs, _ = self._device_tables(device)
        txt_freqs = pos_freqs[max_vid_index : max_vid_index + int(max_txt_seq_len), ...]
        return torch.cat(vid_freqs, dim=0), txt_freqs


def _modulation_cache_allowed() -> bool:
    """Whether python-side caching of modulation outputs is sound right now."""
    if torch.is_grad_enabled():  # autograd must see img_mod/txt_mod in each pass's graph
        return False
    if torch.compiler.is_compiling():  # dynamo would bake the python branch into the graph
        return False
    if is_in_breakable_cuda_graph():  # replay never re-enters python: a hit can't be replayed
        return False
    return not is_stream_capturing()


# ----------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------


class QwenDoubleStreamAttention(nn.Module):
    """Joint attention over ``[txt ; img]``: separate QKV projections per stream, RMSNorm
    qk-norm, RoPE, one attention, split back, separate output projections.

    Parameter names follow diffusers' ``Attention(added_kv_proj_dim=dim,
    context_pre_only=False, qk_norm="rms_norm")``.
    """

    def __init__(self, dim: int, heads: int, dim_head: int, eps: float = 1e-6) -> None:
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.head_dim = dim_head
        self.norm_q = RMSNorm(dim_head, eps=eps)
        self.norm_k = RMSNorm(dim_head, eps=eps)
        self.to_q = nn.Linear(dim, inner_dim)
        self.to_k = nn.Linear(dim, inner_dim)
        self.to_v = nn.Linear(dim, inner_dim)
        self.add_k_proj = nn.Linear(dim, inner_dim)
        self.add_v_proj = nn.Linear(dim, inner_dim)
        self.add_q_proj = nn.Linear(dim, inner_dim)
        self.to_out = nn.ModuleList([nn.Linear(inner_dim, dim), nn.Dropout(0.0)])
        self.to_add_out = nn.Linear(inner_dim, dim)
        self.norm_added_q = RMSNorm(dim_head, eps=eps)
        self.norm_added_k = RMSNorm(dim_head, eps=eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None,
        varlen_meta: VarlenMeta | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq_txt = encoder_hidden_states.shape[1]

        def heads(x: torch.Tensor) -> torch.Tensor:
            return x.unflatten(-1, (-1, self.head_dim))

        img_query = self.norm_q(heads(self.to_q(hidden_states)))
        img_key = self.norm_k(heads(self.to_k(hidden_states)))
        img_value = heads(self.to_v(hidden_states))
        txt_query = self.norm_added_q(heads(self.add_q_proj(encoder_hidden_states)))
        txt_key = self.norm_added_k(heads(self.add_k_proj(encoder_hidden_states)))
        txt_value = heads(self.add_v_proj(encoder_hidden_states))

        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb
            img_query = apply_rotary_emb_complex(img_query, img_freqs)
            img_key = apply_rotary_emb_complex(img_key, img_freqs)
            txt_query = apply_rotary_emb_complex(txt_query, txt_freqs)
            txt_key = apply_rotary_emb_complex(txt_key, txt_freqs)

        joint_query = torch.cat([txt_query, img_query], dim=1)
        joint_key = torch.cat([txt_key, img_key], dim=1)
        joint_value = torch.cat([txt_value, img_value], dim=1)

        if varlen_meta is None:
            # No padding anywhere in the batch: plain dense SDPA, no mask.
            out = dense_attention(joint_query, joint_key, joint_value)
        else:
            # Padded text: attend over the valid tokens only. Image rows match diffusers'
            # key-masked SDPA; padded text rows come out 0 instead of diffusers' (unused)
            # values -- they are masked as keys everywhere, so the image output is equal.
            out = varlen_attention(joint_query, joint_key, joint_value, varlen_meta)
        out = out.flatten(2, 3).to(joint_query.dtype)

        txt_attn_output = self.to_add_out(out[:, :seq_txt, :].contiguous())
        img_attn_output = self.to_out[1](self.to_out[0](out[:, seq_txt:, :].contiguous()))
        return img_attn_output, txt_attn_output


# ----------------------------------------------------------------------------------------
# Block
# ----------------------------------------------------------------------------------------


class QwenImageTransformerBlock(nn.Module):
    def __init__(
        self,
        dim: int,
        num_attention_heads: int,
        attention_head_dim: int,
        qk_norm: str = "rms_norm",
        eps: float = 1e-6,
        zero_cond_t: bool = False,
    ) -> None:
        super().__init__()
        if qk_norm != "rms_norm":
            raise ValueError(f"only qk_norm='rms_norm' is supported, got {qk_norm!r}")
        self.dim = dim
        self.num_attention_heads = num_attention_heads
        self.attention_head_dim = attention_head_dim

        self.img_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.img_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.attn = QwenDoubleStreamAttention(dim, num_attention_heads, attention_head_dim, eps)
        self.img_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.img_mlp = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate")

        self.txt_mod = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.txt_norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=eps)
        self.txt_mlp = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate")

        self.zero_cond_t = zero_cond_t
        self._modulation_slot: ModulationSlot | None = None
        # Hits served from the slot since construction: a pipeline reads the difference per
        # run, so a report shows whether the optimization engaged (a plain int, no sync).
        self.modulation_cache_hits = 0

    @staticmethod
    def _modulate(
        x: torch.Tensor, mod_params: torch.Tensor, index: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shift, scale, gate = mod_params.chunk(3, dim=-1)
        if index is not None:
            # zero_cond_t: rows [:b] condition the target tokens, rows [b:] (t=0) the
            # reference-image tokens; pick per token with `index` [b, l].
            actual_batch = shift.size(0) // 2
            index_expanded = index.unsqueeze(-1) == 0

            def pick(p: torch.Tensor) -> torch.Tensor:
                return torch.where(
                    index_expanded, p[:actual_batch].unsqueeze(1), p[actual_batch:].unsqueeze(1)
                )

            shift, scale, gate = pick(shift), pick(scale), pick(gate)
        else:
            shift, scale, gate = shift.unsqueeze(1), scale.unsqueeze(1), gate.unsqueeze(1)
        return x * (1 + scale) + shift, gate

    def _mod_weights_version(self) -> tuple[int | None, ...]:
        img, txt = self.img_mod[1], self.txt_mod[1]
        return tuple(tensor_version(p) for p in (img.weight, img.bias, txt.weight, txt.bias))

    def clear_modulation_cache(self) -> None:
        self._modulation_slot = None

    def _modulation_params(
        self, temb: torch.Tensor, key: ModulationKey | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(img_mod(temb), txt_mod(temb'))``, served from the one-slot cache on a hit."""
        temb_txt = torch.chunk(temb, 2, dim=0)[0] if self.zero_cond_t else temb
        if key is None:
            # Reference path (and every pass where caching is unsound): compute, keep nothing.
            self._modulation_slot = None
            return self.img_mod(temb), self.txt_mod(temb_txt)

        weights_version = self._mod_weights_version()
        slot = self._modulation_slot
        if slot is not None and slot.key.matches(key) and slot.weights_version == weights_version:
            # CFG uncond pass with the cond pass's timestep tensor: the projections are the
            # very same values, skip two [B, dim] x [dim, 6*dim] GEMMs per block. Consume the
            # slot so it can serve exactly one reuse and frees the tensors right away.
            self._modulation_slot = None
            self.modulation_cache_hits += 1
            return slot.img_mod_params, slot.txt_mod_params
        img_mod_params = self.img_mod(temb)
        txt_mod_params = self.txt_mod(temb_txt)
        self._modulation_slot = ModulationSlot(key, weights_version, img_mod_params, txt_mod_params)
        return img_mod_params, txt_mod_params

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        varlen_meta: VarlenMeta | None = None,
        modulate_index: torch.Tensor | None = None,
        modulation_key: ModulationKey | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        img_mod_params, txt_mod_params = self._modulation_params(temb, modulation_key)
        img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)
        txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)

        img_modulated, img_gate1 = self._modulate(
            self.img_norm1(hidden_states), img_mod1, modulate_index
        )
        txt_modulated, txt_gate1 = self._modulate(self.txt_norm1(encoder_hidden_states), txt_mod1)

        img_attn_output, txt_attn_output = self.attn(
            img_modulated, txt_modulated, image_rotary_emb, varlen_meta
        )
        hidden_states = hidden_states + img_gate1 * img_attn_output
        encoder_hidden_states = encoder_hidden_states + txt_gate1 * txt_attn_output

        img_modulated2, img_gate2 = self._modulate(
            self.img_norm2(hidden_states), img_mod2, modulate_index
        )
        hidden_states = hidden_states + img_gate2 * self.img_mlp(img_modulated2)

        txt_modulated2, txt_gate2 = self._modulate(self.txt_norm2(encoder_hidden_states), txt_mod2)
        encoder_hidden_states = encoder_hidden_states + txt_gate2 * self.txt_mlp(txt_modulated2)

        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states


# ----------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------


class AdaLayerNormContinuous(nn.Module):
    """``LayerNorm(x) * (1 + scale) + shift`` with ``(scale, shift) = linear(silu(cond))``."""

    def __init__(self, embedding_dim: int, conditioning_embedding_dim: int, eps: float) -> None:
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(conditioning_embedding_dim, embedding_dim * 2)
        self.norm = nn.LayerNorm(embedding_dim, eps, elementwise_affine=False)

    def forward(self, x: torch.Tensor, conditioning_embedding: torch.Tensor) -> torch.Tensor:
        emb = self.linear(self.silu(conditioning_embedding).to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class QwenImageTransformer2DModel(nn.Module):
    """Qwen-Image transformer; constructor arguments as diffusers 0.42, plus the toggles
    ``qwen_modulation_cache`` and ``qwen_varlen_host_meta`` (default on)."""

    def __init__(
        self,
        patch_size: int = 2,
        in_channels: int = 64,
        out_channels: int | None = 16,
        num_layers: int = 60,
        attention_head_dim: int = 128,
        num_attention_heads: int = 24,
        joint_attention_dim: int = 3584,
        guidance_embeds: bool = False,
        axes_dims_rope: tuple[int, int, int] = (16, 56, 56),
        zero_cond_t: bool = False,
        use_additional_t_cond: bool = False,
        use_layer3d_rope: bool = False,
        *,
        qwen_modulation_cache: bool = True,
        qwen_varlen_host_meta: bool = True,
    ) -> None:
        """Over the house limits because the parameters are diffusers'
        `QwenImageTransformer2DModel.__init__` (its config keys, passed by name from a
        checkpoint's config), plus the two toggles."""
        super().__init__()
        if use_layer3d_rope:
            raise NotImplementedError("use_layer3d_rope (Qwen-Image-Layered) is not supported")
        if sum(axes_dims_rope) != attention_head_dim:
            raise ValueError(
                f"sum(axes_dims_rope)={sum(axes_dims_rope)} must equal "
                f"attention_head_dim={attention_head_dim}"
            )
        self.config = init_config(QwenImageTransformer2DModel.__init__, locals())
        self.config.axes_dims_rope = tuple(axes_dims_rope)
        self.out_channels = out_channels or in_channels
        self.inner_dim = num_attention_heads * attention_head_dim

        self.pos_embed = QwenEmbedRope(theta=10000, axes_dim=list(axes_dims_rope), scale_rope=True)
        self.time_text_embed = QwenTimestepProjEmbeddings(
            embedding_dim=self.inner_dim, use_additional_t_cond=use_additional_t_cond
        )
        self.txt_norm = RMSNorm(joint_attention_dim, eps=1e-6)
        self.img_in = nn.Linear(in_channels, self.inner_dim)
        self.txt_in = nn.Linear(joint_attention_dim, self.inner_dim)
        self.transformer_blocks = nn.ModuleList(
            [
                QwenImageTransformerBlock(
                    dim=self.inner_dim,
                    num_attention_heads=num_attention_heads,
                    attention_head_dim=attention_head_dim,
                    zero_cond_t=zero_cond_t,
                )
                for _ in range(num_layers)
            ]
        )
        self.norm_out = AdaLayerNormContinuous(self.inner_dim, self.inner_dim, eps=1e-6)
        self.proj_out = nn.Linear(self.inner_dim, patch_size * patch_size * self.out_channels)

        self.zero_cond_t = zero_cond_t
        self.qwen_modulation_cache = qwen_modulation_cache
        self.qwen_varlen_host_meta = qwen_varlen_host_meta

    @property
    def dtype(self) -> torch.dtype:
        return self.img_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.img_in.weight.device

    # -- optimization plumbing ---------------------------------------------------------------

    def modulation_cache_hits(self) -> int:
        """Modulation-cache hits of every block since construction."""
        return sum(block.modulation_cache_hits for block in self.transformer_blocks)

    def clear_modulation_cache(self) -> None:
        """Drop every block's cached modulation projections (e.g. after a request)."""
        for block in self.transformer_blocks:
            block.clear_modulation_cache()

    def _modulation_key(
        self,
        timestep: torch.Tensor,
        additional_t_cond: torch.Tensor | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> ModulationKey | None:
        """Key for the per-block modulation cache, from the timestep tensor *as passed in*.

        ``None`` (blocks compute and clear their slot) when the toggle is off or caching is
        unsound: grad enabled, torch.compile tracing, breakable CUDA-graph or stream capture.
        """
        if not self.qwen_modulation_cache or not _modulation_cache_allowed():
            return None
        return ModulationKey(
            timestep=timestep,
            timestep_version=tensor_version(timestep),
            additional_t_cond=additional_t_cond,
            additional_t_cond_version=(
                None if additional_t_cond is None else tensor_version(additional_t_cond)
            ),
            dtype=dtype,
            device=device,
            weights_version=tuple(tensor_version(p) for p in self.time_text_embed.parameters()),
        )

    @staticmethod
    def _valid_txt_seq_lens(txt_seq_lens: Any, batch_size: int, txt_len: int) -> list[int] | None:
        """``txt_seq_lens`` as python ints when usable, else ``None`` (use the mask).

        Integer-like entries are accepted as sglang passes them: python ints, numpy
        integers, 0-d integer tensors, or a 1-D integer tensor / array (a device tensor is
        read with one sync, as the mask path would pay). Anything else -- the wrong count,
        a length outside ``[0, txt_len]``, floats, bools -- is not trusted: the caller
        falls back to the mask, which is what diffusers' reference always uses.
        """
        if isinstance(txt_seq_lens, torch.Tensor):
            if txt_seq_lens.dim() != 1 or txt_seq_lens.is_floating_point():
                return None
            if txt_seq_lens.is_complex() or txt_seq_lens.dtype == torch.bool:
                return None
            values = txt_seq_lens.tolist()
        elif isinstance(txt_seq_lens, (str, bytes, dict)):
            return None
        else:
            try:
                values = list(txt_seq_lens)
            except TypeError:
                return None
        if len(values) != batch_size:
            return None
        out = []
        for n in values:
            if isinstance(n, bool) or (isinstance(n, torch.Tensor) and n.dtype == torch.bool):
                return None
            try:
                n = operator.index(n)
            except TypeError:
                return None
            if not 0 <= n <= txt_len:
                return None
            out.append(n)
        return out

    def _joint_varlen_meta(
        self,
        encoder_hidden_states_mask: torch.Tensor | None,
        txt_seq_lens: Any,
        batch_size: int,
        txt_len: int,
        img_len: int,
        device: torch.device,
    ) -> VarlenMeta | None:
        """Varlen metadata for the joint ``[txt ; img]`` rows, or ``None`` if nothing is padded."""
        lens = (
            None
            if txt_seq_lens is None
            else self._valid_txt_seq_lens(txt_seq_lens, batch_size, txt_len)
        )
        capturing = is_stream_capturing()
        in_graph = capturing or is_in_breakable_cuda_graph()
        if lens is not None and all(n == txt_len for n in lens) and in_graph:
            # Nothing padded, known on the host: dense attention, as the optimized path
            # decides below. The mask path would call nonzero(), which cannot be captured.
            return None
        if capturing and (lens is not None or encoder_hidden_states_mask is not None):
            # A plain stream capture records the host path's H2D copy from a pinned buffer
            # built from this call's ints (stale on replay), and the mask path's nonzero()
            # cannot be recorded at all: padded prompts cannot be captured.
            raise ValueError(
                f"padded prompts (txt_seq_lens={txt_seq_lens!r}, mask given: "
                f"{encoder_hidden_states_mask is not None}) cannot be captured in a CUDA "
                "graph: their varlen metadata is data dependent; use equal prompt lengths"
            )
        if self.qwen_varlen_host_meta and lens is not None and not in_graph:
            # Optimized: lengths are host ints already -> build on the CPU, one async H2D copy,
            # no device sync. (Not under any capture: host ints would be baked into the
            # captured graph and be wrong on replay.)
            if all(n == txt_len for n in lens):
                return None
            ranges = joint_txt_img_ranges(lens, txt_len, img_len)
            return build_varlen_mask_meta_from_ranges(ranges, txt_len + img_len, device)

        # Reference: derive everything from the device mask (nonzero -> device->host sync).
        txt_mask = encoder_hidden_states_mask
        if txt_mask is None and lens is not None:
            lens_t = torch.tensor(lens, device=device)
            txt_mask = torch.arange(txt_len, device=device)[None, :] < lens_t[:, None]
        if txt_mask is None:
            return None
        img_mask = torch.ones(batch_size, img_len, dtype=torch.bool, device=device)
        meta = build_varlen_mask_meta(torch.cat([txt_mask.to(torch.bool), img_mask], dim=1))
        return meta if meta.has_padding else None

    # -- forward -------------------------------------------------------------------------------

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_hidden_states_mask: torch.Tensor | None = None,
        timestep: torch.Tensor | None = None,
        img_shapes: list[list[tuple[int, int, int]]] | None = None,
        guidance: torch.Tensor | None = None,
        attention_kwargs: dict[str, Any] | None = None,
        controlnet_block_samples: list[torch.Tensor] | None = None,
        additional_t_cond: torch.Tensor | None = None,
        return_dict: bool = True,
        *,
        txt_seq_lens: list[int] | None = None,
    ) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """See the module docstring for shapes. ``attention_kwargs`` is accepted and ignored.

        Over the house limits because the signature is diffusers'
        `QwenImageTransformer2DModel.forward`, which `QwenImagePipeline` calls by keyword.
        """
        encoder_hidden_states, timestep, img_shapes = _required_arguments(
            encoder_hidden_states, timestep, img_shapes, guidance
        )
        timestep_in = timestep  # the caller's tensor object: what the modulation cache keys on

        hidden_states = self.img_in(hidden_states)
        timestep, modulate_index = self._conditioning_timesteps(
            timestep, img_shapes, hidden_states.dtype
        )

        encoder_hidden_states = self.txt_in(self.txt_norm(encoder_hidden_states))
        batch_size, txt_len = encoder_hidden_states.shape[:2]
        img_len = hidden_states.shape[1]
        _check_text_mask(encoder_hidden_states_mask, batch_size, txt_len)

        modulation_key = self._modulation_key(
            timestep_in, additional_t_cond, hidden_states.dtype, hidden_states.device
        )
        temb = self.time_text_embed(timestep, hidden_states, additional_t_cond)
        image_rotary_emb = self.pos_embed(img_shapes, txt_len, hidden_states.device)
        varlen_meta = self._joint_varlen_meta(
            encoder_hidden_states_mask,
            txt_seq_lens,
            batch_size,
            txt_len,
            img_len,
            hidden_states.device,
        )

        conditioning = (temb, image_rotary_emb, varlen_meta, modulate_index, modulation_key)
        hidden_states = self._run_blocks(
            hidden_states, encoder_hidden_states, conditioning, controlnet_block_samples
        )
        output = self._project_out(hidden_states, temb)
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)

    def _conditioning_timesteps(
        self,
        timestep: torch.Tensor,
        img_shapes: list[list[tuple[int, int, int]]],
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The timesteps the modulation sees, in the model's dtype. With ``zero_cond_t`` the
        batch's timesteps are followed by zeros (the condition images are modulated by
        t = 0) and the index that picks one or the other per image token."""
        timestep = timestep.to(dtype)
        if not self.zero_cond_t:
            return timestep, None
        timestep = torch.cat([timestep, timestep * 0], dim=0)
        return timestep, _modulate_index(img_shapes, timestep.device)

    def _run_blocks(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        conditioning: tuple[
            torch.Tensor,
            tuple[torch.Tensor, torch.Tensor],
            VarlenMeta | None,
            torch.Tensor | None,
            ModulationKey | None,
        ],
        controlnet_block_samples: list[torch.Tensor] | None,
    ) -> torch.Tensor:
        """The two streams through every block in turn; each block gets the same
        ``conditioning`` (timestep embedding, RoPE, varlen metadata, modulation index, cache
        key). ControlNet samples, if any, are spread evenly over the blocks: each is added
        after ``interval`` consecutive blocks. Returns the image stream."""
        for index_block, block in enumerate(self.transformer_blocks):
            encoder_hidden_states, hidden_states = block(
                hidden_states, encoder_hidden_states, *conditioning
            )
            if controlnet_block_samples is not None:
                interval = math.ceil(len(self.transformer_blocks) / len(controlnet_block_samples))
                hidden_states = hidden_states + controlnet_block_samples[index_block // interval]
        return hidden_states

    def _project_out(self, hidden_states: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        """The final AdaLN (on the generated image's conditioning only, under
        ``zero_cond_t``) and the projection back to patches."""
        if self.zero_cond_t:
            temb = temb.chunk(2, dim=0)[0]
        hidden_states = self.norm_out(hidden_states, temb)
        return self.proj_out(hidden_states)


def _required_arguments(
    encoder_hidden_states: torch.Tensor | None,
    timestep: torch.Tensor | None,
    img_shapes: list[list[tuple[int, int, int]]] | None,
    guidance: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, list[list[tuple[int, int, int]]]]:
    """The arguments diffusers' signature makes optional that this model needs, checked
    present, and the guidance embedding it does not have, checked absent."""
    if encoder_hidden_states is None or timestep is None or img_shapes is None:
        raise ValueError("encoder_hidden_states, timestep and img_shapes are required")
    if guidance is not None:
        raise ValueError(
            "guidance embedding is not supported (diffusers 0.42 has no guidance embedder)"
        )
    return encoder_hidden_states, timestep, img_shapes


def _modulate_index(
    img_shapes: list[list[tuple[int, int, int]]], device: torch.device
) -> torch.Tensor:
    """zero_cond_t: per sample, 0 for the tokens of its first image (the one generated,
    modulated by t) and 1 for those of the condition images (modulated by t = 0)."""
    return torch.tensor(
        [
            [0] * math.prod(sample[0]) + [1] * sum(math.prod(s) for s in sample[1:])
            for sample in img_shapes
        ],
        device=device,
        dtype=torch.int,
    )


def _check_text_mask(mask: torch.Tensor | None, batch_size: int, txt_len: int) -> None:
    if mask is not None and tuple(mask.shape[:2]) != (batch_size, txt_len):
        raise ValueError(
            f"encoder_hidden_states_mask shape {tuple(mask.shape)} "
            f"must be (batch_size, text_seq_len)=({batch_size}, {txt_len})"
        )
