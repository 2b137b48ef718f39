"""`perfguard history publish` on a large archive: wall time, the site's size, page load.

Builds an SQLite archive of N reports (default 1,000) x 2 cases x ~40 metrics (e2e, the
six stages, 20 denoising steps, aggregates, memory and work counters such as
`ops:DenoisingStage` and `syncs:DenoisingStage`) over two hardware, with a +12 % step in
the denoising stage on one of them, then publishes it and prints the figures. With
`--browser`, opens the index and the first case page in Debian's headless chromium and
prints the time to first plot and to every plot drawn.

    python benchmarks/history_site.py [--reports 1000] [--browser] [--keep DIR]

The reports are made as the archive stores them (`ReportRecord`, the parsed form), so
the archive is built in seconds; the publish reads it back through the same code as for
real reports.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from perfguard.metrics import PIPELINE_STAGES
from perfguard.storage.archive import ReportRecord, add_records

STAGES = PIPELINE_STAGES
CASES = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")
HARDWARE = ("h100-sxm", "h200-sxm")


def metric_levels(steps: int = 26) -> dict[str, float]:
    """~40 metrics with plausible levels (ms, MB, counts)."""
    out = {"e2e": 900.0, "step_avg": 40.0, "step_median": 40.0, "peak_memory": 12000.0}
    out |= {
        f"stage:{s}": lv for s, lv in zip(STAGES, (0.2, 30.0, 1.0, 0.5, 800.0, 60.0), strict=True)
    }
    out |= {f"step:{i}": 40.0 for i in range(steps)}
    out |= {"ops:DenoisingStage": 5200.0, "flops:DenoisingStage": 3.1e12}
    out |= {"alloc:DenoisingStage": 410.0, "syncs:DenoisingStage": 20.0}
    return out


def synthetic_records(
    n_reports: int, *, seed: int = 0, step_at: float = 0.6, step: float = 1.12
) -> list[ReportRecord]:
    rng = np.random.default_rng(seed)
    levels = metric_levels()
    out = []
    for i in range(n_reports):
        hw = HARDWARE[i % len(HARDWARE)]
        commit = hashlib.sha1(f"commit{i // len(HARDWARE)}".encode()).hexdigest()
        moved = hw == HARDWARE[0] and i >= step_at * n_reports
        rows = []
        for case in CASES:
            for metric, level in levels.items():
                counter = metric.split(":")[0] in ("ops", "flops", "alloc", "syncs")
                noise = 0.0 if counter else 0.01
                factor = step if moved and metric in ("stage:DenoisingStage", "e2e") else 1.0
                median = level * factor * (1 + noise * rng.standard_normal())
                ratio = median / level
                rows.append(
                    (case, metric, 5, median, level * noise * 1.3, median * 0.98,
                     median * 1.03, level, ratio,
                     "regression" if ratio > 1.05 else "pass",
                     level * 1.05, level * 0.9, ratio * 0.99, ratio * 1.01, None)
                )  # fmt: skip
        day = 1 + i // (len(HARDWARE) * 24)
        out.append(
            ReportRecord(
                content_hash=hashlib.sha256(f"report{seed}-{i}".encode()).hexdigest(),
                source=f"report-{i}.json",
                git_commit=commit,
                date=f"2026-{1 + (day - 1) // 28 % 12:02d}-{1 + (day - 1) % 28:02d}T"
                f"{(i // 2) % 24:02d}:00:00+00:00",
                platform="cuda",
                hardware=hw,
                profile="long_term",
                verdict="fail" if moved else "pass",
                inject=None,
                environment={"platform": "cuda", "hardware": hw},
                rows=rows,
            )
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reports", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="Publishes to time (median).")
    ap.add_argument("--browser", action="store_true", help="Also time page loads in chromium.")
    ap.add_argument("--keep", default=None, help="Keep the archive and site in this folder.")
    args = ap.parse_args()
    from perfguard.presentation.site import publish

    work = Path(args.keep or tempfile.mkdtemp(prefix="perfguard-site-"))
    work.mkdir(parents=True, exist_ok=True)
    db = work / "history.sqlite"
    if db.exists():
        db.unlink()
    t = time.perf_counter()
    add_records(db, synthetic_records(args.reports))
    build_s = time.perf_counter() - t
    print(f"archive: {args.reports} reports x {len(CASES)} cases x {len(metric_levels())} "
          f"metrics, {db.stat().st_size / 1e6:.1f} MB, built in {build_s:.1f} s")  # fmt: skip
    walls = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        summary = publish(db, work / "site")
        walls.append(time.perf_counter() - t)
    site = work / "site"
    files = [p for p in site.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    largest = max(files, key=lambda p: p.stat().st_size)
    print(summary)
    print(f"publish wall: median {statistics.median(walls):.2f} s of {args.repeat} "
          f"(min {min(walls):.2f}, max {max(walls):.2f}); {len(files)} files, "
          f"{size / 1e6:.1f} MB; largest {largest.relative_to(site)} "
          f"{largest.stat().st_size / 1e6:.2f} MB; cpus {os.cpu_count()}")  # fmt: skip
    if args.browser:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        from browser import browser, visit

        case_page = sorted(site.glob("case-*.html"))[0]
        with browser() as b:
            for name, path, done in (
                ("index", site / "index.html", "document.readyState === 'complete'"),
                (case_page.name, case_page, "document.body.dataset.complete === '1'"),
            ):
                loads, firsts, alls = [], [], []
                for _ in range(3):
                    t = time.perf_counter()
                    v = visit(b, path.as_uri())
                    loads.append(time.perf_counter() - t)
                    if name != "index":
                        v.page.wait_for_function(
                            "Number(document.body.dataset.drawn || 0) >= 1", timeout=60000
                        )
                        firsts.append(time.perf_counter() - t)
                    v.page.wait_for_function(done, timeout=120000)
                    alls.append(time.perf_counter() - t)
                    assert not v.errors and not v.outside, (v.errors, v.outside)
                    v.page.close()
                first = f", first plot {statistics.median(firsts):.2f} s" if firsts else ""
                print(f"chromium {name}: load event {statistics.median(loads):.2f} s{first}, "
                      f"all drawn {statistics.median(alls):.2f} s (median of 3)")  # fmt: skip
    print(f"files in {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
