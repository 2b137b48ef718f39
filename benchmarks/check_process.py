"""Does a check's own process read like the baseline's workers?

A stored check measures each case first in the command's own process (a fork of the
resident server that has parsed the command line and loaded the baseline, then counts the
build's work in one untimed run before it times), while `gen-baselines` measures in forked
worker processes of which only the first `COUNTED_PROCESSES` count. If either difference
moves the timings, unchanged code reads off its baseline by that much, and every verdict
inherits the bias: a check that reads 5 % fast needs a 10 % slowdown to see 5 %.

Each round runs, in a random order, `perfguard run --tag smoke` (the cases in the
command's process, as a check's first measurement) and `perfguard run --tag smoke
--processes 6` (forked workers, as `gen-baselines`), both with `--repeats R` so the
per-process medians are steady. For every case it prints, over the rounds, the median
and quartiles of the in-process median over the workers' pooled median (what a baseline
stores), raw and run by run normalized by the reference workload, the same for the
counted workers (the first two) over the uncounted ones (the other four), and how a
process's first 5 runs (what a baseline worker times by default) read against all of
its runs (a check's first measurement takes up to 20), in each kind of process.

    python benchmarks/check_process.py --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from perfguard.decision.normalize import divided  # noqa: E402
from perfguard.measurement.options import COUNTED_PROCESSES  # noqa: E402

STAGE = "stage:DenoisingStage"


def run(out: Path, extra: list[str], repeats: int) -> dict:
    cmd = [sys.executable, "-m", "perfguard", "run", "--tag", "smoke", "--repeats"]
    cmd += [str(repeats), "--no-progress", "--out", str(out), *extra]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, env=dict(os.environ))
    return json.loads(out.read_text())["cases"]


def pooled(case: dict, metric: str, which: slice) -> tuple[float, float]:
    """(raw, normalized) median of the runs of the processes `which`, pooled."""
    xs, ref = case["samples"][metric], case["reference"]
    groups = case.get("groups") or [len(xs)]
    starts = [sum(groups[:k]) for k in range(len(groups))]
    keep = [j for k in range(len(groups))[which] for j in range(starts[k], starts[k] + groups[k])]
    raw = [xs[j] for j in keep]
    return statistics.median(raw), statistics.median(divided(raw, [ref[j] for j in keep]) or [0])


def early(case: dict, metric: str, k: int) -> list[float]:
    """Each process's normalized median of its first `k` runs over that of all its runs."""
    xs, ref = case["samples"][metric], case["reference"]
    out, i = [], 0
    for g in case.get("groups") or [len(xs)]:
        norm = divided(xs[i : i + g], ref[i : i + g]) or []
        if g > k:
            out.append(statistics.median(norm[:k]) / statistics.median(norm))
        i += g
    return out


def quartiles(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"{q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--metric", default=STAGE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="Write every round's figures here.")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows: dict[str, dict[str, list[float]]] = {}
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            arms = ["inproc", "workers"]
            rng.shuffle(arms)
            got = {}
            for arm in arms:
                extra = ["--processes", "6"] if arm == "workers" else []
                got[arm] = run(Path(tmp) / f"{arm}.json", extra, args.repeats)
            rounds.append({"order": arms, **got})
            for cid in got["inproc"]:
                inproc = pooled(got["inproc"][cid], args.metric, slice(None))
                base = pooled(got["workers"][cid], args.metric, slice(None))
                counted = pooled(got["workers"][cid], args.metric, slice(0, COUNTED_PROCESSES))
                rest = pooled(got["workers"][cid], args.metric, slice(COUNTED_PROCESSES, None))
                ref_in = statistics.median(got["inproc"][cid]["reference"])
                ref_w = statistics.median(got["workers"][cid]["reference"])
                r = rows.setdefault(cid, {})
                r.setdefault("in/workers raw", []).append(inproc[0] / base[0])
                r.setdefault("in/workers normalized", []).append(inproc[1] / base[1])
                r.setdefault("reference in/workers", []).append(ref_in / ref_w)
                r.setdefault("counted/uncounted raw", []).append(counted[0] / rest[0])
                r.setdefault("counted/uncounted normalized", []).append(counted[1] / rest[1])
                for arm in ("inproc", "workers"):
                    r.setdefault(f"first 5 runs / all ({arm}, normalized)", []).extend(
                        early(got[arm][cid], args.metric, 5)
                    )
            print(f"round {n + 1}/{args.rounds} ({' then '.join(arms)})", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(rounds))
    print(f"{args.metric}, {args.rounds} rounds, {args.repeats} runs a process; median [quartiles]")
    print("| case | figure | ratio over rounds |")
    print("|---|---|---|")
    for cid, r in sorted(rows.items()):
        for name, xs in r.items():
            print(f"| {cid} | {name} | {quartiles(xs)} |")


if __name__ == "__main__":
    main()
