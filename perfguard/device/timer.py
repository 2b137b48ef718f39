"""Stage and denoising-step timing on the device, with an ambient current timer.

Model and pipeline code mark their stages with the module-level `stage(name)` and
`step(index)`; they reach whichever `StageTimer` is active in this context (a
`contextvars.ContextVar`), so the timer need not be threaded through every call. With no
timer active, or a disabled one, both return a shared do-nothing context manager: a
pipeline can stay instrumented in production at the cost of one context-variable read.

Why events and one resolution at the end: on CUDA/NPU a host clock measures how long it
took to *enqueue* kernels, not to run them. Each boundary records a device event on the
current stream instead, and `record()` synchronizes once and reads the event pairs. A sync
per stage (`sync="stage"`) is available for debugging and for code whose host work
overlaps badly with the device, but it serializes host and device and so changes what is
measured; it is not the default. On CPU the marks are `perf_counter_ns()` integers.

Peak memory: the device allocators (CUDA/NPU) give it per stage; the peak counter is
reset at every stage boundary and folded into every open span, so nested stages each get
their own peak and the run keeps the overall one. On CPU only the run's peak is recorded
(a process-level measure, see `perfguard.device.platform.Platform`), because reading it costs
tens of microseconds, too much to pay at every boundary.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Mapping
from typing import Any, Literal

from perfguard.device.inject import check_matched
from perfguard.device.platform import Platform
from perfguard.results import RunRecord

SyncPolicy = Literal["none", "stage"]
MB = 1024 * 1024


class _NullSpan:
    """The do-nothing span returned by a disabled (or absent) timer."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    # Named parameters, not `*exc`: packing a tuple is measurable at this call rate.
    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        return None

    def abandon(self) -> None:
        return None


_NULL_SPAN = _NullSpan()


class _Span:
    """One stage or step being timed.

    Entering and leaving is the timer's hot path (every stage and step of every run), held
    to <= 2 us enabled and <= 0.2 us disabled per pair by `benchmarks/timer_overhead.py`:
    hence `__slots__`, attribute reads hoisted into locals, and no work beyond one mark
    per boundary unless memory tracking, a per-stage sync or an injection asks for it.
    """

    __slots__ = ("_range", "_step", "_timer", "injected_s", "name", "peak", "start")

    def __init__(self, timer: StageTimer, name: str, step: bool) -> None:
        self._timer = timer
        self._step = step
        self.name = name
        self.peak = 0
        self.injected_s = 0.0  # busy time its steps already added (injection only)

    def __enter__(self) -> _Span:
        timer = self._timer
        # Steps are not spans of their own peak and do not change the open spans, so the
        # next stage boundary folds their peak into the same spans: no allocator read
        # and reset twice per denoising step.
        if timer._memory and not self._step:
            timer._fold_peak()
        if not self._step:
            stack = timer._stack
            if stack:
                self.name = stack[-1].name + "/" + self.name
            stack.append(self)
        if timer._sync:
            timer.platform.synchronize()
        if timer._ranges:
            self._range = timer._open_range(self)
        self.start = timer.platform.mark()
        return self

    def abandon(self) -> None:
        """Leave an entered step without recording it (its end was never seen): the
        steps recorded stay the ones whose both ends were marked."""
        if not self._step:
            raise ValueError("only a step can be abandoned; a stage is always closed")
        entered = getattr(self, "_range", None)  # its profiler range, when ranges are on
        if entered is not None:
            entered.__exit__(None, None, None)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        timer = self._timer
        if timer._inject:
            timer._slow_down(self)
        if timer._sync:
            timer.platform.synchronize()
        end = timer.platform.mark()
        if timer._memory and not self._step:
            timer._fold_peak()  # while this span is still open, so it gets its own peak
        if timer._ranges:
            self._range.__exit__(None, None, None)
        if self._step:
            timer._steps.append((self.start, end))
        else:
            timer._stack.pop()
            timer._spans.append((self.name, self.start, end))
            if timer._memory and self.peak > timer._stage_peaks.get(self.name, 0):
                timer._stage_peaks[self.name] = self.peak


class StageTimer:
    """Times named stages and denoising steps of one run on one platform.

    Use as a context manager around the whole run; while it is open it is the ambient
    timer that `perfguard.device.timer.stage()` / `step()` reach::

        with StageTimer(platform) as timer:
            with stage("TextEncodingStage"):
                ...
            with stage("DenoisingStage"):
                for i in range(steps):
                    with step(i):
                        ...
        record = timer.record()

    `inject` maps stage names to a fraction (0.10 = +10 %) by which that stage is slowed
    with real busy work, for the gate self-test (`perfguard.device.inject`); it is empty in
    normal runs and costs one falsy check per stage exit. `record()` raises
    `perfguard.device.inject.InjectionUnmatched` when an injected name matched no stage.

    `enabled=False` makes every call a no-op (the timer still activates, so code that
    asks for `current_timer()` gets it). `track_memory` reads the device allocator's peak
    per stage where the platform supports it cheaply.

    `ranges=True` also opens a `torch.profiler.record_function` range per stage
    (`stage:<name>`, nested names joined by `/`) and step (`step:<i>`), so that a
    profiled run (`perfguard.measurement.profile`) can say which stage each op ran in and
    a Chrome trace shows the pipeline's structure. Only profiled runs ask for it: a range
    costs microseconds per boundary, which timed runs do not pay (one falsy check).
    """

    def __init__(
        self,
        platform: Platform | None = None,
        *,
        enabled: bool = True,
        sync: SyncPolicy = "none",
        track_memory: bool = True,
        inject: Mapping[str, float] | None = None,
        ranges: bool = False,
    ) -> None:
        if sync not in ("none", "stage"):
            raise ValueError(f"sync must be 'none' or 'stage', not {sync!r}")
        self.platform = platform or Platform()
        self.enabled = enabled
        self._sync = sync == "stage"
        self._track_memory = track_memory and enabled
        self._memory = self._track_memory and self.platform.stage_memory
        self._stack: list[_Span] = []
        self._spans: list[tuple[str, Any, Any]] = []
        self._steps: list[tuple[Any, Any]] = []
        self._stage_peaks: dict[str, int] = {}
        self._run_peak = 0
        self._start: Any = None
        self._end: Any = None
        self._token: contextvars.Token[StageTimer] | None = None
        self._inject = dict(inject or {})
        self._ranges = ranges and enabled

    def _open_range(self, span: _Span) -> Any:
        """The profiler range of `span`, entered (see `ranges`)."""
        from torch.profiler import record_function

        label = f"step:{len(self._steps)}" if span._step else f"stage:{span.name}"
        entered = record_function(label)
        entered.__enter__()
        return entered

    # ---- spans ---------------------------------------------------------------------------
    def stage(self, name: str) -> _Span | _NullSpan:
        """A context manager timing the named pipeline stage (nestable)."""
        if not self.enabled:
            return _NULL_SPAN
        return _Span(self, name, False)

    def step(self, index: int) -> _Span | _NullSpan:
        """A context manager timing one denoising step; steps must be entered in order."""
        if not self.enabled:
            return _NULL_SPAN
        if index != len(self._steps):
            raise ValueError(f"denoising step {index} entered, expected {len(self._steps)}")
        return _Span(self, "", True)

    # ---- run -----------------------------------------------------------------------------
    def __enter__(self) -> StageTimer:
        self._token = _CURRENT.set(self)
        if self.enabled:
            if self._track_memory:
                self.platform.reset_peak_memory()
            if self._sync:
                self.platform.synchronize()
            self._start = self.platform.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            if self._sync:
                self.platform.synchronize()
            self._end = self.platform.mark()
            if self._track_memory:
                self._fold_peak()
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None

    def _slow_down(self, span: _Span) -> None:
        """Busy-wait for an injected stage's fraction of `span`'s own time before it ends.

        A step is slowed by the fraction of the innermost open stage that is injected (its
        own time x fraction), and that stage is told how much was added; the stage then
        adds what is left of `fraction x (its time without the injected part)`. So an
        injected `DenoisingStage` is slower by the fraction, and so is each of its steps
        (`step:<i>`, `step_avg`, `step_median`), which is what a slower denoiser looks
        like; injecting at the stage's end only, as before, left the step metrics as
        they were and the self-test never exercised their gate.

        The device is synchronized first so the span's real (device) time is known; the
        wait then spins on the host, which the end event (recorded after it on an idle
        stream) includes. Spinning rather than sleeping keeps the delay accurate at the
        sub-millisecond scale of tiny CPU stages.
        """
        if span._step:
            owner = next((s for s in reversed(self._stack) if s.name in self._inject), None)
            if owner is None:
                return
            fraction = self._inject[owner.name]
        elif span.name in self._inject:
            owner, fraction = None, self._inject[span.name]
        else:
            return
        self.platform.synchronize()
        now = self.platform.mark()
        self.platform.synchronize()
        elapsed_s = self.platform.elapsed_ms(span.start, now) / 1e3
        if owner is not None:
            wait_s = elapsed_s * fraction
        else:
            wait_s = max(0.0, (elapsed_s - span.injected_s) * fraction - span.injected_s)
        start = time.perf_counter()
        deadline = start + wait_s
        now_s = start
        while now_s < deadline:
            now_s = time.perf_counter()
        if owner is not None:
            # What the wait really took: on a busy machine a spin overshoots its deadline
            # when the process is descheduled near its end; counting the overshoot lets
            # the stage's own wait make up for it, so the stage stays at its fraction.
            owner.injected_s += now_s - start

    def _fold_peak(self) -> None:
        """Fold the allocator's peak since the last reset into every open span, then reset.

        Resetting at each boundary is what gives each stage its own peak; folding into
        all open spans (and the run) is what keeps nesting and the overall peak right.
        """
        peak = self.platform.peak_memory_bytes() or 0
        for span in self._stack:
            if peak > span.peak:
                span.peak = peak
        if peak > self._run_peak:
            self._run_peak = peak
        if self._memory:
            self.platform.reset_peak_memory()

    def spans(self) -> list[tuple[str, Any, Any]]:
        """Each closed stage as (name, start mark, end mark), in the order they ended."""
        return list(self._spans)

    def step_marks(self) -> list[tuple[Any, Any]]:
        """Each denoising step's (start mark, end mark), in step order."""
        return list(self._steps)

    def run_marks(self) -> tuple[Any, Any]:
        """The run's (start mark, end mark); the run must have finished."""
        if self._start is None or self._end is None:
            raise RuntimeError("StageTimer.run_marks() called before the timed run finished")
        return self._start, self._end

    def record(self) -> RunRecord:
        """Resolve the marks (one device sync) into a `RunRecord`."""
        if not self.enabled:
            return RunRecord(stages_ms={}, steps_ms=[], e2e_ms=0.0)
        if self._start is None or self._end is None:
            raise RuntimeError("StageTimer.record() called before the timed run finished")
        if self._stack:
            raise RuntimeError(f"stage {self._stack[-1].name!r} is still open")
        self.platform.synchronize()
        elapsed = self.platform.elapsed_ms
        stages: dict[str, float] = {}
        for name, start, end in self._spans:
            stages[name] = stages.get(name, 0.0) + elapsed(start, end)
        if self._inject:
            check_matched(self._inject, stages)
        peak = self._run_peak / MB if self._track_memory and self._run_peak else None
        return RunRecord(
            stages_ms=stages,
            steps_ms=[elapsed(s, e) for s, e in self._steps],
            e2e_ms=elapsed(self._start, self._end),
            peak_memory_mb=peak,
            stage_peak_memory_mb={k: v / MB for k, v in self._stage_peaks.items()},
        )


_DISABLED = StageTimer(enabled=False)
_CURRENT: contextvars.ContextVar[StageTimer] = contextvars.ContextVar(
    "perfguard_timer", default=_DISABLED
)


def current_timer() -> StageTimer:
    """The active timer in this context, or a disabled one when none is active."""
    return _CURRENT.get()


def stage(name: str) -> _Span | _NullSpan:
    """Time `name` on the ambient timer: `with stage("DecodingStage"): ...`.

    Inlines `StageTimer.stage` to save a method call on the disabled path, which is
    what production code pays when no timer is active.
    """
    timer = _CURRENT.get()
    if timer.enabled:
        return _Span(timer, name, False)
    return _NULL_SPAN


def step(index: int) -> _Span | _NullSpan:
    """Time denoising step `index` on the ambient timer (disabled path inlined, as `stage`)."""
    timer = _CURRENT.get()
    if timer.enabled:
        return timer.step(index)
    return _NULL_SPAN
