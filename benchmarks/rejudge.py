"""Re-judge kept detection checks under other settings: the same measurements, other rules.

`benchmarks/detection.py --keep DIR --json T.json` keeps each check's pooled results
(`check --out`) and the baseline it ran against. This script judges every kept check
again for each `--alpha` and each `--max-reruns` cap, and prints the detection table of
each setting. The comparison is paired: every setting sees the same processes, so the
differences between settings are the rules', not the runner's.

A cap below the one the checks ran with is exact: the gate confirms one fresh process
at a time while a metric is over its bound, so a check with cap R would have stopped at
the first 1 + R process groups of the kept results, or earlier where it stopped anyway.
A cap above it cannot be replayed. `--sessions` replays each setting with other session
offsets (`Profile.session_sd`) in place of the ones the baselines carry: `none`, the
platform's default (`cpu`), or `class=sd,...`; `--process-ratios` with other process
screens (`ContentionPolicy.process_ratio`, 0: none). A case the screen finds contended
replays as `contended` (exit 4), where the gate would have waited and measured again.
The futility stop of the first measurement's runs tests the median's reach at the
check's own alpha, so a lower alpha replayed here sees the runs the check's alpha took
(a few more or fewer than its own stop would take).

The first setting listed (the checks' own) is also compared with the exit codes the checks
returned: a replay that does not reproduce them is reported, so a drift between this
script and the gate shows.

`--fit-reference` recovers the processes of baselines written before they were kept
(`inferred_groups`), so that the gate fits the reference's share as it does for a new
baseline (`perfguard.decision.normalize.fitted_exponent`); `--whole-reference` drops them,
so that every run is divided by the reference whole, as before.

It prints the A/A failures and mean ratios per baseline, the kept processes binned by
the reference workload beside them, the processes of each A/A check failing under the
first or the last setting, and each metric's session offset estimated from the A/A
checks (method of moments, per variant): the variance of the baselines' mean log ratio,
less what the baseline's own processes (its share of the between-process term) and the
checks' scatter around that mean explain. That is the figure `tolerances.SESSION_SD` is set from.

    python benchmarks/rejudge.py T.json --alphas 0.01 0.005 0.0025 --max-reruns 8 4 \
        --sessions none cpu
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from scipy.stats import beta

from perfguard.api import load_baseline
from perfguard.decision.comparison import Rule
from perfguard.decision.contention import PROCESS_RATIO, ContentionPolicy
from perfguard.decision.options import JudgeOptions
from perfguard.decision.tolerances import SESSION_SD
from perfguard.decision.verdict import judge_with
from perfguard.metrics import is_timed
from perfguard.results import CaseResult, Results
from perfguard.storage.reports import read_results

CASES = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")
TIME_CLASSES = ("e2e", "denoise_stage", "non_denoise_stage", "denoise_step", "denoise_agg")


def upper95(k: int, n: int) -> float:
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def lower95(k: int, n: int) -> float:
    return 0.0 if k == 0 else float(beta.ppf(0.05, k, n - k + 1))


def first_groups(result: CaseResult, groups: int) -> CaseResult:
    """`result` with only its first `groups` process groups (the first measurement and
    the confirmations a smaller --max-reruns would have allowed)."""
    sizes = result.groups or [len(result.reference)]
    runs = sum(sizes[:groups])
    return result.only_runs([i < runs for i in range(len(result.reference))])


def capped(results: Results, reruns: int) -> Results:
    return dataclasses.replace(
        results,
        cases={
            cid: first_groups(c, 1 + reruns) if c.status == "ok" else c
            for cid, c in results.cases.items()
        },
    )


def inferred_groups(scenario):
    """The runs of each process of a baseline written before `Scenario.groups` was kept,
    recovered from what it did keep: its samples in order and its per-process medians.
    A process ran `(runs + dropped runs) / processes` runs (`gen-baselines` gives each
    the same number) and the screen only removed some, so the split is into that many
    consecutive groups of at most that many runs whose medians match the stored ones (to
    their 3 digits) on every timed metric with all the runs; the split when exactly one
    does, else None (the replay then divides by the reference whole, as such a baseline
    is judged)."""
    summaries = [
        s
        for m, s in scenario.metrics.items()
        if is_timed(m) and s.samples and s.processes and len(s.samples) == scenario.reference.n
    ]
    if not summaries:
        return None
    n, k = len(summaries[0].samples), len(summaries[0].processes)
    longest = (n + (scenario.dropped_runs or 0)) // k

    def fits(a: int, b: int, j: int) -> bool:
        return all(
            abs(statistics.median(s.samples[a:b]) - s.processes[j]) <= 0.0015 for s in summaries
        )

    found: list[list[int]] = []

    def walk(at: int, j: int, sizes: list[int]) -> None:
        if len(found) > 1:
            return
        if j == k:
            if at == n:
                found.append(list(sizes))
            return
        for size in range(1, longest + 1):
            if at + size <= n and fits(at, at + size, j):
                walk(at + size, j + 1, [*sizes, size])

    walk(0, 0, [])
    return tuple(found[0]) if len(found) == 1 else None


def with_groups(base):
    """`base` with `Scenario.groups` recovered where it lacks them (`inferred_groups`)."""
    scenarios = {}
    for cid, sc in base.scenarios.items():
        if sc.groups is None and sc.normalized:
            sc = dataclasses.replace(sc, groups=inferred_groups(sc))
        scenarios[cid] = sc
    return dataclasses.replace(base, scenarios=scenarios)


def without_groups(base):
    """`base` judged as before the reference's share was fitted: no `Scenario.groups`."""
    scenarios = {cid: dataclasses.replace(sc, groups=None) for cid, sc in base.scenarios.items()}
    return dataclasses.replace(base, scenarios=scenarios)


def session_figures(spec: str) -> dict[str, float] | None:
    """`none` -> {}, a platform of `SESSION_SD` -> its figures, `class=sd,...` -> those;
    `baseline` -> None (each baseline's own)."""
    if spec == "baseline":
        return None
    if spec == "none":
        return {}
    if spec in SESSION_SD:
        return dict(SESSION_SD[spec])
    out = {}
    for part in spec.split(","):
        kind, _, value = part.partition("=")
        if kind not in TIME_CLASSES:
            raise SystemExit(f"--sessions: unknown metric class {kind!r} in {spec!r}")
        out[kind] = float(value)
    return out


def with_sessions(base, figures: dict[str, float] | None):
    """`base` with every profile's session offsets replaced by `figures` (None: as is)."""
    if figures is None:
        return base
    return dataclasses.replace(
        base,
        profiles={n: dataclasses.replace(p, session_sd=figures) for n, p in base.profiles.items()},
    )


def session_estimates(noise: dict[tuple, dict[str, list]]) -> list[str]:
    """Per (variant, case, metric), the session offset's sd estimated from the A/A checks:
    var(baseline means) - mean(check scatter / checks) - mean(baseline's between share)."""
    lines = []
    for (variant, case, metric), by_base in sorted(noise.items()):
        groups = [v for v in by_base.values() if len(v) > 2]
        if len(groups) < 3:
            continue
        means = [statistics.fmean(x[0] for x in v) for v in groups]
        scatter = statistics.fmean(statistics.pvariance([x[0] for x in v]) / len(v) for v in groups)
        own = statistics.fmean(x[1] for v in groups for x in v)
        tau2 = statistics.variance(means) - scatter - own
        lines.append(
            f"  {variant} {case} {metric}: baselines' mean log ratio sd "
            f"{statistics.stdev(means):.1%}; session offset sd {math.sqrt(max(tau2, 0.0)):.1%}"
        )
    return lines


BINS = (0.0, 0.95, 1.05, 1.10, 1.15, 1.20, 1.30)


def process_figures(result: CaseResult, scenario) -> list[tuple[float, float]]:
    """Per process of `result`: its quiet runs' reference median over the baseline's and
    its normalized `DenoisingStage` median over the baseline's (runs over the 1.3x run
    screen left out; a process with none left is skipped)."""
    if result.status != "ok" or scenario is None or scenario.reference is None:
        return []
    ref = scenario.reference.median
    stage = scenario.metrics["stage:DenoisingStage"].median
    out, at = [], 0
    for size in result.groups or [len(result.reference)]:
        runs = zip(
            result.reference[at : at + size],
            result.samples["stage:DenoisingStage"][at : at + size],
            strict=True,
        )
        at += size
        quiet = [(x, y) for x, y in runs if x <= 1.3 * ref]
        if quiet:
            speed = statistics.median(x for x, _ in quiet) / ref
            out.append((speed, statistics.median(y * ref / x for x, y in quiet) / stage))
    return out


def slow_processes(trials: list[dict], baselines: dict, kept: dict[str, Results]) -> list[str]:
    """Per variant, case and slowdown, the kept checks' processes binned by their reference
    median over the baseline's, with the median and sd of their normalized
    `DenoisingStage` over the baseline's (`process_figures`): what the process screen
    (`contention.PROCESS_RATIO`) is set from."""
    bins: dict[tuple, list[float]] = defaultdict(list)
    for t in trials:
        scenarios = baselines[t["baseline"]].scenarios
        for cid, r in kept[t["results"]].cases.items():
            for speed, norm in process_figures(r, scenarios.get(cid)):
                lo = max(b for b in BINS if b <= speed)
                bins[(t["variant"], cid, t["pct"], lo)].append(math.log(norm))
    lines = [
        "| variant | case | slowdown | process reference / baseline's | processes "
        "| normalized DenoisingStage / baseline's: median | sd |",
        "|---|---|---|---|---|---|---|",
    ]
    for (variant, cid, pct, lo), logs in sorted(bins.items()):
        hi = BINS[BINS.index(lo) + 1] if lo != BINS[-1] else math.inf
        sd = f"{statistics.stdev(logs):.1%}" if len(logs) > 2 else ""
        lines.append(
            f"| {variant} | {cid} | +{pct} % | {lo:.2f}-{hi:.2f} | {len(logs)} "
            f"| {math.exp(statistics.median(logs)):.3f} | {sd} |"
        )
    return lines


def offsets(trials: list[dict]) -> list[str]:
    """Per variant, how the A/A checks' failures and `DenoisingStage` ratios fall by the
    baseline they ran against: the offset a baseline carries from its session."""
    aa: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for t in trials:
        if t["pct"] == 0:
            aa[t["variant"]][t["baseline"]].append(t)
    lines = []
    for variant, by_base in sorted(aa.items()):
        fails = sorted(
            ((sum(t["exit"] == 1 for t in ts), len(ts)) for ts in by_base.values()), reverse=True
        )
        lines.append(
            f"A/A failures per baseline ({variant}, as the checks ran): "
            f"{', '.join(f'{k}/{n}' for k, n in fails)} ({len(by_base)} baselines)"
        )
        for name, ts in sorted(by_base.items()):
            means = []
            for case in CASES:
                logs = [math.log(r) for t in ts if (r := t["cases"][case].get("ratio"))]
                means.append(f"{case.split('_')[0]} {math.exp(statistics.fmean(logs)):.3f}")
            lines.append(
                f"  {Path(name).name}: {sum(t['exit'] == 1 for t in ts)}/{len(ts)} failed; "
                f"geometric mean A/A DenoisingStage ratio {', '.join(means)}"
            )
        for case in CASES:
            logs = [
                [math.log(t["cases"][case]["ratio"]) for t in ts if t["cases"][case].get("ratio")]
                for ts in by_base.values()
            ]
            logs = [v for v in logs if len(v) > 2]
            between = statistics.stdev(statistics.fmean(v) for v in logs)
            within = math.sqrt(statistics.fmean(statistics.pvariance(v) for v in logs))
            lines.append(
                f"  {case}: sd of the baselines' mean A/A log DenoisingStage ratio "
                f"{between:.1%}, within a baseline {within:.1%}"
            )
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trials", help="The --json of a detection.py run made with --keep.")
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.01, 0.005, 0.0025])
    ap.add_argument("--max-reruns", type=int, nargs="+", default=[4])
    ap.add_argument(
        "--sessions",
        nargs="+",
        default=["baseline"],
        help="session offsets to replay with: baseline (each baseline's own), none, cpu, "
        "or class=sd,... (e.g. non_denoise_stage=0.04,denoise_step=0.015)",
    )
    ap.add_argument(
        "--process-ratios",
        type=float,
        nargs="+",
        default=[PROCESS_RATIO],
        help="process screens to replay with (0: none)",
    )
    ap.add_argument(
        "--fit-reference",
        action="store_true",
        help="recover the processes of baselines written before they were kept "
        "(inferred_groups), so that the reference's share is fitted as for a new baseline",
    )
    ap.add_argument(
        "--whole-reference",
        action="store_true",
        help="drop the baselines' processes (Scenario.groups), so that every timed run is "
        "divided by the reference whole, as the gate judged before it fitted the share",
    )
    args = ap.parse_args(argv)
    trials = [t for t in json.loads(Path(args.trials).read_text())["trials"] if "results" in t]
    baselines: dict[str, object] = {}
    sessions = {spec: session_figures(spec) for spec in args.sessions}
    settings = [
        (a, r, spec, pr)
        for pr in args.process_ratios
        for spec in args.sessions
        for r in args.max_reruns
        for a in args.alphas
    ]
    # (variant, case, metric) -> baseline -> [(log ratio, the baseline's share of between^2)]
    aa_noise: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    # (setting, variant, pct) -> [alarms, checks, qwen caught, glm caught, contended]
    table: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    culprits: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    mismatches = 0
    kept: dict[str, Results] = {}
    # A/A checks failing under the first or the last setting -> (setting, failing metrics)
    failing: list[tuple[dict, tuple, list[str]]] = []
    for t in trials:
        if t["baseline"] not in baselines:
            base = load_baseline(t["baseline"])
            if args.fit_reference:
                base = with_groups(base)
            elif args.whole_reference:
                base = without_groups(base)
            baselines[t["baseline"]] = base
        base = baselines[t["baseline"]]
        results = kept[t["results"]] = read_results(t["results"])
        for i, (alpha, reruns, spec, pr) in enumerate(settings):
            policy = ContentionPolicy(process_ratio=pr)
            judging = JudgeOptions(rule=Rule(alpha=alpha), max_reruns=reruns, policy=policy)
            judgement = judge_with(
                judging, capped(results, reruns), with_sessions(base, sessions[spec])
            )
            code = judgement.exit_code
            if i == 0 and t["exit"] in (0, 1) and code != t["exit"]:
                mismatches += 1
            if i == 0 and t["pct"] == 0:
                for c in judgement.cases:
                    for m in c.metrics:
                        n = m.noise
                        if n is None or not m.low or not m.high or n.between <= 0:
                            continue
                        kb, kc = n.processes_baseline, n.processes_current
                        own = n.between**2 * (1 / kb) / (1 / kb + 1 / kc)
                        key = (t["variant"], c.case_id, m.metric)
                        aa_noise[key][t["baseline"]].append((math.log(m.low * m.high) / 2, own))
            verdicts = {c.case_id: c.verdict for c in judgement.cases}
            row = table[((alpha, reruns, spec, pr), t["variant"], t["pct"])]
            row[0] += code == 1
            row[1] += 1
            row[2] += verdicts.get(CASES[0]) == "regression"
            row[3] += verdicts.get(CASES[1]) == "regression"
            row[4] += code == 4
            if t["pct"] == 0 and code == 1 and i in (0, len(settings) - 1):
                bad = [
                    f"{c.case_id}:{m.metric}"
                    for c in judgement.cases
                    for m in c.metrics
                    if m.verdict == "regression"
                ]
                failing.append((t, (alpha, reruns, spec, pr), bad))
            if t["pct"] == 0:
                seen = culprits[((alpha, reruns, spec, pr), t["variant"])]
                for c in judgement.cases:
                    for m in c.metrics:
                        seen[f"{c.case_id}:{m.metric}"] += m.verdict == "regression"
    print(
        f"{len(trials)} kept checks re-judged under {len(settings)} settings; replays of the "
        f"first setting that differ from the check's exit code: {mismatches}"
    )
    print()
    print(
        "| alpha | max reruns | sessions | process screen | variant | slowdown | checks "
        "| exit 1 | exit 4 | qwen caught | glm caught |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for ((alpha, reruns, spec, pr), variant, pct), (k, n, q, g, c4) in sorted(table.items()):
        if pct == 0:
            rate = f"{k}/{n} = {k / n:.1%} (95 % upper {upper95(k, n):.1%})"
        else:
            rate = f"{k}/{n} = {k / n:.0%} (95 % lower {lower95(k, n):.0%})"
        print(
            f"| {alpha:g} | {reruns} | {spec} | {pr:g} | {variant} | +{pct} % | {n} | {rate} "
            f"| {c4} | {q}/{n} | {g}/{n} |"
        )
    print("\n".join(offsets(trials)))
    print("\nthe kept checks' processes by the reference workload beside them:")
    print("\n".join(slow_processes(trials, baselines, kept)))
    print("\nA/A checks failing under the first or the last setting, process by process")
    print("(reference / baseline's, normalized DenoisingStage / baseline's):")
    for t, (alpha, _reruns, spec, pr), bad in failing:
        scenarios = baselines[t["baseline"]].scenarios
        procs = {
            cid.split("_")[0]: " ".join(
                f"{a:.2f}/{b:.2f}" for a, b in process_figures(r, scenarios.get(cid))
            )
            for cid, r in kept[t["results"]].cases.items()
        }
        print(
            f"  {Path(t['results']).name} (alpha {alpha:g}, sessions {spec}, screen {pr:g}): "
            f"{', '.join(bad)}; " + "; ".join(f"{c}: {v}" for c, v in procs.items())
        )
    print("session offsets estimated from the A/A checks:")
    print("\n".join(session_estimates(aa_noise)))
    for ((alpha, reruns, spec, pr), variant), counts in sorted(culprits.items()):
        most = sorted(((m, k) for m, k in counts.items() if k), key=lambda kv: (-kv[1], kv[0]))
        print(
            f"A/A regressions (alpha {alpha:g}, reruns {reruns}, sessions {spec}, "
            f"process screen {pr:g}, {variant}): " + ", ".join(f"{m} x{k}" for m, k in most)
        )


if __name__ == "__main__":
    main()
