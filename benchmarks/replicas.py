"""Whether builds interleaved inside one process average out what separates processes.

A fresh process's median of a stage, normalized run by run by the reference workload
(`perfguard.decision.normalize`), still moves between processes by several percent, and
no number of further runs of that process shrinks it: the offset belongs to the process
(where its tensors and code landed, which spell of the host it met). This benchmark asks
whether building the same case K times in one process, and running the K builds round
robin (build 0, 1, ..., K-1, 0, 1, ...), samples that offset within the process.

Each round starts one fresh interpreter per K in `--replicas` (the order alternating
round by round, so a slow spell of the machine hits every setting alike); each times
`--runs` runs of `DenoisingStage` in all (split evenly over its K builds, so every
setting pays the same time), with the reference before and after every run, as the
runner times it. Printed per K: the median, the sd (log scale) of the process medians
raw and normalized, and for K > 1 the sd between the builds of one process (normalized).

    python benchmarks/replicas.py --case qwen_image_t2i_smoke --rounds 12 --replicas 1 4
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys

from noise import log_sd  # benchmarks/ is this script's directory, first on sys.path


def child(case_id: str, cases: str, replicas: int, runs: int, metric: str) -> None:
    """One process: K builds, `runs` timed runs round robin; one JSON line on stdout."""
    from perfguard.device.platform import probe
    from perfguard.device.reference import Reference
    from perfguard.device.threads import apply
    from perfguard.device.timer import StageTimer
    from perfguard.storage.cases import load_registry
    from perfguard.workloads.registry import build_pipeline

    apply(1)
    platform = probe("cpu")
    (case,) = [c for c in load_registry(platform.name, cases) if c.id == case_id]
    builds = [build_pipeline(case, platform) for _ in range(replicas)]
    reference = Reference(platform)
    for pipeline in builds:
        pipeline()  # the warm-up run of each build, as the runner does
    raw: list[list[float]] = [[] for _ in builds]
    normalized: list[list[float]] = [[] for _ in builds]
    before = reference.time_ms()
    for i in range(runs):
        k = i % replicas
        with StageTimer(platform) as timer:
            builds[k]()
        after = reference.time_ms()
        value = timer.record().stages_ms[metric]
        raw[k].append(value)
        normalized[k].append(value / max(before, after))
        before = after
    print(
        json.dumps(
            {
                "raw": statistics.median(x for v in raw for x in v),
                "normalized": statistics.median(x for v in normalized for x in v),
                "builds": [statistics.median(v) for v in normalized],
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--cases", default="cases")
    ap.add_argument("--metric", default="DenoisingStage", help="A stage name.")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--runs", type=int, default=60, help="Timed runs per process.")
    ap.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.case, args.cases, args.child, args.runs, args.metric)
        return
    rows: dict[int, list[dict]] = {k: [] for k in args.replicas}
    for r in range(args.rounds):
        order = args.replicas if r % 2 == 0 else list(reversed(args.replicas))
        for k in order:
            command = [sys.executable, __file__, "--child", str(k), "--case", args.case]
            command += ["--cases", args.cases, "--runs", str(args.runs), "--metric", args.metric]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            rows[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    print(
        "| builds a process | processes | median (ms) | sd of process medians, raw "
        "| sd normalized | sd between builds of a process (normalized) |"
    )
    print("|---|---|---|---|---|---|")
    for k, got in rows.items():
        within = "-"
        if k > 1:
            pooled = statistics.mean(log_sd(g["builds"]) ** 2 for g in got)
            within = f"{math.sqrt(pooled):.1%}"
        print(
            f"| {k} | {len(got)} | {statistics.median(g['raw'] for g in got):.3f} "
            f"| {log_sd([g['raw'] for g in got]):.1%} "
            f"| {log_sd([g['normalized'] for g in got]):.1%} | {within} |"
        )


if __name__ == "__main__":
    main()
