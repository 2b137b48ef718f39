"""Another process's load on the runner while perfguard measures (Linux `/proc`).

A runner that is noisy by nature and a runner that something else is using look alike
in the timings: both spread. They differ in who uses the cores. The kernel counts every
core's busy time (`/proc/stat`) and every process's own (`/proc/<pid>/stat`), so the
CPU time used outside perfguard's own processes during a session is a subtraction:
busy time of all cores minus that of perfguard's process tree. On the project's 2-core
runner a `while True: pass` on the other core read 1.00 core, the idle runner under 0.01
(docs/measurements/2026-12-07-noisy-runner.md): unlike a timing's spread, this does not
mistake a noisy runner for a busy one.

The tree is the descendants of `LoadMeter.root`: this process, or the resident server
that forked this command (`perfguard.measurement.resident.tree_root`), whose children
the measuring processes are then. A child's CPU time reaches its parent's `cutime` when
the parent reaps it, so the processes of a session that ended count too. Elsewhere than
Linux nothing is read and the load is unknown (None).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):  # pragma: no cover
        return 100.0


def busy_cpu_s() -> float | None:
    """Seconds of CPU time every core has spent busy since boot (None: unknown)."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...: busy is all but idle and iowait;
    # steal is time another guest of the host used, which is load this runner did not get.
    values = [int(v) for v in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    return busy / _ticks()


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, seconds of CPU: own and reaped children's) of `pid`, or None."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 15:
        return None
    ppid = int(rest[1])
    utime, stime, cutime, cstime = (int(v) for v in rest[11:15])
    return ppid, (utime + stime + cutime + cstime) / _ticks()


def tree_cpu_s(root: int) -> float:
    """Seconds of CPU used by `root` and its live descendants, with what they reaped."""
    stats: dict[int, tuple[int, float]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            got = _stat(int(entry.name))
            if got is not None:
                stats[int(entry.name)] = got
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, ()))
    return total


@dataclass
class LoadMeter:
    """Cores used by other processes, on average, between `start` and `read`."""

    root: int = 0
    _wall: float = 0.0
    _busy: float | None = None
    _own: float = 0.0

    def start(self) -> LoadMeter:
        self.root = self.root or os.getpid()
        self._wall = time.monotonic()
        self._busy = busy_cpu_s()
        self._own = tree_cpu_s(self.root) if self._busy is not None else 0.0
        return self

    def read(self) -> float | None:
        """Other processes' cores since `start` (None where the kernel does not say);
        then starts again, so consecutive reads cover consecutive windows."""
        busy, wall = busy_cpu_s(), time.monotonic() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return None
        own = tree_cpu_s(self.root)
        foreign = max(0.0, (busy - self._busy) - (own - self._own)) / wall
        self._wall, self._busy, self._own = time.monotonic(), busy, own
        return round(foreign, 3)
