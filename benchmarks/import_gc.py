"""What the warm servers' collector settings save: imports with the collector off, and a
fork's `gc.collect()` after `gc.freeze()` (`perfguard/measurement/forkserver.py`).

Each round imports every workload's modules and the command line (what the resident
server preloads) in a fresh interpreter, once with the collector on and once off, in
alternating order; then, in one interpreter that imported them, times `gc.collect()` in a
fork before and after `gc.freeze()`. Medians over the rounds, with the range.

    python benchmarks/import_gc.py --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

IMPORT = """
import gc, importlib, sys, time
if sys.argv[1] == "off":
    gc.disable()
t0 = time.perf_counter()
from perfguard.measurement.resident import preload_modules
for name in preload_modules():
    try:
        importlib.import_module(name.lstrip("?"))
    except ImportError:
        pass
print(time.perf_counter() - t0)
"""

COLLECT = IMPORT.replace(
    "print(time.perf_counter() - t0)",
    """
import os
for label in ("before", "after"):
    if label == "after":
        gc.freeze()
    pid = os.fork()
    if pid == 0:
        t = time.perf_counter(); gc.collect(); print(label, time.perf_counter() - t, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
""",
)


def run(code: str, arg: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True)
    out.check_returncode()
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    imports: dict[str, list[float]] = {"on": [], "off": []}
    collect: dict[str, list[float]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for setting in ("on", "off") if r % 2 == 0 else ("off", "on"):
            imports[setting].append(float(run(IMPORT, setting).split()[-1]))
        for line in run(COLLECT, "off").splitlines():
            label, _, value = line.rpartition(" ")
            collect[label].append(float(value))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)

    def cell(xs: list[float], unit: float = 1.0, fmt: str = ".2f") -> str:
        lo, mid, hi = (f"{v * unit:{fmt}}" for v in (min(xs), statistics.median(xs), max(xs)))
        return f"{mid} ({lo}-{hi})"

    print(f"{args.rounds} rounds, medians (min-max)")
    print(f"imports, collector on:  {cell(imports['on'])} s")
    print(f"imports, collector off: {cell(imports['off'])} s")
    for label, xs in collect.items():
        print(f"gc.collect() in a fork, {label} gc.freeze(): {cell(xs, 1e3, '.1f')} ms")


if __name__ == "__main__":
    main()
