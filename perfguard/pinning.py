"""Which variable pins a platform's devices, and what a worker does before importing torch.

This module imports neither torch nor anything that does. A worker (`perfguard._worker`)
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
