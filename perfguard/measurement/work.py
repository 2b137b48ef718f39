"""What a pipeline run does, counted exactly: ops, FLOPs, bytes allocated, host syncs.

Why counts: the reference optimizations change *work* (operations launched, FLOPs,
tensor memory allocated, host-device syncs), and that work is a deterministic function
of the code, the case and the torch version. A wall clock on a shared CPU runner cannot
see a copy of a 0.3 MB embedding or a `nonzero()` that would stall a GPU; a count sees
either exactly, on any runner, in one run, with no noise at all.

How: `WorkCounter` is a `TorchDispatchMode` (the tensor-memory tracker of
`perfguard.measurement.memory`, extended) that sees every aten op a run dispatches.

- **ops**: the leaf aten ops that ran. An op that torch's FLOP formulas do not cover is
  first decomposed (`OpOverload.decompose`, as `torch.utils.flop_counter.FlopCounterMode`
  does), so `aten::linear` counts as the `aten::t` + `aten::addmm` that execute it: the
  histogram names the kernels, the proxy for launches. Views are counted too: each is a
  dispatch the host pays for.
- **flops**: from `torch.utils.flop_counter.flop_registry`, torch's own formulas (matmuls,
  convolutions, attention); CPU's fused attention kernel
  (`_scaled_dot_product_flash_attention_for_cpu`) takes the flash formula, which reads
  the same query / key / value layout. Elementwise ops count 0, as in torch's counter.
- **alloc**: bytes of fresh tensor storage (outputs that alias no input, by their schema),
  summed over the stage, on the platform's device type: the total beside the peak.
- **syncs**: ops that make the host wait for the device (`host_sync`), counted from the
  op stream on every platform, a CPU included, so a sync is caught before the PR reaches
  a GPU (on a CPU run every tensor stands for a device tensor; on a device run an op
  whose tensors are all on the host is not a sync). On CUDA / ROCm the same run also
  counts what `torch.cuda.set_sync_debug_mode` reports (`device_syncs`), which checks
  the list against the device (`benchmarks/gpu_selfcheck.py`).

Per stage and per denoising step: the counted run carries a `StageTimer` whose platform
marks are counter snapshots (`_CountedPlatform`), so each stage and step gets the
difference of its two marks, with the timer's own stage names and nesting.

Why a run of its own: the mode puts a Python call on every op (~3x the run's time on the
smoke cases), so timed runs cannot carry it. The runner makes one counted run per
pipeline build, after the warm-up; on CPU it is the same run that measures the tensor
memory (one dispatch mode, not two).
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from perfguard.device.platform import Platform
from perfguard.measurement.memory import MemoryRun, TensorMemory, TrackedPlatform
from perfguard.metrics import WORK_KINDS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from perfguard.storage.baseline import Baseline
    from perfguard.storage.cases import Case

KINDS = WORK_KINDS
"""The counters of a stage or step, in report order (names in `perfguard.metrics`)."""

MEASURE = (
    "aten ops, torch FLOP formulas, fresh tensor storage, host syncs (perfguard.measurement.work)"
)

_aten = torch.ops.aten
_FLOP_ALIASES = {
    # CPU's fused attention kernel has flash attention's query/key/value layout; torch's
    # registry lists only the device kernels.
    _aten._scaled_dot_product_flash_attention_for_cpu: _aten._scaled_dot_product_flash_attention,
}

SYNC_OPS = frozenset(
    {
        "aten::nonzero",  # output shape depends on the data
        "aten::_local_scalar_dense",  # .item(), bool(t), int(t), float(t)
        "aten::masked_select",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::unique_dim_consecutive",
        "aten::bincount",  # output size from the data's max
        "aten::equal",  # returns a host bool
    }
)
"""Ops that wait for the device whatever their arguments (`host_sync` adds the ones
that do only with some arguments)."""

_MASK_INDEX_OPS = frozenset(
    {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
)
_COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_"})


_OP_INFO: dict[Any, tuple[str, Any, bool]] = {}


def _op_info(func: Any) -> tuple[str, Any, bool]:
    """(name, FLOP formula or None, decomposes) of an op, looked up once per overload.

    Cached because the mode pays it on every op (tens of thousands a run): whether an op
    has a composite (decomposing) kernel, which `OpOverload.decompose` would find out by
    re-entering the mode, is a property of the overload.
    """
    info = _OP_INFO.get(func)
    if info is None:
        packet = func.overloadpacket
        formula = flop_registry.get(packet)
        if formula is None and packet in _FLOP_ALIASES:
            formula = flop_registry.get(_FLOP_ALIASES[packet])
        composite = (
            formula is None
            and func is not torch.ops.prim.device.default
            and torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), "CompositeImplicitAutograd"
            )
        )
        info = _OP_INFO[func] = (func._schema.name, formula, bool(composite))
    return info


def _argument(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], name: str) -> Any:
    """The value of argument `name` of `func`, positional or keyword (None when absent)."""
    if name in kwargs:
        return kwargs[name]
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == name:
            return args[i] if i < len(args) and not arg.kwarg_only else None
    return None


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type not in ("cpu", "meta")


def host_sync(name: str, func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether this op makes the host wait for the device, as it would on a GPU.

    Judged from the op and its arguments, not from the device the run is on, so a CPU
    run counts the syncs a device run would have: `SYNC_OPS`; indexing with a boolean
    (or uint8) mask, read or write (it runs `nonzero` inside); `repeat_interleave` with
    a tensor of repeats and no `output_size`; and a blocking copy from a device tensor
    into host memory (`.cpu()`, `.tolist()`, `.numpy()` start with one).
    """
    if name in SYNC_OPS:
        return True
    if name in _MASK_INDEX_OPS:
        indices = _argument(func, args, kwargs, "indices") or ()
        return any(
            isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in indices
        )
    if name == "aten::repeat_interleave":
        repeats = _argument(func, args, kwargs, "repeats")
        if repeats is None and args and isinstance(args[0], torch.Tensor):
            repeats = args[0]  # the `.Tensor` overload: repeats is `self`
        return isinstance(repeats, torch.Tensor) and (
            _argument(func, args, kwargs, "output_size") is None
        )
    if name in _COPY_OPS:
        if _argument(func, args, kwargs, "non_blocking"):
            return False
        if name == "aten::_to_copy":
            src, dst = args[0] if args else None, kwargs.get("device")
            to_host = dst is not None and torch.device(dst).type == "cpu"
        else:
            dst_t, src = (*args, None, None)[:2]
            to_host = isinstance(dst_t, torch.Tensor) and dst_t.device.type == "cpu"
        return to_host and _on_device(src)
    return False


@dataclass(frozen=True)
class _Snapshot:
    """The counters at one timer mark (cumulative since the run began)."""

    totals: tuple[int, int, int, int]
    op_counts: Mapping[str, int]
    sync_ops: Mapping[str, int]
    device_syncs: int

    def minus(self, start: _Snapshot) -> dict[str, Any]:
        """What ran between `start` and this mark."""
        out: dict[str, Any] = {
            k: a - b for k, a, b in zip(KINDS, self.totals, start.totals, strict=True)
        }
        out["op_counts"] = _diff(self.op_counts, start.op_counts)
        out["sync_ops"] = _diff(self.sync_ops, start.sync_ops)
        out["device_syncs"] = self.device_syncs - start.device_syncs
        return out


def _diff(after: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v != before.get(k, 0)}


class WorkCounter(TensorMemory):
    """Counts every aten op a run dispatches, with its FLOPs, fresh storage and syncs.

    Also the `TensorMemory` it extends: live and peak bytes of the tensor storage on
    `device_type`. `device_syncs` is a callable giving the count of syncs the device
    itself reported so far (CUDA's sync debug mode), or None.
    """

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__(device_type)
        self.flops = 0
        self.alloc_bytes = 0
        self.syncs = 0
        self.op_counts: collections.Counter[str] = collections.Counter()
        self.sync_ops: collections.Counter[str] = collections.Counter()
        self.uncounted_flops: set[str] = set()
        self.device_syncs: Callable[[], int] | None = None

    def _fresh(self, size: int) -> None:
        self.alloc_bytes += size

    def snapshot(self) -> _Snapshot:
        return _Snapshot(
            (self.ops, self.flops, self.alloc_bytes, self.syncs),
            dict(self.op_counts),
            dict(self.sync_ops),
            self.device_syncs() if self.device_syncs is not None else 0,
        )

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one op (a composite one as the ops it decomposes into) and count it: its
        name, FLOPs, whether it waits for the device, and the storages it allocated."""
        name, formula, composite = _op_info(func)
        if composite:
            # Count what executes: a composite op runs as the ops it decomposes into.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        self.ops += 1
        self.op_counts[name] += 1
        if formula is not None:
            try:
                self.flops += int(formula(*args, **kwargs, out_val=out))
            except Exception:  # a formula torch cannot apply to these arguments
                self.uncounted_flops.add(name)
        if host_sync(name, func, args, kwargs) and (
            self.device_type == "cpu" or any(_on_device(t) for t in tree_leaves((args, kwargs)))
        ):
            # On a device run, an op on host tensors only (a `.item()` of a CPU scalar)
            # makes nobody wait; on a CPU run every tensor would be on the device.
            self.syncs += 1
            self.sync_ops[name] += 1
        self.track_outputs(func, out)
        return out


class _CountedPlatform(TrackedPlatform):
    """A platform whose marks carry a counter snapshot, so spans get their counts.

    `StageTimer` marks every stage and step boundary; here a mark is `(base mark,
    snapshot)`, and the time of a span is the base platform's. Whether the tracker's
    peaks are read at all is the timer's `track_memory` (CPU only: a device keeps its own).
    """

    def __init__(self, base: Platform, counter: WorkCounter) -> None:
        super().__init__(base, counter)
        self._counter = counter

    def mark(self) -> Any:
        return (self._base.mark(), self._counter.snapshot())

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return self._base.elapsed_ms(start[0], end[0])


@dataclass(frozen=True)
class WorkRun:
    """What one counted run did: totals, per stage, per denoising step, per op.

    `stages[name]` and `steps[i]` map each of `KINDS` to an integer; `op_counts[stage]`
    and `sync_ops[stage]` are the histograms of the ops and of the syncing ops;
    `device_syncs` is what the device's sync debug mode saw (None where there is none);
    `context` is what the counts depend on (torch version, device type, dtype).
    """

    total: Mapping[str, int]
    stages: Mapping[str, Mapping[str, int]]
    steps: tuple[Mapping[str, int], ...]
    op_counts: Mapping[str, Mapping[str, int]]
    sync_ops: Mapping[str, Mapping[str, int]]
    context: Mapping[str, str]
    device_syncs: Mapping[str, int] | None = None
    uncounted_flops: tuple[str, ...] = field(default_factory=tuple)

    def metrics(self) -> dict[str, int]:
        """`<kind>`, `<kind>:<Stage>` and `<kind>_per_step` (`perfguard.metrics`)."""
        from perfguard.decision.work_counts import flatten

        return flatten(self.to_json())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "measure": MEASURE,
            "context": dict(self.context),
            "total": dict(self.total),
            "stages": {k: dict(v) for k, v in sorted(self.stages.items())},
            "steps": [dict(s) for s in self.steps],
            "op_counts": {k: dict(v) for k, v in sorted(self.op_counts.items())},
            "sync_ops": {k: dict(v) for k, v in sorted(self.sync_ops.items()) if v},
        }
        if self.device_syncs is not None:
            out["device_syncs"] = dict(self.device_syncs)
        if self.uncounted_flops:
            out["uncounted_flops"] = list(self.uncounted_flops)
        return out


def context(platform: Platform, dtype: str) -> dict[str, str]:
    """What the counts depend on beside the code and the case: torch, device type, dtype.

    The device type, not the device: a CUDA build dispatches other kernels than a CPU
    one (fused attention, cuBLAS epilogues), but two GPUs of one type run the same ops.
    """
    device = "cuda" if platform.name == "rocm" else platform.name
    return {"torch": str(torch.__version__), "device_type": device, "dtype": str(dtype)}


def refuse_another_context(
    cases: Sequence[Case], platform: Platform, baseline: Baseline, path: str
) -> None:
    """Before a work check runs: a case whose baseline counts were made under another
    context (torch, device type, dtype) is a `PerfguardError` (exit 2) naming the case
    and what differs. The work check judges counts only, and counts of another context are
    not compared (`decision.work_counts.context_mismatch`), so every case would pass having
    compared nothing; on a CI runner that installed another torch build that would be a
    gate that never fails."""
    from perfguard.errors import PerfguardError

    for case in cases:
        scenario = baseline.scenarios.get(case.id)
        counted = scenario.work.context if scenario and scenario.work else None
        here = context(platform, case.dtype)
        diffs = [
            f"{k} {counted[k]} (here {here[k]})"
            for k in here
            if counted and counted.get(k) != here[k]
        ]
        if diffs:
            raise PerfguardError(
                f"{path}: case {case.id!r}: work counted under {', '.join(diffs)}: "
                "the work check would compare nothing (install the baseline's versions or "
                "refresh it)"
            )


def _sync_debug(platform: Platform) -> tuple[Callable[[], int], Callable[[], None]] | None:
    """CUDA / ROCm: count the syncs `torch.cuda.set_sync_debug_mode("warn")` reports.

    Returns (count so far, restore) or None where the platform has no such mode.
    """
    if platform.name not in ("cuda", "rocm") or not torch.cuda.is_available():
        return None
    previous = torch.cuda.get_sync_debug_mode()
    caught = warnings.catch_warnings(record=True)
    seen = caught.__enter__()
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")

    scanned = [0, 0]  # warnings read so far, syncs among them: each mark reads only the new

    def count() -> int:
        new = seen[scanned[0] :]
        scanned[0] += len(new)
        scanned[1] += sum(1 for w in new if "synchroniz" in str(w.message))
        return scanned[1]

    def restore() -> None:
        torch.cuda.set_sync_debug_mode(previous)
        caught.__exit__(None, None, None)

    return count, restore


def counted_run(
    pipeline: Callable[[], Any], platform: Platform, dtype: str = "float32"
) -> tuple[WorkRun, MemoryRun | None]:
    """Run `pipeline` once counted; its work, and on CPU its tensor memory, not its time.

    Stage and step names come from the pipeline's own `perfguard.device.timer`
    marks, so the counts line up with the timed metrics. The timings of this run are
    discarded (the mode inflates them). The memory figures are returned where the
    platform has no allocator statistics (`separate_memory_run`), else None.
    """
    from perfguard.device.timer import StageTimer

    memory = platform.separate_memory_run
    counter = WorkCounter(platform.name if platform.name != "rocm" else "cuda")
    debug = _sync_debug(platform)
    counter.device_syncs = None if debug is None else debug[0]
    try:
        timed = _CountedPlatform(platform, counter)
        with counter, StageTimer(timed, track_memory=memory) as timer:
            pipeline()
        record = timer.record()
    finally:
        if debug is not None:
            debug[1]()
    stages: dict[str, dict[str, Any]] = {}
    for name, start, end in timer.spans():
        part = end[1].minus(start[1])
        have = stages.get(name)
        if have is None:
            stages[name] = part
        else:  # a stage entered twice in a run accumulates, as its time does
            for kind in (*KINDS, "device_syncs"):
                have[kind] += part[kind]
            for key in ("op_counts", "sync_ops"):
                merged = collections.Counter(have[key])
                merged.update(part[key])
                have[key] = dict(sorted(merged.items()))
    steps = [end[1].minus(start[1]) for start, end in timer.step_marks()]
    whole = timer.run_marks()
    total = whole[1][1].minus(whole[0][1])
    work = WorkRun(
        total={k: total[k] for k in KINDS},
        stages={s: {k: c[k] for k in KINDS} for s, c in stages.items()},
        steps=tuple({k: s[k] for k in KINDS} for s in steps),
        op_counts={s: c["op_counts"] for s, c in stages.items()},
        sync_ops={s: c["sync_ops"] for s, c in stages.items()},
        context=context(platform, dtype),
        device_syncs=None
        if debug is None
        else {"total": total["device_syncs"], **{s: c["device_syncs"] for s, c in stages.items()}},
        uncounted_flops=tuple(sorted(counter.uncounted_flops)),
    )
    mem = None
    if memory:
        mem = MemoryRun(
            peak_mb=record.peak_memory_mb or 0.0,
            stage_peak_mb=dict(record.stage_peak_memory_mb),
            ops=counter.ops,
        )
    return work, mem
