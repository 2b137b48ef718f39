"""Print the stage timer's overhead per enter+exit on CPU, enabled and disabled.

    python benchmarks/timer_overhead.py [--n 200000] [--repeats 7]

Each figure is the median over `--repeats` blocks of `--n` enter+exit pairs, minus the
cost of an empty loop, so it is what instrumenting one stage adds. Targets: <= 2 us
enabled, <= 0.2 us disabled (issue "Foundation").
"""

from __future__ import annotations

import argparse
import statistics
import time

from perfguard.device.timer import StageTimer, stage


def _block(n: int, body: str) -> float:
    start = time.perf_counter_ns()
    if body == "empty":
        for _ in range(n):
            pass
    elif body == "stage":
        for _ in range(n):
            with stage("DenoisingStage"):
                pass
    end = time.perf_counter_ns()
    return (end - start) / n


def measure(n: int, repeats: int, enabled: bool | None) -> float:
    """Median ns per enter+exit; `enabled=None` means no timer active at all."""
    samples = []
    for _ in range(repeats):
        empty = _block(n, "empty")
        if enabled is None:
            t = _block(n, "stage")
        else:
            with StageTimer(enabled=enabled, track_memory=False):
                t = _block(n, "stage")
        samples.append(t - empty)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    rows = [
        ("enabled (CPU, perf_counter_ns)", measure(args.n, args.repeats, True), 2000),
        ("disabled timer", measure(args.n, args.repeats, False), 200),
        ("no timer active", measure(args.n, args.repeats, None), 200),
    ]
    print(f"{'mode':34} {'ns / enter+exit':>16} {'target ns':>10}  ok")
    for name, ns, target in rows:
        print(f"{name:34} {ns:16.1f} {target:10d}  {'yes' if ns <= target else 'NO'}")


if __name__ == "__main__":
    main()
