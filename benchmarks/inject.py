"""What `--inject` moves: each metric's ratio, injected over not, on the smoke cases.

In one process with one intra-op thread, each case's pipeline is run in interleaved
pairs (injected / not, the order alternating so a slow spell of the machine hits both)
and the median per-pair ratio is printed per metric. An injection of +N % on
`DenoisingStage` should move the stage and every step by N % and e2e by the time added.

    python benchmarks/inject.py --pairs 12 --inject DenoisingStage=+50%
"""

from __future__ import annotations

import argparse
import statistics

METRICS = ("stage:DenoisingStage", "step_avg", "step_median", "step:0", "e2e")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--inject", default="DenoisingStage=+50%")
    ap.add_argument("--cases", nargs="+", default=["qwen_image_t2i_smoke", "glm_image_t2i_smoke"])
    args = ap.parse_args()

    from perfguard.device import threads
    from perfguard.device.inject import parse_inject
    from perfguard.device.platform import probe
    from perfguard.device.timer import StageTimer
    from perfguard.measurement.runner import _default_factory
    from perfguard.metrics import metrics_of_run
    from perfguard.storage.cases import load_registry, select

    inject = parse_inject(args.inject)
    platform = probe("cpu")
    threads.apply(1)
    print(f"{args.inject}: median of {args.pairs} interleaved pairs (injected / not), 1 thread")
    for case in select(load_registry("cpu"), args.cases):
        pipe = _default_factory(case, platform)
        pipe()  # warm-up
        ratios: dict[str, list[float]] = {}
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            figures = {}
            for injected in order:
                chosen = inject if injected else {}
                with StageTimer(platform, inject=chosen, track_memory=False) as t:
                    pipe()
                figures[injected] = metrics_of_run(t.record().to_dict())
            for m in METRICS:
                ratios.setdefault(m, []).append(figures[True][m] / figures[False][m])
        cells = ", ".join(f"{m} {statistics.median(v):.3f}x" for m, v in ratios.items())
        print(f"  {case.id}: {cells}")


if __name__ == "__main__":
    main()
