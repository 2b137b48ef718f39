"""benchmarks/gpu_selfcheck.py: it runs on CPU (device rows skipped with their reasons), and
each row that can be driven by a fake device passes on a faithful fake and fails on a
broken one (events that disagree with the host clock, a sync per event, a host path that
syncs, an allocation in the wrong stage, an optimization that is slower).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from perfguard.device import platform as pf
from perfguard.device.timer import MB, stage
from perfguard.workloads import qwen_image
from tests.fake_pipeline import SteppedClock
from tests.helpers import HostAllocator

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "gpu_selfcheck", REPO / "benchmarks/gpu_selfcheck.py"
)
assert _spec is not None and _spec.loader is not None
sc = importlib.util.module_from_spec(_spec)
sys.modules["gpu_selfcheck"] = sc
_spec.loader.exec_module(sc)


# ---- fakes ------------------------------------------------------------------------------------


class FakeCuda:
    """A torch.cuda whose clock moves only when a kernel runs (`_sleep`: 1 cycle = 1 ns).

    `skew` scales what events report against the host clock; `sync_on_record` makes every
    event record a synchronizing call (as the sync debug mode would report it);
    `record_cost_ns` is host time spent per record.
    """

    def __init__(
        self, skew: float = 1.0, sync_on_record: bool = False, record_cost_ns: int = 0
    ) -> None:
        self.ns = 0
        self.skew = skew
        self.sync_on_record = sync_on_record
        self.record_cost_ns = record_cost_ns
        self.mode = "default"
        self.initialized = False

    # clocks and kernels
    def host_ns(self) -> int:
        return self.ns

    def _sleep(self, cycles: int) -> None:
        self.ns += int(cycles)

    def synchronize(self) -> None:
        pass

    def set_sync_debug_mode(self, mode: str) -> None:
        self.mode = mode

    def Event(self, enable_timing: bool = True) -> _FakeEvent:  # torch's name
        return _FakeEvent(self)

    # allocator and devices
    def max_memory_allocated(self) -> int:
        return 0

    def reset_peak_memory_stats(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        return 0

    def get_device_name(self, index: int = 0) -> str:
        return "NVIDIA H200"

    def device_count(self) -> int:
        return 1


class _FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda
        self.t = 0.0

    def record(self) -> None:
        if self.cuda.sync_on_record and self.cuda.mode == "warn":
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
        self.t = self.cuda.ns * self.cuda.skew
        self.cuda.ns += self.cuda.record_cost_ns

    def elapsed_time(self, other: _FakeEvent) -> float:
        return (other.t - self.t) / 1e6


def _fake_env(cuda: FakeCuda, **kw: Any) -> Any:
    class Plat(pf.CudaPlatform):
        @property
        def module(self) -> FakeCuda:
            return cuda

    return sc.Env(
        platform=Plat(),
        quick=True,
        cuda=cuda,
        host_ns=cuda.host_ns,
        count_syncs=sc.count_syncs_with(cuda),
        **kw,
    )


_BOOL_INDEXED = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default}
_SYNCING = {
    torch.ops.aten.nonzero.default,
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.is_nonzero.default,
}


class _WouldSync(TorchDispatchMode):
    """Counts the CPU ops that synchronize with the host on a device: a data-dependent
    size (`nonzero`, boolean indexing, `masked_select`) or a scalar read (`.item()`)."""

    count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        bool_indexed = func in _BOOL_INDEXED and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]
        )
        if func in _SYNCING or bool_indexed:
            self.count += 1
        return func(*args, **(kwargs or {}))


def would_sync(fn: Any) -> int:
    with _WouldSync() as mode:
        fn()
    return mode.count


def host_reads(fn: Any) -> int:
    """A cheaper counter for whole pipeline runs (a dispatch mode costs ~1 ms an op): the
    Python calls that read device data on the host, `nonzero`, `item` and `tolist`."""
    count = [0]
    names = ("nonzero", "item", "tolist")
    originals = {name: getattr(torch.Tensor, name) for name in names}

    def counted(original: Any) -> Any:
        def call(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return original(self, *args, **kwargs)

        return call

    try:
        for name, original in originals.items():
            setattr(torch.Tensor, name, counted(original))
        fn()
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    return count[0]


def _cpu_env(**kw: Any) -> Any:
    plat = pf.Platform()
    kw.setdefault("count_syncs", host_reads)
    return sc.Env(
        platform=plat,
        quick=True,
        # Shorter prompts (still unequal) keep the CPU runs of the real model fast.
        cases=[
            dataclasses.replace(c, prompt_lengths=tuple(max(1, n // 6) for n in c.prompt_lengths))
            for c in sc.load_registry("cuda", REPO / "cases")
        ],
        preset="tiny",
        size=64,
        **kw,
    )


# ---- the whole script on CPU -------------------------------------------------------------------


def test_quick_run_on_cpu_writes_one_row_per_check(tmp_path: Path) -> None:
    out = tmp_path / "sc.json"
    assert sc.main(["--quick", "--platform", "cpu", "--out", str(out), "--no-install"]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == sc.KIND and doc["quick"] is True
    assert [r["id"] for r in doc["rows"]] == [i for i, _, _ in sc.CHECKS]
    for row in doc["rows"]:
        assert row["status"] in (sc.PASSED, sc.SKIPPED), row
        assert row["reason"]
    skipped = {r["id"]: r["reason"] for r in doc["rows"] if r["status"] == sc.SKIPPED}
    assert "needs a CUDA device; this run is on cpu" in skipped["1"]
    assert "per stage" in skipped["5"]
    assert doc["summary"][sc.FAILED] == 0


def test_unknown_row_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sc.json"
    assert sc.main(["--rows", "1,99", "--out", str(out)]) == 2
    assert "unknown row '99'" in capsys.readouterr().err
    assert not out.exists()


def test_a_crashing_check_is_a_failed_row_not_a_crashed_run() -> None:
    def boom(env: Any) -> Any:
        raise RuntimeError("device fell off the bus")

    row = sc.run_check(_cpu_env(), "x", "crash", boom)
    assert row.status == sc.FAILED and "device fell off the bus" in row.reason


def test_odd_figures_still_make_strict_json(tmp_path: Path) -> None:
    row = sc.Row("x", "odd", sc.FAILED, "r", {"sd": float("inf"), "dtype": torch.bfloat16})
    row.figures["n"] = np.float64(2.5)
    assert row.to_json()["figures"] == {"sd": "inf", "dtype": "torch.bfloat16", "n": 2.5}
    sc.write_json_atomic(tmp_path / "x.json", sc.document(_cpu_env(), [row], {}, 1.0))


# ---- row 0: the parent's device context ----------------------------------------------------------


def test_row0_fails_when_the_parent_initialised_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "_nvidia_smi_name", lambda dev: "NVIDIA H200")
    env = _fake_env(FakeCuda())
    env.context_at_start = {"initialized": False, "pids": [1]}
    assert sc.check_context(env)[0] == sc.PASSED
    env.context_at_start = {"initialized": True, "pids": [1]}
    assert sc.check_context(env)[0] == sc.FAILED
    monkeypatch.setattr(pf, "_nvidia_smi_name", lambda dev: "NVIDIA H100 80GB HBM3")
    env.context_at_start = {"initialized": False, "pids": []}
    assert sc.check_context(env)[0] == sc.FAILED  # the names (hence the slug) disagree


# ---- row 1: timer correctness ----------------------------------------------------------------


def test_row1_passes_when_events_match_the_host_clock() -> None:
    status, reason, figures = sc.check_timer(_fake_env(FakeCuda()))
    assert status == sc.PASSED, reason
    assert figures["syncs_per_stage"] == 0 and figures["host_ms"] == pytest.approx(20.0, 0.01)


def test_row1_fails_when_events_disagree_with_the_host_clock() -> None:
    status, reason, figures = sc.check_timer(_fake_env(FakeCuda(skew=1.05)))
    assert status == sc.FAILED and "5.00%" in reason
    assert figures["relative_error"]["DenoisingStage"] == pytest.approx(0.05, abs=1e-3)


def test_row1_fails_when_events_sync() -> None:
    status, _, figures = sc.check_timer(_fake_env(FakeCuda(sync_on_record=True)))
    assert status == sc.FAILED and figures["syncs_per_stage"] == 3.0  # 6 records, 2 stages


# ---- row 2: syncs per step --------------------------------------------------------------------


def test_row2a_passes_on_the_real_model_with_a_sync_counter() -> None:
    status, reason, figures = sc.check_varlen_syncs(_cpu_env())
    assert status == sc.PASSED, reason
    assert figures["syncs_per_step_on"] == 0 and figures["syncs_per_step_off"] >= 1


def test_row2a_fails_when_the_host_path_syncs(monkeypatch: pytest.MonkeyPatch) -> None:
    real = qwen_image.build_varlen_mask_meta_from_ranges

    def syncing(*args: Any, **kwargs: Any) -> Any:
        torch.ones(2).nonzero()  # a device->host wait slipped into the host path
        return real(*args, **kwargs)

    monkeypatch.setattr(qwen_image, "build_varlen_mask_meta_from_ranges", syncing)
    status, reason, _ = sc.check_varlen_syncs(_cpu_env())
    assert status == sc.FAILED and "expected 0 syncs" in reason


def test_row2b_reports_the_inplace_drop_and_fails_if_masked_fill_syncs() -> None:
    env = _cpu_env(prior_shape=(1, 64, 32), count_syncs=would_sync)
    status, reason, figures = sc.check_prior_drop_syncs(env)
    assert status == sc.PASSED, reason
    assert figures["x[drop] *= 0.0"]["syncs"] >= 1 and figures["masked_fill"]["syncs"] == 0
    env.count_syncs = lambda fn: (fn(), 1)[1]  # a device on which every op waits
    assert sc.check_prior_drop_syncs(env)[0] == sc.FAILED


def test_row2c_counts_modulation_cache_hits_and_fails_without_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, reason, figures = sc.check_modulation_hits(_cpu_env())
    assert status == sc.PASSED, reason
    assert figures["hits_on"] == figures["expected_hits"] == 3 * 2  # 3 steps x 2 tiny blocks
    monkeypatch.setattr(qwen_image, "_modulation_cache_allowed", lambda: False)
    status, _, figures = sc.check_modulation_hits(_cpu_env())
    assert status == sc.FAILED and figures["hits_on"] == 0


# ---- row 3: perfguard ab ----------------------------------------------------------------------


def _ab_env(optimized_factor: float) -> Any:
    plat = SteppedClock(noise=0.02)

    def factory(case: Any, platform: Any) -> Any:
        on = any(case.toggle(t) for t in sc.AB_CASES if t in case.toggles)
        factor = optimized_factor if on else 1.0

        def pipeline() -> torch.Tensor:
            with stage("DenoisingStage"):
                plat.work(4.0 * factor)
            with stage("DecodingStage"):
                plat.work(2.0 * factor)
            return torch.zeros(1)

        return pipeline

    env = _cpu_env(factory=factory)
    env.platform = plat
    env.quick = False
    return env


def test_row3_reports_each_optimizations_ratio_and_fails_on_a_slowdown() -> None:
    status, reason, figures = sc.check_ab(_ab_env(0.8))
    assert status == sc.PASSED, reason
    assert set(figures) == {f"{t}@tiny" for t in sc.AB_CASES}
    e2e = figures["qwen_modulation_cache@tiny"]["e2e"]
    assert e2e["ratio"] == pytest.approx(0.8, abs=0.05) and e2e["bounds"][1] < 1
    status, reason, _ = sc.check_ab(_ab_env(1.3))
    assert status == sc.FAILED and "the optimization is slower" in reason


# ---- row 5: per-stage peaks -------------------------------------------------------------------


class FakeAllocator(HostAllocator):
    """A device allocator on the host: `hold(n)` returns a block freed when dropped."""

    def hold(self, n: int) -> Any:
        alloc = self

        class Block:
            def __init__(self) -> None:
                alloc.allocate(n)

            def __del__(self) -> None:
                alloc.release(n)

        return Block()


class FakePipe:
    def __init__(self, alloc: FakeAllocator, decode_in: str) -> None:
        self.alloc = alloc
        self.decode_in = decode_in

    def __call__(self) -> None:
        with stage("DenoisingStage"):
            latents = self.alloc.hold(100 * MB)
            if self.decode_in == "DenoisingStage":
                self.decode()
            del latents
        with stage("DecodingStage"):
            if self.decode_in == "DecodingStage":
                self.decode()

    def decode(self) -> None:
        image = self.alloc.hold(10 * MB)
        del image


def _peak_env(decode_in: str) -> Any:
    alloc = FakeAllocator()
    env = _cpu_env(factory=lambda case, plat: FakePipe(alloc, decode_in), allocate=alloc.hold)
    env.platform = alloc
    return env


def test_row5_sees_the_extra_64_mib_in_its_stage_only() -> None:
    status, reason, figures = sc.check_stage_peaks(_peak_env("DecodingStage"))
    assert status == sc.PASSED, reason
    assert figures["delta_mb"] == {"DenoisingStage": 0.0, "DecodingStage": 64.0}
    assert "peak_memory:DecodingStage" in figures["metric_names"]


def test_row5_fails_when_the_extra_lands_in_another_stage() -> None:
    status, _, figures = sc.check_stage_peaks(_peak_env("DenoisingStage"))
    assert status == sc.FAILED
    assert figures["delta_mb"]["DenoisingStage"] == 64.0


# ---- row 8: timer overhead --------------------------------------------------------------------


def test_row8_measures_per_pair_cost_and_fails_above_the_limit() -> None:
    status, reason, figures = sc.check_overhead(_fake_env(FakeCuda()))
    assert status == sc.PASSED, reason
    status, reason, figures = sc.check_overhead(_fake_env(FakeCuda(record_cost_ns=20_000)))
    assert status == sc.FAILED and figures["ns_with_stage_peaks"] == pytest.approx(40_000, 0.01)


# ---- rows that need the real runtime ------------------------------------------------------------


@pytest.mark.parametrize("row", ["4", "6", "7", "9", "10", "11", "12", "13"])
def test_device_only_rows_skip_with_a_reason_on_cpu(row: str) -> None:
    (fn,) = [f for i, _, f in sc.CHECKS if i == row]
    result = sc.run_check(_cpu_env(), row, "x", fn)
    assert result.status == sc.SKIPPED and "CUDA" in result.reason
