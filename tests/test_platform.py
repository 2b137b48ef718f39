"""The platform probe: NPU via a torch_npu import, ROCm via torch.version.hip, CPU fallback."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest
import torch

from perfguard.device import platform as pf
from perfguard.device.gpu_clocks import gpu_clocks
from perfguard.errors import PerfguardError
from perfguard.results import slugify


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
    assert slugify("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert slugify("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz") == (
        "intel-xeon-platinum-8375c-2-90ghz"
    )
    assert "/" not in slugify("a/b\\c")


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


# ---- what else changes timings -------------------------------------------------------------


def _fake_cpufreq(root: Path, cpu: int, governor: str, cur: int, lo: int, hi: int) -> None:
    d = root / f"cpu{cpu}" / "cpufreq"
    d.mkdir(parents=True)
    (d / "scaling_governor").write_text(governor + "\n")
    for name, khz in (("cur", cur), ("min", lo), ("max", hi)):
        (d / f"scaling_{name}_freq").write_text(f"{khz}\n")


def test_fingerprint_records_cpu_count_affinity_and_frequency_scaling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cpufreq(tmp_path, 0, "performance", 2_900_000, 800_000, 3_500_000)
    _fake_cpufreq(tmp_path, 1, "powersave", 1_200_000, 800_000, 3_400_000)
    _fake_cpufreq(tmp_path, 2, "powersave", 1_000_000, 800_000, 3_400_000)
    (tmp_path / "cpufreq").mkdir()  # not a CPU: ignored
    monkeypatch.setattr(pf, "SYS_CPU", tmp_path)
    monkeypatch.setattr(pf.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    fp = pf.fingerprint(pf.probe("cpu"))
    assert fp["cpu_count"] == pf.os.cpu_count()
    assert fp["cpu_affinity"] == "0-1"
    # Only the CPUs this process may run on count: cpu2's 1000 MHz is left out.
    assert fp["cpu_frequency"] == {
        "available": True,
        "governor": "performance,powersave",
        "cur_mhz": [1200, 2900],
        "min_mhz": [800, 800],
        "max_mhz": [3400, 3500],
    }
    assert "gpu_clocks" not in fp  # only CUDA platforms read GPU clocks
    assert pf.cpu_frequency()["cur_mhz"] == [1000, 2900]  # all CPUs when none are named


def test_cpu_list_uses_the_cpuset_notation() -> None:
    assert pf.cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert pf.cpu_list([3]) == "3"
    assert pf.cpu_list([]) == ""


def test_missing_cpufreq_or_affinity_is_recorded_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pf, "SYS_CPU", tmp_path / "absent")

    def no_affinity(pid: int) -> set[int]:
        raise OSError("not supported")

    monkeypatch.setattr(pf.os, "sched_getaffinity", no_affinity, raising=False)
    fp = pf.fingerprint(pf.probe("cpu"))
    assert fp["cpu_affinity"] is None
    assert fp["cpu_frequency"]["available"] is False
    assert "no cpufreq under" in fp["cpu_frequency"]["reason"]


class _FakeNvml(types.ModuleType):
    """The part of nvidia-ml-py's `pynvml` that `gpu_clocks` reads: two H200s."""

    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        return {1: 1980, 2: 3201}[kind] - 100 * h

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:
        return {1: 1980, 2: 3201}[kind]

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 700_000  # milliwatts

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return 1 - h


def test_gpu_clocks_come_from_nvml_when_it_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = _FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    clocks = gpu_clocks()
    assert clocks["available"] and clocks["source"] == "nvml"
    first, second = clocks["gpus"]
    assert first == {
        "index": 0,
        "name": "NVIDIA H200",
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 3201,
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 3201,
        "power_limit_w": 700.0,
        "persistence_mode": "Enabled",
    }
    assert second["sm_clock_mhz"] == 1880 and second["persistence_mode"] == "Disabled"
    assert second["power_limit_w"] is None  # not supported on that board: None, not a crash
    assert nvml.calls == ["init", "shutdown"]


FAKE_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu=index,name,clocks.sm*) echo "0, NVIDIA H200, 1980, 3201, 1980, 3201, 700.00, Enabled"
     echo "1, NVIDIA H200, 345, 3201, 1980, 3201, [N/A], Disabled" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def _fake_smi_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(script)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_gpu_clocks_fall_back_to_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_smi_on_path(tmp_path, monkeypatch, FAKE_SMI)
    clocks = gpu_clocks()
    assert clocks["source"] == "nvidia-smi"
    assert clocks["gpus"][0]["power_limit_w"] == 700
    assert clocks["gpus"][1] == {
        "index": 1,
        "name": "NVIDIA H200",
        "sm_clock_mhz": 345,
        "mem_clock_mhz": 3201,
        "max_sm_clock_mhz": 1980,
        "max_mem_clock_mhz": 3201,
        "power_limit_w": None,
        "persistence_mode": "Disabled",
    }


def test_gpu_clocks_unavailable_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_smi_on_path(
        tmp_path, monkeypatch, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n"
    )
    clocks = gpu_clocks()
    assert clocks == {
        "available": False,
        "reason": "pynvml (nvidia-ml-py) is not installed; nvidia-smi: NVIDIA-SMI has failed",
    }
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert "nvidia-smi: " in gpu_clocks()["reason"]  # not on PATH: recorded, not raised


def test_cuda_fingerprint_records_gpu_clocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml())
    cuda = pf.CudaPlatform()
    monkeypatch.setattr(pf.CudaPlatform, "device_name", lambda self: "NVIDIA H200")
    monkeypatch.setattr(pf.CudaPlatform, "device_count", lambda self: 2)
    monkeypatch.setattr(pf, "_nvidia_driver", lambda: "570.1")
    fp = pf.fingerprint(cuda)
    assert fp["gpu_clocks"]["source"] == "nvml" and len(fp["gpu_clocks"]["gpus"]) == 2
