"""Peak memory of what a pipeline allocates on the CPU: live tensor storage, op by op.

Why not the process's resident set: on CPU that is the interpreter, torch's libraries
and every page the allocator ever touched (~350 MB for a model whose activations are
under 1 MB), so a change in what the pipeline allocates disappears in it, and a 64 MB
pad on it catches nothing. torch keeps no statistics for its CPU allocator (nothing like
`torch.cuda.max_memory_allocated`; the profiler's memory events cost a trace of every
op), and `tracemalloc` does not see it (tensors are allocated in C++: a 16 MiB tensor
moves its count by 480 bytes).

What is measured instead: `TensorMemory` is a `TorchDispatchMode` that sees every aten
op's outputs. An output that does not alias an input (its schema says so) is a fresh
allocation: its storage's bytes are added to the live total, and a weak reference to
the storage takes them off when the storage is freed (torch keeps one Python object per
storage, so the reference dies with the storage, not with a view). The peak of that
total is the figure: the most tensor memory the run held at once, counted from what was
live when it started (weights and caches built before the run are not counted; an
output or a cache the run creates is, from when it is created). This is the technique
of torch's own `torch.distributed._tools.mem_tracker`, without its per-module
accounting. It does not see memory a kernel allocates and frees inside itself
(workspaces) nor allocations outside torch.

Why a run of its own: the dispatch mode puts a Python call on every op, ~8 us per op
or ~3x the run's time on the smoke cases (`benchmarks/memory_overhead.py` printed it;
retired, figures in docs/measurements/retired-benchmarks.md),
so timed runs cannot carry it. The runner makes one tracked run per pipeline build, after the
warm-up, and takes the peak memory from it; on a deterministic pipeline the figure is
the same every run, so one run is the measurement, not a sample of it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from perfguard.device.platform import Platform

MEASURE = "tensor storage allocated by the run (perfguard.measurement.memory)"
"""How CPU peak memory is measured, recorded in results and baselines settings."""


class TensorMemory(TorchDispatchMode):
    """Live bytes of the tensor storage allocated while the mode is active, and their peak.

    `peak_bytes` is the highest `live_bytes` since the mode was entered or since the
    last `reset_peak()` (which sets it to what is live now), as CUDA's
    `reset_peak_memory_stats` / `max_memory_allocated` do for the device allocator.
    Storages on other devices than `device_type` are not counted.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Do not wrap `__torch_dispatch__` in `torch._disable_dynamo`.

        That wrapper imports `torch._dynamo` on the first op (~3 s on the 2-core runner,
        paid by every fresh worker process and charged to the case's `--timeout`) to
        keep `torch.compile` out of the mode's frames; this mode does no compilation.
        """
        return False

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type
        self.live_bytes = 0
        self.peak_bytes = 0
        self.ops = 0
        # id(storage) -> (bytes, weak reference whose callback releases them)
        self._storages: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _release(self, key: int) -> None:
        entry = self._storages.pop(key, None)
        if entry is not None:
            self.live_bytes -= entry[0]

    def _track(self, tensor: torch.Tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no plain storage
            return
        key = id(storage)
        size = storage.nbytes()
        entry = self._storages.get(key)
        if entry is None:
            ref = weakref.ref(storage, lambda _ref, key=key: self._release(key))
            self._storages[key] = (size, ref)
            self.live_bytes += size
            self._fresh(size)
        elif entry[0] != size:  # resized in place (an `out=` argument grown by the op)
            self._storages[key] = (size, entry[1])
            self.live_bytes += size - entry[0]
            self._fresh(max(0, size - entry[0]))
        else:
            return
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes

    def _fresh(self, size: int) -> None:
        """Called with the bytes of each storage allocation seen (a hook for subclasses)."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return self.dispatch(func, args, kwargs or {})

    def dispatch(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run one op and track the storages it allocated (a subclass counts more)."""
        out = func(*args, **kwargs)
        self.ops += 1
        self.track_outputs(func, out)
        return out

    def track_outputs(self, func: Any, out: Any) -> None:
        """Count the storage of the outputs of `func` that are fresh allocations."""
        schema = getattr(func, "_schema", None)  # every OpOverload has one
        returns = schema.returns if schema is not None else ()
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for i, value in enumerate(outputs):
            # A return with alias info is a view of, or an in-place write to, an input:
            # no new memory. Returns past the schema's (a TensorList) are checked too.
            if i < len(returns) and returns[i].alias_info is not None:
                continue
            for leaf in tree_leaves(value):
                if isinstance(leaf, torch.Tensor) and leaf.device.type == self.device_type:
                    self._track(leaf)


class TrackedPlatform(Platform):
    """A platform whose allocator statistics are a `TensorMemory`'s (for `StageTimer`).

    With `stage_memory` true the timer reads and resets the peak at every stage
    boundary, so each stage gets its own peak, exactly as on a CUDA device.
    """

    def __init__(self, base: Platform, memory: TensorMemory) -> None:
        super().__init__(name=base.name)
        self._base = base
        self._memory = memory

    @property
    def stage_memory(self) -> bool:
        return True

    @property
    def peak_memory_resettable(self) -> bool:
        return True

    def reset_peak_memory(self) -> None:
        self._memory.reset_peak()

    def peak_memory_bytes(self) -> int:
        return self._memory.peak_bytes

    def synchronize(self) -> None:
        self._base.synchronize()

    def mark(self) -> Any:
        return self._base.mark()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return self._base.elapsed_ms(start, end)


@dataclass(frozen=True)
class MemoryRun:
    """What one tracked run allocated: the run's peak and each stage's, in MB."""

    peak_mb: float
    stage_peak_mb: dict[str, float]
    ops: int

    def metrics(self) -> dict[str, float]:
        """`peak_memory` and `peak_memory:<Stage>`, the metrics a device run records."""
        from perfguard.metrics import STAGE_PEAK_PREFIX

        out = {"peak_memory": self.peak_mb}
        for stage, mb in self.stage_peak_mb.items():
            out[STAGE_PEAK_PREFIX + stage] = mb
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "measure": MEASURE,
            "peak_mb": round(self.peak_mb, 6),
            "stage_peak_mb": {k: round(v, 6) for k, v in sorted(self.stage_peak_mb.items())},
            "ops": self.ops,
        }


def measure_run(pipeline: Callable[[], Any], platform: Platform) -> MemoryRun:
    """Run `pipeline` once under `TensorMemory` and a stage timer; its memory, not its time.

    The stage names come from the pipeline's own `perfguard.device.timer.stage` marks, so the
    per-stage peaks line up with the timed metrics. The timings of this run are
    discarded: the dispatch mode inflates them.
    """
    from perfguard.device.timer import StageTimer

    memory = TensorMemory(platform.name if platform.name != "rocm" else "cuda")
    with memory, StageTimer(TrackedPlatform(platform, memory)) as timer:
        pipeline()
    record = timer.record()
    # The timer reset the tracker's peak at every stage boundary and kept the maximum.
    return MemoryRun(
        peak_mb=record.peak_memory_mb or 0.0,
        stage_peak_mb=dict(record.stage_peak_memory_mb),
        ops=memory.ops,
    )
