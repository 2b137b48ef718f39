"""The library API: what each command does, one function each.

    from perfguard import MeasureOptions, Selection, check, gen_baselines

    options = MeasureOptions(repeats=5, processes=6)
    gen_baselines(Selection(tags=("smoke",)), options, baseline="b.json")
    report = check(Selection(tags=("smoke",)), options.replace(processes=1), baseline="b.json")
    raise SystemExit(report.exit_code)

Every function composes the layers below: `perfguard.measurement` runs cases (it needs
torch, so it is imported inside the functions that measure), `perfguard.decision` judges,
`perfguard.storage` reads and writes. The CLI parses flags, calls one, and renders.

Errors the user can fix raise `PerfguardError` (one line, exit 2); progress notes go to
`echo` (stderr by default), never into the returned values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfguard.decision.gate import RELATIVE_JUDGING, JudgeOptions
from perfguard.device.load import LoadMeter
from perfguard.errors import PerfguardError
from perfguard.measurement.explain import attribute_regressions, explain  # noqa: F401
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.warm import in_warm_pool
from perfguard.results import CaseResult, Results
from perfguard.storage.baseline import Baseline
from perfguard.storage.cases import Case, Selection, load_registry
from perfguard.storage.reports import Report

if TYPE_CHECKING:
    from perfguard.decision.calibrate import CaseCalibration, CheckSetup
    from perfguard.device.platform import Platform
    from perfguard.measurement.relative import RelativeOptions

Echo = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---- cases and baselines --------------------------------------------------------------------


def probe(name: str | None = None) -> Platform:
    """The platform to measure on: `name`, `$PERFGUARD_PLATFORM`, else the probed one."""
    from perfguard.device import platform

    return platform.probe(name)


def resolve_platform(platform: Platform | str | None) -> Platform:
    """`platform` as given, else the one it names (None: the probed one); the commands
    that start a warm server first probe only after it (`perfguard.measurement.warm`)."""
    return probe(platform) if platform is None or isinstance(platform, str) else platform


def baseline_path(path: str | None, platform: str, hardware: str) -> str:
    """`path`, else the default baseline of this platform and hardware."""
    from perfguard.storage.baseline import default_path

    return path or str(default_path(platform, hardware))


def load_baseline(path: str) -> Baseline:
    """The baseline a check compares with; a missing file says how to make one."""
    from perfguard.storage import baseline as store

    if not os.path.exists(path):
        raise PerfguardError(
            f"{path}: no baseline file: measure one with `perfguard gen-baselines` "
            "on this hardware, or pass --baseline"
        )
    return store.load(path)


def select_cases(
    platform: str,
    selection: Selection,
    *,
    split_by: str | None = None,
    preflight: bool = True,
    echo: Echo = _stderr,
) -> list[Case]:
    """The selected cases of `platform`'s registry; exit 2 when none matches.

    With `selection.shard`, only that shard (balanced by the baseline at `split_by`
    where cases lack `estimated_time_s`). With `preflight`, a diffusers model directory
    that cannot load offline is an error now, before anything runs.
    """
    cases = selection.of(load_registry(platform, selection.cases_dir))
    if not cases:
        raise PerfguardError("no case matches the selection (see `perfguard list-cases`)")
    if preflight:
        from perfguard.interop.diffusers import preflight_all

        preflight_all(cases)
    return shard(cases, selection.shard, split_by, echo=echo)


def shard(
    cases: list[Case], spec: str | None, split_by: str | None, *, echo: Echo = _stderr
) -> list[Case]:
    """The cases of shard `spec` (`K/N`); says so when this shard has none."""
    from perfguard.measurement.shard import shard_selection

    chosen = shard_selection(cases, spec, split_by)
    if spec and not chosen:
        echo(f"perfguard: shard {spec} has no case ({len(cases)} selected)")
    return chosen


def run_cases(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions,
    *,
    on_case: Callable[[CaseResult], None] | None = None,
    until_for: Callable[[Case], Callable[[CaseResult], bool] | None] | None = None,
    warm: Any = None,
) -> Results:
    """Run `cases` here or in worker processes, as `options` say (`workers.execute`);
    `warm` (a `workers.WarmPool`) keeps warm servers for later calls. Server cases run
    here, their rounds being their processes (`perfguard.measurement.serving.case`)."""
    from perfguard.measurement.serving.case import with_server_cases
    from perfguard.measurement.workers import execute

    return with_server_cases(execute, cases, platform, options, on_case=on_case,
                             until_for=until_for, warm=warm)  # fmt: skip


# ---- run and gen-baselines ------------------------------------------------------------------


@in_warm_pool(lambda options, kw: options.isolated)
def run(
    selection: Selection,
    options: MeasureOptions,
    *,
    platform: Platform | str | None = None,
    out: str | None = None,
    echo: Echo = _stderr,
    warm: Any = None,
) -> Results:
    """Measure the selected cases; every sample of every metric, errors kept per case.

    `out` also writes the results file (the input of `judge --results`).
    """
    from perfguard.storage.reports import write_results

    platform = resolve_platform(platform)
    split_by = baseline_path(None, platform.name, platform.hardware_slug())
    cases = select_cases(platform.name, selection, split_by=split_by, echo=echo)
    results = run_cases(cases, platform, options, warm=warm)
    if out:
        write_results(out, results)
    return results


@dataclass
class BaselineUpdate:
    """What `gen_baselines` did to the baseline file at `path`."""

    path: str
    results: Results
    selected: int
    saved: list[str] = field(default_factory=list)
    contended: list[str] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """Cases measured on a busy runner (`contention.busy_session`): not written."""
    pruned: list[str] = field(default_factory=list)
    tightened: bool = False

    @property
    def failed(self) -> bool:
        return any(r.status != "ok" for r in self.results.cases.values())


@in_warm_pool(lambda options, kw: options.isolated)
def gen_baselines(
    selection: Selection,
    options: MeasureOptions,
    *,
    baseline: str | None = None,
    tighten: bool = False,
    prune: bool = False,
    timing: str | None = None,
    platform: Platform | str | None = None,
    echo: Echo = _stderr,
    say: Echo = print,
    warm: Any = None,
    allow_busy: bool = False,
) -> BaselineUpdate:
    """Measure the selected cases and store them in the baseline file.

    Only the selected cases are updated; the others, their notes and overrides are kept.
    A case measured on a busy runner (`store.record_measured`) is not written unless
    `allow_busy`. The file is saved after each case, under a lock. Refuses fault
    injection and a file it cannot read, before measuring. `say` hears each case's
    outcome; `timing` is how the timed runs are stored (`perfguard.decision.normalize`;
    None: the platform's default).
    Over the house limits because each keyword is one of the command's flags.
    """
    _refuse_injection(options)
    from perfguard.decision.normalize import timing_of
    from perfguard.device.platform import fingerprint
    from perfguard.storage import baseline as store

    platform = resolve_platform(platform)
    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    cases = select_cases(platform.name, dataclasses.replace(selection, shard=None), echo=echo)
    environment = fingerprint(platform)
    timing = timing_of(environment, timing)  # a bad value fails before anything is measured
    with store.lock(path):
        earlier = store.open_for_update(path, environment)  # refuse an unreadable file first
    cases = shard(cases, selection.shard, path, echo=echo)
    update = BaselineUpdate(path=path, results=Results({}, {}), selected=len(cases))
    update.tightened = tighten
    meter = LoadMeter().start()
    waiting: dict[str, str] = {}  # case id -> why its session was busy

    def on_case(result: CaseResult) -> None:
        load = meter.read()
        if result.status != "ok":
            say(f"{result.case_id}: error, baseline not updated: {result.error}")
            return
        done = store.record_measured(
            path, result, environment, earlier.scenarios.get(result.case_id),
            allow_busy=allow_busy, tighten=tighten, timing=timing, foreign_load=load,
        )  # fmt: skip
        if done.stored is None:
            waiting[result.case_id] = done.busy or "busy"
            return
        waiting.pop(result.case_id, None)
        if done.busy:
            say(f"{result.case_id}: warning: the runner was busy ({done.busy}); marked busy")
        if done.contended:
            update.contended.append(result.case_id)
            say(f"{result.case_id}: warning: {done.contended}; kept every run (--allow-busy)")
        update.saved.append(result.case_id)
        say(_saved_line(done.stored, done.scenario))

    update.results = run_cases(cases, platform, options, on_case=on_case, warm=warm)
    _wait_out_contention(cases, waiting, update, say, lambda todo: run_cases(
        todo, platform, options, on_case=on_case, warm=warm), meter)  # fmt: skip
    if prune:
        known = {c.id for c in load_registry(platform.name, selection.cases_dir)}
        update.pruned = store.prune(path, known)
    return update


def _refuse_injection(options: MeasureOptions) -> None:
    """A baseline must never contain injected time."""
    from perfguard.device.inject import ENV_INJECT, inject_from

    if options.inject or inject_from(None):
        source = f"${ENV_INJECT}" if inject_from(None) else "--inject"
        raise PerfguardError(
            f"gen-baselines refuses fault injection ({source} is set): "
            "a baseline must never contain injected time"
        )


def _wait_out_contention(
    cases: Sequence[Case],
    waiting: dict[str, str],
    update: BaselineUpdate,
    say: Echo,
    measure: Callable[[Sequence[Case]], Results],
    meter: Any,
) -> None:
    """Measure the cases whose session was busy again, after `ContentionPolicy.wait_s`,
    at most `waits` times (contention passes: a neighbour's job ends); a case still busy
    is not written. Noise is not contention: a spread runner is recorded, never waited
    out (`perfguard.decision.contention.busy_session`)."""
    from perfguard.decision import contention

    policy = contention.DEFAULT_POLICY
    for attempt in range(1, policy.waits + 1):
        if not waiting:
            break
        for cid, why in sorted(waiting.items()):
            say(
                f"{cid}: the runner was busy ({why}): waiting {policy.wait_s:g} s and "
                f"measuring again ({attempt} of {policy.waits})"
            )
        time.sleep(policy.wait_s)
        meter.read()  # the wait is not the session's
        again = measure([c for c in cases if c.id in waiting])
        update.results.cases.update(again.cases)
    for cid, why in sorted(waiting.items()):
        update.busy.append(cid)
        waited = f" after waiting {policy.waits} x {policy.wait_s:g} s" if policy.waits else ""
        say(f"{cid}: the runner was busy ({why}){waited}: baseline not updated")


def _saved_line(result: CaseResult, scenario: Any = None) -> str:
    """What gen-baselines says of a case it stored: its median e2e and what a check
    against it resolves, or (`counters_only`) that only the work and output were."""
    from perfguard.decision.resolution import describe

    if "e2e" not in result.samples:
        return f"{result.case_id}: work and output saved (nothing timed)"
    e2e = sorted(result.samples["e2e"])[len(result.samples["e2e"]) // 2]
    where = f", {len(result.groups)} processes" if result.groups else ""
    resolves = ""
    if scenario is not None and scenario.resolution:
        resolves = f"; a check resolves {describe(scenario.resolution)}"
    return f"{result.case_id}: e2e {e2e:.3f} ms (n={result.repeats}{where}) saved{resolves}"


# ---- check ----------------------------------------------------------------------------------


# Only a first measurement in workers starts the server first: a server started for
# confirmations that may never come cost a check ~3 s on a 2-core runner (docs/verdicts.md).
@in_warm_pool(lambda options, kw: options.isolated and not options.counters_only)
def check(
    selection: Selection,
    options: MeasureOptions,
    *,
    judging: JudgeOptions | None = None,
    baseline: str | None = None,
    out: str | None = None,
    platform: Platform | str | None = None,
    echo: Echo = _stderr,
    warm: Any = None,
    traces_dir: str | None = None,
) -> Report:
    """Run the selected cases through the gate and judge them against the baseline.

    What can be wrong with the baseline (missing, unreadable, another platform or
    thread count, an unknown profile) fails before anything runs. The gate
    (`perfguard.decision.gate`) measures a case over a bound or that can't tell in
    fresh processes, drops contended runs and stops sampling clear cases early; `out`
    also writes the results it judged; `judging` (`JudgeOptions`) says how to judge; a
    timed regression's attribution traces go to `traces_dir`.
    `options.counters_only` (the work check) times nothing: each case runs once and
    once counted, and only what is exact is judged (work, output, CPU tensor memory).
    """
    from perfguard.decision.gate import DEFAULT_MAX_REPEATS, run_gate
    from perfguard.measurement.comparable import check_comparable
    from perfguard.storage.reports import build_against, write_results

    judging = judging or JudgeOptions()
    platform = resolve_platform(platform)
    cases, base, path = _stored_setup(selection, options, judging, baseline, platform, echo)
    if options.counters_only:
        return _check_counters(cases, platform, options, judging, (base, path), selection, out)
    # Adaptive sampling needs the verdict after every run, so it applies when the cases
    # run in this process; in workers each measurement is REPEATS runs.
    in_process = not options.uses_workers(cases)
    cap = max(options.repeats, options.max_repeats or DEFAULT_MAX_REPEATS)
    adaptive = in_process and cap > options.repeats
    first = options.replace(max_repeats=cap if adaptive else None)

    def measure_cases(todo: Any, until_for: Any) -> Results:
        stop = until_for if adaptive else None
        return run_cases(list(todo), platform, first, until_for=stop, warm=warm)

    def confirm(todo: Any, until_for: Any) -> Results:
        # A fresh process for each confirmation: the process, not the run, is the unit
        # whose spread the verdict's interval needs (perfguard.decision.gate).
        # It times; it does not count again: the first measurement counted this build's
        # work, and counts are exact (a counted run costs ~3x a plain one).
        again = options.replace(isolate=True, processes=1, max_repeats=None, count_work=False)
        return run_cases(list(todo), platform, again, warm=warm)

    with warm:
        outcome = run_gate(
            cases,
            base,
            judging,
            measure_cases,
            confirm=confirm if in_process else None,
            adaptive=adaptive,
            max_repeats=cap if adaptive else None,
            on_event=lambda case_id, message: echo(f"perfguard: {case_id}: {message}"),
        )
    results = outcome.results
    if out:
        write_results(out, results)
    check_comparable(results, base, path)
    _warn_hardware(results, base, echo)
    # The report records how the first measurement sampled (`max_repeats`: its cap).
    settings = {"source": "run", **first.settings("check"), "shard": selection.shard}
    settings |= {"max_reruns": judging.max_reruns, "confirm_gap_s": judging.confirm_gap_s}
    settings["alpha"] = judging.rule.alpha
    report = build_against(outcome.judgement, results, base, path, settings=settings)
    # A timed regression gets its per-op attribution against the baseline's revision.
    return attribute_regressions(report, cases, options, None, platform=platform.name,
                                 traces_dir=traces_dir)  # fmt: skip


def _stored_setup(
    selection: Selection,
    options: MeasureOptions,
    judging: JudgeOptions,
    baseline: str | None,
    platform: Platform,
    echo: Echo,
) -> tuple[list[Case], Baseline, str]:
    """The cases, the baseline and its path of a check against a stored baseline; what
    can be wrong with the baseline fails here, before anything runs."""
    from perfguard.measurement.comparable import check_threads
    from perfguard.storage import baseline as store

    cases = select_cases(platform.name, dataclasses.replace(selection, shard=None), echo=echo)
    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    base = load_baseline(path)  # before running anything: a bad file fails fast
    store.check_platform(base, platform.name, path)
    base.profile(judging.profile)
    cases = shard(cases, selection.shard, path, echo=echo)
    check_threads(cases, platform.name, base, path, options.threads)
    return cases, base, path


def _check_counters(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions,
    judging: JudgeOptions,
    stored: tuple[Baseline, str],
    selection: Selection,
    out: str | None,
) -> Report:
    """`check-work`: one counted run per case, judged on what is exact."""
    from perfguard.measurement.work import refuse_another_context
    from perfguard.storage.reports import build_against, write_results

    base, path = stored
    refuse_another_context(cases, platform, base, path)
    counted = options.replace(counters_only=True, max_repeats=None)
    results = run_cases(cases, platform, counted)
    if out:
        write_results(out, results)
    timed = {
        m
        for cid in results.cases
        if cid in base.scenarios
        for m in base.scenarios[cid].metrics
        if m not in results.cases[cid].samples
    }
    judgement = judging.judge(results, base, ignore_missing=sorted(timed))
    settings = {"source": "run", **counted.settings("counters"), "shard": selection.shard}
    return build_against(judgement, results, base, path, settings=settings)


def check_results(
    results_file: str,
    selection: Selection | None = None,
    *,
    judging: JudgeOptions | None = None,
    baseline: str | None = None,
    echo: Echo = _stderr,
) -> Report:
    """Judge a results file (`perfguard run --out`) against its baseline; no torch."""
    from perfguard.storage.reports import read_results

    results = (selection or Selection()).filter_results(read_results(results_file))
    settings = {
        "source": "results",
        "results_file": results_file,
        "repeats": results.settings.get("repeats"),
        "warmup": results.settings.get("warmup"),
        "inject": results.settings.get("inject"),
    }
    judging = judging or JudgeOptions()
    return _judge_results(
        results, judging, baseline=baseline, settings=settings, source=results_file, echo=echo
    )


def judge_results(
    results: Results,
    *,
    baseline: str | None = None,
    profile: str = "pr_test",
    fail_on_missing: bool = False,
    advisory: bool = False,
    settings: dict[str, Any] | None = None,
    source: str = "the results",
    echo: Echo = _stderr,
    allow_output_change: bool = False,
) -> Report:
    """Judge `results` measured elsewhere (a results file, a pytest session) against the
    baseline at `baseline` (default: its platform and hardware's); no torch."""
    judging = JudgeOptions(
        profile=profile,
        fail_on_missing=fail_on_missing,
        advisory=advisory,
        allow_output_change=allow_output_change,
    )
    return _judge_results(
        results, judging, baseline=baseline, settings=settings, source=source, echo=echo
    )


def _judge_results(
    results: Results,
    judging: JudgeOptions,
    *,
    baseline: str | None,
    settings: dict[str, Any] | None,
    source: str,
    echo: Echo,
) -> Report:
    from perfguard.measurement.comparable import check_comparable
    from perfguard.storage.reports import build_against

    path = baseline_path(baseline, results.platform, results.hardware)
    base = load_baseline(path)
    if results.platform != base.platform:
        raise PerfguardError(
            f"{source} is from platform {results.platform!r} but {path} is a "
            f"baseline for {base.platform!r}"
        )
    check_comparable(results, base, path)
    _warn_hardware(results, base, echo)
    judgement = judging.judge(results, base)
    return build_against(
        judgement, results, base, path, settings=results.settings if settings is None else settings
    )


def check_perf_log(
    perf_log: str,
    *,
    judging: JudgeOptions | None = None,
    baseline: str,
    case_id: str | None = None,
) -> Report:
    """Judge the requests of sglang's `performance.log` against a baseline; no torch.

    The log names no platform, so the baseline is required; what the log cannot hold
    (sglang's log has no memory figures, no per-stage allocator peaks, no outputs) is
    not missing.
    """
    from perfguard.interop.sglang import NOT_IN_PERF_LOG, perf_log_results, read_perf_log
    from perfguard.metrics import STAGE_PEAK_PREFIX
    from perfguard.storage.reports import build_against

    base = load_baseline(baseline)
    results = perf_log_results(read_perf_log(perf_log), base, case_id=case_id, source=perf_log)
    metrics = {m for s in base.scenarios.values() for m in s.metrics}
    peaks = {m for m in metrics if m.startswith(STAGE_PEAK_PREFIX)}
    judging = judging or JudgeOptions()
    judgement = judging.judge(results, base, ignore_missing=NOT_IN_PERF_LOG + tuple(sorted(peaks)))
    settings = {"source": "sglang-perf-log", "perf_log": perf_log, "inject": None}
    return build_against(judgement, results, base, baseline, settings=settings)


def check_relative(
    selection: Selection,
    options: MeasureOptions,
    against: RelativeOptions,
    *,
    judging: JudgeOptions | None = None,
    out: str | None = None,
    platform: Platform | None = None,
    echo: Echo = _stderr,
    traces_dir: str | None = None,
) -> Report:
    """The relative check: this revision against a base one, side by side, no baseline.

    Base (`against.directory`, or a worktree of `against.ref`) and head run in randomized
    interleaved blocks of fresh processes, judged on their paired per-block ratios
    (`perfguard.decision.paired`). Bad options, registry, base or baseline path fail
    before the first block. `judging` (default `RELATIVE_JUDGING`) less confirmations.
    """
    from perfguard.decision.paired import BASE, HEAD
    from perfguard.storage import baseline as store
    from perfguard.storage.reports import build_relative, write_results

    if options.devices is not None and len(options.devices) > 1:
        raise PerfguardError("--devices: a relative check runs both sides on one device; list one")
    platform = platform or probe()
    cases, environment = _relative_preflight(selection, options, against, platform, echo)
    base, outcome = _measure_relative(
        cases, options, against, judging or RELATIVE_JUDGING, platform, echo
    )
    against_info = {**base.to_json(), **outcome.summary()}
    if against.ref is not None:
        against_info["dir"] = f"{against.ref} (temporary worktree)"
    settings = {
        "source": "relative",
        **options.settings("relative"),
        **{"shard": selection.shard, "budget_s": against.budget_s},
        **{"min_blocks": against.min_blocks, "max_blocks": against.max_blocks},
        "timing": against.timing_on(platform.name),
    }
    report = build_relative(
        outcome.judgement, environment=environment, against=against_info, settings=settings
    )  # then the regressed timings' per-op attribution (measurement/explain.py)
    report = attribute_regressions(report, cases, options, against, platform=platform.name,
                                   traces_dir=traces_dir)  # fmt: skip
    if out:
        head = Results(environment=environment, settings=settings)
        head.cases = dict(outcome.pooled[HEAD])
        write_results(out, head)
    if against.write_baseline:
        base_env = {**environment, "git_commit": base.commit}
        for _, result in sorted(outcome.pooled[BASE].items()):
            if result.status == "ok":
                store.record_case(against.write_baseline, result, base_env)
    return report


def _relative_preflight(
    selection: Selection,
    options: MeasureOptions,
    against: RelativeOptions,
    platform: Platform,
    echo: Echo,
) -> tuple[list[Case], dict[str, Any]]:
    """The cases of a relative check and this platform's environment; a case, factory
    or baseline file to write that cannot do fails here, before the base is probed."""
    from perfguard.device.platform import fingerprint
    from perfguard.measurement.runner import import_factory
    from perfguard.storage import baseline as store

    cases = select_cases(platform.name, selection, echo=echo)
    multi = [c.id for c in cases if c.num_devices > 1]
    if multi:
        raise PerfguardError(
            f"case {multi[0]!r} needs more than one device: a relative check "
            "runs single-device cases only (select them with --case / --tag)"
        )
    if options.factory:
        import_factory(options.factory)
    environment = fingerprint(platform)
    if against.write_baseline:
        if options.inject:
            echo("perfguard: the injection applies to the head only")
        store.open_for_update(against.write_baseline, environment)  # a bad file fails now
    return cases, environment


def _measure_relative(
    cases: list[Case],
    options: MeasureOptions,
    against: RelativeOptions,
    judging: JudgeOptions,
    platform: Platform,
    echo: Echo,
) -> tuple[Any, Any]:
    """Probe the base (in a temporary worktree of `against.ref`, always removed) and
    measure blocks of both sides until the verdicts are clear or the budget is spent:
    the base and the `RelativeOutcome`."""
    from perfguard.decision.paired import BASE, HEAD, Comparing
    from perfguard.measurement import checkout, relative

    timing = against.timing_on(platform.name)
    with contextlib.ExitStack() as stack:
        directory = against.directory
        if against.ref is not None:
            directory = str(stack.enter_context(checkout.temporary_worktree(against.ref)))
        assert directory is not None
        base = relative.probe_base(
            directory, subdir=against.subdir, factory=options.factory, ref=against.ref
        )
        for case in cases:
            relative.case_for_base(case, base)  # an unknown field fails before any block
        sides = {
            HEAD: relative.head_side(options, platform.name),
            BASE: relative.base_side(options, base, platform.name),
        }
        echo(
            f"perfguard: relative check of {len(cases)} case(s) against {base.describe()}, "
            f"base perfguard {base.version}; up to {against.max_blocks} blocks in "
            f"{against.budget_s:g} s, timings {timing}"
        )

        def on_block(index: int, block: Any, open_metrics: int) -> None:
            looked = f", {open_metrics} metric(s) unresolved" if open_metrics >= 0 else ""
            echo(f"perfguard: block {index + 1} ({block.order}) took {block.seconds:.1f} s{looked}")

        blocks = stack.enter_context(relative.process_blocks(sides, platform.name, options.devices))
        outcome = relative.run_relative(
            cases,
            blocks,
            judging=judging,
            min_blocks=against.min_blocks,
            max_blocks=against.max_blocks,
            budget_s=against.budget_s,
            seed=against.order_seed,
            on_block=on_block,
            compare=Comparing(timing, platform.name),
        )
    return base, outcome


def _warn_hardware(results: Results, baseline: Baseline, echo: Echo) -> None:
    if results.hardware != baseline.hardware:
        echo(f"perfguard: warning: results of {results.hardware!r}, baseline {baseline.hardware!r}")


def write_report(
    report: Report,
    json_path: str | None = None,
    markdown_path: str | None = None,
    *,
    step_summary: bool = True,
) -> tuple[Report, str]:
    """Write the JSON / Markdown files asked for and (`step_summary`) the CI job summary
    (`$GITHUB_STEP_SUMMARY`, where it is set).

    Returns the report as its JSON file holds it (figures rounded) and its Markdown:
    renderings are made from that, so that `perfguard report render` of the file later
    prints exactly the same thing.
    """
    from perfguard.presentation.render import append_step_summary, render_markdown, write_markdown
    from perfguard.storage import reports

    data = reports.write_report(json_path, report) if json_path else report.to_json()
    report = Report.from_json(data)
    markdown = render_markdown(report)
    if markdown_path:
        write_markdown(markdown_path, markdown)
    if step_summary:
        append_step_summary(markdown)
    return report, markdown


# ---- calibrate ------------------------------------------------------------------------------


@dataclass
class Calibration:
    """`calibrate`'s figures: one `CaseCalibration` per case, and what was written."""

    path: str | None
    profile: str
    cases: list[CaseCalibration]
    written: bool = False

    @property
    def failed(self) -> bool:
        return any(c.error for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"baseline": self.path, "profile": self.profile}
        for cal in self.cases:
            out[cal.case_id] = cal.to_json()
        return out


def calibrate(
    selection: Selection,
    options: MeasureOptions,
    setup: CheckSetup,
    *,
    baseline: str | None = None,
    profile: str = "pr_test",
    write: bool = False,
    all_metrics: bool = False,
    platform: Platform | None = None,
    echo: Echo = _stderr,
) -> Calibration:
    """Measure this runner's noise per metric and what the gate can catch through it.

    Each case runs in `options.processes` fresh processes of `options.repeats` runs. Per
    metric: the noise within and between processes, the false-alarm rate of the current
    band, the smallest slowdown caught with >= 95 % probability at <= 1 % false alarms
    (simulated through the real rule for checks set up as `setup` says), and the
    tightest band that keeps false alarms within 1 %. `write` stores those bands as
    per-case tolerance overrides in the baseline.
    """
    from perfguard.decision import calibrate as calibration
    from perfguard.decision.tolerances import default_profiles
    from perfguard.device.inject import ENV_INJECT, inject_from
    from perfguard.storage import baseline as store

    runs = options.processes
    if options.inject or inject_from(None):
        raise PerfguardError(f"calibrate refuses fault injection (${ENV_INJECT} is set)")
    if write and runs < calibration.MIN_RUNS_TO_WRITE:
        raise PerfguardError(
            f"calibrate --write needs --runs >= {calibration.MIN_RUNS_TO_WRITE} (got {runs}): "
            f"from {runs} processes the simulated false-alarm rate moves in steps of "
            f"1/{runs}^2 = {1 / runs**2:.0%}, too coarse to hold a band to "
            f"{calibration.FALSE_ALARM_TARGET:.0%}"
        )
    platform = platform or probe()
    cases = select_cases(platform.name, selection, echo=echo)
    path = baseline_path(baseline, platform.name, platform.hardware_slug())
    base = load_baseline(path) if (write or os.path.exists(path)) else None
    if base is not None:
        store.check_platform(base, platform.name, path)
    prof = base.profile(profile) if base else default_profiles(platform.name)[profile]
    if write and base is not None:  # base is None only without --write
        missing = [c.id for c in cases if c.id not in base.scenarios]
        if missing:
            raise PerfguardError(
                f"{path}: no scenario for {', '.join(missing)}: "
                "run gen-baselines for them before calibrate --write"
            )
    results = run_cases(cases, platform, options.replace(isolate=True))
    out = Calibration(path=path if base else None, profile=profile, cases=[])
    for case in cases:
        scenario = base.scenarios.get(case.id) if base else None
        result, timing = calibration.as_judged(results.cases[case.id], scenario, platform.name)
        out.cases.append(
            calibration.calibrate_case(
                result, prof, setup, scenario=scenario, all_metrics=all_metrics, timing=timing
            )
        )
    if write and base is not None:
        with store.lock(path):
            current = store.load(path)
            for cal in out.cases:
                if cal.error or not cal.detections:
                    continue
                scenario = current.scenarios[cal.case_id]
                merged = calibration.suggested_overrides(
                    cal.detections, scenario.tolerance_overrides
                )
                current = current.with_scenario(
                    cal.case_id, dataclasses.replace(scenario, tolerance_overrides=merged)
                )
            store.save(path, current.touched())
        out.written = True
    return out
