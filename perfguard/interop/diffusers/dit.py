"""perfguard's DiT in a user's diffusers pipeline: `dit = "perfguard"`.

With `dit = "perfguard"` the pipeline's transformer is replaced by perfguard's optimized
DiT of the same config with the same weights (Qwen-Image, GLM-Image), and the case's
toggles apply to it.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from perfguard.storage.cases import Case

# Pipeline class (model_index.json `_class_name`) -> perfguard workload whose DiT can
# replace its transformer.
PERFGUARD_DITS = {"QwenImagePipeline": "qwen_image", "GlmImagePipeline": "glm_image"}


def swap_dit(pipe: Any, case: Case) -> torch.nn.Module:
    """Replace `pipe.transformer` by perfguard's DiT of the same config and weights.

    Built on the meta device and given the loaded tensors with `assign=True`: no second
    copy of the weights, and `strict=True` proves every parameter found its place.
    """
    from perfguard.workloads.presets import MODEL_CLASSES

    workload = PERFGUARD_DITS.get(type(pipe).__name__)
    if workload is None:
        raise ValueError(f"{case.id}: dit = 'perfguard' needs a {' or '.join(PERFGUARD_DITS)}")
    original = pipe.transformer
    cls = MODEL_CLASSES[workload]
    accepted = inspect.signature(cls.__init__).parameters
    config = {k: v for k, v in dict(original.config).items() if k in accepted}
    toggles = {name: case.toggles[name] for name in case.toggles if name in accepted}
    with torch.device("meta"):
        model = cls(**config, **toggles)
    model.load_state_dict(original.state_dict(), strict=True, assign=True)
    model.eval()
    # The pipeline's loop enters `transformer.cache_context(name)` (diffusers' cache hooks);
    # perfguard's DiT has no such cache, so the context does nothing.
    model.cache_context = lambda name: contextlib.nullcontext()
    pipe.transformer = model
    return model
