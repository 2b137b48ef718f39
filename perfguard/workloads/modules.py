"""The library modules each workload imports, named once (no torch here).

Why direct modules: `from transformers import X` and `from diffusers import X` go
through the packages' lazy export tables, which resolve a name to its module on first
use; importing the defining module (`transformers.models.t5.modeling_t5`) skips the
table and states what a case costs to import. A package's own `__init__` still runs
(Python imports parents first): diffusers' `models.autoencoders` imports every
autoencoder, and diffusers' `utils` imports `torch._dynamo`; those are the import bill
that remains, paid once per command by the warm server (`--start-method forkserver`,
`perfguard.measurement.forkserver`), which preloads `preload(cases)` before it forks
any worker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEDULER = "diffusers.schedulers.scheduling_flow_match_euler_discrete"
IMAGE_PROCESSOR = "diffusers.image_processor"
TORCH_UTILS = "diffusers.utils.torch_utils"

QWEN_IMAGE = (
    "transformers.models.qwen2.tokenization_qwen2",
    "transformers.models.qwen2_5_vl.configuration_qwen2_5_vl",
    "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl",
    "diffusers.models.autoencoders.autoencoder_kl_qwenimage",
    "diffusers.pipelines.qwenimage.pipeline_qwenimage",
)
GLM_IMAGE = (
    "transformers.tokenization_utils_tokenizers",
    "transformers.models.byt5.tokenization_byt5",
    "transformers.models.glm_image.configuration_glm_image",
    "transformers.models.glm_image.image_processing_pil_glm_image",
    "transformers.models.glm_image.modeling_glm_image",
    "transformers.models.glm_image.processing_glm_image",
    "transformers.models.t5.configuration_t5",
    "transformers.models.t5.modeling_t5",
    "diffusers.models.autoencoders.autoencoder_kl",
    "diffusers.pipelines.glm_image.pipeline_glm_image",
)
DIFFUSERS = ("diffusers.pipelines.pipeline_utils",)

BY_WORKLOAD = {"qwen_image": QWEN_IMAGE, "glm_image": GLM_IMAGE, "diffusers": DIFFUSERS}

RUNNER = ("perfguard.measurement.runner", "perfguard.workloads.registry")
"""perfguard's own measuring modules (torch, the timer, the runner, the pipelines)."""

RUNNER_LIBRARIES = ("jsonschema", "torch.utils.flop_counter", "torch.utils.module_tracker")
"""What a worker's perfguard imports from other packages beyond the workloads' modules
(`tests/test_workers.py` checks that the list is whole): a server shared by two
revisions imports them, so that a fork pays only for perfguard's own modules: a smoke
case's worker is ready 0.031 s after the fork against 0.020 s from a server that
imported perfguard too (`benchmarks/fork_start.py`, since retired: its figures are in
docs/measurements/retired-benchmarks.md)."""

COMMANDS = (
    "perfguard.cli.app",
    "perfguard.api",
    "perfguard.decision.gate",
    "perfguard.interop.diffusers",
    "perfguard.measurement.relative",
    "perfguard.measurement.base_revision",
    "perfguard.measurement.paired_blocks",
    "perfguard.measurement.workers",
    "perfguard.presentation.render",
    "perfguard.presentation.work_report",
    "perfguard.storage.reports",
    "perfguard.measurement.serving.app",
)
"""What a measuring command imports besides the workloads: the command line, the
library, the gate and the reports (the resident server preloads them), and what
`perfguard serve` imports (FastAPI and uvicorn where the `serve` extra is installed),
so that a server case's launched servers start warm."""


def preload(cases: Iterable[Any]) -> list[str]:
    """What a warm server imports before forking workers for `cases`: perfguard's runner,
    the shared diffusers modules, and each case's workload modules (each once)."""
    out = [*RUNNER, SCHEDULER, IMAGE_PROCESSOR, TORCH_UTILS]
    for case in cases:
        for name in BY_WORKLOAD.get(getattr(case, "workload", ""), ()):
            if name not in out:
                out.append(name)
    return out


def everything() -> list[str]:
    """`preload` of every workload: what a server started before the cases are known
    (`perfguard.measurement.launch.early_server`) imports. The workload modules other
    than diffusers' package imports cost ~0.1 s together."""
    out = [*RUNNER, SCHEDULER, IMAGE_PROCESSOR, TORCH_UTILS]
    for names in BY_WORKLOAD.values():
        out += [n for n in names if n not in out]
    return out


def preload_for(cases: Iterable[Any] | None, factory: str | None = None) -> list[str]:
    """What a warm server imports for `cases` (None: every workload, the cases not yet
    known); with a factory, the runner and the factory's module (it builds the
    pipelines, not perfguard's workloads)."""
    if factory:
        return [RUNNER[0], factory.partition(":")[0]]
    return everything() if cases is None else preload(cases)


def shared_preload(
    names: Iterable[str], factory: str | None = None, roots: Iterable[str] = ()
) -> list[str]:
    """What a server shared by two revisions imports (`launch.SharedFork`): `names`
    without perfguard's modules, the factory's, and any package one of the sides'
    import `roots` holds (a base checkout of diffusers, say: its workers must import
    it from there, not get the server's), each optional ("?"), torch first."""
    skip = {"perfguard", (factory or "").partition(":")[0].partition(".")[0]}
    for root in roots:
        with contextlib.suppress(OSError):
            for entry in Path(root).iterdir():
                if entry.is_dir() or entry.suffix in (".py", ".so"):
                    skip.add(entry.name.partition(".")[0])
    out = [] if "torch" in skip else ["torch"]
    for name in [*names, *RUNNER_LIBRARIES]:
        bare = name.lstrip("?")
        if bare.partition(".")[0] not in skip and bare != "torch" and "?" + bare not in out:
            out.append("?" + bare)
    return out
