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
NPU; see `perfguard.device.timer`). The timer pays for it at every stage boundary, so it is
stored, reported and gated like the run's peak: a stage that starts holding an extra
buffer shows under its own name, where the run's peak would hide it under the largest
stage. On CPU both come from one tracked, untimed run per pipeline build (the tensor
storage the run allocates, `perfguard.measurement.memory`), not from the timed runs.

Work counters: what a run does, counted exactly in one untimed counted run per pipeline
build (`perfguard.measurement.work`), on every platform. Integers, no noise:

| name                     | unit  | what                                              |
|--------------------------|-------|---------------------------------------------------|
| `ops`, `ops:<Stage>`     | ops   | aten ops dispatched (leaf ops: the launch proxy)  |
| `flops`, `flops:<Stage>` | FLOP  | FLOPs by torch's formulas (`flop_counter`)        |
| `alloc`, `alloc:<Stage>` | B     | bytes of fresh tensor storage (a total, no peak)  |
| `syncs`, `syncs:<Stage>` | syncs | ops that make the host wait for the device        |
| `<kind>_per_step`        |       | the heaviest denoising step's count               |

Each kind is its own tolerance class (`ops`, `flops`, `alloc`, `syncs`).
The bare name is the whole run (work between stages included). The per-op histogram of
each stage is kept beside them in results and baselines (`work.op_counts`); it is not a
metric. The verdict on counters is `perfguard.decision.counters`: exact by default, a
growth is a regression whatever the timings say.

Server figures (`workload = "server"`, docs/serving.md): one sample per round of the load
scenario, per concurrency level N. They are stages of the level, `stage:c<N>/<figure>`,
so that a baseline file keeps its one schema (`stages` by name) and every rule applies
unchanged:

| name                        | unit | class               | what                          |
|-----------------------------|------|---------------------|-------------------------------|
| `stage:c4/latency_p50`      | ms   | `e2e`               | median request latency        |
| `stage:c4/latency_p90`, `stage:c4/latency_p99` | ms | `non_denoise_stage` | tail latency |
| `stage:c4/inv_throughput`   | ms   | `e2e`               | 1000 / throughput (req/s)     |
| `stage:c4/queue_time`       | ms   | `non_denoise_stage` | median time queued            |
| `stage:c4/<Stage>`          | ms   | as `stage:<Stage>`  | median of the requests' stage times |
| `stage:c4/step_avg`         | ms   | `denoise_agg`       | median of the requests' mean step |
| `peak_memory:c4`            | MB   | `peak_memory`       | the server's reported peak    |

| `failures:c4`              | requests | `failures` (exact) | requests not answered `ok` |

Throughput is judged as its inverse, so that lower is better as for every other figure.
Tails are judged at 20 % (a p99 of 16 requests is their slowest), the median and the
throughput at 3 %. Failed requests are counted, not timed: `failures:c4` is judged
exactly, as a work counter is (`perfguard.decision.counters.judge_failures`), over the
requests of a measurement's rounds.
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
WORK_KINDS = ("ops", "flops", "alloc", "syncs")
"""The work counter classes (`perfguard.measurement.work.KINDS`), each its own tolerance class."""
WORK_UNITS = {"ops": "ops", "flops": "FLOP", "alloc": "B", "syncs": "syncs"}
PER_STEP = "_per_step"
DENOISING_STAGE = "DenoisingStage"
PIPELINE_STAGES = (
    "InputValidationStage",
    "TextEncodingStage",
    "LatentPreparationStage",
    "TimestepPreparationStage",
    DENOISING_STAGE,
    "DecodingStage",
)
"""The stages every built-in pipeline runs, in order (`perfguard.workloads.pipeline`;
GLM-Image adds its PriorTokenGenerationStage after the text encoding)."""
STAGE_PEAK_PREFIX = "peak_memory:"
_METRIC_RE = re.compile(
    r"^(e2e|step_avg|step_median|peak_memory|peak_memory:[A-Za-z0-9_./-]+"
    r"|stage:[A-Za-z0-9_./-]+|step:\d+)$"
)
_WORK_RE = re.compile(r"^(ops|flops|alloc|syncs)(_per_step|:[A-Za-z0-9_./-]+)?$")
SERVER_FIGURES = (
    "latency_p50",
    "latency_p90",
    "latency_p99",
    "inv_throughput",
    "queue_time",
    "step_avg",
)
"""The server figures of a concurrency level other than its stages, in report order."""
_SERVER_CLASSES = {"latency_p50": "e2e", "inv_throughput": "e2e", "step_avg": "denoise_agg"}
_SERVER_RE = re.compile(r"^(?:stage:|peak_memory:)c([0-9]+)(?:/([A-Za-z0-9_./-]+))?$")
FAILURES = "failures"
"""The class (and unit) of a server level's failed requests: exact, like a work counter."""
_FAILURES_RE = re.compile(r"^failures:c([0-9]+)$")


def server_metric(concurrency: int, figure: str) -> str:
    """`stage:c4/latency_p99` for a server figure (or a stage) at a concurrency level."""
    return f"stage:c{concurrency}/{figure}"


def server_peak_metric(concurrency: int) -> str:
    """`peak_memory:c4`: the server's reported peak memory at a concurrency level."""
    return f"{STAGE_PEAK_PREFIX}c{concurrency}"


def failures_metric(concurrency: int) -> str:
    """`failures:c4`: the requests of a concurrency level that were not answered `ok`."""
    return f"{FAILURES}:c{concurrency}"


def is_failures_metric(name: str) -> bool:
    return bool(_FAILURES_RE.match(name))


def parse_server_metric(name: str) -> tuple[int, str] | None:
    """(4, `latency_p99`) for `stage:c4/latency_p99`, (4, `peak_memory`) for
    `peak_memory:c4`; None for a name that is not a server figure."""
    m = _SERVER_RE.match(name)
    if m is None or (name.startswith("stage:") != (m.group(2) is not None)):
        return None
    return int(m.group(1)), m.group(2) or "peak_memory"


def work_metric(kind: str, stage: str | None = None, *, step: bool = False) -> str:
    """`ops`, `ops:<Stage>` or `ops_per_step` (kind one of `WORK_KINDS`)."""
    if kind not in WORK_KINDS:
        raise ValueError(f"not a work counter: {kind!r}")
    if step:
        return kind + PER_STEP
    return kind if stage is None else f"{kind}:{stage}"


def is_work_metric(name: str) -> bool:
    """Whether `name` is a work counter (`ops:DenoisingStage`), not a time or a peak."""
    return bool(_WORK_RE.match(name))


def work_kind(name: str) -> str:
    """`ops` for `ops:DenoisingStage` / `ops_per_step` / `ops`."""
    return name.split(":", 1)[0].removesuffix(PER_STEP)


def work_stage(name: str) -> str | None:
    """`DenoisingStage` for `ops:DenoisingStage`; None for a run total or a per-step figure."""
    return name.split(":", 1)[1] if ":" in name else None


def is_metric_name(name: str) -> bool:
    return bool(_METRIC_RE.match(name)) or is_work_metric(name) or is_failures_metric(name)


def metric_class(name: str) -> str:
    """The tolerance class of a metric name; `ValueError` for a name that is not a metric."""
    if name == "e2e":
        return "e2e"
    if is_work_metric(name):
        return work_kind(name)
    if is_failures_metric(name):
        return FAILURES
    if name == "peak_memory" or name.startswith(STAGE_PEAK_PREFIX):
        return "peak_memory"
    if name in ("step_avg", "step_median"):
        return "denoise_agg"
    if name.startswith("step:"):
        return "denoise_step"
    server = parse_server_metric(name)
    if server is not None and server[1] in _SERVER_CLASSES:
        return _SERVER_CLASSES[server[1]]
    if name.startswith("stage:"):
        # Model-specific denoisers (sglang's `Ideogram4DenoisingStage`) count as denoise.
        return "denoise_stage" if name.endswith(DENOISING_STAGE) else "non_denoise_stage"
    raise ValueError(f"not a metric name: {name!r}")


def unit(name: str) -> str:
    if is_work_metric(name):
        return WORK_UNITS[work_kind(name)]
    if is_failures_metric(name):
        return "requests"
    return "MB" if name == "peak_memory" or name.startswith(STAGE_PEAK_PREFIX) else "ms"


def metric_sort_key(name: str) -> tuple[int, int, str]:
    """e2e, stages, aggregates, steps in order, memory."""
    if name == "e2e":
        return (0, 0, name)
    if is_failures_metric(name):  # first of its level: what the requests answered
        return (1, int(name.rsplit("c", 1)[1]), "")
    server = parse_server_metric(name)
    if server is not None:  # by level, then the figures before the stages
        level, figure = server
        known = SERVER_FIGURES.index(figure) if figure in SERVER_FIGURES else len(SERVER_FIGURES)
        return (1, level, f"{known:02d}{figure}")
    if name.startswith("stage:"):
        return (1, 0, name)
    if name in ("step_avg", "step_median"):
        return (2, 0, name)
    if name.startswith("step:"):
        return (3, int(name.split(":", 1)[1]), name)
    if is_work_metric(name):
        return (5 + WORK_KINDS.index(work_kind(name)), 0 if ":" not in name else 1, name)
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


# ---- how timed figures are stored: raw or normalized ---------------------------------------

RAW = "raw"
NORMALIZED = "normalized"
TIMINGS = (RAW, NORMALIZED)
"""A timed figure is stored as measured (`raw`) or at the runner speed of the reference
workload beside it (`normalized`; `perfguard.decision.normalize` does the scaling)."""

TIMED_CLASSES = ("e2e", "denoise_stage", "denoise_agg", "denoise_step", "non_denoise_stage")
"""The classes of times (not memory, not a work counter), in the order reports list them."""


def is_timed(metric: str) -> bool:
    """A time that the runner's speed scales (not memory, not a work counter)."""
    try:
        return metric_class(metric) in TIMED_CLASSES
    except ValueError:
        return False


def default_timing(platform: str) -> str:
    """`normalized` on CPU, `raw` on the devices (`perfguard.decision.normalize` says why)."""
    return NORMALIZED if platform == "cpu" else RAW


def timing_of(environment: Mapping[str, Any], timing: str | None) -> str:
    """`timing` if given, else the default of the platform `environment` names."""
    if timing is None:
        return default_timing(str(environment.get("platform", "cpu")))
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {', '.join(TIMINGS)}, not {timing!r}")
    return timing
