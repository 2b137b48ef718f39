"""Where the noise comes from: between-process spread of a stage, raw and normalized.

Runs `perfguard run` for one case in fresh processes, the settings interleaved round by
round (so a slow spell of the machine hits every setting alike), and prints for each
setting: the stage's median, the sd of the per-process medians (log scale, ~relative),
the within-process IQR/median, and the same spread of the stage divided by the
reference workload timed beside it (`perfguard.measurement.reference`).

    python benchmarks/noise.py --case qwen_image_t2i_smoke --processes 16 --threads 1 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_process(case: str, repeats: int, threads: int, out: Path, extra: list[str]) -> dict:
    env = dict(os.environ, PERFGUARD_THREADS=str(threads))
    cmd = [
        sys.executable,
        "-m",
        "perfguard",
        "run",
        "--case",
        case,
        "--repeats",
        str(repeats),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["cases"][case]


def log_sd(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--metric", default="stage:DenoisingStage")
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", default=None, help="Write the per-process figures here.")
    args = ap.parse_args()
    rows: dict[int, list[tuple[float, float, float]]] = {t: [] for t in args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            order = args.threads if i % 2 == 0 else list(reversed(args.threads))
            for t in order:
                res = one_process(args.case, args.repeats, t, Path(tmp) / "r.json", [])
                xs = res["samples"][args.metric]
                ref = res["reference"]
                q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
                med = statistics.median(xs)
                rows[t].append((med, statistics.median(ref), (q3 - q1) / med))
    print(
        f"{args.case} {args.metric}: {args.processes} fresh processes per setting, "
        f"{args.repeats} runs each, interleaved"
    )
    print(
        "| threads | median (ms) | sd of process medians | range (ms) | within IQR/median "
        "| reference median (ms) | sd of reference | sd of stage/reference |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for t, vals in rows.items():
        meds = [v[0] for v in vals]
        refs = [v[1] for v in vals]
        norm = [m / r for m, r in zip(meds, refs, strict=True)]
        print(
            f"| {t} | {statistics.median(meds):.3f} | {log_sd(meds):.1%} | "
            f"{min(meds):.2f}-{max(meds):.2f} | {statistics.median(v[2] for v in vals):.1%} | "
            f"{statistics.median(refs):.3f} | {log_sd(refs):.1%} | {log_sd(norm):.1%} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=1))


if __name__ == "__main__":
    main()
