"""Relative-check benchmark: A/A false alarms and catch rates of `perfguard compare --against`.

Live checks. Round-robin over the conditions (A/A, then +5 % and +10 % busy work in
`DenoisingStage`), it runs real relative checks of the smoke cases until `--minutes`
are up, each one exactly as CI does:

    python -m perfguard compare --platform cpu --tag smoke --against REPO [--inject ...]

The base is this checkout itself (so A/A compares identical code, the base side through
the base's import path), and the slowdown is injected into the head side only
(`--inject` never reaches the base). Each check is one trial; a false alarm or a catch is
its exit code 1. The table gives the rate with its 95 % Clopper-Pearson interval, the
median wall time of a check and the median number of blocks it used.

Resampled checks (`--resample N`). Live checks take minutes each, too few for a false
alarm rate near 1 %. So every block the live checks measured (both cases, every metric,
both sides) goes into a pool per condition, and N further checks are replayed through
the real schedule and rule (`perfguard.measurement.relative.run_relative`) on blocks dealt from the
shuffled pool (distinct blocks within a check; a pool of at least twice the maximum
blocks of a check), each on a virtual clock that advances by the block's own measured
duration. They assume blocks are exchangeable (no drift across the benchmark): an
estimate of what more live checks would show, labelled as such in the output. Each
pool is replayed once per `--timing`, per `--levels` (how each look's level is set:
perfguard's simulated one, or Bonferroni's `alpha / (K + 1)`) and per `--max-blocks`;
run another checkout's copy of this script with `--replay --out DIR` to replay the same
blocks through its rules.

With at least three live A/A checks it also prints, per metric, the sd of the checks'
mean per-block log ratio against their standard error (`check_offsets`): blocks that
are independent give a ratio of about 1; and the median over checks of the sd of a
check's per-block log ratios (how far a block's two sides differ).

Run late on a shared machine, at normal priority: `python benchmarks/relative.py
--minutes 30 --out /tmp/relative`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_MAX_BLOCKS = 24  # perfguard.measurement.relative.DEFAULT_MAX_BLOCKS (no torch import here)

CONDITIONS = {"A/A": None, "+5%": "DenoisingStage=+5%", "+10%": "DenoisingStage=+10%"}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval for k successes in n trials."""
    from scipy.stats import beta

    if n == 0:
        return 0.0, 1.0
    a = (1 - level) / 2
    low = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return low, high


def live_check(
    out: Path, index: int, name: str, spec: str | None, tag: str, extra: Sequence[str] = ()
) -> dict[str, Any]:
    report = out / f"check-{index:03d}-{name.strip('+%/').replace('/', '') or 'aa'}.json"
    cmd = [sys.executable, "-m", "perfguard", "compare", "--platform", "cpu", "--tag", tag]
    head, base = report.with_suffix(".head.json"), report.with_suffix(".base.json")
    cmd += ["--against", str(REPO), "--report", str(report)]
    cmd += ["--out", str(head), "--write-baseline", str(base)]
    if spec:
        cmd += ["--inject", spec]
    cmd += list(extra)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("PERFGUARD_INJECT", None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 1) or not report.is_file():
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"condition": name, "code": proc.returncode, "wall_s": wall, "error": tail}
    data = json.loads(report.read_text())
    return {
        "condition": name,
        "code": proc.returncode,
        "wall_s": wall,
        "blocks": data["against"]["blocks"],
        "stopped": data["against"]["stopped"],
        "report": str(report),
        "head": str(head),
        "base": str(base),
        "failing": sorted(
            f"{cid}:{m}"
            for cid, c in data["cases"].items()
            for m, v in c["metrics"].items()
            if v["verdict"] == "regression"
        ),
    }


# ---- resampling the measured blocks -------------------------------------------------------------


def blocks_of(
    row: dict[str, Any], timing: str = "raw"
) -> list[tuple[float, dict[str, dict[str, dict[str, float]]]]]:
    """(seconds, {side: {case: {metric: median}}}) of each block a live check measured.

    The head side's per-block medians come from its results (`--out`: every sample, with
    the runs of each block as a group), the base side's from the baseline it wrote
    (`--write-baseline`: each metric's per-process medians); the report is not enough,
    since a metric decided at an early look is summarized over that look's blocks only.
    With `timing` normalized, a timed metric's block median is that of its runs scaled
    by the reference time beside each, on both sides, by the share of the reference
    fitted on the check's runs (as `check --against` compares them:
    `perfguard.decision.paired.reference_exponent`); `whole` divides by the reference
    whole (the check's rule before it fitted the share). The base's runs come from the
    baseline's samples (stored `x * level / reference` when the baseline is normalized).
    """
    from perfguard.decision.normalize import fitted_exponent, scaled_to_reference
    from perfguard.decision.stats import split_groups
    from perfguard.metrics import is_timed
    from perfguard.storage.baseline import load
    from perfguard.storage.reports import read_results

    seconds = json.loads(Path(row["report"]).read_text())["against"]["block_seconds"]
    head, base = read_results(row["head"]), load(row["base"])
    out = [(s, {"B": {}, "H": {}}) for s in seconds]
    for cid, res in head.cases.items():
        scenario = base.scenarios[cid]
        groups = res.groups or ()
        runs = sum(groups)
        for metric, values in res.samples.items():
            if len(values) == len(groups):  # one figure a block (peak memory)
                per_block = list(values)
                base_blocks = list(scenario.metrics[metric].processes or ())
            elif len(values) == runs:
                xs, refs = list(values), list(res.reference or [])
                base_blocks = list(scenario.metrics[metric].processes or ())
                if timing != "raw" and is_timed(metric):
                    bx, brefs = _base_runs(scenario, metric, groups)
                    if len(refs) == runs and bx:
                        exponent = 1.0
                        if timing == "normalized":
                            fitted = fitted_exponent([(xs, refs), (bx, brefs)])
                            exponent = 1.0 if fitted is None else fitted
                        xs, bx = (
                            scaled_to_reference(xs, refs, 1.0, exponent),
                            scaled_to_reference(bx, brefs, 1.0, exponent),
                        )
                    base_blocks = [_median(g) for g in split_groups(bx, groups)] if bx else []
                per_block = [_median(g) for g in split_groups(xs, groups)]
            else:
                continue
            if len(per_block) != len(out) or len(base_blocks) != len(out):
                continue
            for i in range(len(out)):
                out[i][1]["H"].setdefault(cid, {})[metric] = per_block[i]
                out[i][1]["B"].setdefault(cid, {})[metric] = base_blocks[i]
    return out


def _base_runs(
    scenario: Any, metric: str, groups: Sequence[int]
) -> tuple[list[float], list[float]]:
    """The base side's raw runs of `metric` and the reference readings beside them, from
    the baseline it wrote (empty when they do not align with the head's blocks)."""
    from perfguard.decision.normalize import aligned

    xs = list(scenario.metrics[metric].samples or ())
    refs = list(scenario.reference.samples or ()) if scenario.reference else []
    if len(xs) != sum(groups) or not aligned(xs, refs):
        return [], []
    if scenario.normalized:  # stored as x * level / reference: undo it
        xs = [x * r / scenario.reference.median for x, r in zip(xs, refs, strict=True)]
    return xs, refs


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


class Replay:
    """A `MeasureBlock` that deals measured blocks from a shuffled pool, on a virtual clock.

    Without replacement within a check: a block drawn twice would make the check's
    blocks agree with each other more than measured blocks do, and call noise a change.
    """

    def __init__(self, pool: Sequence[Any], rng: random.Random) -> None:
        self.pool = list(pool)
        rng.shuffle(self.pool)
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(self, index: int, order: str, todo: Sequence[Any]) -> dict[str, dict[str, Any]]:
        from perfguard.results import CaseResult

        seconds, blk = self.pool.pop()
        self.now += seconds
        out: dict[str, dict[str, Any]] = {"B": {}, "H": {}}
        for side in ("B", "H"):
            for case in todo:
                res = CaseResult(case.id, repeats=1)
                res.samples = {m: [v] for m, v in blk[side][case.id].items()}
                out[side][case.id] = res
        return out


LEVELS = ("simulated", "bonferroni")
"""How a replayed check sets the level of each look: perfguard's (`simulated`, the
family-wise rate over the schedule found by simulation) or the earlier `alpha / (K + 1)`."""


@contextlib.contextmanager
def level_per_look(kind: str) -> Iterator[None]:
    """The relative check's per-look level set the `kind` way while the block lasts."""
    from perfguard.decision import paired

    if kind == "simulated":
        yield
        return
    real = paired.alpha_per_look
    paired.alpha_per_look = lambda alpha, looks: alpha / (len(looks) + 1)
    try:
        yield
    finally:
        paired.alpha_per_look = real


def resample(
    pool: Sequence[Any], checks: int, seed: int, *, max_blocks: int = DEFAULT_MAX_BLOCKS
) -> tuple[int, list[int]]:
    """Replay `checks` relative checks on blocks drawn from `pool`; (failures, blocks used).

    The pool's block medians are already per reference where `--timing` asked for it
    (`blocks_of`), so the replayed checks compare them as they are."""
    from perfguard.measurement.relative import Schedule, run_relative
    from perfguard.storage.cases import Case

    rng = random.Random(seed)
    cases = [Case(id=cid, workload="qwen_image", preset="tiny") for cid in sorted(pool[0][1]["H"])]
    failures, used = 0, []
    for n in range(checks):
        replay = Replay(pool, rng)
        plan = Schedule(max_blocks=max_blocks, seed=seed + n)
        outcome = run_relative(cases, replay, plan, clock=replay.clock)
        failures += outcome.judgement.exit_code == 1
        used.append(len(outcome.blocks))
    return failures, used


def own_blocks(rows: Sequence[dict[str, Any]], timing: str) -> str:
    """Each live check judged again on its own blocks, compared the `timing` way, through
    the real schedule and rule: the exit 1s per condition, beside the live ones."""
    from perfguard.measurement.relative import Schedule, run_relative
    from perfguard.storage.cases import Case

    counts: dict[str, list[int]] = {}
    for n, row in enumerate(r for r in rows if "error" not in r):
        pool = blocks_of(row, timing)
        if not pool:
            continue
        cases = [Case(id=c, workload="qwen_image", preset="tiny") for c in sorted(pool[0][1]["H"])]
        replay = Replay(pool, random.Random(n))
        plan = Schedule(max_blocks=len(pool), seed=n)
        outcome = run_relative(cases, replay, plan, clock=replay.clock)
        got = counts.setdefault(row["condition"], [0, 0, 0])
        got[0] += 1
        got[1] += outcome.judgement.exit_code == 1
        got[2] += row["code"] == 1
    parts = [f"{c}: {k}/{n} (live {live}/{n})" for c, (n, k, live) in counts.items()]
    return f"own blocks, {timing}: exit 1 in " + ", ".join(parts)


def check_offsets(rows: Sequence[dict[str, Any]], timing: str = "normalized") -> list[str]:
    """Whether the blocks of one live A/A check are independent: per check, the mean of
    its normalized per-block log ratios (head over base) and its standard error; across
    checks, the sd of those means against the rms standard error. With independent
    blocks the sd of mean / se is about 1; above it, each check carries an offset between
    its sides that its blocks do not show (and that resampling blocks across checks
    hides)."""
    per: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        blocks = [b for _, b in blocks_of(row, timing)]
        for case in sorted(blocks[0]["H"]) if blocks else ():
            for metric in ("e2e", "stage:DenoisingStage"):
                logs = [
                    math.log(b["H"][case][metric] / b["B"][case][metric])
                    for b in blocks
                    if metric in b["H"].get(case, {}) and metric in b["B"].get(case, {})
                ]
                if len(logs) > 2:
                    sd = statistics.stdev(logs)
                    row_ = (statistics.fmean(logs), sd / math.sqrt(len(logs)), sd)
                    per.setdefault((case, metric), []).append(row_)
    lines = [
        f"\nA/A checks' offsets between their sides ({len(rows)} checks, {timing}):",
        f"{'case':<24}{'metric':<22}{'sd of means':>12}{'rms se':>9}{'sd(mean/se)':>13}"
        f"{'median block sd':>17}",
    ]
    for (case, metric), v in sorted(per.items()):
        means = [m for m, _, _ in v]
        rms = math.sqrt(statistics.fmean(se * se for _, se, _ in v))
        z = [m / se for m, se, _ in v if se > 0]
        block_sd = statistics.median(sd for _, _, sd in v)
        lines.append(
            f"{case:<24}{metric:<22}{statistics.stdev(means):>12.2%}{rms:>9.2%}"
            f"{statistics.stdev(z):>13.2f}{block_sd:>17.2%}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="Live checks for this long.")
    parser.add_argument("--tag", default="smoke")
    parser.add_argument("--out", type=Path, default=Path("relative-benchmark"))
    parser.add_argument(
        "--resample", type=int, default=1000, help="Resampled checks per condition."
    )
    parser.add_argument("--replay", action="store_true", help="Only resample the reports in --out.")
    parser.add_argument(
        "--check-args",
        default="",
        help="More `check` options, one string (e.g. '--start-method spawn').",
    )
    parser.add_argument(
        "--conditions",
        nargs="+",
        default=list(CONDITIONS),
        choices=list(CONDITIONS),
        help="The live conditions, taken in turn (e.g. only A/A, for a false-alarm count).",
    )
    parser.add_argument(
        "--timing",
        nargs="+",
        default=["raw", "normalized"],
        choices=["raw", "whole", "normalized"],
        help="How the resampled checks compare a block's sides (each is resampled).",
    )
    parser.add_argument(
        "--levels",
        nargs="+",
        default=["simulated"],
        choices=LEVELS,
        help="How the resampled checks set each look's level (each is resampled).",
    )
    parser.add_argument(
        "--max-blocks",
        nargs="+",
        type=int,
        default=[DEFAULT_MAX_BLOCKS],
        help="The resampled checks' --max-blocks (each is resampled; the budget still applies).",
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "checks.jsonl"
    if not args.replay:
        deadline = time.monotonic() + args.minutes * 60
        index = len(log.read_text().splitlines()) if log.exists() else 0
        names = list(args.conditions)
        while time.monotonic() < deadline:
            name = names[index % len(names)]
            row = live_check(
                args.out, index, name, CONDITIONS[name], args.tag, args.check_args.split()
            )
            with log.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
            index += 1
    rows = [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []
    print(f"\nlive relative checks of --tag {args.tag} (python benchmarks/relative.py):")
    head = ("checks", "failed", "rate", "95% CI", "wall s", "blocks")
    widths = (7, 8, 8, 16, 9, 8)
    print(f"{'condition':<10}" + "".join(f"{h:>{w}}" for h, w in zip(head, widths, strict=True)))
    pools: dict[str, list[Any]] = {}
    for name in CONDITIONS:
        got = [r for r in rows if r["condition"] == name and "error" not in r]
        errors = [r for r in rows if r["condition"] == name and "error" in r]
        k = sum(r["code"] == 1 for r in got)
        lo, hi = clopper_pearson(k, len(got))
        wall = statistics.median(r["wall_s"] for r in got) if got else math.nan
        blocks = statistics.median(r["blocks"] for r in got) if got else math.nan
        rate = k / len(got) if got else math.nan
        print(
            f"{name:<10}{len(got):>7}{k:>8}{rate:>8.1%}{f'{lo:.1%}-{hi:.1%}':>16}"
            f"{wall:>9.0f}{blocks:>8.0f}"
            + (f"  ({len(errors)} check(s) errored)" if errors else "")
        )
        for timing in args.timing:
            pools[f"{name} {timing}"] = [b for r in got for b in blocks_of(r, timing)]
    aa = [r for r in rows if r["condition"] == "A/A" and "error" not in r]
    if len(aa) > 2:
        for timing in args.timing:
            print("\n".join(check_offsets(aa, timing)))
    for timing in args.timing:
        print(own_blocks(rows, timing))
    if args.resample:
        print(
            f"\nresampled checks ({args.resample} per condition, blocks dealt from the live ones;"
            " the same blocks compared raw and normalized, same seeds):"
        )
        print(
            f"{'condition':<20}{'level':>11}{'max':>5}{'pool':>7}{'failed':>8}{'rate':>8}"
            f"{'95% CI':>16}{'blocks':>8}"
        )
        for name, pool in pools.items():
            for level in args.levels:
                for most in args.max_blocks:
                    row = f"{name:<20}{level:>11}{most:>5}{len(pool):>7}"
                    if len(pool) < 2 * most:
                        print(f"{row}  too few blocks to resample")
                        continue
                    seed = 1000 * list(CONDITIONS).index(name.split()[0])
                    with level_per_look(level):
                        k, used = resample(pool, args.resample, seed=seed, max_blocks=most)
                    lo, hi = clopper_pearson(k, args.resample)
                    print(
                        f"{row}{k:>8}{k / args.resample:>8.1%}"
                        f"{f'{lo:.1%}-{hi:.1%}':>16}{statistics.median(used):>8.0f}"
                    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
