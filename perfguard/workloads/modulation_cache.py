"""The modulation cache's key and slot (Qwen-Image's ``qwen_modulation_cache``).

With serial CFG the cond and uncond passes of a step get the same timestep tensor object,
so every block's ``img_mod(temb)`` / ``txt_mod(temb)`` is identical; a block keeps the first
pass's projections in a `ModulationSlot` and the second pass reuses them when its
`ModulationKey` matches. The model decides when a hit is sound
(`perfguard.workloads.qwen_image`); this module says what a hit must match.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModulationKey", "ModulationSlot", "tensor_version"]


def tensor_version(t: torch.Tensor) -> int | None:
    """``t._version``, or None for an inference tensor: it has no version counter (reading
    `_version` raises) and can only be mutated inside inference_mode, which this cache then
    cannot detect (see `ModulationKey`)."""
    return None if t.is_inference() else t._version


@dataclass(frozen=True, eq=False)
class ModulationKey:
    """Identity of the conditioning a block's ``img_mod``/``txt_mod`` outputs derive from.

    The key holds strong references to the keyed tensors, not just their ``id``: an ``id``
    is a memory address, and once a tensor is freed a *new* timestep tensor can be allocated
    at the same address with different values -- an id-only key would then return stale
    projections. Holding the reference keeps the address occupied for as long as the key
    lives (one CFG pair: the slot is consumed on the hit), at the cost of keeping a ``[B]``
    tensor alive. ``_version`` catches in-place edits (``t.add_(0)`` bumps it) of normal
    tensors; inference tensors have no version counter (``None``), so an in-place edit of an
    inference-mode timestep between the two passes is not detected -- pipelines create a
    fresh timestep tensor per step anyway.
    """

    timestep: torch.Tensor
    timestep_version: int | None
    additional_t_cond: torch.Tensor | None
    additional_t_cond_version: int | None
    dtype: torch.dtype
    device: torch.device
    # Versions of the timestep-embedder weights: temb also depends on them.
    weights_version: tuple[int | None, ...]

    def matches(self, other: ModulationKey) -> bool:
        return (
            self.timestep is other.timestep
            and self.timestep_version == other.timestep_version
            and self.additional_t_cond is other.additional_t_cond
            and self.additional_t_cond_version == other.additional_t_cond_version
            and self.dtype == other.dtype
            and self.device == other.device
            and self.weights_version == other.weights_version
        )


@dataclass(frozen=True, eq=False)
class ModulationSlot:
    """A block's cached ``img_mod`` / ``txt_mod`` outputs and what they were computed from."""

    key: ModulationKey
    weights_version: tuple[int | None, ...]  # img_mod / txt_mod weights of the block
    img_mod_params: torch.Tensor
    txt_mod_params: torch.Tensor
