"""Server cases: A/A false alarms, what each kind of slowdown the gate catches, and the
offset one server process leaves on its figures.

A `launch` case (a fresh `perfguard serve` per round, started warm from the resident
server): one baseline, then `--checks` checks of unchanged code (held-out A/A runs: none
of them chose anything), then one check each of a server slowed inside its denoising
stage (+30 % per step), outside its stages (image encoding made slower by 30 % of the
baseline's median latency at concurrency 1) and failing every 5th request. Prints one
line per check: its exit code, time, answer counts and the slower figures.

`--url` measures `url` cases instead: one server started per command (the baseline's,
each check's), all of a command's rounds on it, as a server perfguard does not start.

`--offsets N` first measures N servers of unchanged code, `--offset-rounds` rounds each,
as a `url` case measures one server, and prints per metric class the sd (log scale) of
the server's offset beyond its rounds' spread (one-way analysis of variance, the median
over the class's figures): what `tolerances.SERVER_SESSION_SD` is for.

    python benchmarks/serving.py --checks 8 --offsets 6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from noise import one_way  # benchmarks/noise.py, beside this script

from perfguard import api
from perfguard.decision.options import JudgeOptions
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.serving.case import ServerRun
from perfguard.measurement.serving.launch import Launched
from perfguard.metrics import metric_class
from perfguard.storage import baseline as store
from perfguard.storage.cases import Selection, load_registry

WATCHED = ("stage:c1/DenoisingStage", "stage:c1/latency_p50", "stage:c4/latency_p50")
"""The figures each check line shows as ratio [interval]: what the slowdowns move."""
SERVE = [sys.executable, "-m", "perfguard", "serve", "--platform", "cpu", "--port", "{port}"]


def case_dir(root: Path, server: dict[str, object], args: argparse.Namespace) -> str:
    body = {"id": "served", "workload": "server", **server, "concurrency": [1, 4],
            "requests": args.requests, "warmup": 2, "rounds": args.rounds}  # fmt: skip
    lines = ["[[case]]", *(f"{k} = {json.dumps(v)}" for k, v in body.items())]
    lines.append('request = {prompt = "a red fox", response_format = "b64_json"}')
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.toml").write_text("\n".join(lines) + "\n")
    return str(root)


class Server:
    """Where a case's rounds run: a fresh server per round (`launch`), or, with `--url`,
    one server started here for the whole command (`url`)."""

    def __init__(self, extra: list[str], url: bool) -> None:
        self.launched = Launched([*SERVE, *extra]) if url else None
        self.extra = extra

    def __enter__(self) -> dict[str, object]:
        if self.launched is None:
            return {"launch": [*SERVE, *self.extra]}
        return {"url": self.launched.start()}

    def __exit__(self, *_exc: object) -> None:
        if self.launched is not None:
            self.launched.stop()


def one_check(root: Path, baseline: str, extra: list[str], args: argparse.Namespace) -> str:
    t0 = time.perf_counter()
    with Server(extra, args.url) as where:
        cases = case_dir(root, where, args)
        report = api.check(Selection(cases_dir=cases), MeasureOptions(repeats=1),
                           judging=JudgeOptions(), baseline=baseline, platform="cpu")  # fmt: skip
    (case,) = report.cases
    answers: dict[str, int] = {}
    for m in case.metrics:
        key = m.answer.answer if m.answer else m.verdict
        answers[key] = answers.get(key, 0) + 1
    slower = [m.metric for m in case.metrics if m.verdict == "regression"]
    shown = []
    for m in case.metrics:
        if m.metric in WATCHED and m.ratio is not None:
            interval = f" [{m.low:.2f}, {m.high:.2f}]" if m.low and m.high else ""
            shown.append(f"{m.metric.removeprefix('stage:')} {m.ratio:.2f}x{interval}")
    return (f"exit {report.exit_code} in {time.perf_counter() - t0:.1f} s {answers} "
            f"slower: {', '.join(slower) or '-'}; {'; '.join(shown)}")  # fmt: skip


def offsets(root: Path, args: argparse.Namespace) -> None:
    """The server offset per class: N servers x R rounds, one-way ANOVA per figure."""
    (case,) = load_registry("cpu", case_dir(root, {"url": "http://127.0.0.1:1"}, args))
    per_server: list[list[dict[str, float]]] = []
    for _ in range(args.offsets):
        server = Launched(SERVE)
        try:
            url = server.start()
            run = ServerRun(dataclasses.replace(case, url=url), lambda _m: None)
            run.measure(args.offset_rounds)
            per_server.append(run.rounds)
        finally:
            server.stop()
    by_class: dict[str, list[float]] = {}
    for metric in sorted(set.intersection(*(set(r) for rs in per_server for r in rs))):
        groups = [[math.log(r[metric]) for r in rs] for rs in per_server]
        within, sd, _, _ = one_way(groups)  # the sd a server adds, and within one
        by_class.setdefault(metric_class(metric), []).append(sd)
        print(f"  {metric}: server offset sd {sd:.3f}, within {within:.3f}", flush=True)
    for cls, sds in sorted(by_class.items()):
        shape = f"{args.offsets} servers x {args.offset_rounds} rounds"
        print(f"offset {cls}: median {statistics.median(sds):.3f} max {max(sds):.3f} "
              f"over {len(sds)} figures, {shape}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=8, help="held-out A/A checks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--offsets", type=int, default=0, help="servers for the offset figure")
    parser.add_argument("--offset-rounds", type=int, default=3)
    parser.add_argument("--url", action="store_true", help="url cases: one server per command")
    args = parser.parse_args()
    os.environ["PERFGUARD_ATTRIBUTION"] = "0"
    root = Path(tempfile.mkdtemp(prefix="perfguard-serving-"))
    if args.offsets:
        offsets(root / "offsets", args)
    baseline = str(root / "b.json")
    t0 = time.perf_counter()
    with Server([], args.url) as where:
        cases = case_dir(root / "cases", where, args)
        api.gen_baselines(Selection(cases_dir=cases), MeasureOptions(repeats=1),
                          baseline=baseline, platform="cpu", say=lambda _m: None)  # fmt: skip
    stored = store.load(baseline).scenarios["served"].metrics
    p50 = stored["stage:c1/latency_p50"].median
    print(f"baseline: {time.perf_counter() - t0:.1f} s, c1 p50 {p50:.1f} ms", flush=True)
    for i in range(args.checks):
        print(f"A/A {i + 1}: {one_check(root / 'cases', baseline, [], args)}", flush=True)
    slowed = {
        "DenoisingStage +30%": ["--inject", "DenoisingStage=+30%"],
        f"encoding +{0.3 * p50:.0f} ms (30 % of p50)": ["--encode-delay-ms", f"{0.3 * p50:.1f}"],
        "every 5th 500": ["--fail-every", "5"],
    }
    for name, extra in slowed.items():
        print(f"{name}: {one_check(root / 'cases', baseline, extra, args)}", flush=True)


if __name__ == "__main__":
    main()
