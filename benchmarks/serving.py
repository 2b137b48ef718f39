"""Server cases: A/A false alarms, and what each kind of slowdown the gate catches.

One baseline against `perfguard serve` (a fresh server), then `--checks` checks of
unchanged servers (each a fresh server: held-out A/A runs), then one check each of a
server slowed inside its denoising stage, outside its stages and failing every 5th
request. Prints one line per check: its exit code, answer counts and the slower figures.

    python benchmarks/serving.py --checks 5 --rounds 5 --requests 16
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from perfguard import api
from perfguard.decision.gate import JudgeOptions
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.serving.launch import Launched
from perfguard.storage.cases import Selection

SERVE = [sys.executable, "-m", "perfguard", "serve", "--platform", "cpu", "--port", "{port}"]


def case_dir(root: Path, url: str, args: argparse.Namespace) -> str:
    body = {"id": "served", "workload": "server", "url": url, "concurrency": [1, 4],
            "requests": args.requests, "warmup": 2, "rounds": args.rounds}  # fmt: skip
    lines = ["[[case]]", *(f"{k} = {json.dumps(v)}" for k, v in body.items())]
    lines.append('request = {prompt = "a red fox", response_format = "b64_json"}')
    root.mkdir(parents=True, exist_ok=True)
    (root / "cpu.toml").write_text("\n".join(lines) + "\n")
    return str(root)


def one_check(root: Path, baseline: str, extra: list[str], args: argparse.Namespace) -> str:
    server = Launched([*SERVE, *extra])
    server.start()
    try:
        t0 = time.perf_counter()
        report = api.check(Selection(cases_dir=case_dir(root, server.url, args)),
                           MeasureOptions(repeats=1), judging=JudgeOptions(),
                           baseline=baseline, platform="cpu")  # fmt: skip
        (case,) = report.cases
        answers: dict[str, int] = {}
        for m in case.metrics:
            key = m.answer.answer if m.answer else m.verdict
            answers[key] = answers.get(key, 0) + 1
        slower = [m.metric for m in case.metrics if m.verdict == "regression"]
        failed = " output changed" if case.output_failed else ""
        return (f"exit {report.exit_code} in {time.perf_counter() - t0:.1f} s {answers}"
                f"{failed} slower: {', '.join(slower) or '-'}")  # fmt: skip
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=5, help="A/A checks")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=16)
    args = parser.parse_args()
    os.environ["PERFGUARD_ATTRIBUTION"] = "0"
    root = Path(tempfile.mkdtemp(prefix="perfguard-serving-"))
    baseline = str(root / "b.json")
    server = Launched(SERVE)
    server.start()
    try:
        t0 = time.perf_counter()
        api.gen_baselines(Selection(cases_dir=case_dir(root / "cases", server.url, args)),
                          MeasureOptions(repeats=1), baseline=baseline, platform="cpu",
                          say=lambda _m: None)  # fmt: skip
        print(f"baseline: {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        server.stop()
    for i in range(args.checks):
        print(f"A/A {i + 1}: {one_check(root / 'cases', baseline, [], args)}", flush=True)
    slowed = {
        "DenoisingStage +30%": ["--inject", "DenoisingStage=+30%"],
        "encoding +30 ms": ["--encode-delay-ms", "30"],
        "every 5th 500": ["--fail-every", "5"],
    }
    for name, extra in slowed.items():
        print(f"{name}: {one_check(root / 'cases', baseline, extra, args)}", flush=True)


if __name__ == "__main__":
    main()
