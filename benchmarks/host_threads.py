"""Which threads of a measured process compete with the one that measures?

Builds one case in a fresh process per setting (one intra-op thread, as the CPU gate
runs), runs it `--runs` times, and prints for every thread of the process its name, the
CPU it used (clock ticks) and how often it was preempted (involuntary context switches,
from /proc/self/task). A thread that does no work but is woken for every run costs the
measuring thread its core on a small runner. The settings compare the `tokenizers`
library's thread pool on (`TOKENIZERS_PARALLELISM=true`, the library's default) and off
(`false`, what `perfguard.device.threads.apply` sets with one intra-op thread), and the
spread of the `DenoisingStage` runs in each.

    python benchmarks/host_threads.py --case qwen_image_t2i_smoke --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys
from perfguard.device.platform import probe
from perfguard.device.threads import apply
from perfguard.device.timer import StageTimer
from perfguard.storage.cases import load_registry
from perfguard.workloads.registry import build_pipeline

def threads():
    out = {}
    for tid in os.listdir("/proc/self/task"):
        stat = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        status = open(f"/proc/self/task/{tid}/status").read().splitlines()
        inv = next(int(l.split()[1]) for l in status if l.startswith("nonvoluntary_ctxt"))
        name = open(f"/proc/self/task/{tid}/comm").read().strip()
        out[tid] = (name, int(stat[11]) + int(stat[12]), inv)
    return out

case_id, runs = sys.argv[1], int(sys.argv[2])
apply(1)
platform = probe("cpu")
(case,) = [c for c in load_registry("cpu", "cases") if c.id == case_id]
pipeline = build_pipeline(case, platform)
for _ in range(3):
    pipeline()
before, times = threads(), []
for _ in range(runs):
    with StageTimer(platform) as timer:
        pipeline()
    times.append(timer.record().stages_ms["DenoisingStage"])
after = threads()
rows = []
for t in sorted(after, key=int):
    was = before.get(t, ("", 0, 0))
    rows.append((after[t][0], after[t][1] - was[1], after[t][2] - was[2]))
print(json.dumps({"threads": rows, "denoise_ms": times}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    import statistics

    for setting in ("true", "false"):
        env = dict(os.environ, TOKENIZERS_PARALLELISM=setting, PERFGUARD_THREADS="1")
        out = subprocess.run(
            [sys.executable, "-c", CHILD, args.case, str(args.runs)],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        data = json.loads(out.stdout.strip().splitlines()[-1])
        xs = data["denoise_ms"]
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        print(
            f"TOKENIZERS_PARALLELISM={setting}: {len(data['threads'])} threads; "
            f"DenoisingStage median {statistics.median(xs):.2f} ms, "
            f"IQR/median {(q3 - q1) / statistics.median(xs):.1%} over {args.runs} runs"
        )
        for i, (name, ticks, preempted) in enumerate(data["threads"]):
            role = "main" if i == 0 else f"thread {i}"
            print(f"  {role:9s} {name:10s} cpu {ticks:4d} ticks, preempted {preempted:5d} times")


if __name__ == "__main__":
    main()
