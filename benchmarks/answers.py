"""The stored check's three answers on simulated runners: how often it says same, slower
or can't tell, for unchanged code and for slowdowns of the denoising loop.

Recorded processes (a `perfguard run --processes K --out FILE` results file of real runs)
are resampled into checks: a baseline of `--baseline-processes` of them, a check of
others, each process's samples multiplied by exp(N(0, sd)) (a runner whose processes
differ by `sd`, on top of what the recording already had) and, for the check, the
denoising stage, its steps and their aggregates by 1 + effect (e2e by the stage's added
time). Each check goes through the real gate (`perfguard.decision.gate.run_gate`, the
default options: confirmations while a figure is over its bound or can't tell), which
draws every fresh process from the recording the same way.

    python benchmarks/answers.py /tmp/rec/setA.json --sd 0 0.02 0.10 0.20 --effects 0 5 10
    python benchmarks/answers.py A.json --report-on B.json   # baselines of A, checks of B

Nothing here is tuned: the rule's constants are fixed in perfguard/decision/; this prints
what they give. Timings are compared raw (the recorded reference readings are dropped):
simulated jitter is not on the reference workload, so normalizing could not remove it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfguard.decision.gate import run_gate
from perfguard.decision.options import JudgeOptions
from perfguard.decision.tolerances import SESSION_SD
from perfguard.results import CaseResult, Results, pool
from perfguard.storage.baseline import new_baseline
from perfguard.storage.cases import Case
from perfguard.storage.refresh import scenario_from_result

LOOP = ("stage:DenoisingStage", "step_avg", "step_median")
HEADLINE = ("e2e", "stage:DenoisingStage")


def processes(
    path: Path, center: bool = False, within: float | None = None
) -> dict[str, list[dict[str, list[float]]]]:
    """Per case, the recorded processes: each a dict metric -> its samples. `center`
    scales each process to the case's median process, figure by figure: the recording
    keeps its spread within a process and loses the spread between processes, which the
    simulation then sets (`--sd`). `within` rescales each run's log deviation from its
    process's median so that their sd over the case is `within` (the recording's shape,
    skew and outliers kept, its size set): a quiet runner from a busy recording."""
    data = json.loads(path.read_text())
    out: dict[str, list[dict[str, list[float]]]] = {}
    for cid, case in data["cases"].items():
        res = CaseResult.from_json(cid, case)
        if res.status != "ok" or not res.groups:
            continue
        # Only the metrics every run measured (peak memory comes from one counted run).
        runs = sum(res.groups)
        timed = {m: v for m, v in res.samples.items() if len(v) == runs}
        start, procs = 0, []
        for n in res.groups:
            procs.append({m: list(v[start : start + n]) for m, v in timed.items()})
            start += n
        if within is not None:
            for m in timed:
                devs = [
                    math.log(x / statistics.median(p[m]))
                    for p in procs
                    for x in p[m]
                    if x > 0 and statistics.median(p[m]) > 0
                ]
                spread = statistics.pstdev(devs) if len(devs) > 1 else 0.0
                k = within / spread if spread > 0 else 1.0
                for p in procs:
                    mid = statistics.median(p[m])
                    p[m] = [mid * (x / mid) ** k if x > 0 and mid > 0 else x for x in p[m]]
        if center:
            for m in timed:
                overall = statistics.median(statistics.median(p[m]) for p in procs)
                for p in procs:
                    own = statistics.median(p[m])
                    p[m] = [x * overall / own for x in p[m]] if own > 0 else p[m]
        out[cid] = procs
    return out


def _process(
    recorded: dict[str, list[float]],
    rng: random.Random,
    sd: float,
    effect: float,
    offset: float = 1.0,
) -> dict[str, list[float]]:
    factor = offset * (rng.lognormvariate(0.0, sd) if sd > 0 else 1.0)
    out = {m: [x * factor for x in v] for m, v in recorded.items()}
    if effect:
        stage = out.get("stage:DenoisingStage", [])
        for m in out:
            if m in LOOP or m.startswith("step:"):
                out[m] = [x * (1 + effect) for x in out[m]]
        if "e2e" in out and stage:
            out["e2e"] = [e + s * effect for e, s in zip(out["e2e"], stage, strict=True)]
    return out


def _result(cid: str, procs: Sequence[dict[str, list[float]]]) -> CaseResult:
    parts = [CaseResult(case_id=cid, samples=p, repeats=len(next(iter(p.values())))) for p in procs]
    return pool(parts, True) if len(parts) > 1 else parts[0]


def one_check(
    cid: str,
    base_pool: list[dict[str, list[float]]],
    check_pool: list[dict[str, list[float]]],
    rng: random.Random,
    sd: float,
    effect: float,
    baseline_processes: int,
    session: float = 0.0,
    session_term: float | None = None,
    max_reruns: int | None = None,
    timing_gate: str = "auto",
) -> tuple[str | None, int, dict[str, float]]:
    """One simulated check: its answer, exit code and headline detectable slowdowns.

    `session`: the sd of an offset shared by every process of one session (the
    baseline's, and the check's own), which no process of it shows. `session_term`:
    the sd the verdict's interval allows for it on the large figures (None: the profile's
    own, `tolerances.SESSION_SD`; 0: none)."""
    chosen = rng.sample(range(len(base_pool)), baseline_processes)
    base_offset = rng.lognormvariate(0.0, session) if session > 0 else 1.0
    check_offset = rng.lognormvariate(0.0, session) if session > 0 else 1.0
    base = _result(cid, [_process(base_pool[i], rng, sd, 0.0, base_offset) for i in chosen])
    baseline = new_baseline({"platform": "cpu", "hardware": "sim"})
    if session_term is not None:  # another term than the profiles': SESSION_SD's large
        # figures set to `session_term`, the small stages' scaled with them (0: none)
        scale = session_term / SESSION_SD["cpu"]["denoise_stage"]
        terms = {k: v * scale for k, v in SESSION_SD["cpu"].items()} if scale else {}
        baseline = dataclasses.replace(
            baseline,
            profiles={
                n: dataclasses.replace(p, session_sd=terms) for n, p in baseline.profiles.items()
            },
        )
    baseline = baseline.with_scenario(cid, scenario_from_result(base))
    # Held out: the check's processes come from the other recording; the same one, the
    # processes the baseline did not use.
    spare = [p for i, p in enumerate(check_pool) if check_pool is not base_pool or i not in chosen]

    def measure(cases: Sequence[Case], _until: Any) -> Results:
        res = _result(cid, [_process(rng.choice(spare), rng, sd, effect, check_offset)])
        return Results(environment={}, settings={}, cases={cid: res})

    case = Case(id=cid, workload="qwen_image", preset="tiny")
    judging = JudgeOptions(timing_gate=timing_gate)
    if max_reruns is not None:
        judging = judging.replace(max_reruns=max_reruns)
    outcome = run_gate([case], baseline, judging, measure, sleep=lambda _s: None)
    (verdict,) = outcome.judgement.cases
    detectable = {
        m.metric: m.answer.detectable
        for m in verdict.metrics
        if m.metric in HEADLINE and m.answer is not None and m.answer.detectable is not None
    }
    return verdict.answer, outcome.judgement.exit_code, detectable


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording", type=Path, help="results file of recorded processes")
    ap.add_argument("--report-on", type=Path, help="draw the checks from this recording")
    ap.add_argument("--sd", type=float, nargs="+", default=[0.0, 0.02, 0.10, 0.20])
    ap.add_argument("--effects", type=float, nargs="+", default=[0.0, 5.0, 10.0])
    ap.add_argument("--checks", type=int, default=100, help="checks per case and cell")
    ap.add_argument("--baseline-processes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--session-sd",
        type=float,
        default=0.0,
        help="sd of the offset one session shares across its processes (baseline, check)",
    )
    ap.add_argument(
        "--session-term",
        type=float,
        default=None,
        metavar="SD",
        help="judge with this session term on the large figures instead of the profile's "
        "(tolerances.SESSION_SD; 0: none): what a term buys",
    )
    ap.add_argument(
        "--max-reruns",
        type=int,
        default=None,
        help="fresh processes a check may add (default: the gate's; --rigorous: 16)",
    )
    ap.add_argument(
        "--within",
        type=float,
        default=None,
        help="rescale the recording's within-process spread to this sd (a quieter runner)",
    )
    ap.add_argument(
        "--center",
        action="store_true",
        help="remove the recording's own between-process spread (a busy recording)",
    )
    ap.add_argument(
        "--timing-gate",
        default="auto",
        choices=("auto", "gate", "advise"),
        help="the check's timing gate (perfguard/decision/resolution.py)",
    )
    ap.add_argument("--json", type=Path, help="write every cell's counts here")
    args = ap.parse_args(argv)
    base_rec = processes(args.recording, args.center, args.within)
    check_rec = processes(args.report_on, args.center, args.within) if args.report_on else base_rec
    cases = sorted(set(base_rec) & set(check_rec))
    if not cases:
        print("no case with recorded processes in both files", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    rows = []
    print(
        f"baselines from {args.recording}, checks from {args.report_on or args.recording}; "
        f"cases {', '.join(cases)}; {args.checks} checks per case and cell"
        + ("; recorded processes centered" if args.center else "")
        + (f"; within-process sd set to {args.within:g}" if args.within is not None else "")
        + f"; session offset sd {args.session_sd:g}"
        + ("" if args.session_term is None else f"; session term {args.session_term:g}")
        + ("" if args.max_reruns is None else f"; at most {args.max_reruns} fresh processes")
        + f"; timing gate {args.timing_gate}"
    )
    print(f"{'sd':>5} {'effect':>7} {'checks':>6} {'same':>6} {'slower':>7} {'cant':>6} "
          f"{'below':>6} {'exit1':>6} {'exit4':>6} {'detect e2e':>11} "
          f"{'detect stage':>13}")  # fmt: skip
    for sd in args.sd:
        for effect in args.effects:
            answers: list[str | None] = []
            exits: list[int] = []
            det: dict[str, list[float]] = {m: [] for m in HEADLINE}
            for cid in cases:
                for _ in range(args.checks):
                    a, code, d = one_check(
                        cid, base_rec[cid], check_rec[cid], rng, sd, effect / 100,
                        args.baseline_processes, args.session_sd, args.session_term,
                        args.max_reruns, args.timing_gate,
                    )  # fmt: skip
                    answers.append(a)
                    exits.append(code)
                    for m, v in d.items():
                        det[m].append(v)
            n = len(answers)
            row = {
                "sd": sd,
                "effect_pct": effect,
                "checks": n,
                "same": answers.count("same"),
                "slower": answers.count("slower"),
                "cant_tell": answers.count("cant_tell"),
                "unresolved": answers.count("unresolved"),
                "exit_1": exits.count(1),
                "exit_4": exits.count(4),
                "detectable_median": {m: statistics.median(v) for m, v in det.items() if v},
            }
            rows.append(row)
            dm = row["detectable_median"]
            print(
                f"{sd:5.2f} {effect:6.0f}% {n:6d} {row['same'] / n:6.1%} {row['slower'] / n:7.1%} "
                f"{row['cant_tell'] / n:6.1%} {row['unresolved'] / n:6.1%} "
                f"{row['exit_1']:6d} {row['exit_4']:6d} "
                f"{dm.get('e2e', float('nan')):11.1%} "
                f"{dm.get('stage:DenoisingStage', float('nan')):13.1%}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
