"""How the runner's speed moves inside one process: a case and the reference, window by window.

Builds one case in this process (one intra-op thread, as the CPU gate runs) and runs it
for `--seconds`, timing the reference workload (`perfguard.device.reference`) twice
after every run, as the runner does beside each run. Every `--window` seconds it prints
the window's median run, median reference, and two normalized figures: the ratio of
the two medians, and the median of each run over the reference beside it (what a
`timing: normalized` baseline stores, `perfguard.decision.normalize`). At the end, the
sd (log scale) of each column over the windows: how much of the machine's drift the
reference takes out.

    python benchmarks/spells.py --case qwen_image_t2i_smoke --seconds 90 --window 5
"""

from __future__ import annotations

import argparse
import statistics
import time

from noise import log_sd  # benchmarks/ is this script's directory, first on sys.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--cases", default="cases")
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--window", type=float, default=5.0)
    args = ap.parse_args()

    from perfguard.device.platform import probe
    from perfguard.device.reference import Reference
    from perfguard.device.threads import apply
    from perfguard.storage.cases import load_registry
    from perfguard.workloads.registry import build_pipeline

    apply(1)
    platform = probe("cpu")
    (case,) = [c for c in load_registry(platform.name, args.cases) if c.id == args.case]
    pipeline = build_pipeline(case, platform)
    reference = Reference(platform)
    for _ in range(3):
        pipeline()
    start = time.perf_counter()
    window: list[tuple[float, float]] = []
    rows: list[tuple[float, float, float, float]] = []
    print(
        "| end (s) | runs | run median (ms) | reference median (ms) | ratio of medians "
        "| median of run/reference |"
    )
    print("|---|---|---|---|---|---|")
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        pipeline()
        t1 = time.perf_counter()
        ref = (reference.time_ms() + reference.time_ms()) / 2
        window.append(((t1 - t0) * 1e3, ref))
        if t1 - start >= args.window * (len(rows) + 1):
            run = statistics.median(w[0] for w in window)
            ref_med = statistics.median(w[1] for w in window)
            per_run = statistics.median(w[0] / w[1] for w in window)
            rows.append((run, ref_med, run / ref_med, per_run))
            print(
                f"| {t1 - start:.1f} | {len(window)} | {run:.2f} | {ref_med:.3f} | "
                f"{run / ref_med:.2f} | {per_run:.2f} |"
            )
            window = []
    names = ("run", "reference", "ratio of medians", "median of run/reference")
    for i, name in enumerate(names):
        print(f"sd over {len(rows)} windows, {name}: {log_sd([r[i] for r in rows]):.1%}")


if __name__ == "__main__":
    main()
