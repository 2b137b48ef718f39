"""Detection benchmark: false alarms and catch rates of three gating rules on the same samples.

On a real CPU smoke case, with 0 (A/A) and +5 / +10 / +20 / +30 % busy work injected into
one stage (`perfguard.inject`, the gate self-test switch), it measures:

- baseline processes: fresh processes measuring the case unchanged (as `gen-baselines`
  does, with `--processes` pooling several of them);
- calibration processes: the same, kept apart, for `perfguard calibrate`'s suggested
  bands (a team calibrates once, then makes its baseline);
- check processes: each a fresh process, as one `perfguard check` in CI is; for every
  injection level (in a random order per process) it measures up to three pipeline builds
  of `--max-repeats` runs back to back, the first measurement and the two confirmation
  re-runs the gate may ask for.

It then replays every check process against several baselines drawn from the baseline
processes, and applies, to the same samples:

  (i)   perfguard's rule through the real gate (`perfguard.gate.run_gate`: adaptive
        sampling from `--repeats` to `--max-repeats` runs, borderline re-runs), with the
        default pr_test bands and with the bands `perfguard calibrate` suggests;
  (ii)  sglang's rule: one sample (the first request), `max(b * 1.25, b + 20 ms)`;
  (iii) pytest-benchmark's `--benchmark-compare-fail=min:5%`: the minimum of the check's
        first `--repeats` runs against the minimum of one saved run.

The baselines are made in processes other than the check's, as in real CI. A trial is one
(check process, baseline) pair; the check processes are the independent units, and the
table says how many there were. Run on a quiet machine: `python benchmarks/detection.py`
(~8 minutes on 2 cores with the defaults).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# ---- measuring (in fresh subprocesses) -----------------------------------------------------


def _measure(args: argparse.Namespace) -> None:
    """The subprocess side: measure as told and write every sample as JSON."""
    from perfguard.cases import load_registry, select
    from perfguard.platform import probe
    from perfguard.runner import run_case

    platform = probe("cpu")
    (case,) = select(load_registry("cpu", REPO / "cases"), [args.case])
    levels = [float(x) for x in args.levels.split(",")] if args.levels else [0.0]
    random.Random(args.seed).shuffle(levels)
    out: dict[str, Any] = {}
    for level in levels:
        inject = {args.stage: level / 100.0} if level else None
        groups = []
        for _ in range(args.groups):
            res = run_case(
                case, platform, repeats=args.max_repeats, warmup=args.warmup, inject=inject
            )
            if res.status != "ok":
                raise SystemExit(f"{case.id}: {res.error}")
            groups.append(res.samples)
        out[f"{level:g}"] = groups
    Path(args.out).write_text(json.dumps(out))


def _spawn(role: str, i: int, a: argparse.Namespace, workdir: str) -> dict[str, Any]:
    """Measure one process; re-measure it while other jobs load the machine.

    Each process starts once other jobs have left the machine quiet for 2 s (waiting at
    most `--quiet-wait`), and a process during which they kept more than
    `--max-other-load` cores busy is measured again (up to `--quiet-tries` times; the
    last one is kept and counted): this benchmark is about the rule on this runner, not
    about sharing it with another job's test suite. Contention that the guest cannot see
    (the host's other tenants) stays in, as it would in CI.
    """
    for attempt in range(1, a.quiet_tries + 1):
        _wait_for_quiet(a.max_other_load, a.quiet_wait)
        data = _spawn_once(role, i, a, workdir)
        data["_attempts"] = attempt
        if data["_other_load"] <= a.max_other_load:
            break
    return data


def _wait_for_quiet(max_load: float, max_wait_s: float) -> None:
    """Wait (at most `max_wait_s`) until other jobs use at most `max_load` cores for 2 s."""
    hz = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + max_wait_s
    while time.monotonic() < deadline:
        busy0 = _busy_jiffies()
        time.sleep(2.0)
        if (_busy_jiffies() - busy0) / hz / 2.0 <= max_load:
            return


def _spawn_once(role: str, i: int, a: argparse.Namespace, workdir: str) -> dict[str, Any]:
    out = os.path.join(workdir, f"{role}-{i}.json")
    trial = role == "check"
    cmd = [
        sys.executable,
        __file__,
        "--measure",
        "--case",
        a.case,
        "--stage",
        a.stage,
        "--max-repeats",
        str(a.max_repeats),
        "--warmup",
        str(a.warmup),
        "--groups",
        str(1 + a.max_reruns if trial else 1),
        "--levels",
        a.levels if trial else "0",
        "--seed",
        str(a.seed * 1000 + i),
        "--out",
        out,
    ]
    busy0, wall0 = _busy_jiffies(), time.monotonic()
    child0 = _children_cpu_s()
    subprocess.run(cmd, check=True, cwd=REPO)
    elapsed = time.monotonic() - wall0
    ours = _children_cpu_s() - child0
    hz = os.sysconf("SC_CLK_TCK")
    others = max(0.0, (_busy_jiffies() - busy0) / hz - ours) / elapsed  # cores busy elsewhere
    data = json.loads(Path(out).read_text())
    data["_other_load"] = others
    return data  # type: ignore[no-any-return]


def _busy_jiffies() -> int:
    """Busy CPU time of the whole machine so far (/proc/stat; 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except OSError:
        return 0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


def _children_cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# ---- the three rules -----------------------------------------------------------------------


def sglang_alarm(base: dict[str, list[float]], cur: dict[str, list[float]], metric: str) -> bool:
    """sglang: one request's figure against one saved figure, `max(b * 1.25, b + 20 ms)`."""
    b, m = base[metric][0], cur[metric][0]
    return m > max(b * 1.25, b + 20.0)


def sglang_cpu_pad_alarm(
    base: dict[str, list[float]], cur: dict[str, list[float]], metric: str
) -> bool:
    """The same with the pad scaled to the CPU case (perfguard's CPU pad, 1.2 ms)."""
    b, m = base[metric][0], cur[metric][0]
    return m > max(b * 1.25, b + 1.2)


def pytest_benchmark_alarm(
    base: dict[str, list[float]], cur: dict[str, list[float]], metric: str, n: int
) -> bool:
    """pytest-benchmark `min:5%`: min of this run's rounds vs min of the saved run's."""
    return min(cur[metric][:n]) > min(base[metric][:n]) * 1.05


def _case_result(samples: dict[str, list[float]], k: int) -> Any:
    from perfguard.runner import CaseResult

    return CaseResult(
        case_id="bench",
        samples={m: v[:k] for m, v in samples.items()},
        repeats=k,
        output_hash="x",
        deterministic=True,
    )


def perfguard_gate(
    case: Any,
    baseline: Any,
    check_groups: Sequence[Sequence[dict[str, list[float]]]],
    *,
    repeats: int,
    max_repeats: int,
    max_reruns: int,
    fresh: bool,
) -> tuple[Any, int]:
    """The real gate on recorded samples: (case verdict, runs measured).

    `check_groups[g]` is the g-th measurement (first, then re-runs); each is a list of
    processes' samples (one in process; several for `check --processes`). `fresh`: the
    measurements ran in fresh processes (workers), so no adaptive sampling and each
    re-run is a new group; else in process, with adaptive sampling replayed on the
    recorded runs (the gate sees them one at a time and stops where it would have).
    """
    from perfguard.gate import run_gate
    from perfguard.runner import Results, pool

    used = 0
    adaptive = not fresh

    def measure(cases: Sequence[Any], until_for: Callable[[Any], Any]) -> Results:
        nonlocal used
        procs = check_groups[used]
        used += 1
        until = until_for(cases[0]) if adaptive else None
        k = repeats
        if until is not None:
            while k < max_repeats and not until(_case_result(procs[0], k)):
                k += 1
        parts = [dataclasses.replace(_case_result(p, k), case_id=case.id) for p in procs]
        return Results(environment={}, settings={}, cases={case.id: pool(parts)})

    outcome = run_gate(
        [case],
        baseline,
        "pr_test",
        measure,
        adaptive=adaptive,
        max_reruns=max_reruns,
        max_repeats=max_repeats,
        rerun_in_new_process=fresh,
    )
    return outcome.judgement.cases[0], outcome.results.cases[case.id].repeats


# ---- the benchmark -------------------------------------------------------------------------


def _baseline_of(
    case: Any, processes: Sequence[dict[str, list[float]]], n: int, overrides: Any = None
) -> Any:
    from perfguard.baseline import new_baseline, scenario_from_result
    from perfguard.runner import pool

    parts = [dataclasses.replace(_case_result(p, n), case_id=case.id) for p in processes]
    scenario = scenario_from_result(pool(parts))
    if overrides:
        scenario = dataclasses.replace(scenario, tolerance_overrides=overrides)
    env = {"platform": "cpu", "hardware": "bench"}
    return new_baseline(env).with_scenario(case.id, scenario)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", default="qwen_image_t2i_smoke")
    p.add_argument("--stage", default="DenoisingStage")
    p.add_argument("--levels", default="0,5,10,20,30", help="injected %%, 0 = A/A")
    p.add_argument("--checks", type=int, default=40, help="check processes")
    p.add_argument("--baselines", type=int, default=16, help="baseline processes")
    p.add_argument("--calibration", type=int, default=8, help="calibration processes")
    p.add_argument("--pairs", type=int, default=4, help="baselines per check process")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--max-repeats", type=int, default=20)
    p.add_argument("--max-reruns", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=None, help="reuse (or save) the measurements here")
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.25,
        help="re-measure a process while other jobs keep more cores than this busy",
    )
    p.add_argument("--quiet-tries", type=int, default=3)
    p.add_argument(
        "--quiet-wait", type=float, default=120.0, help="seconds to wait for a quiet machine"
    )
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--groups", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.measure:
        _measure(a)
        return 0

    from perfguard.cases import load_registry, select
    from perfguard.verdict import REGRESSION

    t0 = time.perf_counter()
    data_path = Path(a.data) if a.data else None
    if data_path is not None and data_path.exists():
        data = json.loads(data_path.read_text())
        measured_s = data.get("wall_s", 0.0)
    else:
        roles = (
            [("check", i) for i in range(a.checks)]
            + [("base", i) for i in range(a.baselines)]
            + [("cal", i) for i in range(a.calibration)]
        )
        random.Random(a.seed).shuffle(roles)  # spread each role over the whole run
        data = {"check": {}, "base": {}, "cal": {}}
        with tempfile.TemporaryDirectory() as workdir:
            for done, (role, i) in enumerate(roles, 1):
                data[role][str(i)] = _spawn(role, i, a, workdir)
                print(f"\r measured {done}/{len(roles)} processes", end="", file=sys.stderr)
        print(file=sys.stderr)
        measured_s = time.perf_counter() - t0
        data["wall_s"] = measured_s
        if data_path is not None:
            data_path.write_text(json.dumps(data))
    t_judge = time.perf_counter()
    checks = [data["check"][k] for k in sorted(data["check"], key=int)]
    bases = [data["base"][k]["0"][0] for k in sorted(data["base"], key=int)]
    cals = [data["cal"][k]["0"][0] for k in sorted(data["cal"], key=int)]
    levels = sorted((k for k in checks[0] if not k.startswith("_")), key=float)
    metric = f"stage:{a.stage}"
    (case,) = select(load_registry("cpu", REPO / "cases"), [a.case])
    rng = random.Random(a.seed)

    # Bands a team would get from `perfguard calibrate` on the calibration processes.
    from perfguard.calibrate import CheckSetup, calibrate_case, suggested_overrides
    from perfguard.runner import pool
    from perfguard.verdict import default_profiles

    profile = default_profiles("cpu")["pr_test"]
    cal_result = pool(
        [dataclasses.replace(_case_result(c, a.repeats), case_id=case.id) for c in cals]
    )
    configs = [  # label, baseline processes, check processes, re-runs in fresh processes
        ("baseline 1 process; check in process", 1, 1, False),
        ("baseline 5 processes; check in process", 5, 1, False),
        ("baseline 10 processes; check --isolate", 10, 1, True),
        ("baseline 10 processes; check --processes 4", 10, 4, True),
    ]
    calibrated: dict[str, Any] = {}
    for label, kb, kc, fresh in configs:
        setup = CheckSetup(
            repeats=a.repeats,
            baseline_processes=kb,
            check_processes=kc,
            max_reruns=a.max_reruns,
            isolate=fresh,
        )
        cal = calibrate_case(cal_result, profile, setup)
        calibrated[label] = (cal, suggested_overrides(cal.detections, {}))

    rows: dict[str, dict[str, list[bool]]] = {}
    runs: dict[str, list[int]] = {}

    def tally(rule: str, level: str, alarm: bool) -> None:
        rows.setdefault(rule, {}).setdefault(level, []).append(alarm)

    attempts = 1 + a.max_reruns
    for j, chk in enumerate(checks):
        for _ in range(a.pairs):
            for label, kb, kc, fresh in configs:
                needed = kc * attempts if fresh else 1
                if kb > len(bases) or needed > len(checks):
                    continue
                chosen = rng.sample(range(len(bases)), kb)
                mates = [j, *rng.sample([x for x in range(len(checks)) if x != j], needed - 1)]
                for bands in ("pr_test", "calibrated"):
                    if bands == "pr_test" and kb != 1:
                        continue
                    overrides = calibrated[label][1] if bands == "calibrated" else None
                    bl = _baseline_of(case, [bases[i] for i in chosen], a.max_repeats, overrides)
                    name = f"perfguard, {bands} bands, {label}"
                    for level in levels:
                        if fresh:  # every measurement, re-runs too, in other processes
                            groups = [
                                [checks[m][level][0] for m in mates[g * kc : (g + 1) * kc]]
                                for g in range(attempts)
                            ]
                        else:  # the re-runs are fresh pipelines in the same process
                            groups = [[chk[level][g]] for g in range(attempts)]
                        verdict, n = perfguard_gate(
                            case,
                            bl,
                            groups,
                            repeats=a.repeats,
                            max_repeats=a.max_repeats,
                            max_reruns=a.max_reruns,
                            fresh=fresh,
                        )
                        by = {m.metric: m for m in verdict.metrics}
                        tally(name, level, by[metric].verdict == REGRESSION)
                        tally(name + " [any metric]", level, verdict.verdict == REGRESSION)
                        runs.setdefault(name, []).append(n)
            saved = bases[rng.randrange(len(bases))]
            for level in levels:
                cur = chk[level][0]
                tally(
                    "sglang: 1 sample, max(1.25b, b+20ms)", level, sglang_alarm(saved, cur, metric)
                )
                tally(
                    "sglang rule with a CPU pad: max(1.25b, b+1.2ms)",
                    level,
                    sglang_cpu_pad_alarm(saved, cur, metric),
                )
                tally(
                    f"pytest-benchmark min:5% ({a.repeats} runs vs 1 saved run)",
                    level,
                    pytest_benchmark_alarm(saved, cur, metric, a.repeats),
                )

    judging_s = time.perf_counter() - t_judge
    print()
    print(
        f"Detection on {a.case}, injected into {a.stage} "
        f"({len(checks)} check processes x {a.pairs} baselines each; baselines from "
        f"{len(bases)} other processes; {len(cals)} calibration processes)"
    )
    loads = [
        v["_other_load"]
        for role in ("check", "base", "cal")
        for v in data[role].values()
        if "_other_load" in v
    ]
    if loads:
        attempts = [
            v.get("_attempts", 1) for role in ("check", "base", "cal") for v in data[role].values()
        ]
        busy = sum(x > a.max_other_load for x in loads)
        print(
            f"machine ({os.cpu_count()} cores): other jobs' load during a measured process "
            f"median {statistics.median(loads):.2f} cores, max {max(loads):.2f}; "
            f"{sum(n > 1 for n in attempts)} processes re-measured for it, "
            f"{busy} kept above {a.max_other_load:g} cores after {a.quiet_tries} tries"
        )
    denoise = [statistics.median(b[metric]) for b in bases]
    print(
        f"{a.stage} median per baseline process: {min(denoise):.2f}-{max(denoise):.2f} ms "
        f"(median {statistics.median(denoise):.2f})"
    )
    for label, *_ in configs:
        cal, overrides = calibrated[label]
        det = next(d for d in cal.detections if d.noise.metric == metric)
        print(
            f"calibrated band for {metric} ({label}): rel {det.suggested.rel:g}, "
            f"abs {det.suggested.abs:g} ms; calibrate predicted {det.suggested_false_alarm:.1%} "
            f"false alarms, >= 95 % caught from "
            f"{'not caught' if det.suggested_catches is None else f'+{det.suggested_catches:.0%}'}"
        )
    noise = calibrated[configs[0][0]][0].detections
    det = next(d for d in noise if d.noise.metric == metric)
    print(
        f"noise of {metric} in the calibration processes: within {det.noise.within:.1%}, "
        f"between {det.noise.between:.1%}"
    )
    print("pr_test band for it: rel 0.25, abs 1.2 ms")
    print()
    header = ["rule", "A/A false alarms"] + [f"+{x}% caught" for x in levels if float(x) > 0]
    header.append("runs/check")
    lines = [header]
    for rule, by_level in rows.items():
        row = [rule]
        for level in levels:
            hits = by_level[level]
            row.append(f"{sum(hits) / len(hits):6.1%} ({sum(hits)}/{len(hits)})")
        base_rule = rule.replace(" [any metric]", "")
        if base_rule in runs:
            row.append(f"{statistics.mean(runs[base_rule]):.1f}")
        else:
            row.append("1" if rule.startswith("sglang") else str(a.repeats))
        lines.append(row)
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    for k, r in enumerate(lines):
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
        if k == 0:
            print("-+-".join("-" * w for w in widths))
    print()
    print(
        f"wall time: {measured_s:.0f} s measuring, {judging_s:.0f} s judging; "
        "perfguard's runs/check count every run of every process, re-runs included"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
