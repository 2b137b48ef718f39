"""Detection benchmark: the README's default flow, in fresh processes, on the real smoke cases.

Each trial is one `perfguard check --tag smoke --baseline B` process, exactly as CI runs
it, against a baseline made by `perfguard gen-baselines --tag smoke` (the defaults: one
intra-op thread, 10 baseline processes, in-process check with confirmation in fresh
processes, contention screening). Conditions are interleaved round by round in a random
order, so a slow spell of the machine hits every condition alike:

- slowdown 0 (A/A), +5, +10, +20 %, made two ways: the timer's `--inject
  'DenoisingStage=+N%'` (busy work inside the stage, perfguard's own self-test), and
  `blocks`: a `sitecustomize` outside the project that busy-waits N % of each DiT
  transformer block's own time (benchmarks/slow_blocks/), which perfguard knows nothing
  about;
- load: `quiet`, `one-busy` (another process spinning on one of the two cores), and
  optionally `two-busy` (both cores: a contended verdict is the right answer).

Each check answers same (exit 0), slower (exit 1) or can't tell (exit 4), and so does
each case; the table counts the answers, the median `DenoisingStage` ratio and the
median slowdown each case's stage could have caught (`detectable`). A false alarm is a
check of unchanged code that answers slower, given with its 95 % upper confidence bound
(Clopper-Pearson); a miss is a slowed check that answers same. The baselines are
regenerated every `--checks-per-baseline` checks, so the trials do not all share one
baseline's luck.

`--revision NAME=DIR` (repeatable) compares checkouts: `python -m perfguard` runs with
DIR as its working directory, each revision keeps baselines of its own (made by its own
`gen-baselines`, with its own defaults), and every condition runs once per revision in
each round, in a random order, so the revisions share the machine's spells.

    python benchmarks/detection.py --budget-s 1800
    python benchmarks/detection.py --revision new=. --revision old=/tmp/old --budget-s 1200
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from scipy.stats import beta

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


ROOT = Path(__file__).resolve().parent.parent
SLOW_BLOCKS = ROOT / "benchmarks" / "slow_blocks"
CASES = ("qwen_image_t2i_smoke", "glm_image_t2i_smoke")
STAGE = "stage:DenoisingStage"


def upper95(k: int, n: int) -> float:
    """One-sided 95 % Clopper-Pearson upper bound of a rate seen k times in n."""
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def spinner() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def env_for(method: str, pct: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PERFGUARD_INJECT", None)
    env.pop("PERFGUARD_BENCH_SLOW_BLOCKS", None)
    if pct and method == "blocks":
        env["PYTHONPATH"] = os.pathsep.join([str(SLOW_BLOCKS), env.get("PYTHONPATH", "")])
        env["PERFGUARD_BENCH_SLOW_BLOCKS"] = str(pct / 100)
    return env


def gen_baseline(path: Path, extra: list[str] | None = None, cwd: Path = ROOT) -> float:
    t0 = time.perf_counter()
    path.unlink(missing_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "perfguard",
            "gen-baselines",
            "--tag",
            "smoke",
            "--baseline",
            str(path),
            "--no-progress",
            *(extra or []),
        ],
        check=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_for("", 0),
        cwd=cwd,
    )
    return time.perf_counter() - t0


def one_check(
    baseline: Path,
    method: str,
    pct: int,
    report: Path,
    extra: list[str] | None = None,
    cwd: Path = ROOT,
    keep: Path | None = None,
) -> dict:
    """One `perfguard check` process; with `keep`, its results are written there and its
    report beside them (`report-NNNN.json`)."""
    cmd = [
        sys.executable,
        "-m",
        "perfguard",
        "check",
        "--tag",
        "smoke",
        "--baseline",
        str(baseline),
        "--report",
        str(report),
        "--no-progress",
        *(extra or []),
    ]
    if pct and method == "inject":
        cmd += ["--inject", f"DenoisingStage=+{pct}%"]
    if keep is not None:
        cmd += ["--out", str(keep)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env_for(method, pct),
        check=False,
        cwd=cwd,
    )
    wall = time.perf_counter() - t0
    out: dict = {"exit": proc.returncode, "wall_s": wall, "cases": {}}
    if keep is not None and keep.exists():
        out["results"] = str(keep)
    if report.exists():
        data = json.loads(report.read_text())
        out["answer"] = data.get("answer")
        for cid, case in data["cases"].items():
            m = case["metrics"].get(STAGE, {})
            out["cases"][cid] = {
                "verdict": case["verdict"],
                "answer": case.get("answer"),
                "stage_verdict": m.get("verdict"),
                "stage_answer": (m.get("answer") or {}).get("answer"),
                "detectable": (m.get("answer") or {}).get("detectable"),
                "ratio": m.get("ratio"),
                "confirmations": (case.get("sampling") or {}).get("confirmations", 0),
                "regressed": sorted(
                    k for k, v in case["metrics"].items() if v.get("verdict") == "regression"
                ),
            }
        if keep is not None:
            kept = keep.with_name(keep.name.replace("check-", "report-", 1))
            shutil.move(report, kept)
            out["report"] = str(kept)
        else:
            report.unlink()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=1800.0)
    ap.add_argument("--levels", type=int, nargs="+", default=[0, 5, 10, 20])
    ap.add_argument("--methods", nargs="+", default=["inject", "blocks"])
    ap.add_argument("--loads", nargs="+", default=["quiet", "one-busy"])
    ap.add_argument(
        "--aa-weight",
        type=int,
        default=4,
        help="A/A checks per round for each load (false alarms need the most).",
    )
    ap.add_argument("--checks-per-baseline", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--revision",
        action="append",
        default=None,
        metavar="NAME=DIR",
        help="A checkout to measure (repeatable; default: this one), interleaved with the "
        "others condition by condition, each with baselines of its own.",
    )
    ap.add_argument("--json", default=None, help="Write every trial here.")
    ap.add_argument(
        "--gen-args",
        default="",
        help="More gen-baselines options, one string (e.g. '--repeats 15'): to measure "
        "what a larger baseline buys.",
    )
    ap.add_argument(
        "--check-variants",
        nargs="+",
        default=["default="],
        metavar="NAME=ARGS",
        help="Check settings to compare, each NAME=more check options (e.g. "
        "'reruns6=--max-reruns 6'): every condition runs once per variant in each round, "
        "in a random order, against the same baselines.",
    )
    ap.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="Keep every baseline, every check's results (--out) and its report in DIR, "
        "named in the --json trials, so that other settings can re-judge the same measurements "
        "(benchmarks/rejudge.py).",
    )
    args = ap.parse_args()
    keep = Path(args.keep).resolve() if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    checks = dict(v.split("=", 1) for v in args.check_variants)
    revisions = {
        n: Path(d).resolve()
        for n, _, d in (r.partition("=") for r in (args.revision or [f"this={ROOT}"]))
    }
    # A variant is a revision with check settings; with one revision it is named after
    # the settings alone, as before.
    variants = {
        (f"{rev}/{name}" if len(revisions) > 1 else name): (rev, extra)
        for rev in revisions
        for name, extra in checks.items()
    }
    conditions: list[tuple[str, str, str, int]] = []
    for name in variants:
        for load in args.loads:
            conditions += [(name, load, "none", 0)] * args.aa_weight
            conditions += [(name, load, m, p) for m in args.methods for p in args.levels if p]
    trials: list[dict] = []
    gen_times: dict[str, list[float]] = {rev: [] for rev in revisions}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        since_gen = dict.fromkeys(revisions, args.checks_per_baseline)
        rounds = 0
        while time.perf_counter() - start < args.budget_s:
            order = conditions[:]
            rng.shuffle(order)
            for variant, load, method, pct in order:
                if time.perf_counter() - start >= args.budget_s:
                    break
                rev, extra = variants[variant]
                base, cwd = Path(tmp) / f"baseline-{rev}.json", revisions[rev]
                if since_gen[rev] >= args.checks_per_baseline or not base.exists():
                    gen_times[rev].append(gen_baseline(base, args.gen_args.split(), cwd))
                    since_gen[rev] = 0
                    if keep is not None and base.exists():
                        kept_base = keep / f"baseline-{rev}-{len(gen_times[rev])}.json"
                        shutil.copyfile(base, kept_base)
                spin = [spinner() for _ in range({"quiet": 0, "one-busy": 1, "two-busy": 2}[load])]
                kept = keep / f"check-{len(trials):04d}.json" if keep is not None else None
                try:
                    res = one_check(base, method, pct, report, extra.split(), cwd, kept)
                finally:
                    for p in spin:
                        p.kill()
                        p.wait()
                res.update(variant=variant, load=load, method=method, pct=pct)
                if keep is not None:
                    res["baseline"] = str(keep / f"baseline-{rev}-{len(gen_times[rev])}.json")
                trials.append(res)
                since_gen[rev] += 1
            rounds += 1
    if args.json:
        Path(args.json).write_text(json.dumps({"trials": trials, "gen_s": gen_times}, indent=1))
    elapsed = time.perf_counter() - start
    gens = "; ".join(
        f"{rev}: {len(ts)} baselines, gen-baselines median {sorted(ts)[len(ts) // 2]:.1f} s"
        for rev, ts in gen_times.items()
        if ts
    )
    print(f"{len(trials)} checks in {rounds} rounds, {elapsed:.0f} s; {gens}")
    for name in variants:
        walls = sorted(t["wall_s"] for t in trials if t["variant"] == name)
        aa = sorted(t["wall_s"] for t in trials if t["variant"] == name and t["pct"] == 0)
        if walls:
            print(
                f"check wall time ({name}): median {walls[len(walls) // 2]:.1f} s, max "
                f"{walls[-1]:.1f} s; unchanged code: median {aa[len(aa) // 2]:.1f} s"
                if aa
                else f"check wall time ({name}): median {walls[len(walls) // 2]:.1f} s"
            )
    groups: dict[tuple[str, str, str, int], list[dict]] = defaultdict(list)
    for t in trials:
        groups[(t["variant"], t["load"], t["method"], t["pct"])].append(t)
    print()
    print(
        "| variant | load | slowdown | method | checks | slower | same | can't tell "
        "| other exits | qwen slower / same / can't tell | glm slower / same / can't tell "
        "| median DenoisingStage ratio (qwen / glm) | median detectable (qwen / glm) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (variant, load, method, pct), ts in sorted(groups.items()):
        n = len(ts)
        said = {a: sum(t.get("answer") == a for t in ts) for a in ("slower", "same", "cant_tell")}
        other = n - sum(said.values())

        def per_case(c: str, ts: list[dict] = ts) -> str:
            got = [t["cases"].get(c, {}).get("answer") for t in ts]
            return "/".join(str(got.count(a)) for a in ("slower", "same", "cant_tell"))

        def med(c: str, key: str, ts: list[dict] = ts, fmt: str = "{:.3f}") -> str:
            vs = sorted(
                t["cases"][c][key] for t in ts if t["cases"].get(c, {}).get(key) is not None
            )
            return fmt.format(vs[len(vs) // 2]) if vs else "-"

        k = said["slower"] if pct == 0 else said["same"]
        bound = f"{k}/{n} (95 % upper {upper95(k, n):.0%})"
        slower = bound if pct == 0 else f"{said['slower']}/{n}"
        same = f"{said['same']}/{n}" if pct == 0 else bound
        print(
            f"| {variant} | {load} | +{pct} % | {method} | {n} | {slower} | {same} | "
            f"{said['cant_tell']}/{n} | {other} | {per_case(CASES[0])} | {per_case(CASES[1])} | "
            f"{med(CASES[0], 'ratio')} / {med(CASES[1], 'ratio')} | "
            f"{med(CASES[0], 'detectable', fmt='+{:.0%}')} / "
            f"{med(CASES[1], 'detectable', fmt='+{:.0%}')} |"
        )
    false_alarms: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t in trials:
        if t["pct"] == 0:
            for c, v in t["cases"].items():
                for metric in v.get("regressed", []):
                    false_alarms[t["variant"]][f"{c}:{metric}"] += 1
    for name, counts in sorted(false_alarms.items()):
        most = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        print(f"A/A regressions ({name}): " + ", ".join(f"{m} x{k}" for m, k in most))


if __name__ == "__main__":
    main()
