"""Shared building blocks for the perfguard workload models.

Everything here is numerically identical to the diffusers 0.42 layer of the same name
(same op order, same dtype casts) so the models built on top of it match diffusers to
float32 round-off, and parameter names match so diffusers state dicts load strictly.

Contents, top-down:

* the config record :func:`init_config`, the output container and small layers:
  :class:`Transformer2DModelOutput`, :class:`RMSNorm`,
  :func:`get_timestep_embedding`, :class:`Timesteps`, :class:`TimestepEmbedding`,
  :class:`FeedForward`;
* rotary embeddings: :func:`apply_rotary_emb_complex` (Qwen, interleaved pairs as complex
  numbers) and :func:`apply_rotary_emb_real` (GLM, cos/sin with half-split pairs);
* dense joint attention: :func:`dense_attention` (SDPA over ``[B, S, H, D]``);
* varlen (packed) joint attention: :class:`VarlenMeta`, its two builders
  :func:`build_varlen_mask_meta` (device path, ``nonzero`` -> host sync) and
  :func:`build_varlen_mask_meta_from_ranges` (host path, one non-blocking H2D copy), and
  :func:`varlen_attention` (flash-attn varlen on CUDA when importable, else a packed torch
  path).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "FeedForward",
    "RMSNorm",
    "TimestepEmbedding",
    "Timesteps",
    "Transformer2DModelOutput",
    "VarlenMeta",
    "apply_rotary_emb_complex",
    "apply_rotary_emb_real",
    "build_varlen_mask_meta",
    "build_varlen_mask_meta_from_ranges",
    "dense_attention",
    "get_timestep_embedding",
    "joint_txt_img_ranges",
    "varlen_attention",
]


# ----------------------------------------------------------------------------------------
# Output container and small layers
# ----------------------------------------------------------------------------------------


def init_config(init: Callable[..., None], arguments: dict[str, Any]) -> SimpleNamespace:
    """A diffusers-style read-only config (`model.config.patch_size`, ...): the values in
    `arguments` (the constructor's `locals()`, taken before it binds any other name) of
    `init`'s positional-or-keyword parameters, in their order, as diffusers'
    `register_to_config` records them; keyword-only toggles are not config."""
    params = list(inspect.signature(init).parameters.values())[1:]  # not self
    return SimpleNamespace(
        **{p.name: arguments[p.name] for p in params if p.kind is p.POSITIONAL_OR_KEYWORD}
    )


@dataclass
class Transformer2DModelOutput:
    """Stand-in for diffusers' output class: ``model(...).sample`` works for both."""

    sample: torch.Tensor


class RMSNorm(nn.Module):
    """diffusers ``RMSNorm`` (non-NPU path): variance in float32, weight cast for half types."""

    def __init__(self, dim: int, eps: float, elementwise_affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        if self.weight is None:
            return hidden_states.to(input_dtype)
        if self.weight.dtype in (torch.float16, torch.bfloat16):
            hidden_states = hidden_states.to(self.weight.dtype)
        return hidden_states * self.weight


def get_timestep_embedding(
    timesteps: torch.Tensor,
    embedding_dim: int,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1,
    scale: float = 1,
    max_period: int = 10000,
) -> torch.Tensor:
    """Sinusoidal timestep embedding ``[N] -> [N, embedding_dim]`` (DDPM style, as diffusers)."""
    if timesteps.dim() != 1:
        raise ValueError(f"timesteps must be 1-D, got shape {tuple(timesteps.shape)}")
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(
        start=0, end=half_dim, dtype=torch.float32, device=timesteps.device
    )
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = F.pad(emb, (0, 1, 0, 0))
    return emb


class Timesteps(nn.Module):
    """Parameter-free sinusoidal projection of a 1-D timestep tensor."""

    def __init__(
        self,
        num_channels: int,
        flip_sin_to_cos: bool,
        downscale_freq_shift: float,
        scale: float = 1,
    ) -> None:
        super().__init__()
        self.num_channels = num_channels
        self.flip_sin_to_cos = flip_sin_to_cos
        self.downscale_freq_shift = downscale_freq_shift
        self.scale = scale

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        return get_timestep_embedding(
            timesteps,
            self.num_channels,
            flip_sin_to_cos=self.flip_sin_to_cos,
            downscale_freq_shift=self.downscale_freq_shift,
            scale=self.scale,
        )


class TimestepEmbedding(nn.Module):
    """``linear_1 -> SiLU -> linear_2`` (diffusers ``TimestepEmbedding`` with defaults)."""

    def __init__(self, in_channels: int, time_embed_dim: int) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(sample)))


class _ProjActivation(nn.Module):
    """diffusers ``GELU`` / ``LinearActivation``: a Linear named ``proj`` then the activation."""

    def __init__(self, dim_in: int, dim_out: int, activation: str) -> None:
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)
        self.activation_name = activation

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.proj(hidden_states)
        if self.activation_name == "gelu":
            return F.gelu(hidden_states)
        if self.activation_name == "gelu-approximate":
            return F.gelu(hidden_states, approximate="tanh")
        return F.silu(hidden_states)  # "linear-silu"


class FeedForward(nn.Module):
    """diffusers ``FeedForward``: ``net = [act(proj), Dropout, Linear]``.

    Supported ``activation_fn``: ``"gelu"``, ``"gelu-approximate"`` (tanh) and
    ``"linear-silu"`` -- the ones Qwen-Image and GLM-Image use.
    """

    _ACTIVATIONS = ("gelu", "gelu-approximate", "linear-silu")

    def __init__(
        self,
        dim: int,
        dim_out: int | None = None,
        mult: int = 4,
        activation_fn: str = "gelu-approximate",
        inner_dim: int | None = None,
    ) -> None:
        super().__init__()
        if activation_fn not in self._ACTIVATIONS:
            raise ValueError(f"activation_fn {activation_fn!r} not in {self._ACTIVATIONS}")
        inner_dim = int(dim * mult) if inner_dim is None else inner_dim
        dim_out = dim if dim_out is None else dim_out
        self.net = nn.ModuleList(
            [
                _ProjActivation(dim, inner_dim, activation_fn),
                nn.Dropout(0.0),
                nn.Linear(inner_dim, dim_out),
            ]
        )

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        for module in self.net:
            hidden_states = module(hidden_states)
        return hidden_states


# ----------------------------------------------------------------------------------------
# Rotary embeddings
# ----------------------------------------------------------------------------------------


def apply_rotary_emb_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Qwen RoPE: ``x [B, S, H, D]`` with adjacent pairs as complex numbers times
    ``freqs_cis [S, D/2]`` (complex64). Computed in float32, returned in ``x.dtype``."""
    x_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(x_complex * freqs_cis.unsqueeze(1)).flatten(3)
    return out.type_as(x)


def apply_rotary_emb_real(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sequence_dim: int = 1
) -> torch.Tensor:
    """GLM RoPE (diffusers ``apply_rotary_emb(use_real=True, use_real_unbind_dim=-2)``):
    the head dim is split in halves ``(real, imag)``; ``cos``/``sin`` are ``[S, D]``."""
    if sequence_dim == 1:
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    elif sequence_dim == 2:
        cos, sin = cos[None, None, :, :], sin[None, None, :, :]
    else:
        raise ValueError(f"sequence_dim must be 1 or 2, got {sequence_dim}")
    cos, sin = cos.to(x.device), sin.to(x.device)
    x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
    x_rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


# ----------------------------------------------------------------------------------------
# Dense joint attention
# ----------------------------------------------------------------------------------------


def dense_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """SDPA on ``[B, S, H, D]`` tensors, returning ``[B, S, H, D]`` (diffusers' native backend).

    ``attn_mask`` is anything SDPA accepts for ``[B, H, S, S]`` scores, e.g. a boolean key
    mask ``[B, 1, 1, S]``.
    """
    q, k, v = (t.permute(0, 2, 1, 3) for t in (query, key, value))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0)
    return out.permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------
# Varlen (packed) joint attention
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class VarlenMeta:
    """Packing metadata for a padded batch ``[B, S]`` (flash-attn varlen conventions).

    Attributes:
        cu_seqlens: int32 ``[B + 1]`` cumulative valid-token counts (on the target device).
        indices: int64 ``[N]`` flat positions ``row * S + col`` of the valid tokens, row-major;
            ``packed = padded.reshape(B * S, ...)[indices]``.
        inv_indices: int32 ``[B * S]``; position in the packed tensor, ``-1`` for padding.
        max_seqlen: longest row (python int, as flash-attn wants).
        seqlens: per-row valid counts (python ints) -- lets the torch fallback slice the
            packed tensor without another device->host sync.
        batch_size, seq_len: the padded shape ``(B, S)``.
    """

    cu_seqlens: torch.Tensor
    indices: torch.Tensor
    inv_indices: torch.Tensor
    max_seqlen: int
    seqlens: tuple[int, ...]
    batch_size: int
    seq_len: int

    @property
    def total_tokens(self) -> int:
        """Number of valid (packed) tokens ``N``."""
        return sum(self.seqlens)

    @property
    def has_padding(self) -> bool:
        return self.total_tokens != self.batch_size * self.seq_len


def build_varlen_mask_meta(mask: torch.Tensor) -> VarlenMeta:
    """Varlen metadata from a boolean ``[B, S]`` mask living on the device (the reference path).

    ``nonzero()`` and the per-row lengths need a device->host sync (their sizes are data
    dependent); this is what :func:`build_varlen_mask_meta_from_ranges` avoids when the
    valid ranges are already known on the host.
    """
    if mask.dim() != 2:
        raise ValueError(f"mask must be [B, S], got shape {tuple(mask.shape)}")
    mask = mask.to(torch.bool)
    batch_size, seq_len = mask.shape
    flat = mask.reshape(-1)
    lens = mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = F.pad(torch.cumsum(lens, dim=0, dtype=torch.int32), (1, 0))
    indices = flat.nonzero().squeeze(1)  # host sync: output size is data dependent
    packed_pos = torch.cumsum(flat, dim=0, dtype=torch.int32) - 1
    inv_indices = torch.where(flat, packed_pos, torch.full_like(packed_pos, -1))
    seqlens = tuple(int(n) for n in lens.tolist())  # host sync (already paid for above)
    return VarlenMeta(
        cu_seqlens=cu_seqlens,
        indices=indices,
        inv_indices=inv_indices,
        max_seqlen=max(seqlens, default=0),
        seqlens=seqlens,
        batch_size=batch_size,
        seq_len=seq_len,
    )


RowRanges = Sequence[tuple[int, int]]


def _normalize_ranges(
    ranges: Sequence[tuple[int, int]] | Sequence[RowRanges], seq_len: int
) -> list[list[tuple[int, int]]]:
    rows: list[list[tuple[int, int]]] = []
    for b, row in enumerate(ranges):
        # A row is either one (start, end) pair of ints or a sequence of such pairs.
        row_ranges = [row] if len(row) == 2 and all(isinstance(v, int) for v in row) else row
        prev_end = 0
        out: list[tuple[int, int]] = []
        for rng in row_ranges:
            start, end = (int(v) for v in rng)
            if not 0 <= start <= end <= seq_len or start < prev_end:
                raise ValueError(
                    f"row {b}: range {(start, end)} must satisfy 0 <= start <= end <= "
                    f"seq_len={seq_len} and be sorted and non-overlapping (got {list(row_ranges)})"
                )
            prev_end = end
            out.append((start, end))
        rows.append(out)
    return rows


def build_varlen_mask_meta_from_ranges(
    ranges: Sequence[tuple[int, int]] | Sequence[RowRanges],
    seq_len: int,
    device: torch.device | str,
) -> VarlenMeta:
    """Varlen metadata from per-row valid ranges known on the host (the optimized path).

    Args:
        ranges: per row, either one ``(start, end)`` half-open range of valid columns or a
            sorted list of non-overlapping ranges (Qwen's joint ``[txt ; img]`` row is
            ``[(0, txt_len_b), (T, T + I)]``, see :func:`joint_txt_img_ranges`).
        seq_len: padded row length ``S``.
        device: where the metadata tensors must live.

    Everything is built on the CPU from python ints, packed into one int64 buffer and sent
    with a single ``non_blocking`` H2D copy (pinned when the target is CUDA), so building
    never waits on the device. Output is identical to :func:`build_varlen_mask_meta` on the
    equivalent mask.
    """
    device = torch.device(device)
    rows = _normalize_ranges(ranges, seq_len)
    batch_size = len(rows)
    seqlens = tuple(sum(end - start for start, end in row) for row in rows)
    total = sum(seqlens)

    parts = [
        torch.arange(b * seq_len + start, b * seq_len + end, dtype=torch.int64)
        for b, row in enumerate(rows)
        for start, end in row
        if end > start
    ]
    indices = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
    inv_indices = torch.full((batch_size * seq_len,), -1, dtype=torch.int64)
    inv_indices[indices] = torch.arange(total, dtype=torch.int64)
    cu_seqlens = torch.tensor([0, *_cumsum(seqlens)], dtype=torch.int64)

    # One buffer -> one H2D copy: [cu_seqlens (B+1) | indices (N) | inv_indices (B*S)].
    host = torch.cat([cu_seqlens, indices, inv_indices])
    if device.type == "cuda":
        host = host.pin_memory()  # non_blocking is only truly async from pinned memory
    dev = host.to(device, non_blocking=True)
    n_cu = batch_size + 1
    return VarlenMeta(
        cu_seqlens=dev[:n_cu].to(torch.int32),
        indices=dev[n_cu : n_cu + total],
        inv_indices=dev[n_cu + total :].to(torch.int32),
        max_seqlen=max(seqlens, default=0),
        seqlens=seqlens,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def _cumsum(values: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for v in values:
        acc += v
        out.append(acc)
    return out


def joint_txt_img_ranges(
    txt_seq_lens: Sequence[int], txt_len: int, img_len: int
) -> list[list[tuple[int, int]]]:
    """Valid ranges of a joint ``[txt (padded to txt_len) ; img]`` row per batch entry."""
    return [[(0, int(n)), (txt_len, txt_len + img_len)] for n in txt_seq_lens]


@functools.cache
def _flash_attn_varlen_func():  # pragma: no cover - needs flash-attn + CUDA
    # Cached: called in every layer's attention, and a failed import is not cached by
    # Python -- each retry would search sys.path again inside the timed forward.
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: VarlenMeta
) -> torch.Tensor:
    """Attention restricted to the valid tokens of each row; ``[B, S, H, D] -> [B, S, H, D]``.

    Valid query rows equal dense SDPA with the boolean key mask built from ``meta`` (up to
    float round-off). Padded query rows are **0** (flash-attn varlen semantics): they never
    feed a valid token because padded keys are masked in every layer.

    Uses ``flash_attn_varlen_func`` for fp16/bf16 CUDA tensors when flash-attn is importable,
    otherwise a packed torch path: gather valid tokens with ``indices``, one SDPA per row on
    its contiguous slice of the packed tensor, scatter back with ``inv_indices``.
    """
    batch_size, seq_len, heads, head_dim = query.shape
    if (batch_size, seq_len) != (meta.batch_size, meta.seq_len):
        raise ValueError(
            f"VarlenMeta is for [B, S]=({meta.batch_size}, {meta.seq_len}) but q/k/v are "
            f"{tuple(query.shape)}"
        )
    q, k, v = (
        t.reshape(batch_size * seq_len, heads, head_dim).index_select(0, meta.indices)
        for t in (query, key, value)
    )

    flash = (
        _flash_attn_varlen_func()
        if query.is_cuda and query.dtype in (torch.float16, torch.bfloat16)
        else None
    )
    if flash is not None:  # pragma: no cover - needs flash-attn + CUDA
        out = flash(q, k, v, meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen)
    else:
        out = torch.empty_like(q)
        start = 0
        for n in meta.seqlens:
            if n:
                # [n, H, D] -> [1, H, n, D] for SDPA, and back.
                qs, ks, vs = (t[start : start + n].transpose(0, 1)[None] for t in (q, k, v))
                out[start : start + n] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(
                    0, 1
                )
            start += n

    # Scatter back by gathering: row 0 of `padded` is zeros, inv_indices + 1 maps padding
    # (-1) there -- a static-shape gather, no data-dependent index_put.
    padded = torch.cat([out.new_zeros(1, heads, head_dim), out], dim=0)
    full = padded.index_select(0, meta.inv_indices + 1)
    return full.reshape(batch_size, seq_len, heads, head_dim)
