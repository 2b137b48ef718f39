"""What a worker forked from a shared server costs against one from a full server.

The relative check forks both sides' workers from one server that imports no perfguard
module (`perfguard.measurement.launch.SharedFork`), so each worker imports its side's
perfguard after the fork. This starts both kinds of server for one case and forks
workers from them in turn (alternating which goes first), and prints the median seconds
from the fork request to the worker's ready message, and of one measurement (build,
warm-up and `--repeats` runs):

    python benchmarks/fork_start.py --workers 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfguard.device.platform import probe
from perfguard.measurement.launch import SharedFork, import_root
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.workers import (
    WarmServer,
    Worker,
    _env_for,
    preload_modules,
)
from perfguard.storage.cases import load_registry
from perfguard.workloads.modules import shared_preload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--workers", type=int, default=12, help="Workers of each kind.")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    platform = probe("cpu")
    (case,) = [c for c in load_registry("cpu", "cases") if c.id == args.case]
    env = _env_for(platform, None, 1, threads=1)
    names = preload_modules([case])
    servers = {
        "full": WarmServer(env, "full server", preload=names, root=import_root()),
        "shared": WarmServer(
            env, "shared server", preload=shared_preload(names), root=import_root()
        ),
    }
    try:
        for server in servers.values():
            why = server.start(300)
            if why:
                raise SystemExit(why)
        options = MeasureOptions(repeats=args.repeats, threads=1, progress=False)
        rows: dict[str, list[tuple[float, float]]] = {k: [] for k in servers}
        for i in range(args.workers):
            for kind in list(servers) if i % 2 == 0 else list(servers)[::-1]:
                server = servers[kind]
                channel = server if kind == "full" else SharedFork(server, env, None, import_root())
                t0 = time.perf_counter()
                worker = Worker(env, f"{kind} worker", server=channel)
                why = worker.start()
                if why:
                    raise SystemExit(why)
                t1 = time.perf_counter()
                res = worker.run(case, options, platform.name)
                rows[kind].append((t1 - t0, time.perf_counter() - t1))
                worker.close()
                if res.status != "ok":
                    raise SystemExit(res.error)
    finally:
        for server in servers.values():
            server.close()
    print(f"{args.case}: {args.workers} workers of each kind, alternating, {args.repeats} runs")
    print("| server | fork to ready (median s) | one measurement (median s) |")
    print("|---|---|---|")
    for kind, v in rows.items():
        ready = statistics.median(a for a, _ in v)
        run = statistics.median(b for _, b in v)
        print(f"| {kind} | {ready:.3f} | {run:.3f} |")


if __name__ == "__main__":
    main()
