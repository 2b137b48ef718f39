"""Model-size presets per workload and :func:`build_model`.

Presets (constructor kwargs of the model class, diffusers 0.42 argument names):

* ``tiny``  -- 2 layers, 2 heads x 16: a whole few-step CPU pipeline case runs in well under
  a second; used by unit tests and CPU smoke cases.
* ``small`` -- 4 layers, 4 heads x 32: still CPU-feasible, large enough for the
  optimizations to show up in CPU timings.
* ``full``  -- the published model sizes (Qwen-Image 20B: 60 layers, 24 x 128, joint 3584;
  GLM-Image: 30 layers, 32 x 128, text 1472, time 512, condition 256, codebook 16384).

The other components of each pipeline (Qwen2.5-VL, the Qwen-Image VAE, GLM-Image's AR
model, ByT5, the GLM-Image VAE) and the schedulers have their presets in
``components.py``, each ``full`` config beside its source: Qwen/Qwen2.5-VL-7B-Instruct and
Qwen/Qwen-Image ``text_encoder`` / ``vae`` configs, transformers' ``GlmImageConfig``
defaults (zai-org/GLM-Image), google/byt5-small, and the scheduler values of
Qwen/Qwen-Image ``scheduler/scheduler_config.json`` (``shift_terminal`` 0.02,
``max_shift`` 0.9, ``max_image_seq_len`` 8192; also mirrored in mflux's Qwen scheduler).

:func:`build_model` constructs on the meta device (no host memory, no init cost) and then
materializes directly on the target device with ``to_empty`` followed by a seeded random
init in the target dtype -- a ``full`` model never takes a round trip through CPU float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from perfguard.workloads.attention import RMSNorm
from perfguard.workloads.glm_image import GlmImageTransformer2DModel
from perfguard.workloads.qwen_image import QwenImageTransformer2DModel

__all__ = [
    "MODEL_CLASSES",
    "PRESETS",
    "TOGGLES",
    "build_model",
    "get_preset",
    "init_weights_",
]

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "qwen_image": QwenImageTransformer2DModel,
    "glm_image": GlmImageTransformer2DModel,
}

# Toggle name -> workload it applies to (toggles of another workload are ignored).
TOGGLES: dict[str, str] = {
    "glm_prior_drop_inplace": "glm_image",
    "qwen_modulation_cache": "qwen_image",
    "qwen_varlen_host_meta": "qwen_image",
}


def _table(fields: tuple[str, ...], rows: dict[str, tuple[Any, ...]]) -> dict[str, dict[str, Any]]:
    """Constructor kwargs per preset from a table: a row of values in `fields`' order
    (patch_size is 2 throughout)."""
    return {
        name: dict(patch_size=2, **dict(zip(fields, row, strict=True)))
        for name, row in rows.items()
    }


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # in_channels = 4 * latent channels (2x2 patches packed by the pipeline);
    # proj_out gives patch_size**2 * out_channels = in_channels, the packed layout.
    "qwen_image": _table(
        (
            "in_channels",
            "out_channels",
            "num_layers",
            "attention_head_dim",
            "num_attention_heads",
            "joint_attention_dim",
            "axes_dims_rope",
        ),
        {
            "tiny": (16, 4, 2, 16, 2, 32, (4, 6, 6)),
            "small": (64, 16, 4, 32, 4, 256, (8, 12, 12)),
            "full": (64, 16, 60, 128, 24, 3584, (16, 56, 56)),
        },
    ),
    "glm_image": _table(
        (
            "in_channels",
            "out_channels",
            "num_layers",
            "attention_head_dim",
            "num_attention_heads",
            "text_embed_dim",
            "time_embed_dim",
            "condition_dim",
            "prior_vq_quantizer_codebook_size",
        ),
        {
            "tiny": (4, 4, 2, 16, 2, 32, 32, 8, 64),
            "small": (16, 16, 4, 32, 4, 128, 64, 16, 1024),
            "full": (16, 16, 30, 128, 32, 1472, 512, 256, 16384),
        },
    ),
}


def get_preset(workload: str, preset: str) -> dict[str, Any]:
    """A copy of the constructor kwargs of ``workload`` at ``preset``."""
    if workload not in PRESETS:
        raise ValueError(f"unknown workload {workload!r}: choose from {', '.join(PRESETS)}")
    presets = PRESETS[workload]
    if preset not in presets:
        raise ValueError(
            f"unknown preset {preset!r} for workload {workload!r}: choose from {', '.join(presets)}"
        )
    return dict(presets[preset])


@torch.no_grad()
def init_weights_(model: nn.Module, seed: int, std: float = 0.02) -> nn.Module:
    """Deterministic random init in place: Linear/Embedding weights and biases ~ N(0, std)
    (nonzero biases, so no layer is degenerate), norm weights 1 and biases 0.

    Values are drawn in float32 from a generator on the parameters' device (so a ``full``
    model is initialized on the GPU without a host round trip) and cast on copy: the same
    ``seed`` gives bit-identical weights on the same device type and dtype.
    """
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, (nn.LayerNorm, RMSNorm)):
                param.fill_(1.0 if name == "weight" else 0.0)
            else:
                values = torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32)
                param.copy_(values.mul_(std))
    for name, buf in model.named_buffers():  # none today; keep to_empty garbage out
        raise RuntimeError(f"unexpected buffer {name!r} ({tuple(buf.shape)}) has no init rule")
    return model


def build_model(
    workload: str,
    preset: str,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    toggles: Mapping[str, bool] | None = None,
    allow_full_on_cpu: bool = False,
) -> nn.Module:
    """Build ``workload`` at ``preset`` with seeded random weights, in eval mode.

    Args:
        workload: ``"qwen_image"`` or ``"glm_image"``.
        preset: ``"tiny"``, ``"small"`` or ``"full"``.
        device, dtype: where and in which dtype the parameters live.
        seed: init seed; same seed -> bit-identical weights.
        toggles: optimization switches by name (see :data:`TOGGLES`); missing ones stay on,
            toggles of the other workload are ignored, unknown names are an error.
        allow_full_on_cpu: ``full`` is tens of GB; refused on CPU unless set.
    """
    kwargs = get_preset(workload, preset)
    device = torch.device(device)
    if preset == "full" and device.type == "cpu" and not allow_full_on_cpu:
        raise ValueError(
            f"refusing to build {workload!r} preset 'full' on CPU (published size); "
            "pass allow_full_on_cpu=True to insist"
        )
    for name, value in (toggles or {}).items():
        if name not in TOGGLES:
            raise ValueError(f"unknown toggle {name!r}: choose from {', '.join(TOGGLES)}")
        if TOGGLES[name] == workload:
            kwargs[name] = bool(value)

    with torch.device("meta"):
        model = MODEL_CLASSES[workload](**kwargs)
    # Cast while still on meta (free), then allocate once on the target device: a cast after
    # materializing would briefly hold both copies (fp32 + bf16 = 120 GB for Qwen full).
    model = model.to(dtype=dtype).to_empty(device=device)
    init_weights_(model, seed)
    return model.eval()
