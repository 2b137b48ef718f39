"""Many runners adding reports to one archive at once: stored, lost, duplicated, wall, errors.

8 processes each add 50 reports of their own, one `add` (one transaction) per report, and
10 reports of their neighbour as well (the same report from two runners must be stored
once), all at once, into a PostgreSQL archive (a real server started here with initdb +
pg_ctl, as the tests do: tests/pg_server.py) and into an SQLite file. Reports are real
report files made by the library (judge + build + write_report).

    python benchmarks/history_concurrency.py [--processes 8] [--reports 50]

Targets: 400 stored, 0 lost, 0 duplicated, 0 errors.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENV = {"platform": "cpu", "hardware": "bench-cpu", "git_commit": None}


def make_report(path: Path, seed: int) -> Path:
    # tests/helpers.py (main() puts tests/ on sys.path): the reports the tests read.
    from helpers import judged_report, noisy_result

    rng = np.random.default_rng(seed)
    base = noisy_result(rng, 20, noisy_decoding=True)
    return judged_report(path, base, noisy_result(rng, 20, noisy_decoding=True), ENV)


def worker(args: tuple[str, list[str], mp.Barrier]) -> tuple[int, int, list[str]]:
    db, paths, barrier = args
    from perfguard.errors import PerfguardError
    from perfguard.storage.archive import add_reports

    added = skipped = 0
    errors = []
    barrier.wait()
    for path in paths:
        try:
            a, s = add_reports(db, [path], commit=f"commit-{Path(path).stem}")
            added, skipped = added + a, skipped + s
        except PerfguardError as exc:
            errors.append(f"{path}: {exc}")
    return added, skipped, errors


def run(db: str, reports: list[list[Path]], processes: int) -> dict[str, float]:
    from perfguard.storage.archive import read_rows

    ctx = mp.get_context("fork")
    barrier = ctx.Manager().Barrier(processes)
    jobs = []
    for w in range(processes):
        mine = [str(p) for p in reports[w]]
        neighbour = [str(p) for p in reports[(w + 1) % processes][:10]]
        jobs.append((db, mine + neighbour, barrier))
    start = time.perf_counter()
    with ctx.Pool(processes) as pool:
        out = pool.map(worker, jobs)
    wall = time.perf_counter() - start
    from perfguard.storage.archive import FRAME_COLUMNS

    rows = [dict(zip(FRAME_COLUMNS, r, strict=True)) for r in read_rows(db)]
    hashes = [r["content_hash"] for r in rows if r["metric"] == "e2e"]
    expected = sum(len(r) for r in reports)
    return {
        "stored": len(set(hashes)),
        "lost": expected - len(set(hashes)),
        "duplicated": len(hashes) - len(set(hashes)),
        "added": sum(a for a, _, _ in out),
        "skipped": sum(s for _, s, _ in out),
        "errors": sum(len(e) for _, _, e in out),
        "wall_s": wall,
        "first_error": next((e[0] for _, _, e in out if e), ""),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--reports", type=int, default=50, help="Reports per process.")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from pg_server import running_server

    work = Path(tempfile.mkdtemp(prefix="perfguard-concurrency-"))
    t = time.perf_counter()
    reports = [
        [make_report(work / f"w{w}-{i}.json", seed=w * 1000 + i) for i in range(args.reports)]
        for w in range(args.processes)
    ]
    made = time.perf_counter() - t
    print(f"{args.processes} processes x {args.reports} reports (+10 of a neighbour's each), "
          f"made in {made:.1f} s; cpus {mp.cpu_count()}, machine shared")  # fmt: skip
    with running_server() as server:
        backends = {"postgresql": server.new_database(), "sqlite": str(work / "h.sqlite")}
        for name, db in backends.items():
            r = run(db, reports, args.processes)
            print(f"{name:10s}: stored {r['stored']}, lost {r['lost']}, duplicated "
                  f"{r['duplicated']}, errors {r['errors']}, adds {r['added']} + "
                  f"{r['skipped']} already present, wall {r['wall_s']:.1f} s"
                  + (f"; first error: {r['first_error']}" if r["first_error"] else ""))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
