"""Run cases: warm-up, measured repeats, every sample of every metric, errors kept per case.

Why warm-up runs: the first calls of a model pay one-off costs (allocator growth, kernel
selection and autotuning, lazy module initialisation, page faults on fresh weights) that
a serving process pays once, not per request. They are run untimed and dropped.

Why every sample: a verdict on a noisy machine needs the spread, not one number, and a
later, better rule can only be applied to data that was kept. Results therefore hold each
metric's list of samples (one per measured run), which `perfguard.decision.verdict` summarizes.

A case that raises (out-of-memory included) or runs past its timeout is recorded as an
error with its message and the remaining cases still run: one broken case must not hide
the regressions of the others.

Why groups: on a shared machine the median of one process (or one pipeline build)
drifts from the next one's by more than its samples spread, so a result that pools
several processes (`--processes`, the gate's re-runs) keeps how many runs each one
contributed (`CaseResult.groups`); the verdict uses the spread of their medians.

Why components and counters: a figure says little without what produced it. A pipeline
may carry `components` (role -> module, or role -> `{"class", "parameters"}`), recorded
once per case as role -> `{"class": "module.Class", "parameters": N}`, and `counters()`
(-> `dict[str, int]`, what its last call did, e.g. modulation-cache hits), read after
each measured run and kept per run like the samples: a report then shows whether an
optimization engaged in the runs it judged, not only that it was switched on.

Why `until`: adaptive sampling. After the minimum `repeats`, the caller's predicate
(`perfguard.decision.gate` asks `perfguard.decision.verdict` whether every verdict is
already clear) is consulted after each run, and measuring stops as soon as it says so, or at
`max_repeats`: clear cases cost the minimum, unclear ones get the samples they need.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from perfguard.device import threads
from perfguard.device.inject import InjectionUnmatched
from perfguard.device.platform import Platform, fingerprint
from perfguard.device.reference import Reference
from perfguard.device.timer import StageTimer
from perfguard.errors import PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.work import counted_run
from perfguard.results import CaseResult, Results
from perfguard.storage.cases import DIFFUSERS, Case
from perfguard.workloads.components import component_info


class CaseTimeout(Exception):
    """Raised inside a case that ran past `--timeout`."""


def tensor_hash(tensor: torch.Tensor) -> str:
    """A short content hash of an output, to make a change in results visible in reports."""
    data = tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def output_sketch(tensor: torch.Tensor) -> dict[str, Any]:
    """The compact reference of an output that the output-equivalence check compares.

    The output itself when it has at most `SKETCH_VALUES` elements; else the means of
    equal blocks of its last two dimensions (an image, downsampled by the smallest
    integer factor that fits), or of a flattened 1-D view. A fixed function of the
    output, so two runs' sketches compare value by value (`decision.counters`).
    """
    import math

    from perfguard.decision.output import SKETCH_VALUES, OutputSketch

    t = tensor.detach().to("cpu", torch.float32)
    shape = tuple(int(x) for x in t.shape)
    if t.numel() <= SKETCH_VALUES:
        sketch = t
    elif t.dim() >= 2 and math.prod(shape[:-2]) * 4 <= SKETCH_VALUES:
        lead, (h, w) = math.prod(shape[:-2]), shape[-2:]
        scale = max(1, math.isqrt(h * w * lead // SKETCH_VALUES))
        while lead * math.ceil(h / scale) * math.ceil(w / scale) > SKETCH_VALUES:
            scale += 1
        size = (math.ceil(h / scale), math.ceil(w / scale))
        pooled = torch.nn.functional.adaptive_avg_pool2d(t.reshape(lead, 1, h, w), size)
        sketch = pooled.reshape(*shape[:-2], *size)
    else:
        flat = t.reshape(1, 1, -1)
        sketch = torch.nn.functional.adaptive_avg_pool1d(flat, SKETCH_VALUES).reshape(-1)
    values = tuple(float(x) for x in sketch.reshape(-1).tolist())
    return OutputSketch(shape, tuple(int(x) for x in sketch.shape), values).to_json()


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise `CaseTimeout` in this thread after `seconds` (SIGALRM; main thread only).

    This interrupts Python code between bytecodes, which covers CPU cases; a kernel that
    hangs on a device cannot be interrupted from inside the process: `--isolate` runs each
    case in a subprocess that is killed instead.
    """
    usable = (
        seconds
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise CaseTimeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))  # type: ignore[arg-type]
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


PipelineFactory = Callable[[Case, Platform], Callable[[], torch.Tensor]]


def _default_factory(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
    if case.workload == DIFFUSERS:
        from perfguard.interop.diffusers import build_diffusers_pipeline

        return build_diffusers_pipeline(case, platform)
    from perfguard.workloads.registry import build_pipeline

    return build_pipeline(case, platform)


def components_of(pipeline: Any) -> dict[str, dict[str, Any]] | None:
    """role -> `{"class", "parameters"}` for a built pipeline.

    From its `components` attribute when it has one (modules, or descriptions already);
    else from the `torch.nn.Module` attributes it holds (role = attribute name). None when
    it shows neither (a custom factory returning a plain function).
    """
    declared = getattr(pipeline, "components", None)
    if isinstance(declared, dict):
        items = list(declared.items())
    else:
        attrs = getattr(pipeline, "__dict__", {})
        items = [
            (k, v)
            for k, v in attrs.items()
            if isinstance(v, torch.nn.Module) and not k.startswith("_")
        ]
    out: dict[str, dict[str, Any]] = {}
    for role, value in items:
        if isinstance(value, torch.nn.Module):
            out[str(role)] = component_info(value)
        elif isinstance(value, dict) and "class" in value:
            out[str(role)] = {
                "class": str(value["class"]),
                "parameters": None if value.get("parameters") is None else int(value["parameters"]),
            }
    return dict(sorted(out.items())) or None


def planned_components(case: Case, platform: Platform) -> tuple[dict[str, Any], str | None]:
    """What `case` would build, without building it: (role -> description, a note or None).

    Built-in workloads are constructed on the meta device (no memory, no weights); where a
    component cannot be (its init needs a real device), the DiT alone is listed, from its
    preset, and the note says the rest is known after a run. A diffusers case lists the
    classes its `model_index.json` declares; their parameter counts are known after a run.
    """
    if case.workload == DIFFUSERS:
        from perfguard.interop.diffusers import component_roles, read_model_index

        try:
            roles = component_roles(read_model_index(case))
        except PerfguardError as exc:
            return {}, str(exc)
        return (
            {r: {"class": f"{lib}.{cls}", "parameters": None} for r, (lib, cls) in roles.items()},
            "parameter counts known after a run",
        )
    try:
        from perfguard.workloads.registry import PIPELINES

        with torch.device("meta"):
            pipe = PIPELINES[case.workload](case, platform, torch.device("meta"))
        return components_of(pipe) or {}, None
    except Exception:
        from perfguard.workloads.presets import MODEL_CLASSES, get_preset

        with torch.device("meta"):
            dit = MODEL_CLASSES[case.workload](**get_preset(case.workload, case.preset))
        return {"transformer": component_info(dit)}, "other components known after a run"


def import_factory(spec: str) -> PipelineFactory:
    """`'package.module:function'` -> the pipeline factory it names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PerfguardError(f"--factory {spec!r}: expected module:function")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PerfguardError(f"--factory {spec!r}: cannot import {module_name}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PerfguardError(f"--factory {spec!r}: {module_name} has no attribute {attr}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise PerfguardError(f"--factory {spec!r}: {attr} is not callable")
    return obj  # type: ignore[no-any-return]


def run_case(
    case: Case,
    platform: Platform,
    options: MeasureOptions | None = None,
    *,
    factory: PipelineFactory | None = None,
    on_run: Callable[[CaseResult], None] | None = None,
    until: Callable[[CaseResult], bool] | None = None,
) -> CaseResult:
    """Build the case's pipeline once, run it `warmup` + `repeats` times, keep every sample.

    With `until` and `options.max_repeats` > `options.repeats`, keep running after the
    first `repeats` until `until(result)` is true or `max_repeats` runs are measured.
    `factory` (a callable, already imported) overrides `options.factory` (a spec).

    One untimed counted run after the warm-up, on every platform, counts the build's
    work (`perfguard.measurement.work`: ops, FLOPs, bytes allocated, host syncs per
    stage and step), kept in `result.work`. Where the platform has no allocator
    statistics (CPU, `separate_memory_run`) the same run measures the tensor memory the
    pipeline allocates (`perfguard.measurement.memory`): the `peak_memory` and
    `peak_memory:<Stage>` samples of this build. The mode costs too much per op to
    ride along in timed runs. A pipeline that fails under the mode loses its counts
    (`result.work_error` says why), not its timings. `options.count_work` False skips
    it (a later process of a multi-process measurement: the counts are exact, and the
    first processes have them).
    """
    options = options or MeasureOptions()
    repeats = options.repeats
    if factory is None and options.factory:
        factory = import_factory(options.factory)
    limit = max(repeats, options.max_repeats or repeats) if until is not None else repeats
    result = CaseResult(case_id=case.id, warmup=options.warmup, repeats=0, case=case.definition())
    hashes: list[str] = []
    pipeline = None
    try:
        with _deadline(options.timeout):
            pipeline = _build(case, platform, options, factory, result)
            yardstick = Reference(platform)
            _describe(pipeline, result)
            if _warm_up(pipeline, options, result, hashes):
                limit = 0  # no timed runs: the last warm-up's output is the one compared
            _count_work(pipeline, platform, case, result, options)
            before = yardstick.time_ms()
            while result.repeats < limit:
                if result.repeats >= repeats and until is not None and until(result):
                    break
                before = _timed_run(pipeline, platform, options, yardstick, before, result, hashes)
                if on_run is not None:
                    on_run(result)
            _observed(pipeline, result)
    except InjectionUnmatched:
        raise  # a mistake in the command line, not this case's failure: exit 2
    except Exception as exc:
        _record_error(result, exc)
    finally:
        del pipeline
        gc.collect()
        platform.empty_cache()
    _settle_output(result, hashes)
    return result


def _timed_run(
    pipeline: Any,
    platform: Platform,
    options: MeasureOptions,
    yardstick: Reference,
    before: float,
    result: CaseResult,
    hashes: list[str],
) -> float:
    """One timed run into `result`, with the reference time beside it; the reference time
    after it (the next run's `before`)."""
    with StageTimer(
        platform,
        sync=options.sync,  # type: ignore[arg-type]
        inject=options.inject,
        track_memory=not platform.separate_memory_run,
    ) as timer:
        output = pipeline()
    # The yardstick right before and right after each run: a run counts as
    # contended when either saw the machine slow (perfguard.device.reference).
    after = yardstick.time_ms()
    result.reference.append(max(before, after))
    result.add_run(timer.record())
    counters = getattr(pipeline, "counters", None)
    if callable(counters):
        result.add_counters(dict(counters()))
    _keep_output(output, result, hashes)
    result.repeats += 1
    return after


def _build(
    case: Case,
    platform: Platform,
    options: MeasureOptions,
    factory: PipelineFactory | None,
    result: CaseResult,
) -> Callable[[], torch.Tensor]:
    """Apply the case's thread count and build its pipeline; `result` keeps the threads
    and the load time."""
    result.threads = threads.apply(
        threads.case_threads(case, platform.name, options.threads)
    ).to_json()
    t0 = time.perf_counter()
    pipeline = (factory or _default_factory)(case, platform)
    platform.synchronize()
    result.load_ms = (time.perf_counter() - t0) * 1e3
    return pipeline


def _describe(pipeline: Any, result: CaseResult) -> None:
    """What the built pipeline says of itself: its components and call arguments."""
    result.components = components_of(pipeline)
    arguments = getattr(pipeline, "arguments", None)
    result.arguments = dict(arguments) if isinstance(arguments, dict) else None


def _observed(pipeline: Any, result: CaseResult) -> None:
    """What the pipeline saw of itself over its runs (a diffusers case: the step seam that
    timed them, the frames of a video), and its call arguments as the seam left them."""
    observed = getattr(pipeline, "observed", None)
    result.observed = dict(observed) if isinstance(observed, dict) and observed else None
    arguments = getattr(pipeline, "arguments", None)
    if isinstance(arguments, dict):
        result.arguments = dict(arguments)


def _warm_up(
    pipeline: Callable[[], torch.Tensor],
    options: MeasureOptions,
    result: CaseResult,
    hashes: list[str],
) -> bool:
    """The untimed warm-up runs (at least one with `counters_only`, whose output is then
    kept as the one compared); whether it was counters only."""
    output = None
    for _ in range(max(options.warmup, 1 if options.counters_only else 0)):
        output = pipeline()
    if options.counters_only and output is not None:
        result.output_sketch = output_sketch(output)
        hashes.append(tensor_hash(output))
        return True
    return False


def _count_work(
    pipeline: Any, platform: Platform, case: Case, result: CaseResult, options: MeasureOptions
) -> None:
    """The untimed counted run, unless `options` skip it: the build's work and, where the
    platform has no allocator statistics, its tensor memory (see `run_case`)."""
    if not (options.count_work or options.counters_only):
        return
    try:
        work, memory = counted_run(pipeline, platform, case.dtype)
    except (CaseTimeout, InjectionUnmatched):
        raise
    except Exception as exc:  # an op the mode cannot see through: no counts
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        result.work_error = f"the pipeline failed under the counting mode ({first})"
    else:
        result.work = [work.to_json()]
        if memory is not None:
            for name, mb in memory.metrics().items():
                result.samples[name] = [mb]
            result.memory = memory.to_json()


def _keep_output(output: torch.Tensor, result: CaseResult, hashes: list[str]) -> None:
    """A timed run's output: its hash, and the first one's sketch."""
    hashes.append(tensor_hash(output))
    if result.output_sketch is None:
        result.output_sketch = output_sketch(output)


def _settle_output(result: CaseResult, hashes: list[str]) -> None:
    """The output compared: the first timed run's hash, and whether every run's matched."""
    if hashes:
        result.output_hash = hashes[0]
        result.deterministic = len(set(hashes)) == 1


def _record_error(result: CaseResult, exc: Exception) -> None:
    """A case that raised (out of memory included) is an error with its message."""
    result.status = "error"
    oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
    kind = "out of memory" if oom else type(exc).__name__
    result.error = f"{kind}: {exc}".strip().splitlines()[0][:500]
    result.case["traceback_tail"] = traceback.format_exc().strip().splitlines()[-1][:500]


def run_in_process(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions | None = None,
    *,
    factory: PipelineFactory | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    until_for: Callable[[Case], Callable[[CaseResult], bool] | None] | None = None,
) -> Results:
    """Run every case in turn in this process; `on_case` sees each result when complete.

    `until_for(case)` gives the case's adaptive stop predicate (see `run_case`).
    """
    options = options or MeasureOptions()
    if factory is None and options.factory:
        factory = import_factory(options.factory)
    settings = options.settings(adaptive=until_for is not None)
    results = Results(environment=fingerprint(platform), settings=settings)
    with _progress(len(cases), options.progress) as advance:
        for case in cases:
            advance(case.id, 0)
            res = run_case(
                case,
                platform,
                options,
                factory=factory,
                until=until_for(case) if until_for is not None else None,
            )
            results.cases[case.id] = res
            if on_case is not None:
                on_case(res)
            advance(case.id, 1)
    return results


@contextlib.contextmanager
def _progress(total: int, enabled: bool | None) -> Iterator[Callable[[str, int], None]]:
    """A rich progress bar on an interactive terminal; silent in CI logs."""
    import sys

    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda _id, _n: None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        transient=True,
    ) as bar:
        task = bar.add_task("cases", total=total)

        def advance(case_id: str, n: int) -> None:
            bar.update(task, description=case_id, advance=n)

        yield advance
