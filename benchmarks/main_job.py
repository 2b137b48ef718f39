"""The README's main job on the runner it is given: exit codes, times, what it resolves.

Each round runs, as a user would (the console script, real timings, no --allow-busy):

1. `perfguard gen-baselines --tag smoke --baseline B` into a fresh file,
2. `perfguard check --tag smoke --baseline B` of the unchanged code (`--checks` times),
3. the same check with `--inject 'DenoisingStage=+100%'` (and `--inject-small`, e.g.
   `DenoisingStage=+12%`, when given),

and prints per round the exit codes, the seconds, the resolution the baseline recorded
for the denoising stage and e2e, the spread of its processes, and each check's first
line; then the counts over all rounds. With `--busy-core` a process spins on one core
through the whole round (contention: gen-baselines must refuse or mark it).

    python benchmarks/main_job.py --rounds 3 --checks 2 --json /tmp/main-job.json
    python benchmarks/main_job.py --rounds 1 --busy-core
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 3600: pass\n"


def run(args: list[str], env: dict[str, str]) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(["perfguard", *args], env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    first = next((ln for ln in proc.stdout.splitlines() if ln.startswith("perfguard ")), "")
    if not first:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        first = lines[-1] if lines else ""
    return proc.returncode, took, first.strip()


def spread(summary: dict[str, Any]) -> float | None:
    procs = summary.get("processes") or []
    if len(procs) < 2:
        return None
    logs = [math.log(x) for x in procs if x > 0]
    return statistics.stdev(logs)


def one_round(
    r: int, base: str, env: dict[str, str], checks: int, inject_small: str | None
) -> dict[str, Any]:
    """gen-baselines into `base`, `checks` checks of unchanged code, the injected ones."""
    row: dict[str, Any] = {"round": r}
    code, took, first = run(["gen-baselines", "--tag", "smoke", "--baseline", base], env)
    row["gen"] = {"exit": code, "s": round(took, 1), "written": Path(base).exists()}
    if not Path(base).exists():
        row["gen"]["said"] = first
        return row
    scenarios = json.loads(Path(base).read_text())["scenarios"]
    row["resolution"] = {c: s.get("resolution") for c, s in scenarios.items()}
    row["busy"] = {c: s["busy"] for c, s in scenarios.items() if s.get("busy")}
    row["spread"] = {
        c: {"e2e": spread(s["e2e"]), "DenoisingStage": spread(s["stages"]["DenoisingStage"])}
        for c, s in scenarios.items()
    }
    check = ["check", "--tag", "smoke", "--baseline", base]
    row["unchanged"] = []
    for _ in range(checks):
        code, took, first = run(check, env)
        row["unchanged"].append({"exit": code, "s": round(took, 1), "first": first})
    row["injected"] = {}
    for spec in ["DenoisingStage=+100%"] + ([inject_small] if inject_small else []):
        code, took, first = run([*check, "--inject", spec], env)
        row["injected"][spec] = {"exit": code, "s": round(took, 1), "first": first}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--checks", type=int, default=2, help="checks of unchanged code a round")
    ap.add_argument("--inject-small", default=None, metavar="STAGE=+N%")
    ap.add_argument("--busy-core", action="store_true", help="spin a process on one core")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    env = {**os.environ}
    env.pop("PERFGUARD_ALLOW_BUSY", None)
    rows: list[dict[str, Any]] = []
    spinner = None
    if args.busy_core:
        spinner = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        for r in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                row = one_round(r, str(Path(tmp) / "pg.json"), env, args.checks, args.inject_small)
            rows.append(row)
            print(json.dumps(row))
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    gens = collections.Counter(r["gen"]["exit"] for r in rows)
    same = collections.Counter(c["exit"] for r in rows for c in r.get("unchanged", []))
    inj = collections.Counter(
        (spec, v["exit"]) for r in rows for spec, v in r.get("injected", {}).items()
    )
    gen_s = [r["gen"]["s"] for r in rows]
    chk_s = [c["s"] for r in rows for c in r.get("unchanged", [])]
    print(f"gen-baselines exits {dict(gens)}, median {statistics.median(gen_s):.1f} s")
    if chk_s:
        print(
            f"check of unchanged code exits {dict(same)}, median {statistics.median(chk_s):.1f} s"
        )
    for (spec, code), n in sorted(inj.items()):
        print(f"check --inject {spec}: exit {code} x{n}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
