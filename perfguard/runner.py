"""Run cases: warm-up, measured repeats, every sample of every metric, errors kept per case.

Why warm-up runs: the first calls of a model pay one-off costs (allocator growth, kernel
selection and autotuning, lazy module initialisation, page faults on fresh weights) that
a serving process pays once, not per request. They are run untimed and dropped.

Why every sample: a verdict on a noisy machine needs the spread, not one number, and a
later, better rule can only be applied to data that was kept. Results therefore hold each
metric's list of samples (one per measured run), which `perfguard.verdict` summarizes.

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
(`perfguard.gate` asks `perfguard.verdict` whether every verdict is already clear) is
consulted after each run, and measuring stops as soon as it says so, or at
`max_repeats`: clear cases cost the minimum, unclear ones get the samples they need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import gc
import hashlib
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from perfguard import threads
from perfguard.cases import DIFFUSERS, Case
from perfguard.errors import PerfguardError
from perfguard.inject import describe
from perfguard.metrics import metrics_of_run
from perfguard.platform import Platform, fingerprint
from perfguard.reference import Reference
from perfguard.timer import RunRecord, StageTimer

RESULTS_KIND = "perfguard.results"
RESULTS_SCHEMA_VERSION = 1


class CaseTimeout(Exception):
    """Raised inside a case that ran past `--timeout`."""


@dataclass
class CaseResult:
    """What the runner measured for one case (or why it could not)."""

    case_id: str
    status: str = "ok"  # "ok" or "error"
    error: str | None = None
    samples: dict[str, list[float]] = field(default_factory=dict)
    output_hash: str | None = None
    deterministic: bool | None = None
    load_ms: float | None = None
    warmup: int = 0
    repeats: int = 0
    case: dict[str, Any] = field(default_factory=dict)
    groups: list[int] | None = None
    threads: dict[str, int] | None = None
    reference: list[float] = field(default_factory=list)
    components: dict[str, dict[str, Any]] | None = None
    counters: dict[str, list[int]] | None = None

    def add_counters(self, counts: dict[str, int]) -> None:
        """One measured run's counters; a counter a run did not report counts 0 there."""
        runs = self.repeats  # runs already recorded before this one
        store = self.counters if self.counters is not None else {}
        for name in set(store) | set(counts):
            values = store.setdefault(name, [0] * runs)
            values.append(int(counts.get(name, 0)))
        self.counters = store

    def add_run(self, record: RunRecord) -> None:
        for name, value in metrics_of_run(record.to_dict()).items():
            self.samples.setdefault(name, []).append(value)

    def only_runs(self, keep: Sequence[bool]) -> CaseResult:
        """This result with only the runs where `keep` is true (one flag per run).

        Every metric and the reference must have one sample per run, so that run `i` is
        the same run in each; otherwise nothing is dropped. `groups` shrink with their
        runs, and a group left empty disappears.
        """
        runs = len(self.reference)
        if len(keep) != runs or all(keep) or not any(keep):
            return self
        if any(len(v) != runs for v in self.samples.values()):
            return self
        groups: list[int] = []
        at = 0
        for size in self.groups or [runs]:
            kept = sum(1 for k in keep[at : at + size] if k)
            if kept:
                groups.append(kept)
            at += size
        return dataclasses.replace(
            self,
            samples={
                m: [x for x, k in zip(v, keep, strict=True) if k] for m, v in self.samples.items()
            },
            reference=[x for x, k in zip(self.reference, keep, strict=True) if k],
            counters=None
            if self.counters is None
            else {
                name: [x for x, k in zip(v, keep, strict=True) if k] if len(v) == runs else v
                for name, v in self.counters.items()
            },
            repeats=sum(keep),
            groups=groups if len(groups) > 1 else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "error": self.error,
            "samples": self.samples,
            "output_hash": self.output_hash,
            "deterministic": self.deterministic,
            "load_ms": self.load_ms,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "case": self.case,
            **({"groups": list(self.groups)} if self.groups else {}),
            **({"threads": dict(self.threads)} if self.threads else {}),
            **({"reference": list(self.reference)} if self.reference else {}),
            **({"components": self.components} if self.components is not None else {}),
            **({"counters": self.counters} if self.counters is not None else {}),
        }

    @classmethod
    def from_json(cls, case_id: str, data: dict[str, Any]) -> CaseResult:
        return cls(
            case_id=case_id,
            status=data.get("status", "ok"),
            error=data.get("error"),
            samples={k: [float(x) for x in v] for k, v in data.get("samples", {}).items()},
            output_hash=data.get("output_hash"),
            deterministic=data.get("deterministic"),
            load_ms=data.get("load_ms"),
            warmup=int(data.get("warmup", 0)),
            repeats=int(data.get("repeats", 0)),
            case=dict(data.get("case", {})),
            groups=[int(g) for g in data["groups"]] if data.get("groups") else None,
            threads={k: int(v) for k, v in data["threads"].items()}
            if data.get("threads")
            else None,
            reference=[float(x) for x in data.get("reference", [])],
            components=(
                {k: dict(v) for k, v in data["components"].items()}
                if data.get("components") is not None
                else None
            ),
            counters=(
                {k: [int(x) for x in v] for k, v in data["counters"].items()}
                if data.get("counters") is not None
                else None
            ),
        )


def pool(parts: Sequence[CaseResult], new_groups: bool = True) -> CaseResult:
    """One result from several measurements of the same case (processes, re-runs).

    Samples are concatenated in order and `groups` records how many runs each part
    contributed (a part that was itself pooled keeps its own groups). With `new_groups`
    False the parts after the first were measured in the same process as the first (an
    in-process re-run) and extend its last group instead: on the 2-core CPU runner two
    pipeline builds in one process differ by ~3 % (median) where two processes differ by
    ~10 %, so counting them as independent processes would understate the noise. A part
    that failed makes the pooled result fail with its error: a baseline or a verdict
    must not rest silently on a subset of what was asked for.
    """
    if not parts:
        raise ValueError("nothing to pool")
    failed = [p for p in parts if p.status != "ok"]
    if failed:
        return failed[0]
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    samples: dict[str, list[float]] = {}
    groups: list[int] = []
    reference: list[float] = []
    counters: dict[str, list[int]] | None = None
    for i, part in enumerate(parts):
        reference.extend(part.reference)
        for name, values in part.samples.items():
            samples.setdefault(name, []).extend(values)
        if part.counters is not None or counters is not None:
            counters = _extend_counters(counters, part, sum(p.repeats for p in parts[:i]))
        if new_groups or i == 0:
            groups.extend(part.groups or [part.repeats])
        else:
            groups[-1] += part.repeats
    hashes = {p.output_hash for p in parts}
    return CaseResult(
        case_id=first.case_id,
        samples=samples,
        output_hash=first.output_hash,
        deterministic=all(p.deterministic for p in parts) and len(hashes) == 1,
        load_ms=first.load_ms,
        warmup=first.warmup,
        repeats=sum(p.repeats for p in parts),
        case=first.case,
        groups=groups if len(groups) > 1 else None,
        threads=first.threads,
        reference=reference,
        components=first.components,
        counters=counters,
    )


def _extend_counters(
    counters: dict[str, list[int]] | None, part: CaseResult, before: int
) -> dict[str, list[int]]:
    """`counters` with `part`'s runs appended, zeros where one side lacks a counter."""
    out = {k: list(v) for k, v in (counters or {}).items()}
    theirs = part.counters or {}
    for name in set(out) | set(theirs):
        values = out.setdefault(name, [0] * before)
        values.extend(theirs.get(name, [0] * part.repeats))
    return out


@dataclass
class Results:
    """A results file: the environment and one `CaseResult` per case id."""

    environment: dict[str, Any]
    settings: dict[str, Any]
    cases: dict[str, CaseResult] = field(default_factory=dict)
    created: str = field(default_factory=lambda: utc_now())

    @property
    def platform(self) -> str:
        return str(self.environment.get("platform", "unknown"))

    @property
    def hardware(self) -> str:
        return str(self.environment.get("hardware", "unknown"))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": RESULTS_KIND,
            "schema_version": RESULTS_SCHEMA_VERSION,
            "created": self.created,
            "environment": self.environment,
            "settings": self.settings,
            "cases": {cid: r.to_json() for cid, r in sorted(self.cases.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Results:
        return cls(
            environment=dict(data.get("environment", {})),
            settings=dict(data.get("settings", {})),
            cases={cid: CaseResult.from_json(cid, r) for cid, r in data["cases"].items()},
            created=str(data.get("created", "")),
        )


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def tensor_hash(tensor: torch.Tensor) -> str:
    """A short content hash of an output, to make a change in results visible in reports."""
    data = tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


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
        from perfguard.workloads.diffusers_pipeline import build_diffusers_pipeline

        return build_diffusers_pipeline(case, platform)
    from perfguard.workloads.pipeline import build_pipeline

    return build_pipeline(case, platform)


def describe_module(module: torch.nn.Module) -> dict[str, Any]:
    """`{"class": "module.Class", "parameters": N}` of one pipeline component."""
    cls = type(module)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": int(sum(p.numel() for p in module.parameters())),
    }


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
            out[str(role)] = describe_module(value)
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
        from perfguard.workloads.diffusers_pipeline import component_roles, read_model_index

        try:
            roles = component_roles(read_model_index(case))
        except PerfguardError as exc:
            return {}, str(exc)
        return (
            {r: {"class": f"{lib}.{cls}", "parameters": None} for r, (lib, cls) in roles.items()},
            "parameter counts known after a run",
        )
    try:
        from perfguard.workloads.pipeline import _PIPELINES

        with torch.device("meta"):
            pipe = _PIPELINES[case.workload](case, platform, torch.device("meta"))
        return components_of(pipe) or {}, None
    except Exception:
        from perfguard.workloads.presets import MODEL_CLASSES, get_preset

        with torch.device("meta"):
            dit = MODEL_CLASSES[case.workload](**get_preset(case.workload, case.preset))
        return {"transformer": describe_module(dit)}, "other components known after a run"


def run_case(
    case: Case,
    platform: Platform,
    *,
    repeats: int = 5,
    warmup: int = 1,
    timeout: float | None = None,
    sync: str = "none",
    inject: dict[str, float] | None = None,
    factory: PipelineFactory | None = None,
    on_run: Callable[[CaseResult], None] | None = None,
    max_repeats: int | None = None,
    until: Callable[[CaseResult], bool] | None = None,
) -> CaseResult:
    """Build the case's pipeline once, run it `warmup` + `repeats` times, keep every sample.

    With `until` and `max_repeats` > `repeats`, keep running after the first `repeats`
    until `until(result)` is true or `max_repeats` runs are measured.
    """
    if repeats < 1 or warmup < 0:
        raise PerfguardError("--repeats must be >= 1 and --warmup >= 0")
    limit = max(repeats, max_repeats or repeats) if until is not None else repeats
    result = CaseResult(case_id=case.id, warmup=warmup, repeats=0, case=case.definition())
    hashes: list[str] = []
    pipeline = None
    try:
        with _deadline(timeout):
            result.threads = threads.apply(threads.case_threads(case, platform.name)).to_json()
            t0 = time.perf_counter()
            pipeline = (factory or _default_factory)(case, platform)
            platform.synchronize()
            result.load_ms = (time.perf_counter() - t0) * 1e3
            yardstick = Reference(platform)
            result.components = components_of(pipeline)
            counters = getattr(pipeline, "counters", None)
            for _ in range(warmup):
                pipeline()
            before = yardstick.time_ms()
            while result.repeats < limit:
                if result.repeats >= repeats and until is not None and until(result):
                    break
                with StageTimer(platform, sync=sync, inject=inject) as timer:  # type: ignore[arg-type]
                    output = pipeline()
                # The yardstick right before and right after each run: a run counts as
                # contended when either saw the machine slow (perfguard.reference).
                after = yardstick.time_ms()
                result.reference.append(max(before, after))
                before = after
                result.add_run(timer.record())
                if callable(counters):
                    result.add_counters(dict(counters()))
                hashes.append(tensor_hash(output))
                result.repeats += 1
                if on_run is not None:
                    on_run(result)
    except Exception as exc:
        result.status = "error"
        oom = isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()
        kind = "out of memory" if oom else type(exc).__name__
        result.error = f"{kind}: {exc}".strip().splitlines()[0][:500]
        result.case["traceback_tail"] = traceback.format_exc().strip().splitlines()[-1][:500]
    finally:
        del pipeline
        gc.collect()
        platform.empty_cache()
    if hashes:
        result.output_hash = hashes[0]
        result.deterministic = len(set(hashes)) == 1
    return result


def run_cases(
    cases: Sequence[Case],
    platform: Platform,
    *,
    repeats: int = 5,
    warmup: int = 1,
    timeout: float | None = None,
    sync: str = "none",
    inject: dict[str, float] | None = None,
    factory: PipelineFactory | None = None,
    progress: bool | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    max_repeats: int | None = None,
    until_for: Callable[[Case], Callable[[CaseResult], bool] | None] | None = None,
) -> Results:
    """Run every case in turn; `on_case` sees each result as soon as it is complete.

    `until_for(case)` gives the case's adaptive stop predicate (see `run_case`).
    """
    results = Results(
        environment=fingerprint(platform),
        settings={
            "repeats": repeats,
            "warmup": warmup,
            "timeout": timeout,
            "sync": sync,
            "inject": describe(inject or {}),
            **({"max_repeats": max_repeats} if until_for is not None else {}),
        },
    )
    with _progress(len(cases), progress) as advance:
        for case in cases:
            advance(case.id, 0)
            res = run_case(
                case,
                platform,
                repeats=repeats,
                warmup=warmup,
                timeout=timeout,
                sync=sync,
                inject=inject,
                factory=factory,
                max_repeats=max_repeats,
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
