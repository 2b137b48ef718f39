"""The platform probe: NPU via a torch_npu import, ROCm via torch.version.hip, CPU fallback."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from perfguard import platform as pf
from perfguard.errors import PerfguardError


class _FakeEvent:
    clock = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = None

    def record(self) -> None:
        _FakeEvent.clock += 1.5
        self.t = _FakeEvent.clock

    def elapsed_time(self, other: _FakeEvent) -> float:
        return other.t - self.t


def _fake_npu_module() -> types.SimpleNamespace:
    state = {"peak": 3 * 1024 * 1024, "syncs": 0}
    return types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 8,
        current_device=lambda: 0,
        get_device_name=lambda i=0: "Ascend910B3",
        synchronize=lambda: state.__setitem__("syncs", state["syncs"] + 1),
        Event=_FakeEvent,
        max_memory_allocated=lambda: state["peak"],
        reset_peak_memory_stats=lambda: state.__setitem__("peak", 0),
        state=state,
    )


@pytest.fixture
def fake_npu(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    module = types.ModuleType("torch_npu")
    module.__version__ = "2.6.0.post1"
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    npu = _fake_npu_module()
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    return npu


def test_fake_torch_npu_makes_the_probe_pick_npu(fake_npu: types.SimpleNamespace) -> None:
    plat = pf.probe()
    assert plat.name == "npu"
    assert plat.device_count() == 8
    assert plat.hardware_slug() == "ascend910b3"
    assert plat.visible_devices_env == "ASCEND_RT_VISIBLE_DEVICES"
    assert plat.versions()["torch_npu"] == "2.6.0.post1"
    start, end = plat.mark(), plat.mark()
    assert plat.elapsed_ms(start, end) == pytest.approx(1.5)
    plat.synchronize()
    assert fake_npu.state["syncs"] == 1
    assert plat.peak_memory_bytes() == 3 * 1024 * 1024
    plat.reset_peak_memory()  # the allocator's own reset, per stage (stage_memory)
    assert plat.peak_memory_bytes() == 0 and plat.stage_memory and plat.peak_memory_resettable


def test_torch_npu_that_raises_at_import_falls_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    real_import = importlib.import_module

    def broken(name: str, *args: object) -> object:
        if name == "torch_npu":
            raise RuntimeError("libascendcl.so: cannot open shared object file")
        return real_import(name, *args)

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(pf.importlib, "import_module", broken)
    avail = pf.availability()["npu"]
    assert not avail.available
    assert "RuntimeError" in avail.reason and "libascendcl" in avail.reason
    plat = pf.probe()
    assert plat.name == "cpu"
    assert any("libascendcl" in note for note in plat.notes)


def test_missing_torch_npu_is_not_npu() -> None:
    avail = pf.availability()["npu"]
    if "torch_npu" in sys.modules:  # pragma: no cover - a machine with a real NPU stack
        pytest.skip("torch_npu is installed")
    assert not avail.available and "not installed" in avail.reason


def test_hip_version_gives_rocm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI300X")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plat = pf.probe()
    assert plat.name == "rocm"
    assert plat.device(1) == torch.device("cuda", 1)  # HIP devices are "cuda" in torch
    assert plat.hardware_slug() == "amd-instinct-mi300x"
    assert plat.visible_devices_env == "HIP_VISIBLE_DEVICES"
    assert not pf.availability()["cuda"].available


def test_cuda_is_picked_when_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    plat = pf.probe()
    assert plat.name == "cuda" and plat.hardware_slug() == "nvidia-h200"
    assert plat.device(1) == torch.device("cuda", 1)


def test_cpu_is_the_fallback_and_always_available() -> None:
    if torch.cuda.is_available():  # pragma: no cover
        pytest.skip("a GPU is present")
    plat = pf.probe()
    assert plat.name == "cpu"
    assert plat.hardware_slug()
    assert pf.probe("cpu").name == "cpu"


def test_requesting_an_unavailable_platform_is_a_usage_error() -> None:
    if torch.cuda.is_available():  # pragma: no cover
        pytest.skip("a GPU is present")
    with pytest.raises(PerfguardError, match="'cuda' is not available") as info:
        pf.probe("cuda")
    assert info.value.exit_code == 2


def test_environment_variable_overrides_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFGUARD_PLATFORM", "npu")
    with pytest.raises(PerfguardError, match="'npu' is not available"):
        pf.probe()
    monkeypatch.setenv("PERFGUARD_PLATFORM", "tpu")
    with pytest.raises(PerfguardError, match="unknown platform 'tpu'"):
        pf.probe()


def test_slugify_makes_file_name_safe_hardware_ids() -> None:
    assert pf.slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert pf.slugify("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz") == (
        "intel-xeon-platinum-8375c-2-90ghz"
    )
    assert "/" not in pf.slugify("a/b\\c")


def test_fingerprint_names_where_figures_came_from() -> None:
    fp = pf.fingerprint(pf.probe("cpu"))
    for key in ("platform", "hardware", "device_name", "torch", "python", "perfguard", "hostname"):
        assert fp[key]
    assert fp["platform"] == "cpu"


def test_cpu_peak_memory_is_a_process_measure_that_resets() -> None:
    plat = pf.Platform()
    plat.reset_peak_memory()
    before = plat.peak_memory_bytes()
    blob = bytearray(64 * 1024 * 1024)
    blob[::4096] = b"x" * len(blob[::4096])  # touch every page so it becomes resident
    after = plat.peak_memory_bytes()
    del blob
    assert before is not None and after is not None
    assert after - before >= 48 * 1024 * 1024
