"""Work counters and output equivalence on the real smoke cases, the README's default flow.

Against one baseline of unchanged code (`perfguard gen-baselines --tag smoke`, the
defaults), each condition is one `perfguard check --tag smoke` process, exactly as CI
runs it, with the change made from outside perfguard the way a pull request would make
it (`benchmarks/slow_blocks/sitecustomize.py`):

- `unchanged`;
- each reference optimization reverted (`PERFGUARD_BENCH_TOGGLE_OFF=<toggle>`: its
  switch forced off before every forward, the case still asks for it on);
- `double-linear`: every `torch.nn.Linear` does its work twice;
- `low-precision`: every DiT transformer block's outputs rounded through bfloat16 (a
  deliberate numeric change: the output-equivalence figure).

For each: the `check` exit code, the counters that moved (stage, counter, delta), and
the output verdict with its PSNR. Then:

- stability: `check-work` of unchanged code in `--processes` fresh processes
  (default 20): the counts of every process must be identical, with 0 counter alarms;
- cost: per case, a plain run, the old memory-only tracked run and the counted run
  (which replaces it), interleaved in one process with one intra-op thread, medians;
  and what the counting adds per pipeline build against the wall of the smoke flow.

The machine may be shared: figures are medians of interleaved repeats, and wall times of
whole commands are single samples of a loaded machine, quoted as such.

    python benchmarks/counters.py --json counters.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "benchmarks" / "slow_blocks"
TOGGLES = ("glm_prior_drop_inplace", "qwen_modulation_cache", "qwen_varlen_host_meta")
CONDITIONS: dict[str, dict[str, str]] = {
    "unchanged": {},
    **{f"{t} off": {"PERFGUARD_BENCH_TOGGLE_OFF": t} for t in TOGGLES},
    "double-linear": {"PERFGUARD_BENCH_DOUBLE_LINEAR": "1"},
    "low-precision": {"PERFGUARD_BENCH_LOW_PRECISION": "1"},
}


def env_for(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PERFGUARD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def perfguard(args: list[str], extra: dict[str, str]) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "perfguard", *args, "--no-progress"],
        env=env_for(extra),
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, time.perf_counter() - t0, proc.stderr


def moved(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Every counter whose value differs from the baseline's, per case."""
    rows = []
    for cid, case in sorted(report["cases"].items()):
        for name, m in case["metrics"].items():
            if m.get("delta"):
                rows.append(
                    {"case": cid, "metric": name, "delta": m["delta"], "verdict": m["verdict"]}
                )
    return rows


def condition(name: str, baseline: Path, tmp: Path) -> dict[str, Any]:
    report = tmp / f"report-{name.replace(' ', '-')}.json"
    markdown = report.with_suffix(".md")
    args = ["check", "--tag", "smoke", "--baseline", str(baseline)]
    code, wall, err = perfguard(
        [*args, "--report", str(report), "--markdown", str(markdown)], CONDITIONS[name]
    )
    out: dict[str, Any] = {"condition": name, "exit": code, "wall_s": round(wall, 1)}
    if not report.exists():
        out["error"] = err.strip().splitlines()[-1:] or ["no report"]
        return out
    data = json.loads(report.read_text())
    out["moved"] = moved(data)
    out["cases"] = {
        cid: {
            "verdict": c["verdict"],
            "output": c.get("output"),
            "timing_regressions": sorted(
                m
                for m, v in c["metrics"].items()
                if v["verdict"] == "regression" and "delta" not in v
            ),
        }
        for cid, c in sorted(data["cases"].items())
    }
    text = markdown.read_text()
    start = text.find("#### What the code does")
    if start >= 0:  # the section ends where the next one (or the details) begins
        ends = [i for i in (text.find("####", start + 5), text.find("<details>", start)) if i > 0]
        out["says"] = text[start : min(ends, default=len(text))].strip()
    else:
        out["says"] = ""
    return out


def stability(baseline: Path, tmp: Path, processes: int) -> dict[str, Any]:
    """`check-work` of unchanged code in fresh processes: identical counts?"""
    seen: list[str] = []
    codes: list[int] = []
    alarms = 0
    walls: list[float] = []
    for i in range(processes):
        res, rep = tmp / f"stab-{i}.json", tmp / f"stab-report-{i}.json"
        code, wall, _ = perfguard(
            [
                "check-work",
                "--tag",
                "smoke",
                "--baseline",
                str(baseline),
                "--out",
                str(res),
                "--report",
                str(rep),
            ],
            {},
        )
        codes.append(code)
        walls.append(wall)
        data = json.loads(res.read_text())
        work = {
            cid: [w["total"], w["stages"], w["steps"], w["op_counts"]]
            for cid, c in data["cases"].items()
            for w in c.get("work", [])
        }
        seen.append(json.dumps(work, sort_keys=True))
        report = json.loads(rep.read_text())
        alarms += sum(
            1
            for c in report["cases"].values()
            for m in c["metrics"].values()
            if "delta" in m and m["verdict"] == "regression"
        )
    return {
        "processes": processes,
        "distinct_counts": len(set(seen)),
        "exit_codes": sorted(set(codes)),
        "counter_alarms": alarms,
        "counters_only_wall_s_median": round(statistics.median(walls), 2),
    }


COST_SCRIPT = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads(1)
from perfguard.measurement.memory import measure_run
from perfguard.device.platform import Platform
from perfguard.measurement.work import counted_run
from perfguard.storage.cases import load_registry
from perfguard.workloads.registry import build_pipeline

repeats = int(sys.argv[1])
cpu = Platform()
out = {}
for case in [c for c in load_registry("cpu") if "smoke" in c.tags]:
    t0 = time.perf_counter()
    pipe = build_pipeline(case, cpu)
    build_s = time.perf_counter() - t0
    pipe()
    plain, memory, counted = [], [], []
    for _ in range(repeats):  # interleaved, so a slow spell hits all three alike
        for fn, xs in ((pipe, plain), (lambda: measure_run(pipe, cpu), memory),
                       (lambda: counted_run(pipe, cpu, case.dtype), counted)):
            t = time.perf_counter(); fn(); xs.append((time.perf_counter() - t) * 1e3)
    out[case.id] = {"build_s": round(build_s, 2),
                    "plain_ms": round(statistics.median(plain), 1),
                    "memory_run_ms": round(statistics.median(memory), 1),
                    "counted_run_ms": round(statistics.median(counted), 1)}
print(json.dumps(out))
"""


def cost(repeats: int) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", COST_SCRIPT, str(repeats)],
        env=env_for({}),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=20, help="stability: fresh processes")
    parser.add_argument("--cost-repeats", type=int, default=7)
    parser.add_argument("--only", action="append", help="conditions to run (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    out: dict[str, Any] = {"note": "shared 2-core machine; one intra-op thread (the default)"}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        baseline = tmp / "baseline.json"
        code, wall, err = perfguard(
            ["gen-baselines", "--tag", "smoke", "--baseline", str(baseline)], {}
        )
        if code != 0:
            print(err, file=sys.stderr)
            return code
        out["gen_baselines_wall_s"] = round(wall, 1)
        print(f"gen-baselines --tag smoke (unchanged code): {wall:.1f} s")
        rows = []
        for name in args.only or list(CONDITIONS):
            row = condition(name, baseline, tmp)
            rows.append(row)
            print(f"\n== {name}: check exit {row['exit']} ({row['wall_s']} s)")
            for cid, c in row.get("cases", {}).items():
                o = c["output"] or {}
                psnr = f", PSNR {o['psnr_db']} dB" if o.get("psnr_db") is not None else ""
                timing = ", ".join(c["timing_regressions"]) or "none"
                print(
                    f"   {cid}: {c['verdict']}; output {o.get('verdict')}{psnr}; "
                    f"timing regressions: {timing}"
                )
            for m in row.get("moved", []):
                print(f"   {m['case']:<22} {m['metric']:<34} {m['delta']:+,.0f}  {m['verdict']}")
            if row.get("says"):
                print("   " + row["says"].replace("\n", "\n   "))
        out["conditions"] = rows
        if args.processes:
            out["stability"] = stability(baseline, tmp, args.processes)
            s = out["stability"]
            print(
                f"\nstability: {s['processes']} fresh `check-work` processes, "
                f"{s['distinct_counts']} distinct count set(s), exit codes {s['exit_codes']}, "
                f"{s['counter_alarms']} counter alarm(s); median wall "
                f"{s['counters_only_wall_s_median']} s"
            )
    out["cost"] = cost(args.cost_repeats)
    print("\ncost per pipeline build (medians, interleaved, 1 thread):")
    added_s = 0.0
    for cid, c in out["cost"].items():
        extra = c["counted_run_ms"] - c["memory_run_ms"]
        added_s += extra / 1e3
        print(
            f"   {cid}: plain run {c['plain_ms']} ms, memory-only run (before) "
            f"{c['memory_run_ms']} ms, counted run (now) {c['counted_run_ms']} ms: "
            f"+{extra:.1f} ms per build"
        )
    unchanged = next((r for r in out.get("conditions", []) if r["condition"] == "unchanged"), None)
    if unchanged and out.get("gen_baselines_wall_s"):
        # gen-baselines builds each case in 3 processes; check once (no confirmation).
        gen = out["gen_baselines_wall_s"]
        chk = unchanged["wall_s"]
        out["added"] = {
            "gen_baselines_pct": round(100 * 3 * added_s / (gen - 3 * added_s), 1),
            "check_pct": round(100 * added_s / (chk - added_s), 1),
        }
        print(
            f"   added to the smoke flow: gen-baselines +{out['added']['gen_baselines_pct']} %"
            f" of {gen} s, check +{out['added']['check_pct']} % of {chk} s"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
