"""Metric names and the tolerance class each belongs to (sglang's vocabulary).

A run of a case yields flat metrics, named so that they sort and read well in reports:

| name                | unit | class               |
|---------------------|------|---------------------|
| `e2e`               | ms   | `e2e`               |
| `stage:<Stage>`     | ms   | `denoise_stage` for `DenoisingStage`, else `non_denoise_stage` |
| `step:<i>`          | ms   | `denoise_step`      |
| `step_avg`, `step_median` | ms | `denoise_agg`   |
| `peak_memory`       | MB   | `peak_memory`       |
| `peak_memory:<Stage>` | MB | `peak_memory`       |

`peak_memory:<Stage>` is the device allocator's peak while that stage ran (CUDA, ROCm,
NPU; see `perfguard.measurement.timer`). The timer pays for it at every stage boundary, so it is
stored, reported and gated like the run's peak: a stage that starts holding an extra
buffer shows under its own name, where the run's peak would hide it under the largest
stage. On CPU both come from one tracked, untimed run per pipeline build (the tensor
storage the run allocates, `perfguard.measurement.memory`), not from the timed runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

METRIC_CLASSES = (
    "e2e",
    "denoise_stage",
    "non_denoise_stage",
    "denoise_step",
    "denoise_agg",
    "peak_memory",
)
DENOISING_STAGE = "DenoisingStage"
STAGE_PEAK_PREFIX = "peak_memory:"
_METRIC_RE = re.compile(
    r"^(e2e|step_avg|step_median|peak_memory|peak_memory:[A-Za-z0-9_./-]+"
    r"|stage:[A-Za-z0-9_./-]+|step:\d+)$"
)


def is_metric_name(name: str) -> bool:
    return bool(_METRIC_RE.match(name))


def metric_class(name: str) -> str:
    """The tolerance class of a metric name; `ValueError` for a name that is not a metric."""
    if name == "e2e":
        return "e2e"
    if name == "peak_memory" or name.startswith(STAGE_PEAK_PREFIX):
        return "peak_memory"
    if name in ("step_avg", "step_median"):
        return "denoise_agg"
    if name.startswith("step:"):
        return "denoise_step"
    if name.startswith("stage:"):
        # Model-specific denoisers (sglang's `Ideogram4DenoisingStage`) count as denoise.
        return "denoise_stage" if name.endswith(DENOISING_STAGE) else "non_denoise_stage"
    raise ValueError(f"not a metric name: {name!r}")


def unit(name: str) -> str:
    return "MB" if name == "peak_memory" or name.startswith(STAGE_PEAK_PREFIX) else "ms"


def metric_sort_key(name: str) -> tuple[int, int, str]:
    """e2e, stages, aggregates, steps in order, memory."""
    if name == "e2e":
        return (0, 0, name)
    if name.startswith("stage:"):
        return (1, 0, name)
    if name in ("step_avg", "step_median"):
        return (2, 0, name)
    if name.startswith("step:"):
        return (3, int(name.split(":", 1)[1]), name)
    return (4, 0, name)


def metrics_of_run(run: Mapping[str, Any]) -> dict[str, float]:
    """Flatten one run record (`RunRecord.to_dict()` layout) into metric name -> value."""
    out: dict[str, float] = {"e2e": float(run["e2e_ms"])}
    for stage, ms in run.get("stages_ms", {}).items():
        out[f"stage:{stage}"] = float(ms)
    steps = run.get("steps_ms") or []
    for i, ms in enumerate(steps):
        out[f"step:{i}"] = float(ms)
    if steps:
        if run.get("avg_step_ms") is not None:
            out["step_avg"] = float(run["avg_step_ms"])
        if run.get("median_step_ms") is not None:
            out["step_median"] = float(run["median_step_ms"])
    if run.get("peak_memory_mb") is not None:
        out["peak_memory"] = float(run["peak_memory_mb"])
    for stage, mb in (run.get("stage_peak_memory_mb") or {}).items():
        out[STAGE_PEAK_PREFIX + stage] = float(mb)
    return out
