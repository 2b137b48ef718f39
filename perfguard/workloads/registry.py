"""The built-in pipelines by workload name: what a case's `workload` builds.

Public, so that the runner (and anyone who composes the library) builds a case through
one table rather than reaching into a pipeline module's privates.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from perfguard.device.platform import Platform
from perfguard.storage.cases import Case
from perfguard.workloads.glm_image_pipeline import GlmImagePipeline
from perfguard.workloads.pipeline import T2IPipeline
from perfguard.workloads.qwen_image_pipeline import QwenImagePipeline

PIPELINES: dict[str, type[T2IPipeline]] = {
    "qwen_image": QwenImagePipeline,
    "glm_image": GlmImagePipeline,
}


def build_pipeline(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
    """The pipeline for `case` on `platform`'s device 0 (a worker sees its own device as 0)."""
    if case.workload not in PIPELINES:
        raise ValueError(f"unknown workload {case.workload!r}")
    return PIPELINES[case.workload](case, platform, platform.device(0))
