"""Build time and per-stage time of the built-in pipelines at the CPU presets.

For each case (default: the `tiny` smoke cases and the `small` CPU cases): the time to
build the pipeline (every component, seeded init) and, over N calls after one warm-up,
the median of each stage, the e2e median, and the pipeline's counters. CPU run:
``python benchmarks/stages.py`` (about a minute on 2 cores).

One thread by default: the tiny models gain nothing from more, and on a shared runner a
second thread per process mostly measures the neighbours.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import StageTimer
from perfguard.storage.cases import load_registry
from perfguard.workloads.registry import build_pipeline

DEFAULT_CASES = (
    "qwen_image_t2i_smoke",
    "glm_image_t2i_smoke",
    "qwen_image_t2i_small_cpu",
    "glm_image_t2i_small_cpu",
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", action="append", help="case id (repeatable)")
    parser.add_argument("--repeats", type=int, default=5, help="measured calls per case")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    platform = Platform()
    cases = {c.id: c for c in load_registry("cpu", Path(__file__).parent.parent / "cases")}
    print(f"torch={torch.__version__} threads={torch.get_num_threads()} repeats={args.repeats}")
    started = time.perf_counter()
    import diffusers  # noqa: F401  (first use imports them: not a pipeline's build cost)
    import transformers  # noqa: F401
    from transformers import GlmImageForConditionalGeneration, Qwen2_5_VLForConditionalGeneration  # noqa: F401

    print(f"import diffusers + transformers: {time.perf_counter() - started:.2f} s")
    for case_id in args.case or DEFAULT_CASES:
        case = cases[case_id]
        started = time.perf_counter()
        pipe = build_pipeline(case, platform)
        build_s = time.perf_counter() - started
        pipe()  # warm-up
        stages: dict[str, list[float]] = {}
        e2e = []
        for _ in range(args.repeats):
            with StageTimer(platform) as timer:
                pipe()
            record = timer.record()
            e2e.append(record.e2e_ms)
            for name, ms in record.stages_ms.items():
                stages.setdefault(name, []).append(ms)
        print(
            f"\n{case_id} ({case.preset}, {case.width}x{case.height}, {case.steps} steps, "
            f"batch {case.batch}): build {build_s:.2f} s, e2e median "
            f"{statistics.median(e2e):.1f} ms"
        )
        for name, values in stages.items():
            print(f"  {name:<28} {statistics.median(values):9.2f} ms")
        params = {role: info["parameters"] for role, info in pipe.components.items()}
        print("  parameters: " + ", ".join(f"{r}={n:,}" for r, n in params.items() if n))
        print("  counters:   " + (", ".join(f"{k}={v}" for k, v in pipe.counters().items()) or "-"))


if __name__ == "__main__":
    main()
