"""GPU self-check: one command that proves perfguard's device paths on a new runner.

    python benchmarks/gpu_selfcheck.py [--quick] [--out selfcheck.json] [--rows 1,2a,...]

Run it first on a new GPU runner (docs/ci.md, "Self-check of a new GPU runner"). It
prints a table and writes a JSON file with one row per check, each `passed`, `failed` or
`skipped`, with the reason and the figures it measured:

| row | check |
|-----|-------|
| 0   | the parent process holds no device context after probing and fingerprinting |
| 1   | per-stage event times agree with a synchronized host clock within 2 %, no sync per stage |
| 2a  | host varlen metadata: 0 syncs per denoising step on, at least 1 off |
| 2b  | GLM prior drop: syncs and time of `x[drop] *= 0.0` against `masked_fill` / `masked_fill_` |
| 2c  | Qwen modulation cache: its hit count (one per block per CFG step) |
| 3   | each optimization's win with `perfguard ab` (ratio of medians, 95 % CI, peak memory) |
| 4   | `glm_image_t2i_cudagraph` captures, replays, `masked_fill` in the graph, equals eager |
| 5   | per-stage allocator peaks: an extra 64 MiB in one stage shows in that stage only |
| 6   | between-process noise of `DenoisingStage`, workers forked warm and spawned; calibrate |
| 7   | one `full` Qwen-Image case (1024x1024): meta build, materialization, bf16, stage times |
| 8   | the stage timer's cost per enter+exit on the device, with and without allocator peaks |
| 9   | two ranks over NCCL, when two GPUs are visible |
| 10  | the flash-attn varlen branch against the packed torch path (flash-attn from a wheel) |
| 11  | work counters: the op stream's sync count against the device's |
| 12  | resident server: 3 `perfguard run` (one `--isolate`), one server, no device context |

Every row is a composition of library calls (`perfguard.device.timer`,
`perfguard.measurement.ab.run_ab`, `perfguard.measurement.workers.run_in_workers`,
`perfguard.decision.calibrate.calibrate_case`, `perfguard.workloads.registry.build_pipeline`).
On a machine without a GPU every device row is skipped with its reason, which is how the
test suite keeps the script from rotting (`tests/test_gpu_selfcheck.py` also makes each
row fail on purpose with a fake device).
Exit status: 0 when no row failed, 1 when one did, 2 for a usage error.

Budget: under 5 minutes on one H200 from a bare machine, `--quick` under 2 (fewer
repeats and pairs, no `full` preset, 3 processes for the noise row instead of 5).

The script lives under benchmarks/ rather than in the product because it measures
perfguard itself (its timer, its optimizations, its device plumbing), once per runner,
and its helpers (sync counting, injected allocations) serve no gate or baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from perfguard.device.platform import Platform, fingerprint, probe
from perfguard.device.timer import MB, StageTimer, stage
from perfguard.errors import EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, PerfguardError
from perfguard.measurement.ab import run_ab
from perfguard.measurement.options import MeasureOptions
from perfguard.metrics import STAGE_PEAK_PREFIX, metrics_of_run
from perfguard.storage.cases import Case, load_registry
from perfguard.storage.jsonio import write_json_atomic

KIND = "perfguard.gpu_selfcheck"
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"

TIMER_TOLERANCE = 0.02
"""Events and a synchronized host clock must agree within 2 % on a kernel of ~20 ms: a
sync costs ~10 us, 0.05 % of it, so a larger gap is a timing defect, not overhead."""

INJECT_BYTES = 64 * MB
STAGE_PEAK_SLACK_MB = 2.0
"""An extra 64 MiB must move its own stage's peak by 64 +- 2 MiB (one allocator block of
rounding) and every other stage's by less than 2 MiB."""

OVERHEAD_LIMIT_NS = 10_000.0
"""The stage timer's cost per enter+exit on the device. A 50-step case has ~60 boundaries
per run, so 10 us each is 0.6 ms a run, under 1 % of a `small` run on an H200."""

NOISE_LIMIT = 0.05
"""Between-process sd of `DenoisingStage` above 5 % of its median means a device whose
bands would have to be wider than sglang's tolerances: the row fails so that it is read."""

QWEN_FULL_PARAMS = 20.43e9  # Qwen-Image's published DiT (Qwen/Qwen-Image transformer config)


class Skip(Exception):
    """This check cannot run here; the message says why."""


@dataclass
class Row:
    """One line of the self-check: what was checked, the verdict, why, and the figures."""

    id: str
    check: str
    status: str = SKIPPED
    reason: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return plain(dataclasses.asdict(self))


def plain(value: Any) -> Any:
    """`value` as strict JSON: a non-finite number is its name as a string ("inf", "nan"),
    anything JSON cannot hold (a dtype, a device) is its `str`; so a figure never breaks
    the file that reports it."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    with contextlib.suppress(TypeError, ValueError):
        number = float(value)  # numpy and 0-d torch scalars
        return number if math.isfinite(number) else str(number)
    return str(value)


def verdict(ok: bool, good: str, bad: str, **figures: Any) -> tuple[str, str, dict[str, Any]]:
    """The (status, reason, figures) a check returns."""
    return (PASSED, good, figures) if ok else (FAILED, bad, figures)


# ---- the environment a check runs in --------------------------------------------------------


def count_syncs_with(module: Any) -> Callable[[Callable[[], Any]], int]:
    """A counter of device->host synchronizations, from the runtime's sync debug mode.

    `torch.cuda.set_sync_debug_mode("warn")` makes every *implicit* sync (a `nonzero`, an
    `.item()`, a copy to the host) emit a warning; explicit `synchronize()` calls are not
    counted, which is what the checks want: they ask whether code waits on the device
    behind the user's back.
    """

    def count(fn: Callable[[], Any]) -> int:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module.set_sync_debug_mode("warn")
            try:
                fn()
            finally:
                module.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    return count


@dataclass
class Env:
    """What the checks need: the platform, its runtime module, clocks, cases and budget.

    Everything device-specific is a field so that the tests can hand in a fake runtime
    (`cuda`), a fake sync counter or a fake host clock and watch each check fail.
    """

    platform: Platform
    quick: bool = False
    cuda: Any = None  # torch.cuda on a CUDA platform, None elsewhere
    host_ns: Callable[[], int] = time.perf_counter_ns
    count_syncs: Callable[[Callable[[], Any]], int] | None = None
    cases: list[Case] = field(default_factory=list)
    preset: str = "small"
    size: int = 256  # height = width of the resized cases, in pixels (`full` rows: 1024)
    install_flash_attn: bool = True
    factory: Any = None  # a pipeline factory for the A/B and peak rows (None: the built-in)
    allocate: Callable[[int], Any] | None = None  # row 5's extra allocation (None: torch.empty)
    prior_shape: tuple[int, int, int] = (1, 4096, 4096)  # row 2b: GLM-Image 1024x1024, full
    context_at_start: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def detect(cls, platform: Platform, quick: bool, cases_dir: str | None = None) -> Env:
        cuda = torch.cuda if platform.name == "cuda" else None
        # The CUDA registry's definitions, resized by `case()`: the checks are about them.
        cases = load_registry("cuda", cases_dir)
        on_cpu = platform.name == "cpu"  # a CPU run only keeps the script from rotting
        return cls(
            platform=platform,
            quick=quick,
            cuda=cuda,
            count_syncs=count_syncs_with(cuda) if cuda is not None else None,
            cases=cases,
            preset="tiny" if on_cpu else "small",
            size=64 if on_cpu else 256,
        )

    def require_cuda(self) -> Any:
        if self.cuda is None:
            raise Skip(f"needs a CUDA device; this run is on {self.platform.name}")
        return self.cuda

    def require_syncs(self) -> Callable[[Callable[[], Any]], int]:
        if self.count_syncs is None:
            raise Skip(f"no device syncs to count on {self.platform.name} (ops run on the host)")
        return self.count_syncs

    def case(self, case_id: str, **changes: Any) -> Case:
        """A registry case, resized to this run's preset unless `changes` say otherwise."""
        found = [c for c in self.cases if c.id == case_id]
        if not found:
            raise Skip(f"case {case_id!r} is not in the {self.platform.name} registry")
        base = {"preset": self.preset, "height": self.size, "width": self.size}
        return dataclasses.replace(found[0], **{**base, **changes})

    def build(self, case: Case) -> Any:
        from perfguard.workloads.registry import build_pipeline

        return (self.factory or build_pipeline)(case, self.platform)

    def sync(self) -> None:
        self.platform.synchronize()


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


# ---- row 0: no device context in the parent ---------------------------------------------------


def context_snapshot(env: Env) -> dict[str, Any]:
    """Whether this process has touched the device yet, taken right after the fingerprint."""
    if env.cuda is None:
        return {}
    return {"initialized": bool(env.cuda.is_initialized()), "pids": _compute_pids()}


def _compute_pids() -> list[int] | None:
    """Processes holding a context on any GPU (nvidia-smi), None where it cannot say."""
    from perfguard.device.gpu_clocks import nvidia_smi

    lines, _ = nvidia_smi("--query-compute-apps=pid", "--format=csv,noheader", timeout=20)
    return None if lines is None else [int(p) for p in lines if p.isdigit()]


def check_context(env: Env) -> tuple[str, str, dict[str, Any]]:
    cuda = env.require_cuda()
    snap = env.context_at_start
    if not snap:
        raise Skip("no snapshot was taken before the other checks")
    holds = snap["pids"] is not None and os.getpid() in snap["pids"]
    without = env.platform._device_name_without_context()  # type: ignore[attr-defined]
    runtime = str(cuda.get_device_name(0))  # initialises CUDA: after the snapshot only
    ok = not snap["initialized"] and not holds and (without is None or without == runtime)
    return verdict(
        ok,
        "probe and fingerprint left the device untouched; the names agree",
        "the parent touched the device before any worker started, or the names disagree "
        "(the hardware slug names the baseline file)",
        cuda_initialized=snap["initialized"],
        parent_in_compute_apps=holds,
        name_without_context=without,
        name_from_runtime=runtime,
    )


# ---- row 1: timer correctness -----------------------------------------------------------------


def _sleep_kernel(env: Env, target_ms: float) -> tuple[Callable[[], None], float]:
    """A device kernel of about `target_ms` (`torch.cuda._sleep`) and its cycles per ms."""
    cuda = env.cuda
    probe_cycles = 2_000_000
    cuda._sleep(probe_cycles)  # first launch pays for module loading
    env.sync()
    t0 = env.host_ns()
    cuda._sleep(probe_cycles)
    env.sync()
    per_ms = probe_cycles / max((env.host_ns() - t0) / 1e6, 1e-6)
    cycles = int(per_ms * target_ms)
    return (lambda: cuda._sleep(cycles)), per_ms


def check_timer(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_cuda()
    count = env.require_syncs()
    kernel, per_ms = _sleep_kernel(env, 20.0)
    repeats = 3 if env.quick else 5
    host, denoise, decode, syncs = [], [], [], 0
    for _ in range(repeats):
        env.sync()
        t0 = env.host_ns()
        kernel()
        env.sync()
        host.append((env.host_ns() - t0) / 1e6)
        timer = StageTimer(env.platform)

        def run(timer: StageTimer = timer) -> None:
            with timer:
                with stage("DenoisingStage"):
                    kernel()
                with stage("DecodingStage"):
                    kernel()

        syncs += count(run)  # the run only: record() synchronizes once, by design
        rec = timer.record()
        denoise.append(rec.stages_ms["DenoisingStage"])
        decode.append(rec.stages_ms["DecodingStage"])
    ref = _median(host)
    errors = {
        "DenoisingStage": _median(denoise) / ref - 1,
        "DecodingStage": _median(decode) / ref - 1,
    }
    worst = max(abs(e) for e in errors.values())
    per_stage = syncs / (2 * repeats)
    return verdict(
        worst <= TIMER_TOLERANCE and syncs == 0,
        f"events within {worst:.2%} of the host clock, 0 syncs per stage",
        f"events off by {worst:.2%} (limit {TIMER_TOLERANCE:.0%}) or {per_stage:g} syncs "
        "per stage (must be 0)",
        host_ms=round(ref, 4),
        event_ms={
            "DenoisingStage": round(_median(denoise), 4),
            "DecodingStage": round(_median(decode), 4),
        },
        relative_error={k: round(v, 5) for k, v in errors.items()},
        syncs_per_stage=per_stage,
        sleep_cycles_per_ms=round(per_ms),
        repeats=repeats,
    )


# ---- row 2: syncs per denoising step ----------------------------------------------------------


def _syncs_per_step(env: Env, case: Case, toggles: dict[str, bool]) -> float:
    """Syncs per denoising step: the difference of whole runs of 2 steps and of 1.

    Differencing leaves out what every run pays once (text encoding, decoding, the final
    copy), so the figure is the per-step cost the optimization is about.
    """
    count = env.require_syncs()
    counts = []
    for steps in (1, 2):
        pipe = env.build(dataclasses.replace(case.with_toggles(**toggles), steps=steps))
        pipe()  # warm-up: first-call allocations and caches are not per-step costs
        env.sync()
        counts.append(count(pipe))
        env.sync()
    return float(counts[1] - counts[0])


def check_varlen_syncs(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_syncs()
    case = env.case("qwen_image_t2i_padded", steps=2)
    on = _syncs_per_step(env, case, {"qwen_varlen_host_meta": True})
    off = _syncs_per_step(env, case, {"qwen_varlen_host_meta": False})
    return verdict(
        on == 0 and off >= 1,
        f"{on:g} syncs per step with host metadata, {off:g} without",
        f"expected 0 syncs per step with host metadata (got {on:g}) and >= 1 without (got {off:g})",
        syncs_per_step_on=on,
        syncs_per_step_off=off,
        case=case.id,
        preset=case.preset,
    )


def _op_ms(env: Env, fn: Callable[[], Any], repeats: int) -> float:
    """Median device time of `fn` over `repeats` calls, each timed by the platform's marks."""
    fn()
    samples = []
    for _ in range(repeats):
        start = env.platform.mark()
        fn()
        end = env.platform.mark()
        env.sync()
        samples.append(env.platform.elapsed_ms(start, end))
    return _median(samples)


def check_prior_drop_syncs(env: Env) -> tuple[str, str, dict[str, Any]]:
    count = env.require_syncs()
    device = env.platform.device(0)
    # GLM-Image at 1024x1024: 4096 prior tokens of inner_dim 32 x 128 (the `full` preset).
    b, s, d = env.prior_shape
    dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
    src = torch.randn(b, s, d, device=device, dtype=dtype)
    drop = torch.ones(b, s, dtype=torch.bool, device=device)
    mask = drop.unsqueeze(-1)
    work = src.clone()

    def inplace() -> None:
        work[drop] *= 0.0

    variants: dict[str, Callable[[], Any]] = {
        "x[drop] *= 0.0": inplace,
        "masked_fill": lambda: src.masked_fill(mask, 0),
        "masked_fill_": lambda: work.masked_fill_(mask, 0),
    }
    repeats = 10 if env.quick else 30
    figures: dict[str, Any] = {}
    for name, fn in variants.items():
        fn()
        env.sync()
        figures[name] = {"syncs": count(fn), "ms": round(_op_ms(env, fn, repeats), 5)}
    reference, zeroed = src.masked_fill(mask, 0), src.clone()
    zeroed[drop] *= 0.0
    same = torch.equal(reference, zeroed)
    static = figures["masked_fill"]["syncs"] == 0 and figures["masked_fill_"]["syncs"] == 0
    return verdict(
        static and same,
        f"in place: {figures['x[drop] *= 0.0']['syncs']} syncs, "
        f"{figures['x[drop] *= 0.0']['ms']:.4f} ms; masked_fill: 0 syncs, "
        f"{figures['masked_fill']['ms']:.4f} ms; "
        f"masked_fill_: {figures['masked_fill_']['ms']:.4f} ms",
        "masked_fill / masked_fill_ synced (they must be static-shape), or the values differ",
        shape=[b, s, d],
        dtype=str(dtype),
        values_equal=same,
        **figures,
    )


def modulation_hits(pipe: Any) -> Callable[[], int]:
    """Count the Qwen blocks' modulation-cache hits from outside, by identity.

    A hit is a call to a block's `_modulation_params` that returns the very tensors of the
    slot the block held before the call; nothing in the model is changed to count it.
    """
    hits = [0]
    for block in pipe.transformer.transformer_blocks:
        original = block._modulation_params

        def spy(temb: Any, key: Any, _block: Any = block, _orig: Any = original) -> Any:
            before = _block._modulation_slot
            out = _orig(temb, key)
            if before is not None and out[0] is before.img_mod_params:
                hits[0] += 1
            return out

        block._modulation_params = spy
    return lambda: hits[0]


def check_modulation_hits(env: Env) -> tuple[str, str, dict[str, Any]]:
    case = env.case("qwen_image_t2i", steps=3)
    figures: dict[str, Any] = {}
    for on in (True, False):
        pipe = env.build(case.with_toggles(qwen_modulation_cache=on))
        hits = modulation_hits(pipe)
        pipe()
        figures["hits_on" if on else "hits_off"] = hits()
    expected = case.steps * _block_count(case)  # the uncond pass of every step, every block
    return verdict(
        figures["hits_on"] == expected and figures["hits_off"] == 0,
        f"{figures['hits_on']} hits with the cache ({case.steps} steps x "
        f"{_block_count(case)} blocks), 0 without",
        f"expected {expected} hits with the cache and 0 without",
        expected_hits=expected,
        steps=case.steps,
        **figures,
    )


def _block_count(case: Case) -> int:
    from perfguard.workloads.presets import get_preset

    return int(get_preset(case.workload, case.preset)["num_layers"])


# ---- row 3: each optimization's win with perfguard ab -------------------------------------------

AB_CASES = {
    "glm_prior_drop_inplace": ("glm_image_t2i", "DecodingStage"),
    "qwen_modulation_cache": ("qwen_image_t2i", "DenoisingStage"),
    "qwen_varlen_host_meta": ("qwen_image_t2i_padded", "DenoisingStage"),
}


def _ab_figures(env: Env, case: Case, toggle: str, key_stage: str, pairs: int) -> dict[str, Any]:
    res = run_ab(
        case, {toggle: False}, {toggle: True}, env.platform, pairs=pairs, factory=env.factory
    )
    comps = {c.metric: c for c in res.comparisons()}
    out: dict[str, Any] = {
        "case": case.id,
        "preset": case.preset,
        "pairs": pairs,
        "shared_model": res.shared_model,
        "outputs_identical": len(set(res.hashes.values())) == 1,
    }
    for metric in ("e2e", f"stage:{key_stage}", "stage:DenoisingStage", "peak_memory"):
        if metric in comps:
            c = comps[metric]
            out[metric] = {
                "median_ref": round(c.median_a, 4),
                "median_opt": round(c.median_b, 4),
                "ratio": round(c.estimate.ratio, 4),
                "bounds": [round(c.estimate.low, 4), round(c.estimate.high, 4)],
                "answer": c.answer.answer,
            }
    return out


def check_ab(env: Env) -> tuple[str, str, dict[str, Any]]:
    if env.factory is None:
        env.require_cuda()
    pairs = 3 if env.quick else 6
    figures: dict[str, Any] = {}
    problems: list[str] = []
    runs = [(t, env.case(cid, steps=4), stage_) for t, (cid, stage_) in AB_CASES.items()]
    if not env.quick and env.factory is None:
        full = env.case("qwen_image_t2i", preset="full", height=1024, width=1024, steps=4)
        runs.append(("qwen_modulation_cache", full, "DenoisingStage"))
    for toggle, case, key_stage in runs:
        name = f"{toggle}@{case.preset}"
        fig = _ab_figures(env, case, toggle, key_stage, pairs)
        figures[name] = fig
        if not fig["outputs_identical"]:
            problems.append(f"{name}: outputs differ between the variants")
        if env.factory is None and not fig["shared_model"]:
            problems.append(f"{name}: the variants did not share one model")
        e2e = fig.get("e2e")
        if e2e and e2e["bounds"][0] > 1.0:
            problems.append(f"{name}: the optimization is slower (e2e {e2e['ratio']:.3f}x)")
        env.platform.empty_cache()
    wins = ", ".join(f"{n} e2e {f['e2e']['ratio']:.3f}x" for n, f in figures.items() if "e2e" in f)
    return verdict(not problems, f"optimized / reference: {wins}", "; ".join(problems), **figures)


# ---- row 4: the CUDA-graph case ---------------------------------------------------------------


class _CountedGraph:
    """A captured `torch.cuda.CUDAGraph` that counts its replays."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.graph.replay()


def check_cudagraph(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_cuda()
    from perfguard.workloads.graphs import is_stream_capturing

    steps = 3 if env.quick else 4
    case = env.case("glm_image_t2i_cudagraph", steps=steps)
    eager = env.build(dataclasses.replace(case, options={}))()
    pipe = env.build(case)
    model = pipe.transformer
    calls: list[tuple[bool, bool]] = []  # (capturing, in place)
    original = model.drop_prior_tokens

    def spy(emb: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
        out = original(emb, drop)
        calls.append((is_stream_capturing(), out is emb))
        return out

    model.drop_prior_tokens = spy
    first = pipe()
    graph = getattr(pipe, "_graph", None)
    counter = None
    if graph is not None:
        counter = _CountedGraph(graph.graph)
        graph.graph = counter  # the captured graph, behind a replay counter
    second = pipe()
    replays = [counter.replays if counter is not None else 0]
    captured = [inplace for capturing, inplace in calls if capturing]
    diff = float((second - eager).abs().max())
    scale = float(eager.abs().max()) or 1.0
    ok = (
        graph is not None
        and replays[0] == steps
        and bool(captured)
        and not any(captured)
        and diff <= 1e-2 * scale
        and torch.equal(first, second)
    )
    return verdict(
        ok,
        f"captured once, {replays[0]} replays in a call, masked_fill inside the graph, "
        f"max |graph - eager| = {diff:.3g}",
        "the graph was not captured or replayed, the in-place drop ran under capture, or "
        "the graphed output differs from eager",
        captured=graph is not None,
        replays_per_call=replays[0],
        drop_calls_under_capture=len(captured),
        inplace_under_capture=sum(captured),
        max_abs_diff=diff,
        output_scale=scale,
        bit_identical=bool(torch.equal(second, eager)),
        steps=steps,
    )


# ---- row 5: per-stage peak memory -------------------------------------------------------------


@contextlib.contextmanager
def extra_allocation(
    pipe: Any, method: str, nbytes: int, allocate: Callable[[int], Any]
) -> Iterator[None]:
    """Hold `nbytes` more while `pipe.<method>` runs (the stage it implements)."""
    original = getattr(pipe, method)

    def held(*args: Any, **kwargs: Any) -> Any:
        extra = allocate(nbytes)
        try:
            return original(*args, **kwargs)
        finally:
            del extra

    setattr(pipe, method, held)
    try:
        yield
    finally:
        setattr(pipe, method, original)


def _stage_peaks(env: Env, pipe: Any) -> dict[str, float]:
    with StageTimer(env.platform) as timer:
        pipe()
    metrics = metrics_of_run(timer.record().to_dict())
    n = len(STAGE_PEAK_PREFIX)
    return {m[n:]: v for m, v in metrics.items() if m.startswith(STAGE_PEAK_PREFIX)}


def check_stage_peaks(env: Env) -> tuple[str, str, dict[str, Any]]:
    if not env.platform.stage_memory:
        raise Skip(f"{env.platform.name} records the run's peak only, not one per stage")
    case = env.case("qwen_image_t2i", steps=2)
    pipe = env.build(case)
    pipe()
    before = _stage_peaks(env, pipe)
    device = env.platform.device(0)
    allocate = env.allocate or (lambda n: torch.empty(n, dtype=torch.uint8, device=device))
    with extra_allocation(pipe, "decode", INJECT_BYTES, allocate):
        after = _stage_peaks(env, pipe)
    delta = {k: round(after.get(k, 0.0) - v, 3) for k, v in before.items()}
    target = "DecodingStage"
    others = {k: v for k, v in delta.items() if k != target}
    ok = (
        bool(before)
        and abs(delta.get(target, 0.0) - INJECT_BYTES / MB) <= STAGE_PEAK_SLACK_MB
        and all(abs(v) < STAGE_PEAK_SLACK_MB for v in others.values())
    )
    return verdict(
        ok,
        f"+{delta.get(target, 0.0):.1f} MiB in {target}, others within "
        f"{max((abs(v) for v in others.values()), default=0.0):.2f} MiB",
        f"an extra {INJECT_BYTES // MB} MiB in {target} moved the peaks by {delta}",
        stage_peak_mb={k: round(v, 3) for k, v in before.items()},
        delta_mb=delta,
        metric_names=sorted(STAGE_PEAK_PREFIX + k for k in before),
    )


# ---- row 6: noise on the device ---------------------------------------------------------------


def check_noise(env: Env) -> tuple[str, str, dict[str, Any]]:
    """Between-process spread of workers forked from a warm server (the default start
    method: the server imports torch but must never initialise CUDA, or its forks could
    not use the device) and of spawned ones, alternately."""
    env.require_cuda()
    from perfguard.decision import normalize
    from perfguard.decision.calibrate import CheckSetup, calibrate_case
    from perfguard.decision.tolerances import default_profiles
    from perfguard.measurement.workers import run_in_workers

    processes = 3 if env.quick else 5
    repeats = 5
    case = env.case("qwen_image_t2i", steps=8)
    metric = "stage:DenoisingStage"
    by_method: dict[str, dict[str, Any]] = {}
    forked = None
    for method in ("forkserver", "spawn"):
        options = MeasureOptions(
            processes=processes, repeats=repeats, warmup=1, start_method=method
        )
        result = run_in_workers([case], env.platform, options).cases[case.id]
        if result.status != "ok":
            return FAILED, f"the case failed in a {method} worker: {result.error}", {}
        samples = result.samples[metric]
        groups = result.groups or [len(samples)]
        # The same spread with each run over the reference workload beside it (timing:
        # normalized, perfguard.decision.normalize): whether devices should default to it.
        level = _median(result.reference) if result.reference else None
        scaled = normalize.normalized(result, level) if level else None
        normed = scaled.samples[metric] if scaled is not None else None
        medians, norm_medians, at = [], [], 0
        for n in groups:
            medians.append(_median(samples[at : at + n]))
            if normed is not None:
                norm_medians.append(_median(normed[at : at + n]))
            at += n
        sd = statistics.stdev(medians) if len(medians) > 1 else 0.0
        med = _median(medians)
        nsd = statistics.stdev(norm_medians) if len(norm_medians) > 1 else None
        by_method[method] = {
            "process_medians_ms": [round(m, 4) for m in medians],
            "median_ms": round(med, 4),
            "relative_sd": round(sd / med if med else math.inf, 5),
            "normalized_relative_sd": None
            if nsd is None
            else round(nsd / _median(norm_medians), 5),
        }
        forked = forked or result
    assert forked is not None
    profile = default_profiles(env.platform.name)["pr_test"]
    cal = calibrate_case(forked, profile, CheckSetup(repeats=repeats, check_processes=1))
    det = cal.to_json()["metrics"].get(metric, {})
    rel = by_method["forkserver"]["relative_sd"]
    spawned = by_method["spawn"]["relative_sd"]
    med = by_method["forkserver"]["median_ms"]
    return verdict(
        max(rel, spawned) <= NOISE_LIMIT,
        f"between-process sd {rel:.2%} (forked) / {spawned:.2%} (spawned) of {med:.3f} ms "
        f"over {processes} processes each",
        f"between-process sd {rel:.2%} forked, {spawned:.2%} spawned (limit {NOISE_LIMIT:.0%})",
        by_start_method=by_method,
        relative_sd=rel,
        calibrate=det,
        processes=processes,
        repeats=repeats,
    )


# ---- row 7: one full Qwen-Image case --------------------------------------------------------


def check_full(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_cuda()
    if env.quick:
        raise Skip("--quick leaves out the full preset (about a minute on an H200)")
    case = env.case("qwen_image_t2i", preset="full", height=1024, width=1024, steps=3)
    env.sync()
    t0 = time.perf_counter()
    pipe = env.build(case)
    env.sync()
    build_s = time.perf_counter() - t0
    params = list(pipe.transformer.parameters())
    count = sum(p.numel() for p in params)
    on_meta = sum(p.is_meta for p in params)
    dtypes = sorted({str(p.dtype) for p in params})
    pipe()  # warm-up
    with StageTimer(env.platform) as timer:
        out = pipe()
    rec = timer.record()
    finite = bool(torch.isfinite(out).all())
    ok = (
        on_meta == 0
        and dtypes == ["torch.bfloat16"]
        and abs(count / QWEN_FULL_PARAMS - 1) < 0.01
        and finite
    )
    figures = {
        "parameters": count,
        "parameters_on_meta": on_meta,
        "dtypes": dtypes,
        "build_s": round(build_s, 2),
        "stages_ms": {k: round(v, 2) for k, v in rec.stages_ms.items()},
        "step_ms": [round(v, 2) for v in rec.steps_ms],
        "peak_memory_mb": rec.peak_memory_mb,
        "output_finite": finite,
    }
    del pipe, out
    env.platform.empty_cache()
    return verdict(
        ok,
        f"{count / 1e9:.2f} B bf16 parameters built in {build_s:.1f} s, "
        f"DenoisingStage {rec.stages_ms.get('DenoisingStage', 0.0):.0f} ms for {case.steps} steps",
        "parameters left on meta, not bf16, not the published count, or a non-finite output",
        **figures,
    )


# ---- row 8: timer overhead on the device ----------------------------------------------------


def _pair_ns(env: Env, n: int, track_memory: bool) -> float:
    """ns per enter+exit of an empty stage, minus an empty loop, median of 5 blocks."""
    samples = []
    for _ in range(5):
        t0 = env.host_ns()
        for _ in range(n):
            pass
        empty = env.host_ns() - t0
        with StageTimer(env.platform, track_memory=track_memory):
            t0 = env.host_ns()
            for _ in range(n):
                with stage("DenoisingStage"):
                    pass
            spent = env.host_ns() - t0
        env.sync()
        samples.append((spent - empty) / n)
    return _median(samples)


def check_overhead(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_cuda()
    n = 2_000 if env.quick else 10_000
    events = _pair_ns(env, n, track_memory=False)
    peaks = _pair_ns(env, n, track_memory=True)
    return verdict(
        peaks <= OVERHEAD_LIMIT_NS,
        f"{events / 1e3:.2f} us per enter+exit with events, {peaks / 1e3:.2f} us with "
        "allocator peaks (stored as peak_memory:<Stage>)",
        f"{peaks / 1e3:.2f} us per enter+exit with allocator peaks (limit "
        f"{OVERHEAD_LIMIT_NS / 1e3:g} us)",
        ns_events_only=round(events, 1),
        ns_with_stage_peaks=round(peaks, 1),
        pairs=n,
    )


# ---- row 9: two ranks over NCCL ---------------------------------------------------------------


def check_nccl(env: Env) -> tuple[str, str, dict[str, Any]]:
    cuda = env.require_cuda()
    visible = int(cuda.device_count())
    if visible < 2:
        raise Skip(f"needs two GPUs; {visible} visible")
    from perfguard.measurement.workers import run_in_workers

    case = env.case("qwen_image_t2i_2gpu", steps=4)
    res = run_in_workers([case], env.platform, MeasureOptions(repeats=3, warmup=1)).cases[case.id]
    if res.status != "ok":
        return FAILED, f"the two-rank case failed: {res.error}", {}
    ranks = res.case.get("ranks")
    return verdict(
        ranks == 2 and bool(res.deterministic),
        f"2 ranks over NCCL, e2e {_median(res.samples['e2e']):.2f} ms, the ranks agree",
        f"ranks={ranks}, deterministic={res.deterministic}",
        ranks=ranks,
        e2e_ms=round(_median(res.samples["e2e"]), 3),
        rank_e2e_ms=res.case.get("rank_e2e_ms"),
    )


# ---- row 10: the flash-attn varlen branch -----------------------------------------------------


def _flash_attn(env: Env) -> tuple[Any, str]:
    """flash_attn_varlen_func, installing flash-attn from a wheel when allowed (never a build)."""
    with contextlib.suppress(ImportError):
        return importlib.import_module("flash_attn").flash_attn_varlen_func, "already installed"
    if not env.install_flash_attn:
        raise Skip("flash-attn is not installed (--no-install)")
    # Wheels only (a source build takes an hour), no retries: an offline runner says so fast.
    cmd = [sys.executable, "-m", "pip", "install", "--only-binary=:all:", "--retries", "0"]
    cmd += ["--timeout", "10", "flash-attn"]
    limit = 30 if env.quick else 90
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        raise Skip(f"pip install flash-attn (wheels only) took over {limit} s") from None
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1][:200]
        raise Skip(f"no flash-attn wheel for this torch/CUDA/Python: {last}")
    importlib.invalidate_caches()
    try:
        return importlib.import_module("flash_attn").flash_attn_varlen_func, "installed a wheel"
    except ImportError as exc:
        raise Skip(f"a flash-attn wheel installed but does not import: {exc}") from None


def check_flash_varlen(env: Env) -> tuple[str, str, dict[str, Any]]:
    env.require_cuda()
    from perfguard.workloads import attention

    flash, how = _flash_attn(env)
    device = env.platform.device(0)
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, s, h, d = 2, 512, 8, 128
    lens = [512, 301]
    q, k, v = (torch.randn(b, s, h, d, generator=gen).to(device, torch.bfloat16) for _ in range(3))
    meta = attention.build_varlen_mask_meta_from_ranges([(0, n) for n in lens], s, device)
    attention._flash_attn_varlen_func.cache_clear()
    fast = attention.varlen_attention(q, k, v, meta)  # the flash branch
    packed = attention.varlen_attention(q.float(), k.float(), v.float(), meta)  # torch path
    attention._flash_attn_varlen_func.cache_clear()
    err = float((fast.float() - packed).abs().max())
    return verdict(
        err <= 2e-2,
        f"flash-attn varlen equals the packed torch path within {err:.2g} ({how})",
        f"flash-attn varlen differs from the packed torch path by {err:.3g}",
        max_abs_diff=err,
        flash_attn=how,
        flash_fn=getattr(flash, "__module__", "?"),
    )


# ---- row 11: work counters on the device --------------------------------------------------

WORK_VARIANTS = (
    ("qwen_image_t2i_padded", "qwen_varlen_host_meta"),
    ("qwen_image_t2i_padded", "qwen_modulation_cache"),
    ("glm_image_t2i", "glm_prior_drop_inplace"),
)


def check_work_counters(env: Env) -> tuple[str, str, dict[str, Any]]:
    """The host syncs counted from the op stream against the device's own count.

    `perfguard.measurement.work` counts syncs from the ops a run dispatches, on every
    platform (a CPU included); on CUDA its counted run also turns on
    `torch.cuda.set_sync_debug_mode("warn")` and counts what the device reports. Per
    optimization on and off, per stage, the two must agree: a stage where the device
    sees syncs the op list does not know (or the reverse) is a gap in the list.
    """
    env.require_cuda()
    from perfguard.measurement.work import counted_run

    figures: dict[str, Any] = {}
    gaps: list[str] = []
    for case_id, toggle in WORK_VARIANTS:
        for on in (True, False):
            case = env.case(case_id, steps=2).with_toggles(**{toggle: on})
            pipe = env.build(case)
            pipe()  # warm-up: first-call caches are not what a build does per call
            env.sync()
            work, _ = counted_run(pipe, env.platform, case.dtype)
            device = dict(work.device_syncs or {})
            stages = {
                stage: {"op_stream": counts["syncs"], "device": device.get(stage)}
                for stage, counts in sorted(work.stages.items())
                if counts["syncs"] or device.get(stage)
            }
            key = f"{toggle}={'on' if on else 'off'}"
            figures[key] = {
                "case": case.id,
                "op_stream_syncs": work.total["syncs"],
                "device_syncs": device.get("total"),
                "stages": stages,
                "sync_ops": {s: dict(c) for s, c in work.sync_ops.items() if c},
            }
            gaps += [
                f"{key} {stage}: op stream {v['op_stream']}, device {v['device']}"
                for stage, v in stages.items()
                if v["op_stream"] != v["device"]
            ]
    return verdict(
        not gaps,
        "op-stream syncs equal the sync debug mode's in every stage, per optimization on and off",
        "op-stream and device sync counts differ: " + "; ".join(gaps[:4]),
        **figures,
    )


# ---- the run --------------------------------------------------------------------------------

# ---- row 12: the resident server on the device ---------------------------------------------


def check_resident(env: Env) -> tuple[str, str, dict[str, Any]]:
    """Two `perfguard run` commands and one `--isolate` run through one resident server
    of a private directory: each command is a fork that starts the device runtime
    itself, the server never holds a context, and the later commands reuse it."""
    import json
    import subprocess
    import sys
    import tempfile

    env.require_cuda()
    from perfguard.measurement import resident

    directory = tempfile.mkdtemp(prefix="pgs", dir="/tmp")
    run_env = {**os.environ, resident.ENV_DIR: directory, resident.ENV_IDLE: "120"}
    run_env.pop(resident.ENV_SOCKET, None)
    out = Path(directory, "r.json")
    walls, codes, statuses = [], [], []
    base = [sys.executable, "-m", "perfguard", "run", "--platform", env.platform.name]
    case = ["--case", "qwen_image_t2i_smoke", "--repeats", "2", "--no-progress", "--out", str(out)]
    try:
        for extra in ([], [], ["--isolate"]):
            t0 = time.perf_counter()
            proc = subprocess.run([*base, *case, *extra], env=run_env, capture_output=True,
                                  text=True, timeout=600)  # fmt: skip
            walls.append(round(time.perf_counter() - t0, 2))
            codes.append(proc.returncode)
            data = json.loads(out.read_text()) if out.exists() else {}
            statuses.append(data.get("cases", {}).get("qwen_image_t2i_smoke", {}).get("status"))
        info = resident.servers(run_env)
        pids = _compute_pids()
    finally:
        resident.stop_all(run_env)
    server = info[0] if info else {}
    holds = pids is not None and server.get("pid") in pids
    ok = codes == [0, 0, 0] and statuses == ["ok"] * 3 and len(info) == 1 and not holds
    return verdict(
        ok and (server.get("served") or 0) >= 4,
        f"3 commands through one server ({server.get('served')} forks), wall {walls} s; the "
        "server holds no device context",
        f"exit codes {codes}, statuses {statuses}, {len(info)} server(s), server holds a "
        f"context: {holds}",
        walls_s=walls,
        exit_codes=codes,
        statuses=statuses,
        server=server,
        server_holds_context=holds,
    )


# ---- row 13: per-op attribution's stage ranges hold the device's kernels -------------------


def check_attribution_ranges(env: Env) -> tuple[str, str, dict[str, Any]]:
    """A profiled run with CUDA activity (`perfguard.measurement.profiling`'s settings):
    the device time of the ops inside a `stage:` range (`StageTimer(ranges=True)`) must be
    nearly all of the kernels' time, or an attribution would miss where the device spent
    it (kernels launched outside the timer's stages, or not linked to their ops)."""
    cuda = env.require_cuda()
    from torch.profiler import ProfilerActivity, profile

    from perfguard.device.timer import StageTimer

    case = env.case("qwen_image_t2i_padded", steps=2)
    pipe = env.build(case)
    pipe()
    env.sync()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities) as prof, StageTimer(env.platform, ranges=True):
        pipe()
        cuda.synchronize()
    staged: dict[str, float] = {}
    for e in prof.events():
        if e.name.startswith(("stage:", "step:")) or not e.self_device_time_total:
            continue
        parent, name = e.cpu_parent, None
        while parent is not None and name is None:
            name = parent.name[len("stage:") :] if parent.name.startswith("stage:") else None
            parent = parent.cpu_parent
        if name is not None:
            staged[name] = staged.get(name, 0.0) + float(e.self_device_time_total)
    kernels = sum(
        float(e.self_device_time_total) for e in prof.events() if e.self_device_time_total
    )
    inside = sum(staged.values())
    share = inside / kernels if kernels else 0.0
    return verdict(
        kernels > 0 and share >= 0.95 and "DenoisingStage" in staged,
        f"{share:.1%} of the device time lies inside the stage ranges",
        f"only {share:.1%} of the device time lies inside the stage ranges",
        kernel_us=round(kernels, 1),
        staged_us={k: round(v, 1) for k, v in sorted(staged.items())},
    )


CHECKS: list[tuple[str, str, Callable[[Env], tuple[str, str, dict[str, Any]]]]] = [
    ("0", "no device context in the parent", check_context),
    ("1", "timer: events vs host clock, syncs per stage", check_timer),
    ("2a", "syncs per step: host varlen metadata", check_varlen_syncs),
    ("2b", "syncs and time: GLM prior drop", check_prior_drop_syncs),
    ("2c", "modulation cache hits", check_modulation_hits),
    ("3", "optimization wins with perfguard ab", check_ab),
    ("4", "CUDA-graph case", check_cudagraph),
    ("5", "per-stage peak memory", check_stage_peaks),
    ("6", "between-process noise, calibrate", check_noise),
    ("7", "full Qwen-Image case", check_full),
    ("8", "timer overhead on the device", check_overhead),
    ("9", "two ranks over NCCL", check_nccl),
    ("10", "flash-attn varlen", check_flash_varlen),
    ("11", "work counters: op-stream syncs vs the device", check_work_counters),
    ("12", "resident server: commands and workers forked on the device", check_resident),
    ("13", "attribution: the stage ranges hold the kernels", check_attribution_ranges),
]


def run_check(env: Env, row_id: str, title: str, fn: Callable[[Env], Any]) -> Row:
    """One check; a skip is a skip, and anything it raises is that row's failure."""
    row = Row(row_id, title)
    t0 = time.perf_counter()
    try:
        row.status, row.reason, row.figures = fn(env)
    except Skip as skip:
        row.status, row.reason = SKIPPED, str(skip)
    except Exception as exc:  # a crash in a check is a failed check, never a crashed run
        tail = traceback.format_exc().strip().splitlines()[-3:]
        row.status, row.reason = FAILED, f"{type(exc).__name__}: {exc}"
        row.figures = {"traceback_tail": tail}
    finally:
        with contextlib.suppress(Exception):
            env.platform.empty_cache()
    row.seconds = round(time.perf_counter() - t0, 2)
    return row


def run_all(env: Env, only: Sequence[str] | None = None) -> list[Row]:
    return [run_check(env, i, t, fn) for i, t, fn in CHECKS if not only or i in only]


def document(env: Env, rows: list[Row], environment: dict[str, Any], seconds: float) -> dict:
    counts = {s: sum(r.status == s for r in rows) for s in (PASSED, FAILED, SKIPPED)}
    return {
        "kind": KIND,
        "quick": env.quick,
        "seconds": round(seconds, 1),
        "environment": environment,
        "summary": counts,
        "rows": [r.to_json() for r in rows],
    }


def print_table(rows: list[Row], seconds: float) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    style = {PASSED: "green", FAILED: "bold red", SKIPPED: "yellow"}
    table = Table(title=f"perfguard GPU self-check ({seconds:.0f} s)")
    for col in ("row", "check", "status", "s", "reason"):
        table.add_column(col, justify="right" if col == "s" else "left", overflow="fold")
    for r in rows:
        table.add_row(
            r.id,
            escape(r.check),
            f"[{style[r.status]}]{r.status}[/]",
            f"{r.seconds:.1f}",
            escape(r.reason),
        )
    Console(width=max(120, Console().width)).print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, no full preset")
    ap.add_argument("--out", default="gpu-selfcheck.json", help="where the JSON goes")
    ap.add_argument("--platform", default=None, help="as perfguard's --platform")
    ap.add_argument("--rows", default=None, help="comma-separated row ids (default: all)")
    ap.add_argument("--cases", default=None, help="case registry directory")
    ap.add_argument("--no-install", action="store_true", help="never pip install flash-attn")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    known = {i for i, _, _ in CHECKS}
    only = [r.strip() for r in args.rows.split(",") if r.strip()] if args.rows else None
    unknown = sorted(set(only or ()) - known)
    try:
        if unknown:
            rows = ", ".join(i for i, _, _ in CHECKS)
            raise PerfguardError(f"--rows: unknown row {unknown[0]!r} (rows: {rows})")
        platform = probe(args.platform)
        environment = fingerprint(platform)
        env = Env.detect(platform, args.quick, args.cases)
    except PerfguardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    env.context_at_start = context_snapshot(env)  # before any check touches the device
    env.install_flash_attn = not args.no_install
    rows = run_all(env, only)
    seconds = time.perf_counter() - started
    doc = document(env, rows, environment, seconds)
    write_json_atomic(Path(args.out), doc)
    print_table(rows, seconds)
    print(f"wrote {args.out}: {doc['summary']}")
    return EXIT_REGRESSION if doc["summary"][FAILED] else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
