"""The relative check's rule, replayed against another revision's: the same simulated
figures judged by this tree's `judge_relative_metric` and by another checkout's, and the
differences counted (verdict, whether the figure stops, `paired.decision`, interval,
answer).

    python benchmarks/relative_rule_replay.py --other DIR [--figures 4000] [--seeds 1 2]

DIR is a checkout of the other revision (`git worktree add /tmp/old REV`). Each figure is
random: a metric, 2-24 blocks, a true log ratio of -0.2 to +0.2, a spread of 0.1-10 %,
a timer floor of 0-0.2 ms and a level of 0.05-5 %. Both sides see the same figures (one
seed each). Prints one line per seed.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def figures(seed: int, count: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        mu = rng.choice([0.0, 0.01, -0.01, 0.03, -0.03, 0.05, -0.05, 0.1, -0.1, 0.2])
        sd = rng.choice([0.001, 0.005, 0.01, 0.02, 0.05, 0.1])
        n = rng.choice([2, 3, 4, 5, 6, 8, 12, 16, 24])
        base_median = rng.choice([0.1, 0.5, 1.0, 10.0, 100.0])
        base = [base_median * math.exp(rng.gauss(0, 0.01)) for _ in range(6)]
        out.append({
            "metric": rng.choice(["e2e", "stage:DecodingStage", "step:0", "stage:Tiny"]),
            "log_ratios": [rng.gauss(mu, sd) for _ in range(n)],
            "base": base,
            "head": [b * math.exp(mu) for b in base],
            "pad": rng.choice([0.0, 0.0, 0.01, 0.05, 0.2]),
            "alpha": rng.choice([0.01, 0.00137, 0.0005, 0.05]),
            "final": rng.choice([True, False]),
        })  # fmt: skip
    return out


JUDGE = """
import json, sys
from perfguard.decision.paired import judge_relative_metric
out = []
for f in json.load(sys.stdin):
    v = judge_relative_metric(f["metric"], f["head"], f["base"], f["log_ratios"],
                              alpha=f["alpha"], final=f["final"], pad=f["pad"])
    out.append(v.to_json() | {"clear": v.clear})
json.dump(out, sys.stdout)
"""


def judged(tree: Path, todo: list[dict]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", JUDGE], input=json.dumps(todo), env=env,
                          capture_output=True, text=True, check=True, cwd=tree)  # fmt: skip
    return json.loads(proc.stdout)


def differences(
    mine: list[dict], other: list[dict]
) -> tuple[collections.Counter, collections.Counter]:
    fields: collections.Counter = collections.Counter()
    answers: collections.Counter = collections.Counter()
    for a, b in zip(other, mine, strict=True):
        for key in ("verdict", "clear", "ratio", "ratio_low"):
            fields[key] += a.get(key) != b.get(key)
        high_a, high_b = a.get("ratio_high"), b.get("ratio_high")
        fields["ratio_high"] += high_a != high_b and not (high_a and high_a > 1e9)
        fields["decision"] += (a.get("paired") or {}).get("decision") != (
            b.get("paired") or {}
        ).get("decision")
        was, now = (a.get("answer") or {}).get("answer"), (b.get("answer") or {}).get("answer")
        if was != now:
            answers[f"{was} -> {now}"] += 1
    return fields, answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, required=True, help="the other checkout")
    parser.add_argument("--figures", type=int, default=4000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args(argv)
    for seed in args.seeds:
        todo = figures(seed, args.figures)
        fields, answers = differences(judged(ROOT, todo), judged(args.other, todo))
        changed = ", ".join(f"{k} {v}" for k, v in sorted(fields.items()))
        moved = ", ".join(f"{k}: {v}" for k, v in answers.most_common()) or "none"
        print(f"seed {seed}: {args.figures} figures; differing {changed} (the last digits "
              f"of upper bounds over 1e9 not counted); answers changed: {moved}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
