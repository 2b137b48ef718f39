"""Which variable pins a platform's devices, and what a worker does before importing torch.

This module imports neither torch nor anything that does. A worker (`perfguard.measurement.worker`)
must narrow the visible-devices variable before the first `import torch`: the device
runtime reads it once, when it starts, and since torch 2.5 `import torch` can also
auto-import a device backend (`torch_npu` through the `torch.backends` entry points) that
reads it at import. Everything a worker needs before that point lives here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

VISIBLE_DEVICES_ENV = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
    "npu": "ASCEND_RT_VISIBLE_DEVICES",
    "cpu": "",
}


def visible_devices_env(platform_name: str) -> str:
    """The variable that pins devices on `platform_name` ('' on CPU: nothing to pin)."""
    return VISIBLE_DEVICES_ENV.get(platform_name, "")


def narrow_visible_devices(platform_name: str, local_rank: int) -> None:
    """Leave this rank only its own device, which it then sees as device 0."""
    var = visible_devices_env(platform_name)
    if not var:
        return
    listed = [d for d in os.environ.get(var, "").split(",") if d.strip()]
    os.environ[var] = listed[local_rank] if local_rank < len(listed) else str(local_rank)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere).

    A worker or rank must not outlive the perfguard (or torchrun) that started it: an
    orphan would hold its device and disturb every later measurement on it.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


ENV_CPU_AFFINITY = "PERFGUARD_CPU_AFFINITY"
"""The cores a CPU worker pins itself to (cpuset notation, `0-1,4`), set by the parent."""


def parse_cpu_list(text: str) -> list[int]:
    """`'0-2,5'` -> `[0, 1, 2, 5]` (the inverse of `perfguard.device.platform.cpu_list`)."""
    cores: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        cores.extend(range(int(lo), int(hi or lo) + 1))
    return cores


def pin_cores() -> list[int] | None:
    """Pin this process to the cores the parent chose (`$PERFGUARD_CPU_AFFINITY`).

    Done first, before anything imports torch, so that every thread torch starts
    (OpenMP, intra- and inter-op pools) inherits the mask; the cores it ended on are
    reported back to the parent with `ready`.
    """
    text = os.environ.get(ENV_CPU_AFFINITY)
    if not text or not hasattr(os, "sched_setaffinity"):
        return None
    os.sched_setaffinity(0, parse_cpu_list(text))
    return sorted(os.sched_getaffinity(0))
