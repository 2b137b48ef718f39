"""What one `gen-baselines` command adds to the spread of its processes.

A stored baseline is one `perfguard gen-baselines` command: the spread of its processes
is what the verdict's interval knows of its error. Whatever all of a command's processes
share (the runner's moment, the server they fork from, its string-hash seed and layout)
no interval sees, and every check against that baseline inherits it. This runs
`gen-baselines --tag smoke` `--rounds` times per arm, the arms in a random order in each
round, and treats each baseline's processes as a group: a one-way random-effects analysis
of variance over the baselines (`noise.one_way`) gives, per case and metric, the sd
within a baseline, the sd a command adds (its session), F and p. A normalized baseline
stores its figures at the runner speed of its own reference median, so every figure is
divided by that median first: baselines compare in one unit, the reference's time
(left in milliseconds, the spread between baselines is the runner's, not the command's:
4-9 % where these figures read 0.4-2 %). It also prints the sd of
the baselines' figures against what their processes alone predict (`within / sqrt(K)`),
and the correlation of consecutive baselines of an arm (a moment of the runner that
outlasts one command shows as a positive lag-1 correlation).

Arms:

- `warm`: every command forks from one resident server that lives for the whole run
  (what `benchmarks/detection.py` measures);
- `cold`: `PERFGUARD_SERVER_IDLE_S=0`, so each command imports its own modules and forks
  its processes from a server of its own, as in a CI job;
- `cold-hash0`: `cold` with `PYTHONHASHSEED=0` for every command and its server.

    python benchmarks/sessions.py --rounds 12 --arms warm cold cold-hash0
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from noise import one_way

CASES = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")
METRICS = ("stage:DenoisingStage", "e2e", "step_avg")
ARMS = ("warm", "cold", "cold-hash0")


def process_medians(scenario: dict, metric: str) -> list[float]:
    """The per-process medians a baseline stores for `metric`."""
    if metric.startswith("stage:"):
        entry = scenario["stages"][metric.removeprefix("stage:")]
    else:
        entry = scenario[metric]
    return [float(x) for x in entry["processes"]]


def gen_baseline(arm: str, path: Path, processes: int, server_dir: str) -> float:
    env = dict(os.environ, PERFGUARD_THREADS="1", PERFGUARD_SERVER_DIR=server_dir)
    if arm.startswith("cold"):
        env["PERFGUARD_SERVER_IDLE_S"] = "0"
    if arm == "cold-hash0":
        env["PYTHONHASHSEED"] = "0"
    cmd = [sys.executable, "-m", "perfguard", "gen-baselines", "--tag", "smoke"]
    cmd += ["--baseline", str(path), "--processes", str(processes), "--no-progress"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def lag1(xs: list[float]) -> float:
    """Lag-1 autocorrelation of a series (0 for fewer than three points)."""
    if len(xs) < 3:
        return 0.0
    m = statistics.fmean(xs)
    den = sum((x - m) ** 2 for x in xs)
    return sum((a - m) * (b - m) for a, b in itertools.pairwise(xs)) / den if den else 0.0


def report(groups: dict[str, dict[tuple[str, str], list[list[float]]]]) -> None:
    print(
        "| arm | case | metric | baselines | sd within a baseline | sd a command adds | F | p "
        "| sd of baseline means | predicted by its processes | lag-1 correlation |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arm, by_metric in groups.items():
        for (case, metric), gs in by_metric.items():
            logs = [[math.log(x) for x in g] for g in gs]
            if len(logs) < 2:
                continue
            within, between, f, p = one_way(logs)
            means = [statistics.fmean(g) for g in logs]
            k = statistics.fmean(len(g) for g in logs)
            print(
                f"| {arm} | {case.split('_')[0]} | {metric} | {len(logs)} | {within:.2%} "
                f"| {between:.2%} | {f:.2f} | {p:.3f} | {statistics.stdev(means):.2%} "
                f"| {within / math.sqrt(k):.2%} | {lag1(means):+.2f} |"
            )


def report_reference(baselines: list[dict]) -> None:
    """Does the reference still explain a baseline's level once divided by it?

    Over the baselines of an arm, the log-log slope of (figure / reference median) on the
    reference median: 0 when dividing by the reference tracks the runner, positive when the
    figure moves more than the reference does (a division by reference**(1 + slope) would
    then remove the sd in the last column).
    """
    print()
    print(
        "| arm | case | metric | baselines | slope on log reference | sd of baseline means "
        "| after the slope |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm in dict.fromkeys(b["arm"] for b in baselines):
        bs = [b for b in baselines if b["arm"] == arm]
        for key in bs[0]["medians"]:
            case = key.split("|")[0]
            x = [math.log(reference_median(b, case)) for b in bs]
            y = [
                statistics.fmean(math.log(v) for v in b["medians"][key]) - xi
                for b, xi in zip(bs, x, strict=True)
            ]
            if len(bs) < 3 or statistics.pvariance(x) == 0:
                continue
            slope, intercept = statistics.linear_regression(x, y)
            resid = [yi - intercept - slope * xi for xi, yi in zip(x, y, strict=True)]
            after = math.sqrt(sum(r * r for r in resid) / (len(bs) - 2))
            print(
                f"| {arm} | {case.split('_')[0]} | {key.split('|')[1]} | {len(bs)} | {slope:+.2f} "
                f"| {statistics.stdev(y):.2%} | {after:.2%} |"
            )


def reference_median(baseline: dict, case: str) -> float:
    """The reference median a baseline's figures are at the runner speed of."""
    return statistics.median(baseline["reference"][case])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--arms", nargs="+", default=list(ARMS[:2]), choices=ARMS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="Write every baseline's process medians here.")
    ap.add_argument("--replay", default=None, help="Print the tables of a --json file and exit.")
    args = ap.parse_args(argv)
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        if not all("reference" in b for b in data["baselines"]):
            ap.error(f"{args.replay}: a baseline has no reference samples (an older file)")
        report(_groups(data["baselines"]))
        report_reference(data["baselines"])
        return 0
    if args.rounds < 2:
        ap.error("--rounds must be at least 2: one baseline an arm has no spread between")
    rng = random.Random(args.seed)
    baselines: list[dict] = []
    walls: dict[str, list[float]] = {a: [] for a in args.arms}
    with tempfile.TemporaryDirectory(prefix="pgs", dir="/tmp") as tmp:
        try:
            for r in range(args.rounds):
                order = list(args.arms)
                rng.shuffle(order)
                for arm in order:
                    path = Path(tmp, f"{arm}-{r}.json")
                    walls[arm].append(gen_baseline(arm, path, args.processes, tmp))
                    scenarios = json.loads(path.read_text())["scenarios"]
                    baselines.append(
                        {
                            "arm": arm,
                            "round": r,
                            "medians": {
                                f"{c}|{m}": process_medians(scenarios[c], m)
                                for c in CASES
                                for m in METRICS
                            },
                            "reference": {
                                c: [float(x) for x in scenarios[c]["reference"]["samples"]]
                                for c in CASES
                            },
                        }
                    )
                print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        finally:
            from perfguard.measurement.resident import ENV_DIR, stop_all

            stop_all({ENV_DIR: tmp})
    print(
        f"{args.rounds} rounds, {args.processes} processes a baseline; median gen-baselines "
        + ", ".join(f"{a} {statistics.median(w):.1f} s" for a, w in walls.items())
    )
    report(_groups(baselines))
    report_reference(baselines)
    if args.json:
        Path(args.json).write_text(json.dumps({"baselines": baselines}, indent=1))
    return 0


def _groups(baselines: list[dict]) -> dict[str, dict[tuple[str, str], list[list[float]]]]:
    """Per arm and (case, metric), each baseline's process medians over its reference median.

    A normalized baseline stores its figures at the runner speed of its own reference
    median, so two baselines' figures compare only in one unit: the reference's time.
    """
    out: dict[str, dict[tuple[str, str], list[list[float]]]] = {}
    for b in baselines:
        for key, medians in b["medians"].items():
            case, metric = key.split("|")
            ref = reference_median(b, case)
            out.setdefault(b["arm"], {}).setdefault((case, metric), []).append(
                [x / ref for x in medians]
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
