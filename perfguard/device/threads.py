"""The thread policy: how many host threads torch may use while a case is measured.

Why fixed and recorded: torch's default intra-op pool has one thread per core. On the
2-vCPU CI runner two threads made the `DenoisingStage` median of the same code move by
8.7 % (sd) between fresh processes, in episodes where some processes land in a slow
mode (8.4 ms against 6.8 ms), while one thread moved it by 2.2 % at the same speed: at
these sizes the second thread buys nothing and costs the precision. A figure measured
with another thread count is another figure, so the count is part of every result and
baseline, and comparing across counts is an error rather than a silent comparison.

Why one thread on CPU: the CPU cases exist to gate code paths, not to benchmark the
host's BLAS; one thread is what makes their medians reproducible, and a second process
spinning on the other core then changes nothing. On CUDA, ROCm and NPU the device does
the work and the host threads only run tokenizers, schedulers and launches: they are
fixed too (`DEVICE_DEFAULT`), so that a runner with more cores does not move the
figures, and recorded like on the CPU. A case may set `threads` to measure another count.

Why the tokenizers' pool goes too, at one thread: the Rust `tokenizers` library keeps a
pool of one thread per core and wakes it for every prompt it encodes. In a measured
qwen smoke process those two threads used 0-1 clock ticks over 20 runs but were
preempted 1,426 and 1,435 times (`python benchmarks/host_threads.py`, since retired:
docs/measurements/retired-benchmarks.md): wake-ups that cost
the measured thread its core on a 2-vCPU runner, at a price that moves with the host.
With one intra-op thread `TOKENIZERS_PARALLELISM` is set to `false` (unless the caller
set it), which the library reads at every call. The detection benchmark with and
without it is in docs/measurements/2026-12-02-normalized.md.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

CPU_DEFAULT = 1
DEVICE_DEFAULT = 4
INTEROP = 1
"""Inter-op threads: perfguard's pipelines run one graph at a time, so a pool of one."""

TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
"""The `tokenizers` library's switch for its thread pool (set off with one thread)."""

ENV_OVERRIDE = "PERFGUARD_THREADS"
"""Overrides every case's `threads` (what `--threads` sets): to measure another count."""

"""Set for worker processes so that the pools are sized before torch starts them."""


def default_threads(platform: str) -> int:
    """The intra-op thread count of a case that does not set `threads`."""
    return CPU_DEFAULT if platform == "cpu" else DEVICE_DEFAULT


def case_threads(case: Any, platform: str, override: int | None = None) -> int:
    """`override` (`MeasureOptions.threads`, `--threads`), else `$PERFGUARD_THREADS`, else
    `case.threads`, else the platform's default."""
    if override is not None:
        return int(override)
    env = os.environ.get(ENV_OVERRIDE)
    if env:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value < 1:
            from perfguard.errors import PerfguardError

            raise PerfguardError(f"{ENV_OVERRIDE}: {env!r} is not an integer >= 1")
        return value
    value = getattr(case, "threads", None)
    return int(value) if value is not None else default_threads(platform)


@dataclass(frozen=True)
class ThreadState:
    """The counts torch reports after `apply`: what the measurement actually used."""

    intra_op: int
    inter_op: int

    def to_json(self) -> dict[str, int]:
        return {"intra_op": self.intra_op, "inter_op": self.inter_op}


def apply(threads: int) -> ThreadState:
    """Set torch's intra-op pool to `threads` (and inter-op to `INTEROP` while allowed).

    torch lets the inter-op pool be sized only before its first parallel work; later
    calls raise, and the pool keeps its size, which is then what is recorded.
    """
    import torch

    if threads < 1:
        raise ValueError(f"threads must be >= 1, not {threads}")
    if threads == 1:
        os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != INTEROP:
        with contextlib.suppress(RuntimeError):
            torch.set_num_interop_threads(INTEROP)
    return current()


def current() -> ThreadState:
    import torch

    return ThreadState(torch.get_num_threads(), torch.get_num_interop_threads())
