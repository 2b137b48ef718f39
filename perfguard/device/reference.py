"""The reference workload: a fixed yardstick timed beside every case, to see the runner.

A case's figures move for two reasons: the code changed, or the machine did (another
job on the runner, a slower host of the same pool, a frequency cap). The reference
workload separates the two. It is small (~1.5 ms on one CPU thread, ~3 MB of weights),
deterministic, and a mix of what the pipelines spend their time on: matmuls and
attention through torch's dispatcher, elementwise ops and normalizations on small
tensors, and a Python loop that calls them one by one (on a shared runner the
interpreter and the dispatcher slow down as much as the kernels). The runner times it
right before and right after every measured run of a case, in the same process and
thread setting, so both see the same machine at the same time.

Its median is stored in the baseline. When a check finds it much slower than at
baseline time, the runner itself is slower, and the gate waits and measures again
instead of calling the code slower (`perfguard.decision.gate`); the verdict `contended` (exit 4)
says that it stayed so. `VERSION` changes whenever the workload does (it is a hash of
this function's source), and a baseline made with another version is not compared.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any


def _workload(device: Any) -> Callable[[], Any]:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(1234)
    # ~3 MB of weights, like the tiny DiTs: a yardstick that fits in L1/L2 would not see
    # a neighbour that thrashes the shared cache, which slows the pipelines most.
    x0 = torch.randn(32, 384, generator=gen).to(device)
    w1 = (torch.randn(384, 1024, generator=gen) / 20).to(device)
    w2 = (torch.randn(1024, 384, generator=gen) / 32).to(device)

    def run() -> Any:
        x = x0
        for _ in range(3):
            h = torch.nn.functional.layer_norm(x, (384,))
            a = torch.softmax(h @ h.T / 19.6, dim=-1) @ h
            x = x + torch.nn.functional.gelu(a @ w1) @ w2
            for _ in range(8):  # small ops, one by one: interpreter and dispatcher time
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x

    return run


@functools.cache
def version() -> str:
    """A short hash of the workload's source: equal figures need equal workloads."""
    return hashlib.sha256(inspect.getsource(_workload).encode()).hexdigest()[:12]


class Reference:
    """The workload built for one device; `time_ms()` runs it once and returns the time.

    Device-correct: it synchronizes before and after (a few microseconds, beside a
    ~1 ms workload), because the figure must be wall time that the host observes.
    """

    def __init__(self, platform: Any) -> None:
        self._platform = platform
        self._run = _workload(platform.device())
        self._run()  # first-call costs (allocation, dispatch caches) are not the machine's
        platform.synchronize()

    def time_ms(self) -> float:
        clock = self._platform.host_ns
        self._platform.synchronize()
        t0 = clock()
        self._run()
        self._platform.synchronize()
        return (clock() - t0) / 1e6
