"""What the NVIDIA driver reports about its GPUs: clocks, power limit, persistence mode.

Locked or lowered clocks, a reduced power limit or persistence mode off (the driver
re-initialises between processes) all change timings on the same GPU model, so a
fingerprint on CUDA records them. They are read through NVML (`nvidia-ml-py`'s `pynvml`)
when it imports, else through `nvidia-smi`; what cannot be read is recorded with the
reason, never raised.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

NVIDIA_SMI_QUERY = (
    "index,name,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,persistence_mode"
)
_GPU_FIELDS = (
    "index",
    "name",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "max_sm_clock_mhz",
    "max_mem_clock_mhz",
    "power_limit_w",
    "persistence_mode",
)


def gpu_clocks() -> dict[str, Any]:
    """Per-GPU clocks (current and max, SM and memory), power limit and persistence mode.

    Locked or lowered clocks, a reduced power limit or persistence mode off (the driver
    re-initialises between processes) all change timings on the same GPU model. Read
    through NVML (`nvidia-ml-py`'s `pynvml`) when it imports, else through
    `nvidia-smi --query-gpu` when it is on PATH; otherwise recorded as unavailable with
    the reason. NVML lists every GPU of the machine, not only the visible ones.
    """
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        nvml_reason = "pynvml (nvidia-ml-py) is not installed"
    except Exception as exc:  # a broken install: fall through to nvidia-smi
        nvml_reason = f"importing pynvml raised {type(exc).__name__}: {exc}"
    else:
        try:
            return {"available": True, "source": "nvml", "gpus": _nvml_gpus(pynvml)}
        except Exception as exc:
            nvml_reason = f"NVML: {type(exc).__name__}: {exc}"
    lines, why = nvidia_smi(f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits")
    if lines is None:
        return {"available": False, "reason": f"{nvml_reason}; nvidia-smi: {why}"}
    return {"available": True, "source": "nvidia-smi", "gpus": [_smi_row(line) for line in lines]}


def nvidia_smi(*args: str, timeout: float = 10) -> tuple[list[str] | None, str]:
    """The non-empty output lines of `nvidia-smi ARGS`, or None and the reason it failed.

    One place for the queries of the fingerprint, the device name and the self-check:
    a missing binary, a hang (`timeout`) or a non-zero exit is a reason, never an error.
    """
    try:
        out = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return None, str(exc)
    if out.returncode != 0:
        why = (out.stderr or out.stdout).strip().splitlines()[:1] or [f"exit {out.returncode}"]
        return None, why[0][:200]
    return [line.strip() for line in out.stdout.splitlines() if line.strip()], ""


def _number(text: str) -> int | float | None:
    try:
        value = float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"
    return int(value) if value.is_integer() else value


def _smi_row(line: str) -> dict[str, Any]:
    cells = [c.strip() for c in line.split(",")]
    row: dict[str, Any] = dict(zip(_GPU_FIELDS, cells, strict=False))
    for key in _GPU_FIELDS[2:7]:
        if key in row:
            row[key] = _number(row[key])
    if "index" in row:
        row["index"] = _number(row["index"])
    return row


def _nvml_gpus(nvml: Any) -> list[dict[str, Any]]:
    nvml.nvmlInit()
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            name = nvml.nvmlDeviceGetName(h)

            def read(fn: str, *args: Any, handle: Any = h) -> Any:
                try:
                    return getattr(nvml, fn)(handle, *args)
                except Exception:  # NVML_ERROR_NOT_SUPPORTED on some boards
                    return None

            limit = read("nvmlDeviceGetPowerManagementLimit")
            persistence = read("nvmlDeviceGetPersistenceMode")
            gpus.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "sm_clock_mhz": read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM),
                    "mem_clock_mhz": read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM),
                    "max_sm_clock_mhz": read("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM),
                    "max_mem_clock_mhz": read("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_MEM),
                    "power_limit_w": None if limit is None else limit / 1000,
                    "persistence_mode": None
                    if persistence is None
                    else ("Enabled" if persistence else "Disabled"),
                }
            )
        return gpus
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()
