"""Print what CPU memory tracking costs: a tracked run against a plain one, per case.

    python benchmarks/memory_overhead.py [--case ID ...] [--pairs 15] [--threads 1]

Each case's pipeline is built once and warmed up, then plain runs and runs under
`perfguard.measurement.memory.TensorMemory` alternate (ABBA order, so a drift in machine load lands
on both alike). Printed per case: the median plain and tracked run, their ratio, the
aten ops a run dispatches and the tracker's cost per op, the peak it measured (and
whether every tracked run measured the same), and what the runner's one tracked run
adds to a case. The resident-set figure the tracker replaces is printed beside it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import StageTimer
from perfguard.measurement.ab import abba_order
from perfguard.measurement.memory import TensorMemory, measure_run
from perfguard.storage.cases import load_registry
from perfguard.workloads.registry import build_pipeline

SMOKE = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", default=None, help="case id (default: smoke)")
    ap.add_argument("--pairs", type=int, default=15, help="ABBA pairs of plain/tracked runs")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cases = {c.id: c for c in load_registry("cpu")}
    cpu = Platform()
    print(
        f"{'case':22} {'plain ms':>9} {'tracked ms':>11} {'ratio':>6} {'ops':>6} "
        f"{'us/op':>6} {'peak MB':>8} {'same':>5} {'RSS peak MB':>12}"
    )
    for cid in args.case or SMOKE:
        pipe = build_pipeline(cases[cid], cpu)
        pipe()
        times: dict[str, list[float]] = {"A": [], "B": []}
        peaks: set[int] = set()
        ops = 0
        for variant in abba_order(args.pairs):
            t0 = time.perf_counter()
            if variant == "A":
                pipe()
            else:
                with TensorMemory() as mem:
                    pipe()
                peaks.add(mem.peak_bytes)
                ops = mem.ops
            times[variant].append((time.perf_counter() - t0) * 1e3)
        plain, tracked = statistics.median(times["A"]), statistics.median(times["B"])
        with StageTimer(cpu) as timer:  # what the runner recorded before: the whole process
            pipe()
        rss = timer.record().peak_memory_mb or float("nan")
        peak = measure_run(pipe, cpu).peak_mb
        print(
            f"{cid:22} {plain:9.2f} {tracked:11.2f} {tracked / plain:6.2f} {ops:6d} "
            f"{(tracked - plain) * 1e3 / ops:6.1f} {peak:8.3f} "
            f"{'yes' if len(peaks) == 1 else 'NO':>5} {rss:12.1f}"
        )
    print(
        f"{args.pairs} ABBA pairs per case, {args.threads} thread(s); the runner makes one "
        "tracked run per pipeline build, so a case pays about one 'tracked ms' once"
    )


if __name__ == "__main__":
    main()
