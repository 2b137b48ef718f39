"""`perfguard compare --against DIR|REF`: this revision against a base one, side by side,
no baseline."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from perfguard.api.common import NO_OUTPUTS, Echo, Outputs, probe, select_cases, to_stderr
from perfguard.decision.options import RELATIVE_JUDGING, JudgeOptions
from perfguard.errors import PerfguardError
from perfguard.measurement.explain import attribute_regressions
from perfguard.measurement.options import MeasureOptions
from perfguard.results import Results
from perfguard.storage.cases import Case, Selection
from perfguard.storage.reports import Report

if TYPE_CHECKING:
    from perfguard.device.platform import Platform
    from perfguard.measurement.relative import RelativeOptions


def check_relative(
    selection: Selection,
    options: MeasureOptions,
    against: RelativeOptions,
    *,
    judging: JudgeOptions | None = None,
    platform: Platform | None = None,
    outputs: Outputs = NO_OUTPUTS,
    echo: Echo = to_stderr,
) -> Report:
    """The relative check: this revision against a base one, side by side, no baseline.

    Base (`against.directory`, or a worktree of `against.ref`) and head run in randomized
    interleaved blocks of fresh processes, judged on their paired per-block ratios
    (`perfguard.decision.paired`). Bad options, registry, base or baseline path fail
    before the first block. `judging` (default `RELATIVE_JUDGING`) less confirmations.
    `outputs.results` also gets the head's results; the attribution's traces go to
    `outputs.traces_dir()`.
    """
    from perfguard.decision.paired import BASE, HEAD
    from perfguard.storage import refresh
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
                                   traces_dir=outputs.traces_dir())  # fmt: skip
    if outputs.results:
        head = Results(environment=environment, settings=settings)
        head.cases = dict(outcome.pooled[HEAD])
        write_results(outputs.results, head)
    if against.write_baseline:
        base_env = {**environment, "git_commit": base.commit}
        for _, result in sorted(outcome.pooled[BASE].items()):
            if result.status == "ok":
                refresh.record_case(against.write_baseline, result, base_env)
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
    from perfguard.decision.paired import BASE, HEAD, BlockComparison
    from perfguard.measurement import base_revision, checkout, paired_blocks, relative

    timing = against.timing_on(platform.name)
    with contextlib.ExitStack() as stack:
        directory = against.directory
        if against.ref is not None:
            directory = str(stack.enter_context(checkout.temporary_worktree(against.ref)))
        assert directory is not None
        base = base_revision.probe_base(
            directory, subdir=against.subdir, factory=options.factory, ref=against.ref
        )
        for case in cases:
            base_revision.case_for_base(case, base)  # an unknown field fails before any block
        sides = {
            HEAD: paired_blocks.head_side(options, platform.name),
            BASE: paired_blocks.base_side(options, base, platform.name),
        }
        echo(
            f"perfguard: relative check of {len(cases)} case(s) against {base.describe()}, "
            f"base perfguard {base.version}; up to {against.max_blocks} blocks in "
            f"{against.budget_s:g} s, timings {timing}"
        )

        def on_block(index: int, block: Any, open_metrics: int) -> None:
            looked = f", {open_metrics} metric(s) unresolved" if open_metrics >= 0 else ""
            echo(f"perfguard: block {index + 1} ({block.order}) took {block.seconds:.1f} s{looked}")

        blocks = stack.enter_context(
            paired_blocks.process_blocks(sides, platform.name, options.devices)
        )
        outcome = relative.run_relative(
            cases,
            blocks,
            against.schedule,
            judging=judging,
            on_block=on_block,
            comparison=BlockComparison(timing, platform.name),
        )
    return base, outcome
