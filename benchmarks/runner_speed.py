"""Does the pipeline slow down as much as the reference workload says the runner did?

The verdict divides a metric's median by the runner's speed (the reference workload's
median now over at baseline time, `perfguard.decision.contention`) before it calls a
slowdown a regression. That is right only if the pipelines slow down with the reference,
one for one. This script measures it: in one process (one intra-op thread, as the CPU
gate runs), it builds the smoke cases and times the reference workload before and after
every run, exactly as the runner does, under several loads made by neighbour processes:

- `quiet`: no neighbour (the machine's other users still run: say so when you quote it);
- `one-busy`: one process spinning in Python on the other core;
- `two-busy`: two spinning processes (both cores of a 2-core runner busy);
- `one-stream`: one process copying 64 MB tensors (memory bandwidth and cache, like a
  neighbour's test suite or build).

The loads are interleaved round by round (each round runs every load in a rotated order)
so that a slow spell of the machine hits all of them. Per load it prints the median
reference and pipeline figures as ratios to `quiet`, their elasticity (log of the
pipeline's ratio over log of the reference's: 1 means the adjustment is exact, below 1
means dividing by the reference over-corrects and excuses real slowdowns), and for the
quiet rounds how far a round's reference speed strays from the quiet median (what the
speed estimate itself carries as noise).

    python benchmarks/runner_speed.py --rounds 6 --runs 10
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import time
from typing import Any

LOADS = ("quiet", "one-busy", "two-busy", "one-stream")


def _spin(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def _stream(stop: Any) -> None:
    import torch

    torch.set_num_threads(1)
    a = torch.ones(16 * 1024 * 1024)  # 64 MB
    b = torch.empty_like(a)
    while not stop.is_set():
        b.copy_(a)
        a.copy_(b)


def _neighbours(load: str) -> tuple[Any, list[Any]]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    target, n = {
        "quiet": (None, 0),
        "one-busy": (_spin, 1),
        "two-busy": (_spin, 2),
        "one-stream": (_stream, 1),
    }[load]
    procs = [ctx.Process(target=target, args=(stop,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return stop, procs


def _measure(pipes: dict[str, Any], yardstick: Any, platform: Any, runs: int) -> dict[str, Any]:
    from perfguard.device.timer import StageTimer

    out: dict[str, Any] = {"reference": []}
    for _ in range(runs):
        for cid, pipe in pipes.items():
            before = yardstick.time_ms()
            with StageTimer(platform, track_memory=False) as timer:
                pipe()
            after = yardstick.time_ms()
            rec = timer.record()
            out["reference"].append(max(before, after))
            out.setdefault(f"{cid} e2e", []).append(rec.e2e_ms)
            out.setdefault(f"{cid} DenoisingStage", []).append(rec.stages_ms["DenoisingStage"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--runs", type=int, default=10, help="runs of each case per load and round")
    ap.add_argument("--cases", nargs="+", default=["qwen_image_t2i_smoke", "glm_image_t2i_smoke"])
    ap.add_argument("--loads", nargs="+", default=list(LOADS), choices=LOADS)
    args = ap.parse_args()

    from perfguard.device import threads
    from perfguard.device.platform import probe
    from perfguard.device.reference import Reference
    from perfguard.measurement.runner import _default_factory
    from perfguard.storage.cases import load_registry, select

    platform = probe("cpu")
    threads.apply(1)
    cases = select(load_registry("cpu"), args.cases)
    pipes = {c.id: _default_factory(c, platform) for c in cases}
    yardstick = Reference(platform)
    for pipe in pipes.values():  # warm-up
        pipe()
        pipe()

    per_round: dict[str, list[dict[str, float]]] = {load: [] for load in args.loads}
    pooled: dict[str, dict[str, list[float]]] = {load: {} for load in args.loads}
    t0 = time.time()
    for r in range(args.rounds):
        k = r % len(args.loads)
        for load in args.loads[k:] + args.loads[:k]:
            stop, procs = _neighbours(load)
            time.sleep(1.0)  # let the neighbours start spinning
            try:
                got = _measure(pipes, yardstick, platform, args.runs)
            finally:
                stop.set()
                for p in procs:
                    p.join(5)
            per_round[load].append({k: statistics.median(v) for k, v in got.items()})
            for key, values in got.items():
                pooled[load].setdefault(key, []).extend(values)
    quiet = {k: statistics.median(v) for k, v in pooled.get("quiet", {}).items()}
    print(
        f"{args.rounds} rounds x {len(args.loads)} loads x {args.runs} runs of "
        f"{', '.join(args.cases)}; one intra-op thread; {time.time() - t0:.0f} s"
    )
    keys = list(next(iter(pooled.values())))
    print()
    print("| load | " + " | ".join(f"{k} / quiet" for k in keys) + " | elasticity (per metric) |")
    print("|---|" + "---:|" * len(keys) + "---|")
    for load in args.loads:
        med = {k: statistics.median(v) for k, v in pooled[load].items()}
        ratios = {k: med[k] / quiet[k] for k in keys}
        ref = ratios["reference"]
        elastic = [
            f"{k.split()[0][:4]} {k.split()[1][:4]} {math.log(ratios[k]) / math.log(ref):.2f}"
            for k in keys
            if k != "reference" and abs(math.log(ref)) > 0.01
        ]
        print(
            f"| {load} | "
            + " | ".join(f"{ratios[k]:.3f}" for k in keys)
            + f" | {', '.join(elastic) or '- (reference within 1 %)'} |"
        )
    if per_round.get("quiet"):
        print()
        print("quiet rounds, each round's median over the quiet median (the speed noise):")
        for key in keys:
            vals = [row[key] / quiet[key] for row in per_round["quiet"]]
            print(f"  {key:>32}: " + " ".join(f"{v:.3f}" for v in vals))
        ref_q = [row["reference"] / quiet["reference"] for row in per_round["quiet"]]
        print(f"  reference round speeds: min {min(ref_q):.3f}, max {max(ref_q):.3f}")
    print()
    print(
        "fit over rounds of log(metric / quiet) on log(reference / quiet): the slope (1: the "
        "metric moves with the reference) and the sd of log(metric / reference), what a "
        "division by the runner's speed leaves as error:"
    )
    rounds = {"all rounds": [row for load in args.loads for row in per_round[load]]}
    if per_round.get("quiet"):
        rounds["quiet rounds"] = per_round["quiet"]
    for label, sel in rounds.items():
        x = [math.log(row["reference"] / quiet["reference"]) for row in sel]
        cells = []
        for key in keys:
            if key == "reference":
                continue
            y = [math.log(row[key] / quiet[key]) for row in sel]
            mx, my = statistics.mean(x), statistics.mean(y)
            sxx = sum((a - mx) ** 2 for a in x)
            slope = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sxx if sxx else 0
            resid = statistics.stdev([b - a for a, b in zip(x, y, strict=True)])
            cells.append(f"{key}: slope {slope:.2f}, sd {resid:.1%}")
        print(f"  {label} ({len(sel)}): " + "; ".join(cells))
    print()
    print("per round and load (speed = reference / quiet reference; metric / quiet metric):")
    for load in args.loads:
        for i, row in enumerate(per_round[load]):
            cells = " ".join(
                f"{k.split()[0][:4]}/{k.split()[-1][:4]} {row[k] / quiet[k]:.3f}" for k in keys
            )
            print(f"  {load:>10} round {i}: {cells}")


if __name__ == "__main__":
    main()
