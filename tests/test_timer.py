"""StageTimer: nesting, steps, the ambient accessor, disabled mode, CPU timing sanity."""

from __future__ import annotations

import time
import types

import pytest

import perfguard.device.timer
from perfguard.device.inject import InjectionUnmatched
from perfguard.device.platform import Platform
from perfguard.device.timer import StageTimer, current_timer, stage, step
from perfguard.errors import EXIT_USAGE
from tests.helpers import HostAllocator


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_timing_matches_a_known_sleep() -> None:
    with StageTimer(Platform()) as timer, stage("DecodingStage"):
        time.sleep(0.05)
    rec = timer.record()
    assert 49.0 <= rec.stages_ms["DecodingStage"] < 400.0  # generous: shared CI machines
    assert rec.e2e_ms >= rec.stages_ms["DecodingStage"]


def test_nested_stages_are_named_by_path_and_contain_their_children() -> None:
    """On a manual clock, so the figures are exact: a parent counted without its child,
    or a child counted twice, changes them."""
    clock = _ManualClock()
    with StageTimer(clock) as timer:
        with stage("DenoisingStage"):
            clock.advance(2.0)
            with stage("CFG"):
                clock.advance(4.0)
        with stage("DecodingStage"):
            pass
    rec = timer.record()
    assert rec.stages_ms == {"DenoisingStage": 6.0, "DenoisingStage/CFG": 4.0, "DecodingStage": 0.0}
    assert rec.e2e_ms == 6.0


def test_a_stage_entered_twice_accumulates() -> None:
    clock = _ManualClock()
    with StageTimer(clock) as timer:
        for ms in (3.0, 5.0):
            clock.advance(1.0)  # between the two entries: not the stage's time
            with stage("TextEncodingStage"):
                clock.advance(ms)
    assert timer.record().stages_ms == {"TextEncodingStage": 8.0}


class _ManualClock(Platform):
    """A CPU platform whose clock advances only when told: exact, load-independent times."""

    def __init__(self) -> None:
        super().__init__()
        self.now_ns = 0

    def mark(self) -> int:
        return self.now_ns

    def host_ns(self) -> int:  # the reference workload sees the virtual clock too
        return self.now_ns

    def advance(self, ms: float) -> None:
        self.now_ns += int(ms * 1e6)


def test_steps_are_recorded_in_order_with_aggregates() -> None:
    clock = _ManualClock()
    with StageTimer(clock) as timer, stage("DenoisingStage"):
        for i, ms in enumerate((1.0, 3.0, 2.0)):
            with step(i):
                clock.advance(ms)
    rec = timer.record()
    assert rec.steps_ms == [1.0, 3.0, 2.0]
    assert rec.median_step_ms == rec.steps_ms[2]
    assert rec.avg_step_ms == pytest.approx(sum(rec.steps_ms) / 3)
    assert rec.stages_ms["DenoisingStage"] == sum(rec.steps_ms) == 6.0


def test_steps_out_of_order_are_refused() -> None:
    with StageTimer() as timer, pytest.raises(ValueError, match="step 1 entered, expected 0"):
        timer.step(1)


def test_the_ambient_timer_is_the_active_one_and_restored_after() -> None:
    assert not current_timer().enabled
    with StageTimer() as outer:
        assert current_timer() is outer
        with StageTimer() as inner:
            assert current_timer() is inner
        assert current_timer() is outer
    assert not current_timer().enabled


def test_stage_without_an_active_timer_does_nothing() -> None:
    with stage("InputValidationStage") as span:
        assert span is None
    with step(5):  # no order check when disabled
        pass


def test_disabled_timer_records_nothing() -> None:
    with StageTimer(enabled=False) as timer:
        with stage("DenoisingStage"):
            _spin(0.001)
        assert current_timer() is timer
    rec = timer.record()
    assert rec.stages_ms == {} and rec.steps_ms == [] and rec.e2e_ms == 0.0


def test_record_before_the_run_ends_is_an_error() -> None:
    timer = StageTimer()
    with pytest.raises(RuntimeError, match="before the timed run finished"):
        timer.record()


def test_cpu_records_a_run_level_peak_memory() -> None:
    with StageTimer(Platform()) as timer:
        blob = bytearray(32 * 1024 * 1024)
        blob[::4096] = b"x" * len(blob[::4096])
    rec = timer.record()
    del blob
    assert rec.peak_memory_mb is not None and rec.peak_memory_mb > 32
    assert rec.stage_peak_memory_mb == {}  # per stage only where the allocator gives it


class _CountingDevice(HostAllocator):
    """A device-like platform: event marks, allocator peak per stage, counted syncs."""

    def __init__(self) -> None:
        super().__init__(name="fake")
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1

    def alloc(self, mb: int) -> None:
        self.allocate(mb * 1024 * 1024)

    def free(self, mb: int) -> None:
        self.release(mb * 1024 * 1024)


def test_device_timing_syncs_once_at_the_end_by_default() -> None:
    dev = _CountingDevice()
    with StageTimer(dev) as timer:
        for name in ("TextEncodingStage", "DenoisingStage", "DecodingStage"):
            with stage(name):
                pass
    assert dev.syncs == 0
    timer.record()
    assert dev.syncs == 1


def test_sync_policy_stage_syncs_at_every_boundary() -> None:
    dev = _CountingDevice()
    with StageTimer(dev, sync="stage") as timer:
        with stage("A"):
            pass
        with stage("B"):
            pass
    assert dev.syncs == 2 + 4  # run start/end + two per stage
    timer.record()


def test_peak_memory_per_stage_with_nesting() -> None:
    dev = _CountingDevice()
    with StageTimer(dev) as timer:
        with stage("TextEncodingStage"):
            dev.alloc(100)
            dev.free(100)
        with stage("DenoisingStage"):
            dev.alloc(10)
            with stage("Inner"):
                dev.alloc(50)
                dev.free(50)
            dev.free(10)
        with stage("DecodingStage"):
            dev.alloc(20)
            dev.free(20)
    rec = timer.record()
    assert rec.stage_peak_memory_mb == {
        "TextEncodingStage": 100,
        "DenoisingStage/Inner": 60,
        "DenoisingStage": 60,
        "DecodingStage": 20,
    }
    assert rec.peak_memory_mb == 100


class _HybridClock(Platform):
    """Real time plus virtual milliseconds: the pipeline's own work is virtual (exact,
    whatever the machine is doing), the injected busy-wait is real."""

    def __init__(self) -> None:
        super().__init__()
        self.offset_ns = 0

    def mark(self) -> int:
        return time.perf_counter_ns() + self.offset_ns

    def advance(self, ms: float) -> None:
        self.offset_ns += int(ms * 1e6)


def test_injection_slows_the_named_stage_by_its_own_time_and_no_other() -> None:
    """+50 % of a 20 ms (virtual) stage is 10 ms of real busy-waiting, inside that stage:
    an injection applied to the wrong stage, to both, to none, or after the stage's end
    mark fails one of the bounds. (Was: lower bounds on time the test itself spun, which
    hold whatever the injection does.)"""
    clock = _HybridClock()
    with StageTimer(clock, inject={"DenoisingStage": 0.5}) as timer:
        with stage("DenoisingStage"):
            clock.advance(20.0)
        with stage("DecodingStage"):
            clock.advance(20.0)
    rec = timer.record()
    injected = rec.stages_ms["DenoisingStage"] - 20.0
    assert 10.0 <= injected < 10.0 + 40.0  # a busy-wait can be stretched, never shortened
    assert 20.0 <= rec.stages_ms["DecodingStage"] < 20.0 + 5.0  # no busy-wait here
    assert rec.e2e_ms >= rec.stages_ms["DenoisingStage"] + rec.stages_ms["DecodingStage"]


def test_injection_of_a_stage_that_does_not_run_slows_nothing_and_is_an_error() -> None:
    clock = _ManualClock()
    with StageTimer(clock, inject={"TextEncodingStage": 1.0}) as timer, stage("DecodingStage"):
        clock.advance(20.0)
    assert timer._spans == [("DecodingStage", 0, 20_000_000)]  # no time injected anywhere
    with pytest.raises(InjectionUnmatched, match="no stage named TextEncodingStage ran"):
        timer.record()


class _VirtualClock(Platform):
    """A platform whose marks read a virtual clock that only the test (and the injected
    busy-wait, one tick per read of its spin clock) moves: bounds can then be exact."""

    TICK_MS = 0.01

    def __init__(self) -> None:
        super().__init__(name="virtual")
        self.now_ns = 0

    def mark(self) -> int:
        return self.now_ns

    def work(self, ms: float) -> None:
        self.now_ns += round(ms * 1e6)

    def perf_counter(self) -> float:  # what the injected spin reads
        self.now_ns += round(self.TICK_MS * 1e6)
        return self.now_ns / 1e9


def test_injected_time_stays_inside_the_named_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _VirtualClock()
    monkeypatch.setattr(
        perfguard.device.timer, "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    inject = {"DenoisingStage": 0.5, "DecodingStage/VaeStage": 0.25}
    with StageTimer(clock, inject=inject, track_memory=False) as timer:
        with stage("TextEncodingStage"):
            clock.work(2.0)
        with stage("DenoisingStage"):
            for i in range(4):
                with step(i):
                    clock.work(10.0)
            clock.work(1.0)
        with stage("DecodingStage"):
            clock.work(1.0)
            with stage("VaeStage"):
                clock.work(4.0)
    rec = timer.record()
    tick = _VirtualClock.TICK_MS
    # The named stage grows by its own time x the fraction, give or take a few spin reads
    # (two per busy-wait: its own and one per step)...
    assert 41 * 1.5 <= rec.stages_ms["DenoisingStage"] <= 41 * 1.5 + 5 * 2 * tick
    assert 4 * 1.25 <= rec.stages_ms["DecodingStage/VaeStage"] <= 4 * 1.25 + 2 * tick
    # ...and so does each step it contains, so the step metrics carry the injection too...
    assert all(10.0 * 1.5 <= s <= 10.0 * 1.5 + 2 * tick for s in rec.steps_ms)
    # ...and the injection lands nowhere else: not in a sibling, only in the stages that
    # enclose it.
    assert rec.stages_ms["TextEncodingStage"] == 2.0
    vae = rec.stages_ms["DecodingStage/VaeStage"]
    assert rec.stages_ms["DecodingStage"] == pytest.approx(1.0 + vae)
    assert rec.e2e_ms == pytest.approx(2.0 + rec.stages_ms["DenoisingStage"] + 1.0 + vae)


def test_steps_outside_an_injected_stage_are_not_slowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps take the fraction of the injected stage that encloses them, and only then."""
    clock = _VirtualClock()
    monkeypatch.setattr(
        perfguard.device.timer, "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    with StageTimer(clock, inject={"DecodingStage": 1.0}, track_memory=False) as timer:
        with stage("DenoisingStage"):
            for i in range(3):
                with step(i):
                    clock.work(10.0)
        with stage("DecodingStage"):
            clock.work(4.0)
    rec = timer.record()
    assert rec.steps_ms == [10.0] * 3
    assert rec.stages_ms["DenoisingStage"] == 30.0
    assert 8.0 <= rec.stages_ms["DecodingStage"] <= 8.0 + 2 * _VirtualClock.TICK_MS


def test_an_injection_that_matched_no_stage_is_a_usage_error() -> None:
    with StageTimer(inject={"Denoisingstage": 0.1}) as timer:
        with stage("TextEncodingStage"):
            pass
        with stage("DenoisingStage"):
            pass
    with pytest.raises(InjectionUnmatched) as err:
        timer.record()
    assert err.value.exit_code == EXIT_USAGE
    assert str(err.value) == (
        "inject Denoisingstage=+10%: no stage named Denoisingstage ran; "
        "stages that ran: TextEncodingStage, DenoisingStage"
    )


def test_a_nested_stage_must_be_named_by_its_path() -> None:
    with StageTimer(inject={"VaeStage": 0.1}) as timer, stage("DecodingStage"), stage("VaeStage"):
        pass
    with pytest.raises(InjectionUnmatched, match=r"VaeStage is nested: name it DecodingStage/Vae"):
        timer.record()


def test_bad_sync_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="sync must be"):
        StageTimer(sync="always")  # type: ignore[arg-type]
