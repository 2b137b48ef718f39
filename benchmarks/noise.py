"""Where the noise comes from: between-process spread of a stage, raw and normalized.

Runs `perfguard run` for one case in fresh processes, the settings interleaved round by
round (so a slow spell of the machine hits every setting alike), and prints for each
setting: the stage's median, the sd of the per-process medians (log scale, ~relative),
the within-process IQR/median, and the same spread of the stage divided by the
reference workload timed beside it (`perfguard.device.reference`): once as the ratio of
the two medians, once run by run (each run over the reference beside it, the figure a
`timing: normalized` baseline stores, `perfguard.decision.normalize`).

    python benchmarks/noise.py --case qwen_image_t2i_smoke --processes 16 --threads 1 2

`--start-methods spawn forkserver` compares how worker processes start instead (threads
fixed at the first `--threads`): each round measures the case once in a spawned worker
(a fresh interpreter) and once in a worker forked from one warm server that lives for
the whole benchmark (`perfguard.measurement.launch`), in alternating order. The forked
workers share the server's address-space layout and hash seed, so if either is a
source of between-process drift, their spread comes out narrower than the spawned ones'.

    python benchmarks/noise.py --processes 24 --start-methods spawn forkserver

`--commands cold resident` compares how a whole command's process starts: each round
runs `perfguard run --case CASE` once as a fresh interpreter (`PERFGUARD_SERVER_IDLE_S=0`,
every command imports its own modules) and once forked from the resident server that
lives for the whole benchmark (`perfguard.measurement.resident`), in alternating order.
This is the process a `check` measures in. (The thread-count mode runs cold commands.)

    python benchmarks/noise.py --processes 24 --commands cold resident

`--server-arms random hash0 hash0-noaslr` asks where a server's shared offset comes from:
each arm starts `--servers` warm servers at once and forks its processes from them in
turn (process i from server i mod N), the arms interleaved. `random`: servers as a check
starts them (a fresh string-hash seed and address-space layout each); `hash0`: every
server with `PYTHONHASHSEED=0`; `hash0-noaslr`: the same seed and no address-space
randomization (`setarch -R`), so every server of the arm starts alike. It prints a
one-way analysis of variance of the processes' normalized medians over servers: the sd
within a server, the sd a server adds (the between-server component) and its F test.
If a server's offset is its hash seed or layout, the component vanishes in that arm.

    python benchmarks/noise.py --processes 32 --servers 8 --server-arms random hash0
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

Rows = dict[str, list[tuple[float, float, float, float]]]


def one_process(
    case: str, repeats: int, threads: int, out: Path, extra: list[str], how: str = "cold"
) -> dict:
    """One `perfguard run` command: a fresh interpreter (`cold`) or a fork of the resident
    server (`resident`, the server directory in `$PERFGUARD_SERVER_DIR`)."""
    env = dict(os.environ, PERFGUARD_THREADS=str(threads))
    env.pop("PERFGUARD_SERVER", None)
    env["PERFGUARD_SERVER_IDLE_S"] = "0" if how == "cold" else "900"
    cmd = [
        sys.executable,
        "-m",
        "perfguard",
        "run",
        "--case",
        case,
        "--repeats",
        str(repeats),
        "--out",
        str(out),
        "--no-progress",
        *extra,
    ]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["cases"][case]


def worker_setup(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, str]]:
    """The CPU platform, the case, its options and the worker environment of a mode that
    starts workers itself (`--start-methods`, `--server-arms`)."""
    from perfguard.device.platform import probe
    from perfguard.measurement.options import MeasureOptions
    from perfguard.measurement.workers import _env_for
    from perfguard.storage.cases import load_registry

    platform = probe("cpu")
    (case,) = [c for c in load_registry(platform.name, args.cases) if c.id == args.case]
    options = MeasureOptions(repeats=args.repeats, threads=args.threads[0], progress=False)
    return platform, case, options, _env_for(platform, None, 1, threads=args.threads[0])


def start_method_rows(args: argparse.Namespace) -> Rows:
    """Per-process (median, reference median, IQR/median) of each start method, and the
    seconds each worker took from the request to ready (printed as it goes)."""
    import time

    from perfguard.measurement.worker_handle import WorkerStarter
    from perfguard.measurement.workers import preload_modules

    platform, case, options, env = worker_setup(args)
    starters = {
        m: WorkerStarter(env, f"{m} worker", m, preload_modules([case])) for m in args.start_methods
    }
    rows: Rows = {m: [] for m in args.start_methods}
    starts: dict[str, list[float]] = {m: [] for m in args.start_methods}
    try:
        for i in range(args.processes):
            order = args.start_methods if i % 2 == 0 else list(reversed(args.start_methods))
            for m in order:
                t0 = time.perf_counter()
                worker, why = starters[m].new()
                if worker is None:
                    raise SystemExit(f"{m}: {why}")
                starts[m].append(time.perf_counter() - t0)
                res = worker.run(case, options, platform.name)
                worker.close()
                if res.status != "ok":
                    raise SystemExit(f"{m}: {res.error}")
                rows[m].append(summarize_process(res.samples[args.metric], res.reference))
            print(f"process {i + 1}/{args.processes}", file=sys.stderr, flush=True)
    finally:
        for starter in starters.values():
            starter.close()
    for m, xs in starts.items():
        print(f"{m}: start to ready, median {statistics.median(xs):.2f} s (first {xs[0]:.2f} s)")
    return rows


def server_arm_rows(args: argparse.Namespace) -> tuple[Rows, dict[str, list[int]]]:
    """Per-process figures of each server arm and the server each process forked from."""
    import shutil
    import time

    from perfguard.measurement.worker_handle import WorkerStarter
    from perfguard.measurement.workers import preload_modules

    platform, case, options, env = worker_setup(args)
    env.pop("PYTHONHASHSEED", None)
    starters: dict[str, list[WorkerStarter]] = {}
    real_exe = sys.executable
    with tempfile.TemporaryDirectory(prefix="pgarm") as tmp:
        wrapper = Path(tmp) / "python-noaslr"
        setarch = shutil.which("setarch") or "setarch"
        machine = os.uname().machine
        wrapper.write_text(f'#!/bin/sh\nexec {setarch} {machine} -R {real_exe} "$@"\n')
        wrapper.chmod(0o755)
        t0 = time.perf_counter()
        try:
            for arm in args.server_arms:
                arm_env = dict(env) if arm == "random" else dict(env, PYTHONHASHSEED="0")
                starters[arm] = []
                for k in range(args.servers):
                    st = WorkerStarter(arm_env, f"{arm} server {k}", "forkserver",
                                       preload_modules([case]))  # fmt: skip
                    sys.executable = str(wrapper) if arm.endswith("noaslr") else real_exe
                    try:
                        st.warm_up()
                    finally:
                        sys.executable = real_exe
                    starters[arm].append(st)
            for arm, sts in starters.items():
                for st in sts:
                    why = st.ready()
                    if why is not None:
                        raise SystemExit(f"{arm}: {why}")
            print(f"servers ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
            rows: Rows = {a: [] for a in args.server_arms}
            server_of: dict[str, list[int]] = {a: [] for a in args.server_arms}
            for i in range(args.processes):
                arms = list(args.server_arms)
                order = arms if i % 2 == 0 else arms[::-1]
                for arm in order:
                    k = i % args.servers
                    worker, why = starters[arm][k].new()
                    if worker is None:
                        raise SystemExit(f"{arm}: {why}")
                    res = worker.run(case, options, platform.name)
                    worker.close()
                    if res.status != "ok":
                        raise SystemExit(f"{arm}: {res.error}")
                    rows[arm].append(summarize_process(res.samples[args.metric], res.reference))
                    server_of[arm].append(k)
                print(f"process {i + 1}/{args.processes}", file=sys.stderr, flush=True)
        finally:
            for sts in starters.values():
                for st in sts:
                    st.close()
    return rows, server_of


def one_way(groups: list[list[float]]) -> tuple[float, float, float, float]:
    """One-way random-effects analysis of variance of `groups` (log figures): the sd
    within a group, the sd a group adds (method of moments, unequal sizes), F and its p."""
    from scipy import stats

    gs = [g for g in groups if len(g) > 1]
    n, m = sum(len(g) for g in gs), len(gs)
    grand = statistics.fmean(x for g in gs for x in g)
    ssw = sum((x - statistics.fmean(g)) ** 2 for g in gs for x in g)
    ssb = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in gs)
    msw, msb = ssw / (n - m), ssb / (m - 1)
    k0 = (n - sum(len(g) ** 2 for g in gs) / n) / (m - 1)
    between = math.sqrt(max(0.0, (msb - msw) / k0))
    f = msb / msw
    return math.sqrt(msw), between, f, float(stats.f.sf(f, m - 1, n - m))


def print_server_anova(rows: Rows, server_of: dict[str, list[int]]) -> None:
    """One-way analysis of variance of log normalized process medians over servers."""
    print("| arm | processes | servers | sd within a server | sd a server adds | F | p |")
    print("|---|---|---|---|---|---|---|")
    for arm, vals in rows.items():
        groups: dict[int, list[float]] = {}
        for v, k in zip(vals, server_of[arm], strict=True):
            groups.setdefault(k, []).append(math.log(v[3]))
        gs = [g for g in groups.values() if len(g) > 1]
        within, between, f, p = one_way(gs)
        n, m = sum(len(g) for g in gs), len(gs)
        print(f"| {arm} | {n} | {m} | {within:.2%} | {between:.2%} | {f:.2f} | {p:.3f} |")


def command_rows(args: argparse.Namespace) -> Rows:
    """Per-process figures of whole `perfguard run` commands, cold and resident."""
    rows: Rows = {m: [] for m in args.commands}
    with tempfile.TemporaryDirectory(prefix="pgn", dir="/tmp") as tmp:
        os.environ["PERFGUARD_SERVER_DIR"] = tmp
        try:
            for i in range(args.processes):
                order = args.commands if i % 2 == 0 else list(reversed(args.commands))
                for m in order:
                    out = Path(tmp) / "r.json"
                    res = one_process(args.case, args.repeats, args.threads[0], out, [], m)
                    rows[m].append(summarize_process(res["samples"][args.metric], res["reference"]))
                print(f"process {i + 1}/{args.processes}", file=sys.stderr, flush=True)
        finally:
            from perfguard.measurement.resident import ENV_DIR, stop_all

            stop_all({ENV_DIR: tmp})
    return rows


def summarize_process(xs: list[float], ref: list[float]) -> tuple[float, float, float, float]:
    """(median, reference median, IQR/median, median of each run over its reference: the
    normalized timing a `timing: normalized` baseline stores, perfguard.decision.normalize)."""
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    med = statistics.median(xs)
    normalized = statistics.median(x / r for x, r in zip(xs, ref, strict=True))
    return med, statistics.median(ref), (q3 - q1) / med, normalized


def log_sd(values: list[float]) -> float:
    logs = [math.log(v) for v in values]
    return statistics.stdev(logs) if len(logs) > 1 else 0.0


# The modes that compare something other than thread counts: the flag, its arms, the help.
COMPARISONS = (
    (
        "--start-methods",
        ("spawn", "forkserver"),
        "Compare how worker processes start instead of thread counts.",
    ),
    (
        "--commands",
        ("cold", "resident"),
        "Compare whole commands: fresh interpreters against resident-server forks.",
    ),
    (
        "--server-arms",
        ("random", "hash0", "hash0-noaslr"),
        "Compare servers' shared offsets: random, fixed hash seed, no ASLR.",
    ),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="qwen_image_t2i_smoke")
    ap.add_argument("--metric", default="stage:DenoisingStage")
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", default=None, help="Write the per-process figures here.")
    ap.add_argument("--cases", default="cases", help="The case registry (start-method mode).")
    for flag, choices, what in COMPARISONS:
        ap.add_argument(flag, nargs="+", default=None, choices=choices, help=what)
    ap.add_argument("--servers", type=int, default=8, help="Servers per arm (--server-arms).")
    args = ap.parse_args()
    rows: Rows
    server_of: dict[str, list[int]] | None = None
    if args.server_arms:
        if args.servers < 2 or args.processes < 2 * args.servers:
            ap.error("--server-arms needs --servers >= 2 and two processes a server")
        rows, server_of = server_arm_rows(args)
        label = "server arm"
    elif args.commands:
        rows = command_rows(args)
        label = "command"
    elif args.start_methods:
        rows = start_method_rows(args)
        label = "start method"
    else:
        label = "threads"
        rows = {str(t): [] for t in args.threads}
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.processes):
                order = args.threads if i % 2 == 0 else list(reversed(args.threads))
                for t in order:
                    res = one_process(args.case, args.repeats, t, Path(tmp) / "r.json", [])
                    rows[str(t)].append(
                        summarize_process(res["samples"][args.metric], res["reference"])
                    )
    print(
        f"{args.case} {args.metric}: {args.processes} fresh processes per setting, "
        f"{args.repeats} runs each, interleaved"
    )
    print(
        f"| {label} | median (ms) | sd of process medians | range (ms) | within IQR/median "
        "| reference median (ms) | sd of reference | sd of stage/reference "
        "| sd of normalized (run by run) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for t, vals in rows.items():
        meds = [v[0] for v in vals]
        refs = [v[1] for v in vals]
        norm = [m / r for m, r in zip(meds, refs, strict=True)]
        print(
            f"| {t} | {statistics.median(meds):.3f} | {log_sd(meds):.1%} | "
            f"{min(meds):.2f}-{max(meds):.2f} | {statistics.median(v[2] for v in vals):.1%} | "
            f"{statistics.median(refs):.3f} | {log_sd(refs):.1%} | {log_sd(norm):.1%} | "
            f"{log_sd([v[3] for v in vals]):.1%} |"
        )
    if server_of is not None:
        print_server_anova(rows, server_of)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "server_of": server_of}, indent=1))


if __name__ == "__main__":
    main()
