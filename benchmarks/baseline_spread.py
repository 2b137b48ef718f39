"""Does a baseline measured over a longer span carry a smaller offset of its own?

A stored baseline is one short session of the runner (`gen-baselines --tag smoke`: 10
processes in ~8 s), and the offset its processes share is what fails the checks of
unchanged code against it (docs/verdicts.md). This script makes `--pairs` pairs of
baselines' worth of measurements, in a random order within each pair:

- `together`: one `perfguard run --tag smoke --processes K` (the K processes back to
  back, as `gen-baselines` measures them);
- `spread`: K separate `perfguard run --tag smoke --processes 1`, `--gap-s` apart (the
  same K processes over K x (gap + ~1 s)).

Each is reduced as a normalized baseline stores it: the median over all runs of the
stage's time over the reference workload's time beside it (`timing: normalized`), per
case. The table gives, per arm and case, the sd over the pairs of that figure's log (the
offset one baseline carries, together with its processes' own spread) and Levene's test
of the two arms' spreads (scipy.stats.levene).

    python benchmarks/baseline_spread.py --pairs 12 --processes 10 --gap-s 3
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy.stats import levene

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from perfguard.storage.reports import read_results  # noqa: E402

CASES = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")
STAGE = "stage:DenoisingStage"


def run(out: Path, processes: int) -> None:
    cmd = [sys.executable, "-m", "perfguard", "run", "--tag", "smoke", "--no-progress"]
    cmd += ["--processes", str(processes), "--out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def figure(paths: list[Path], case: str) -> float:
    """The normalized median of `case`'s stage over every run of `paths`."""
    ratios = []
    for path in paths:
        res = read_results(path).cases[case]
        ratios += [s / r for s, r in zip(res.samples[STAGE], res.reference, strict=True) if r > 0]
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--processes", type=int, default=10)
    ap.add_argument("--gap-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    figures: dict[str, dict[str, list[float]]] = {
        arm: {c: [] for c in CASES} for arm in ("together", "spread")
    }
    spans: dict[str, list[float]] = {"together": [], "spread": []}
    os.environ.setdefault("PERFGUARD_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            arms = ["together", "spread"]
            rng.shuffle(arms)
            for arm in arms:
                t0 = time.perf_counter()
                if arm == "together":
                    paths = [Path(tmp, f"t{pair}.json")]
                    run(paths[0], args.processes)
                else:
                    paths = []
                    for k in range(args.processes):
                        if k:
                            time.sleep(args.gap_s)
                        paths.append(Path(tmp, f"s{pair}-{k}.json"))
                        run(paths[-1], 1)
                spans[arm].append(time.perf_counter() - t0)
                for case in CASES:
                    figures[arm][case].append(figure(paths, case))
            print(
                f"pair {pair + 1}/{args.pairs}: "
                + "  ".join(
                    f"{arm} {case.split('_')[0]} {figures[arm][case][-1]:.3f}"
                    for arm in ("together", "spread")
                    for case in CASES
                ),
                flush=True,
            )
    print(
        f"\n{args.pairs} pairs, {args.processes} processes each; median span: together "
        f"{statistics.median(spans['together']):.1f} s, spread "
        f"{statistics.median(spans['spread']):.1f} s (gap {args.gap_s:g} s)"
    )
    print("| case | arm | median stage / reference | sd over baselines (log) | Levene p |")
    print("|---|---|---|---|---|")
    for case in CASES:
        logs = {arm: [math.log(x) for x in figures[arm][case]] for arm in figures}
        p = levene(logs["together"], logs["spread"]).pvalue
        for arm in ("together", "spread"):
            print(
                f"| {case} | {arm} | {statistics.median(figures[arm][case]):.3f} "
                f"| {statistics.stdev(logs[arm]):.2%} | {p:.3f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
