"""How long the gate makes a PR wait: the README's main job and the relative check, timed.

For each revision (a checkout; `python -m perfguard` run with it as the working
directory, so that its own perfguard is the one imported), each round times, of
unchanged code:

- `gen-baselines --tag smoke` into a fresh baseline file, with no resident server
  running (each round has a server directory of its own: the first command starts the
  server and pays the imports, as on a fresh CI machine),
- `check --tag smoke` against it,
- `check --tag smoke` again (`check again`: what a developer's next check waits),
- with `--against`, `check --tag smoke --against DIR` with the revision as its own base.

A revision without a resident server (`PERFGUARD_SERVER_IDLE_S` unknown to it) imports
in every command, as it always did. The round's servers are stopped at its end.

The revisions alternate round by round (ABBA), so a slow spell of a shared machine hits
both alike; the figures are medians over the rounds, with the exit codes seen.

    python benchmarks/gate_time.py --rounds 3 --revision new=. --revision old=/work/main
    python benchmarks/gate_time.py --rounds 1 --revision new=. --against
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if proc.returncode not in (0, 1, 4):
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        print(f"{' '.join(cmd[3:5])} in {cwd}: exit {proc.returncode}: {tail}", file=sys.stderr)
    return took, proc.returncode


def stop_servers(directory: Path) -> None:
    """End the resident servers a round started (`perfguard server stop` of its directory)."""
    from perfguard.measurement.resident import ENV_DIR, stop_all

    stop_all({ENV_DIR: str(directory)})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--revision", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", action="store_true", help="Also time check --against.")
    ap.add_argument("--tag", default="smoke")
    args = ap.parse_args()
    revisions = [(n, Path(d).resolve()) for n, _, d in (r.partition("=") for r in args.revision)]
    # A timing benchmark times the commands, not the baseline's quality: a busy session
    # is stored (revisions before the busy-session rule ignore the variable).
    env = dict(
        os.environ, PERFGUARD_THREADS="1", PERFGUARD_SERVER_IDLE_S="600", PERFGUARD_ALLOW_BUSY="1"
    )
    env.pop("PERFGUARD_INJECT", None)
    env.pop("PERFGUARD_SERVER", None)
    figures: dict[str, dict[str, list[tuple[float, int]]]] = {n: {} for n, _ in revisions}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = revisions if r % 2 == 0 else revisions[::-1]
            for name, root in order:
                base = Path(tmp, f"{name}-{r}.json")
                servers = Path(tempfile.mkdtemp(prefix="pgs", dir="/tmp"))
                servers.chmod(0o700)
                run_env = {**env, "PERFGUARD_SERVER_DIR": str(servers)}
                py = [sys.executable, "-m", "perfguard"]
                sel = ["--tag", args.tag, "--no-progress"]
                steps = {
                    "gen-baselines": [*py, "gen-baselines", *sel, "--baseline", str(base)],
                    "check": [*py, "check", *sel, "--baseline", str(base)],
                    "check again": [*py, "check", *sel, "--baseline", str(base)],
                }
                if args.against:
                    # `compare` since the commands were split; `check --against` before.
                    split = '"compare"' in (root / "perfguard/cli/check.py").read_text()
                    relative = ["compare"] if split else ["check"]
                    steps["check --against"] = [*py, *relative, *sel, "--against", str(root)]
                try:
                    for step, cmd in steps.items():
                        figures[name].setdefault(step, []).append(timed(cmd, root, run_env))
                finally:
                    stop_servers(servers)
                print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    steps = list(next(iter(figures.values())))
    print(f"{args.rounds} round(s), revisions interleaved; medians in seconds (range; exit codes)")
    print("| revision | " + " | ".join(steps) + " | gen-baselines + check |")
    print("|---|" + "---|" * (len(steps) + 1))
    for name, per in figures.items():
        cells = []
        for step in steps:
            xs = per[step]
            codes = ",".join(str(c) for _, c in xs)
            lo, hi = min(t for t, _ in xs), max(t for t, _ in xs)
            cells.append(f"{statistics.median(t for t, _ in xs):.1f} ({lo:.1f}-{hi:.1f}; {codes})")
        both = [a[0] + b[0] for a, b in zip(per["gen-baselines"], per["check"], strict=True)]
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(both):.1f} |")


if __name__ == "__main__":
    main()
