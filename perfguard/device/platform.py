"""Which accelerator this process runs on, and how to time and measure on it.

`probe()` picks one of four platforms, in sglang's order: Ascend NPU (when `torch_npu`
imports and reports a device), ROCm (`torch.version.hip` is set), CUDA, else CPU.
`--platform` and `PERFGUARD_PLATFORM` override the choice; naming a platform that is not
available is a usage error (exit 2) rather than a silent fallback, because a baseline
measured on the wrong platform is worse than no baseline.

Each `Platform` knows how to synchronize, how to time on the device and how to read
peak memory. Device timing uses events recorded on the current stream (`mark()`), which
are resolved once at the end of a run (`elapsed_ms()` after `synchronize()`): a host
clock would measure kernel *launch* time on an asynchronous device, and a sync per stage
would serialize the host with the device and change what is measured.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import platform as _pyplatform
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from perfguard import __version__
from perfguard.device.gpu_clocks import gpu_clocks, nvidia_smi
from perfguard.device.pinning import VISIBLE_DEVICES_ENV
from perfguard.errors import PerfguardError
from perfguard.results import slugify
from perfguard.storage.cases import PLATFORM_NAMES

ENV_PLATFORM = "PERFGUARD_PLATFORM"


@dataclass
class Platform:
    """The CPU platform; the device platforms below override what differs.

    CPU timing is `time.perf_counter_ns()` (monotonic, ns resolution; CPU work is
    synchronous so the host clock is the device clock). `peak_memory_bytes()` is the
    process's peak resident set size (`VmHWM` in /proc/self/status), reset per run by
    writing `5` to /proc/self/clear_refs (Linux >= 4.0). Where that reset is not possible
    the figure is `ru_maxrss`, the peak since the process started, and
    `peak_memory_resettable` is False. It counts the whole process (interpreter, torch,
    model weights), not tensors alone, so the runner does not gate on it: the
    `peak_memory` metric on CPU is the tensor storage a run allocates, measured by
    `perfguard.measurement.memory` in a run of its own (`separate_memory_run`).
    """

    name: str = "cpu"
    notes: list[str] = field(default_factory=list)
    visible_devices_env: str = ""

    # ---- devices -------------------------------------------------------------------------
    def device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def device_name(self) -> str:
        return _cpu_model_name()

    def hardware_slug(self) -> str:
        return slugify(self.device_name())

    # ---- timing --------------------------------------------------------------------------
    def synchronize(self) -> None:
        """Nothing to wait for: CPU kernels have finished when they return."""

    def mark(self) -> Any:
        """A point in time on the device's timeline; compare two with `elapsed_ms`."""
        return time.perf_counter_ns()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return (end - start) / 1e6

    def host_ns(self) -> int:
        """The host's wall clock (ns): what the reference workload is timed with."""
        return time.perf_counter_ns()

    # ---- memory --------------------------------------------------------------------------
    def empty_cache(self) -> None:
        """Return cached allocator blocks between cases (nothing to do on CPU)."""

    @property
    def peak_memory_resettable(self) -> bool:
        return _clear_refs_works()

    @property
    def stage_memory(self) -> bool:
        """Whether peak memory per stage is cheap enough to read at every stage boundary."""
        return False

    @property
    def separate_memory_run(self) -> bool:
        """Whether peak memory comes from a tracked run of its own (`perfguard.measurement.memory`).

        True on CPU, where no allocator statistics exist and the resident set counts
        the whole process: the runner measures tensor storage in one untimed run and
        the timed runs record no memory. Device platforms read their allocator's peak
        in every timed run.
        """
        return True

    def reset_peak_memory(self) -> None:
        if _clear_refs_works():
            Path("/proc/self/clear_refs").write_text("5")

    def peak_memory_bytes(self) -> int | None:
        hwm = _proc_status_kb("VmHWM")
        if hwm is not None:
            return hwm * 1024
        try:
            import resource

            # ru_maxrss is KiB on Linux, bytes on macOS.
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return rss if sys.platform == "darwin" else rss * 1024
        except Exception:  # pragma: no cover - Windows
            return None

    # ---- environment ---------------------------------------------------------------------
    def versions(self) -> dict[str, str | None]:
        return {}


class _DeviceEventsMixin:
    """Event-based timing and allocator statistics shared by CUDA, ROCm and NPU."""

    module: Any  # torch.cuda or torch.npu
    device_type: ClassVar[str] = "cuda"  # ROCm builds of torch name HIP devices "cuda" too

    def device_count(self) -> int:
        return int(self.module.device_count())

    def device_name(self) -> str:
        """The name of the first visible device, without creating a device context.

        The parent process names the hardware (the fingerprint) before any worker starts;
        `get_device_name(current_device())` would initialise the runtime and create a
        context on device 0 that the parent then holds for the whole run, also under
        `--devices 1,2`. So the runtime is asked only once this process has initialised
        it anyway; otherwise the driver's tool answers (`_device_name_without_context`),
        and only where that fails does the runtime, at its first visible device.
        """
        module = self.module
        initialized = getattr(module, "is_initialized", None)
        if initialized is not None and initialized():
            return str(module.get_device_name(module.current_device()))
        name = self._device_name_without_context()
        return name if name else str(module.get_device_name(0))

    def _device_name_without_context(self) -> str | None:
        """The device name from outside this process's runtime (None where unknown)."""
        return None

    def device(self, index: int = 0) -> torch.device:
        return torch.device(self.device_type, index)

    def synchronize(self) -> None:
        self.module.synchronize()

    def mark(self) -> Any:
        # Recorded on the current stream: the event completes when the work queued before
        # it does, so event-to-event time is device time, not launch time.
        event = self.module.Event(enable_timing=True)
        event.record()
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    @property
    def peak_memory_resettable(self) -> bool:
        return True

    @property
    def stage_memory(self) -> bool:
        return True

    @property
    def separate_memory_run(self) -> bool:
        return False

    def reset_peak_memory(self) -> None:
        self.module.reset_peak_memory_stats()

    def empty_cache(self) -> None:
        self.module.empty_cache()

    def peak_memory_bytes(self) -> int | None:
        return int(self.module.max_memory_allocated())


@dataclass
class CudaPlatform(_DeviceEventsMixin, Platform):
    """NVIDIA GPUs through torch.cuda: CUDA events, caching-allocator peak statistics."""

    name: str = "cuda"
    visible_devices_env: str = VISIBLE_DEVICES_ENV["cuda"]

    @property
    def module(self) -> Any:
        return torch.cuda

    def versions(self) -> dict[str, str | None]:
        return {"cuda": torch.version.cuda, "driver": _nvidia_driver()}

    def _device_name_without_context(self) -> str | None:
        visible = os.environ.get(self.visible_devices_env, "").split(",")[0].strip()
        return _nvidia_smi_name(visible or "0")


@dataclass
class RocmPlatform(CudaPlatform):
    """AMD GPUs: ROCm builds of torch expose HIP through the torch.cuda API."""

    name: str = "rocm"
    visible_devices_env: str = VISIBLE_DEVICES_ENV["rocm"]

    def versions(self) -> dict[str, str | None]:
        return {"hip": getattr(torch.version, "hip", None)}

    def _device_name_without_context(self) -> str | None:
        return None  # nvidia-smi does not know HIP devices: the runtime names them


@dataclass
class NpuPlatform(_DeviceEventsMixin, Platform):
    """Ascend NPUs through torch_npu, which installs `torch.npu` mirroring torch.cuda."""

    name: str = "npu"
    visible_devices_env: str = VISIBLE_DEVICES_ENV["npu"]
    device_type: ClassVar[str] = "npu"

    @property
    def module(self) -> Any:
        return torch.npu  # type: ignore[attr-defined]

    def versions(self) -> dict[str, str | None]:
        torch_npu = sys.modules.get("torch_npu")
        cann = getattr(getattr(torch, "version", None), "cann", None)
        return {
            "torch_npu": getattr(torch_npu, "__version__", None),
            "cann": cann or _cann_version(),
        }


# ---- probe ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Availability:
    """Whether a platform can be used here, and if not, why not (kept for `perfguard env`)."""

    name: str
    available: bool
    reason: str


def _npu_available() -> Availability:
    try:
        importlib.import_module("torch_npu")
    except ImportError as exc:
        return Availability("npu", False, f"torch_npu is not installed ({exc})")
    except Exception as exc:  # a broken CANN install raises all sorts of things at import
        return Availability("npu", False, f"importing torch_npu raised {type(exc).__name__}: {exc}")
    npu = getattr(torch, "npu", None)
    if npu is None:
        return Availability("npu", False, "torch_npu imported but torch.npu is missing")
    try:
        if not npu.is_available():
            return Availability("npu", False, "torch.npu.is_available() is False")
    except Exception as exc:
        return Availability("npu", False, f"torch.npu.is_available() raised {exc}")
    return Availability("npu", True, "torch_npu imported and reports a device")


def availability() -> dict[str, Availability]:
    """Every platform with whether it is usable in this process, and why."""
    out: dict[str, Availability] = {"npu": _npu_available()}
    hip = getattr(torch.version, "hip", None)
    cuda_ok = False
    try:
        cuda_ok = bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - broken driver
        cuda_ok = False
    if hip:
        out["rocm"] = Availability(
            "rocm", cuda_ok, f"torch.version.hip={hip}" + ("" if cuda_ok else ", no device")
        )
        out["cuda"] = Availability("cuda", False, "this is a ROCm (HIP) build of torch")
    else:
        out["rocm"] = Availability("rocm", False, "torch.version.hip is not set")
        out["cuda"] = Availability("cuda", cuda_ok, "torch.cuda.is_available() is " + str(cuda_ok))
    out["cpu"] = Availability("cpu", True, "always available")
    return out


_CLASSES: dict[str, type[Platform]] = {
    "cuda": CudaPlatform,
    "rocm": RocmPlatform,
    "npu": NpuPlatform,
    "cpu": Platform,
}


def probe(requested: str | None = None) -> Platform:
    """Pick the platform: `requested`, else `$PERFGUARD_PLATFORM`, else NPU > ROCm > CUDA > CPU.

    Raises `PerfguardError` (exit 2) when the requested platform is unknown or unavailable.
    """
    requested = requested or os.environ.get(ENV_PLATFORM) or None
    avail = availability()
    notes = [f"{a.name}: {a.reason}" for a in avail.values() if not a.available]
    if requested:
        requested = requested.strip().lower()
        if requested not in _CLASSES:
            raise PerfguardError(
                f"unknown platform {requested!r}: choose one of {', '.join(PLATFORM_NAMES)}"
            )
        if not avail[requested].available:
            usable = ", ".join(n for n, a in avail.items() if a.available)
            raise PerfguardError(
                f"platform {requested!r} is not available here: {avail[requested].reason} "
                f"(available: {usable})"
            )
        return _CLASSES[requested](notes=notes)
    for name in ("npu", "rocm", "cuda", "cpu"):
        if avail[name].available:
            return _CLASSES[name](notes=notes)
    raise AssertionError("cpu is always available")  # pragma: no cover


# ---- environment fingerprint -----------------------------------------------------------------


def git_commit(path: str | os.PathLike[str] | None = None) -> str | None:
    """The commit of the repository holding `path` (default: the working directory)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=path or os.getcwd(),
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", sha) else None


def fingerprint(platform: Platform) -> dict[str, Any]:
    """What a baseline or report needs to say where its figures came from.

    Besides versions and names it records what changes timings on the same hardware,
    where this process can read it: the CPUs it may run on (affinity, not just the
    count: a container or `taskset` limit halves throughput without changing the
    model name), the CPU frequency governor and clocks, and on CUDA the GPU clocks,
    power limit and persistence mode. Each reader is cheap and never raises: what
    cannot be read is recorded with the reason, so `perfguard env` always succeeds.
    """
    affinity = cpu_affinity()
    try:
        name, count = platform.device_name(), platform.device_count()
    except Exception as exc:  # pragma: no cover - a device that vanished
        name, count = f"unknown ({exc})", 0
    return {
        "platform": platform.name,
        "hardware": platform.hardware_slug(),
        "device_name": name,
        "device_count": count,
        "torch": torch.__version__,
        "versions": dict(platform.versions()),
        "python": _pyplatform.python_version(),
        "perfguard": __version__,
        "git_commit": git_commit(),
        "hostname": socket.gethostname(),
        "os": f"{_pyplatform.system()} {_pyplatform.release()}",
        "cpu": _cpu_model_name(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_list(affinity) if affinity else None,
        "cpu_frequency": cpu_frequency(affinity),
        **({"gpu_clocks": gpu_clocks()} if platform.name == "cuda" else {}),
        "notes": list(platform.notes),
        **_measurement_settings(platform),
    }


def _measurement_settings(platform: Platform) -> dict[str, Any]:
    """The thread policy and the reference workload's version: figures need both equal."""
    from perfguard.device import reference, threads

    return {
        "threads": {
            "default_intra_op": threads.default_threads(platform.name),
            "inter_op": threads.INTEROP,
            "override": os.environ.get(threads.ENV_OVERRIDE) or None,
        },
        "reference_workload": reference.version(),
    }


# ---- what else changes timings ---------------------------------------------------------------

SYS_CPU = Path("/sys/devices/system/cpu")
"""Where Linux exposes per-CPU frequency scaling (`cpuN/cpufreq/`); a module attribute
so that tests can point it at a fake tree."""


def cpu_affinity() -> list[int]:
    """The CPUs this process may run on (`os.sched_getaffinity`), [] where unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return []


def cpu_list(cpus: list[int]) -> str:
    """`[0, 1, 2, 5]` -> `'0-2,5'`, the cpuset / taskset notation."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def _read_sys(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def cpu_frequency(cpus: list[int] | None = None) -> dict[str, Any]:
    """Frequency governor and current/min/max clocks (MHz) of `cpus` (default: all).

    Read from /sys/devices/system/cpu/cpuN/cpufreq/ (scaling_governor,
    scaling_cur_freq, scaling_min_freq, scaling_max_freq, in kHz). A `powersave` or
    `ondemand` governor, or a lowered max, makes the same code slower or noisier, so a
    baseline records them. Each figure is the range over the CPUs (`[lo, hi]`); virtual
    machines and containers often expose no cpufreq at all, which is recorded as such.
    """
    if not cpus:
        names = sorted((p.name for p in _glob(SYS_CPU, "cpu[0-9]*")), key=lambda n: int(n[3:] or 0))
        cpus = [int(n[3:]) for n in names if n[3:].isdigit()]
    governors: set[str] = set()
    figures: dict[str, list[int]] = {"cur_mhz": [], "min_mhz": [], "max_mhz": []}
    for cpu in cpus:
        base = SYS_CPU / f"cpu{cpu}" / "cpufreq"
        governor = _read_sys(base / "scaling_governor")
        if governor:
            governors.add(governor)
        for key, name in (("cur_mhz", "cur"), ("min_mhz", "min"), ("max_mhz", "max")):
            text = _read_sys(base / f"scaling_{name}_freq")
            if text and text.isdigit():
                figures[key].append(round(int(text) / 1000))
    if not governors and not any(figures.values()):
        return {"available": False, "reason": f"no cpufreq under {SYS_CPU} (VM or container?)"}
    out: dict[str, Any] = {"available": True, "governor": ",".join(sorted(governors)) or None}
    for key, values in figures.items():
        out[key] = [min(values), max(values)] if values else None
    return out


def _glob(root: Path, pattern: str) -> list[Path]:
    try:
        return list(root.glob(pattern))
    except OSError:
        return []


# ---- small readers ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _cpu_model_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return _pyplatform.processor() or _pyplatform.machine() or "cpu"


def _proc_status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


@functools.lru_cache(maxsize=1)
def _clear_refs_works() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _proc_status_kb("VmHWM") is not None


def _nvidia_driver() -> str | None:
    lines, _ = nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    return lines[0] if lines else None


def _nvidia_smi_name(device: str) -> str | None:
    """`nvidia-smi`'s name of `device` (an index or a UUID): the driver's, as torch's is."""
    lines, _ = nvidia_smi("--query-gpu=name", "--format=csv,noheader", "-i", device)
    return lines[0] if lines else None


def _cann_version() -> str | None:
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
    for rel in ("version.cfg", "ascend_toolkit_install.info"):
        path = Path(home) / rel
        with contextlib.suppress(OSError):
            match = re.search(r"version\s*[=:]\s*([\w.\-]+)", path.read_text())
            if match:
                return match.group(1)
    return None
