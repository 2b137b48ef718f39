"""GLM-Image DiT transformer (``GlmImageTransformer2DModel``), diffusers 0.42 compatible.

A plain ``torch.nn.Module`` re-implementation of
``diffusers.models.transformers.transformer_glm_image``: same constructor arguments, same
parameter names (a diffusers state dict of the same config loads with ``strict=True``) and
the same numerics. Not ported: the image-edit KV caches (``kv_caches`` is accepted only
when it is inactive, as the text-to-image pipeline passes it), gradient checkpointing.

Inputs of :meth:`GlmImageTransformer2DModel.forward` (as ``GlmImagePipeline`` passes them):

* ``hidden_states``: ``[B, in_channels, H/8, W/8]`` latents (NCHW, not packed).
* ``encoder_hidden_states``: ``[B, L, text_embed_dim]`` glyph (ByT5) embeddings, *left*
  padded with zeros to the longest prompt; no attention mask is passed.
* ``prior_token_id``: ``[B, S]`` int64 prior (VQ) token ids, ``S = (H/16) * (W/16)`` -- one
  per image token after 2x2 patching -- in ``[0, prior_vq_quantizer_codebook_size)``.
* ``prior_token_drop``: bool ``[B, S]`` (or ``[B, 1]``, expanded): which prior embeddings
  to zero. The pipeline passes all ``False`` for the cond pass and all ``True`` for the
  uncond pass (``torch.full_like(prior_token_ids, ..., dtype=torch.bool)``).
* ``timestep``: ``[B]`` float (``t.expand(B) - 1``, ``t`` in ``(0, 1000]``).
* ``target_size``: ``[B, 2]`` float ``(height, width)`` in pixels.
* ``crop_coords``: ``[B, 2]`` float top-left crop, normally zeros.

Output: ``[B, out_channels, H/8, W/8]`` (``.sample`` or ``[0]`` with ``return_dict=False``).

Optimization (attribute, default on; the reference path sits beside it):

* ``glm_prior_drop_inplace`` -- zero the dropped prior embeddings in place
  (``prior_embedding[prior_token_drop] *= 0.0``, what diffusers does) instead of allocating
  a second ``[B, S, inner_dim]`` tensor with ``masked_fill``. Inside a breakable CUDA graph,
  a plain ``torch.cuda.graph`` capture or a torch.compile trace
  (``graphs.in_static_capture``) the in-place boolean-index write (``nonzero`` +
  ``index_put_``) is not capturable, so the static-shape ``masked_fill`` is used there.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from perfguard.workloads.attention import (
    FeedForward,
    TimestepEmbedding,
    Timesteps,
    Transformer2DModelOutput,
    apply_rotary_emb_real,
    dense_attention,
    init_config,
)
from perfguard.workloads.graphs import in_static_capture

__all__ = ["GlmImageTransformer2DModel", "GlmImageTransformerBlock", "check_prior_token_drop"]


# ----------------------------------------------------------------------------------------
# Helpers: embeddings, projector, RoPE, prior-drop shape contract
# ----------------------------------------------------------------------------------------


class PixArtAlphaTextProjection(nn.Module):
    """``linear_1 -> SiLU -> linear_2`` (diffusers' class with ``act_fn="silu"``)."""

    def __init__(self, in_features: int, hidden_size: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_features, hidden_size)
        self.act_1 = nn.SiLU()
        self.linear_2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, caption: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act_1(self.linear_1(caption)))


class GlmImageCombinedTimestepSizeEmbeddings(nn.Module):
    def __init__(
        self,
        embedding_dim: int,
        condition_dim: int,
        pooled_projection_dim: int,
        timesteps_dim: int = 256,
    ) -> None:
        super().__init__()
        self.time_proj = Timesteps(
            num_channels=timesteps_dim, flip_sin_to_cos=True, downscale_freq_shift=0
        )
        self.condition_proj = Timesteps(
            num_channels=condition_dim, flip_sin_to_cos=True, downscale_freq_shift=0
        )
        self.timestep_embedder = TimestepEmbedding(timesteps_dim, embedding_dim)
        self.condition_embedder = PixArtAlphaTextProjection(pooled_projection_dim, embedding_dim)

    def forward(
        self,
        timestep: torch.Tensor,
        target_size: torch.Tensor,
        crop_coords: torch.Tensor,
        hidden_dtype: torch.dtype,
    ) -> torch.Tensor:
        timesteps_proj = self.time_proj(timestep)
        crop_coords_proj = self.condition_proj(crop_coords.flatten()).view(crop_coords.size(0), -1)
        target_size_proj = self.condition_proj(target_size.flatten()).view(target_size.size(0), -1)
        condition_proj = torch.cat([crop_coords_proj, target_size_proj], dim=1)
        timesteps_emb = self.timestep_embedder(timesteps_proj.to(dtype=hidden_dtype))
        condition_emb = self.condition_embedder(condition_proj.to(dtype=hidden_dtype))
        return F.silu(timesteps_emb + condition_emb)


class GlmImageImageProjector(nn.Module):
    """Patchify ``[B, C, H, W] -> [B, (H/p)(W/p), C*p*p]`` and project to ``hidden_size``."""

    def __init__(self, in_channels: int = 16, hidden_size: int = 2560, patch_size: int = 2):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Linear(in_channels * patch_size**2, hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        batch_size, channel, height, width = hidden_states.shape
        p = self.patch_size
        hidden_states = hidden_states.reshape(batch_size, channel, height // p, p, width // p, p)
        hidden_states = hidden_states.permute(0, 2, 4, 1, 3, 5).flatten(3, 5).flatten(1, 2)
        return self.proj(hidden_states)


class GlmImageRotaryPosEmbed(nn.Module):
    """2-D RoPE over the patch grid; ``(cos, sin)`` each ``[(H/p)(W/p), attention_head_dim]``.

    Computed on the CPU with diffusers' exact ops and cached per ``(h, w, device)``.
    """

    def __init__(self, dim: int, patch_size: int, theta: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.patch_size = patch_size
        self.theta = theta
        self._cache: dict[tuple[int, int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        height = hidden_states.shape[2] // self.patch_size
        width = hidden_states.shape[3] // self.patch_size
        key = (height, width, hidden_states.device)
        if key not in self._cache:
            dim_h = dim_w = self.dim // 2
            cpu = torch.device("cpu")
            h_exp = torch.arange(0, dim_h, 2, dtype=torch.float32, device=cpu)[: dim_h // 2]
            w_exp = torch.arange(0, dim_w, 2, dtype=torch.float32, device=cpu)[: dim_w // 2]
            h_inv_freq = 1.0 / (self.theta ** (h_exp.float() / dim_h))
            w_inv_freq = 1.0 / (self.theta ** (w_exp.float() / dim_w))
            freqs_h = torch.outer(torch.arange(height, device=cpu), h_inv_freq)
            freqs_w = torch.outer(torch.arange(width, device=cpu), w_inv_freq)
            freqs_h = freqs_h.unsqueeze(1).expand(height, width, -1)
            freqs_w = freqs_w.unsqueeze(0).expand(height, width, -1)
            freqs = torch.cat([freqs_h, freqs_w], dim=-1)
            freqs = torch.cat([freqs, freqs], dim=-1).reshape(height * width, -1)
            device = hidden_states.device
            self._cache[key] = (freqs.cos().to(device), freqs.sin().to(device))
        return self._cache[key]


def check_prior_token_drop(
    prior_token_drop: torch.Tensor, embedding_shape: torch.Size | tuple[int, ...]
) -> torch.Tensor:
    """Enforce the ``prior_token_drop`` shape contract against ``prior_embedding [B, S, D]``.

    Returns a bool ``[B, S]`` mask: ``[B, S]`` as is, ``[B, 1]`` explicitly expanded (a
    broadcast would otherwise silently index the wrong rows in ``emb[mask]``). Anything else
    -- ``[B, S, 1]``, wrong ``B`` or ``S``, a non-bool dtype (diffusers would *integer*-index
    with it) -- is a ``ValueError`` naming both shapes.
    """
    emb_shape = tuple(embedding_shape)
    drop_shape = tuple(prior_token_drop.shape)
    if len(emb_shape) != 3:
        raise ValueError(
            f"prior_embedding must be [B, S, D], got {emb_shape} (prior_token_drop is {drop_shape})"
        )
    batch_size, seq_len = emb_shape[:2]
    if prior_token_drop.dtype != torch.bool:
        raise ValueError(
            f"prior_token_drop must be a bool tensor, got dtype {prior_token_drop.dtype} "
            f"with shape {drop_shape} (prior_embedding is {emb_shape})"
        )
    if drop_shape == (batch_size, seq_len):
        return prior_token_drop
    if drop_shape == (batch_size, 1):
        return prior_token_drop.expand(batch_size, seq_len)
    raise ValueError(
        f"prior_token_drop has shape {drop_shape}; it must be [B, S]={(batch_size, seq_len)} "
        f"(or broadcastable [B, 1]={(batch_size, 1)}) to match prior_embedding {emb_shape}"
    )


# ----------------------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------------------


class GlmImageAttention(nn.Module):
    """Joint self-attention over ``[txt ; img]`` with LayerNorm qk-norm (no affine) and RoPE
    on the image tokens only. Parameter names follow diffusers' ``Attention``."""

    def __init__(self, dim: int, heads: int, dim_head: int, eps: float = 1e-5) -> None:
        super().__init__()
        inner_dim = heads * dim_head
        self.heads = heads
        self.norm_q = nn.LayerNorm(dim_head, eps=eps, elementwise_affine=False, bias=False)
        self.norm_k = nn.LayerNorm(dim_head, eps=eps, elementwise_affine=False, bias=False)
        self.to_q = nn.Linear(dim, inner_dim)
        self.to_k = nn.Linear(dim, inner_dim)
        self.to_v = nn.Linear(dim, inner_dim)
        self.to_out = nn.ModuleList([nn.Linear(inner_dim, dim), nn.Dropout(0.0)])

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dtype = encoder_hidden_states.dtype
        batch_size, text_seq_length, _ = encoder_hidden_states.shape
        image_seq_length = hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)

        query = self.to_q(hidden_states).unflatten(2, (self.heads, -1))
        key = self.to_k(hidden_states).unflatten(2, (self.heads, -1))
        value = self.to_v(hidden_states).unflatten(2, (self.heads, -1))
        query = self.norm_q(query).to(dtype=dtype)
        key = self.norm_k(key).to(dtype=dtype)

        if image_rotary_emb is not None:
            cos, sin = image_rotary_emb
            query = torch.cat(
                [
                    query[:, :text_seq_length],
                    apply_rotary_emb_real(query[:, text_seq_length:], cos, sin, sequence_dim=1),
                ],
                dim=1,
            )
            key = torch.cat(
                [
                    key[:, :text_seq_length],
                    apply_rotary_emb_real(key[:, text_seq_length:], cos, sin, sequence_dim=1),
                ],
                dim=1,
            )

        if attention_mask is not None:
            # diffusers 0.42 parity: the [B, L] text mask becomes a 0/1 *float* matrix that
            # SDPA adds to the scores (it biases rather than masks). The GLM pipeline never
            # passes a mask; this only keeps the two implementations equal when one is given.
            if attention_mask.dim() != 2:
                raise ValueError("attention_mask must be [batch_size, text_seq_length]")
            mix = torch.ones((batch_size, text_seq_length + image_seq_length), device=query.device)
            mix[:, :text_seq_length] = attention_mask.float().to(query.device)
            mix = mix.unsqueeze(2)
            attention_mask = ((mix @ mix.transpose(1, 2)) > 0).unsqueeze(1).to(query.dtype)

        out = dense_attention(query, key, value, attn_mask=attention_mask)
        out = out.flatten(2, 3).to(query.dtype)
        out = self.to_out[1](self.to_out[0](out))
        encoder_hidden_states, hidden_states = out.split(
            [text_seq_length, out.size(1) - text_seq_length], dim=1
        )
        return hidden_states, encoder_hidden_states


# ----------------------------------------------------------------------------------------
# Block
# ----------------------------------------------------------------------------------------


class GlmImageAdaLayerNormZero(nn.Module):
    """One ``Linear(temb -> 12 * dim)``: shift/scale/gate for attention and MLP, per stream."""

    def __init__(self, embedding_dim: int, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-5)
        self.norm_context = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-5)
        self.linear = nn.Linear(embedding_dim, 12 * dim)

    def forward(
        self, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor, temb: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        dtype = hidden_states.dtype
        norm_hidden_states = self.norm(hidden_states).to(dtype=dtype)
        norm_encoder_hidden_states = self.norm_context(encoder_hidden_states).to(dtype=dtype)
        (
            shift_msa,
            c_shift_msa,
            scale_msa,
            c_scale_msa,
            gate_msa,
            c_gate_msa,
            shift_mlp,
            c_shift_mlp,
            scale_mlp,
            c_scale_mlp,
            gate_mlp,
            c_gate_mlp,
        ) = self.linear(temb).chunk(12, dim=1)
        hidden_states = norm_hidden_states * (1 + scale_msa.unsqueeze(1)) + shift_msa.unsqueeze(1)
        encoder_hidden_states = norm_encoder_hidden_states * (
            1 + c_scale_msa.unsqueeze(1)
        ) + c_shift_msa.unsqueeze(1)
        return (
            hidden_states,
            gate_msa,
            shift_mlp,
            scale_mlp,
            gate_mlp,
            encoder_hidden_states,
            c_gate_msa,
            c_shift_mlp,
            c_scale_mlp,
            c_gate_mlp,
        )


class GlmImageTransformerBlock(nn.Module):
    def __init__(
        self,
        dim: int = 2560,
        num_attention_heads: int = 64,
        attention_head_dim: int = 40,
        time_embed_dim: int = 512,
    ) -> None:
        super().__init__()
        self.norm1 = GlmImageAdaLayerNormZero(time_embed_dim, dim)
        self.attn1 = GlmImageAttention(dim, num_attention_heads, attention_head_dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-5)
        self.norm2_context = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-5)
        self.ff = FeedForward(dim=dim, dim_out=dim, activation_fn="gelu-approximate")

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (
            norm_hidden_states,
            gate_msa,
            shift_mlp,
            scale_mlp,
            gate_mlp,
            norm_encoder_hidden_states,
            c_gate_msa,
            c_shift_mlp,
            c_scale_mlp,
            c_gate_mlp,
        ) = self.norm1(hidden_states, encoder_hidden_states, temb)

        attn_hidden_states, attn_encoder_hidden_states = self.attn1(
            norm_hidden_states, norm_encoder_hidden_states, image_rotary_emb, attention_mask
        )
        hidden_states = hidden_states + attn_hidden_states * gate_msa.unsqueeze(1)
        encoder_hidden_states = encoder_hidden_states + attn_encoder_hidden_states * (
            c_gate_msa.unsqueeze(1)
        )

        norm_hidden_states = self.norm2(hidden_states) * (
            1 + scale_mlp.unsqueeze(1)
        ) + shift_mlp.unsqueeze(1)
        norm_encoder_hidden_states = self.norm2_context(encoder_hidden_states) * (
            1 + c_scale_mlp.unsqueeze(1)
        ) + c_shift_mlp.unsqueeze(1)
        hidden_states = hidden_states + self.ff(norm_hidden_states) * gate_mlp.unsqueeze(1)
        encoder_hidden_states = encoder_hidden_states + self.ff(
            norm_encoder_hidden_states
        ) * c_gate_mlp.unsqueeze(1)
        return hidden_states, encoder_hidden_states


# ----------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------


class GlmImageAdaLayerNormContinuous(nn.Module):
    """Final AdaLN: ``LN(x) * (1 + scale) + shift``, ``(scale, shift) = linear(cond)`` --
    no SiLU before the linear (the conditioning is already SiLU'd)."""

    def __init__(self, embedding_dim: int, conditioning_embedding_dim: int, eps: float = 1e-5):
        super().__init__()
        self.linear = nn.Linear(conditioning_embedding_dim, embedding_dim * 2)
        self.norm = nn.LayerNorm(embedding_dim, eps, elementwise_affine=False)

    def forward(self, x: torch.Tensor, conditioning_embedding: torch.Tensor) -> torch.Tensor:
        emb = self.linear(conditioning_embedding.to(x.dtype))
        scale, shift = torch.chunk(emb, 2, dim=1)
        return self.norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]


class GlmImageTransformer2DModel(nn.Module):
    """GLM-Image transformer; constructor arguments as diffusers 0.42, plus the toggle
    ``glm_prior_drop_inplace`` (default on)."""

    def __init__(
        self,
        patch_size: int = 2,
        in_channels: int = 16,
        out_channels: int = 16,
        num_layers: int = 30,
        attention_head_dim: int = 40,
        num_attention_heads: int = 64,
        text_embed_dim: int = 1472,
        time_embed_dim: int = 512,
        condition_dim: int = 256,
        prior_vq_quantizer_codebook_size: int = 16384,
        *,
        glm_prior_drop_inplace: bool = True,
    ) -> None:
        """Over the house limits because the parameters are diffusers'
        `GlmImageTransformer2DModel.__init__` (its config keys, passed by name from a
        checkpoint's config), plus the toggle."""
        super().__init__()
        if attention_head_dim % 4:
            raise ValueError(f"attention_head_dim must be divisible by 4, got {attention_head_dim}")
        self.config = init_config(GlmImageTransformer2DModel.__init__, locals())
        # target_size and crop_coords: two sincos embeddings of 2 * condition_dim each.
        pooled_projection_dim = 2 * 2 * condition_dim
        inner_dim = num_attention_heads * attention_head_dim

        self.rope = GlmImageRotaryPosEmbed(attention_head_dim, patch_size, theta=10000.0)
        self.image_projector = GlmImageImageProjector(in_channels, inner_dim, patch_size)
        self.glyph_projector = FeedForward(
            text_embed_dim, inner_dim, inner_dim=inner_dim, activation_fn="gelu"
        )
        self.prior_token_embedding = nn.Embedding(prior_vq_quantizer_codebook_size, inner_dim)
        self.prior_projector = FeedForward(
            inner_dim, inner_dim, inner_dim=inner_dim, activation_fn="linear-silu"
        )
        self.time_condition_embed = GlmImageCombinedTimestepSizeEmbeddings(
            embedding_dim=time_embed_dim,
            condition_dim=condition_dim,
            pooled_projection_dim=pooled_projection_dim,
            timesteps_dim=time_embed_dim,
        )
        self.transformer_blocks = nn.ModuleList(
            [
                GlmImageTransformerBlock(
                    inner_dim, num_attention_heads, attention_head_dim, time_embed_dim
                )
                for _ in range(num_layers)
            ]
        )
        self.norm_out = GlmImageAdaLayerNormContinuous(inner_dim, time_embed_dim)
        self.proj_out = nn.Linear(inner_dim, patch_size * patch_size * out_channels)

        self.glm_prior_drop_inplace = glm_prior_drop_inplace
        self.prior_drops_inplace = 0  # passes that took the in-place drop (a plain int)

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_out.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj_out.weight.device

    def drop_prior_tokens(
        self, prior_embedding: torch.Tensor, prior_token_drop: torch.Tensor
    ) -> torch.Tensor:
        """Zero the rows of ``prior_embedding [B, S, D]`` selected by ``prior_token_drop``."""
        drop = check_prior_token_drop(prior_token_drop, prior_embedding.shape)
        if self.glm_prior_drop_inplace and not in_static_capture():
            # Optimized (diffusers' own line): write into the embedding output in place, no
            # second [B, S, D] buffer -- the cond pass (nothing dropped) allocates nothing.
            # Values: x * 0.0 gives -0.0 for negative x where masked_fill gives +0.0; equal
            # under ==, and the prior projector's bias makes the next op's output identical.
            prior_embedding[drop] *= 0.0
            self.prior_drops_inplace += 1
            return prior_embedding
        # Reference / graph-safe: static-shape out-of-place fill; no nonzero, no index_put_
        # with a data-dependent shape, so it is capturable in a CUDA graph.
        return prior_embedding.masked_fill(drop.unsqueeze(-1), 0)

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        prior_token_id: torch.Tensor,
        prior_token_drop: torch.Tensor,
        timestep: torch.Tensor,
        target_size: torch.Tensor,
        crop_coords: torch.Tensor,
        attention_kwargs: dict[str, Any] | None = None,
        return_dict: bool = True,
        attention_mask: torch.Tensor | None = None,
        kv_caches: Any = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Transformer2DModelOutput | tuple[torch.Tensor]:
        """See the module docstring for shapes. ``attention_kwargs`` is accepted and ignored;
        ``kv_caches`` only when inactive (every layer's ``mode`` is ``None``).

        Over the house limits because the signature is diffusers'
        `GlmImageTransformer2DModel.forward`, which `GlmImagePipeline` calls by keyword.
        """
        if kv_caches is not None and any(
            getattr(c, "mode", None) is not None for c in getattr(kv_caches, "caches", [kv_caches])
        ):
            raise NotImplementedError("GLM-Image image-edit KV caches are not supported")
        batch_size, _, height, width = hidden_states.shape
        if image_rotary_emb is None:
            image_rotary_emb = self.rope(hidden_states)

        p = self.config.patch_size
        post_patch_height, post_patch_width = height // p, width // p

        hidden_states = self.image_projector(hidden_states)
        encoder_hidden_states = self.glyph_projector(encoder_hidden_states)
        prior_embedding = self.prior_token_embedding(prior_token_id)
        prior_embedding = self.drop_prior_tokens(prior_embedding, prior_token_drop)
        hidden_states = hidden_states + self.prior_projector(prior_embedding)

        temb = self.time_condition_embed(timestep, target_size, crop_coords, hidden_states.dtype)

        for block in self.transformer_blocks:
            hidden_states, encoder_hidden_states = block(
                hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask
            )

        hidden_states = self.proj_out(self.norm_out(hidden_states, temb))
        # Unpatchify (B, H_p, W_p, C, p, p) -> (B, C, H_p * p, W_p * p).
        hidden_states = hidden_states.reshape(
            batch_size, post_patch_height, post_patch_width, -1, p, p
        )
        output = hidden_states.permute(0, 3, 1, 4, 2, 5).flatten(4, 5).flatten(2, 3)
        if not return_dict:
            return (output,)
        return Transformer2DModelOutput(sample=output)
