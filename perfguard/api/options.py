"""The values the commands take, built once from a command line's flags: the selection
(`Selection`), the measurement (`MeasureOptions`), how a check judges (`JudgeOptions`),
the relative check's base (`RelativeOptions`), how gen-baselines stores (`RefreshOptions`),
with the names, defaults and choices their flags show; and the sampling presets.

A preset (`--fast`, `--rigorous`) changes how much a check samples, never its rule, and
only the knobs the command line left to it: a flag given beside it wins.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Container
from typing import Any

from perfguard.decision.comparison import (
    DEFAULT_RULE,
    RELATIVE_ALPHA,
    RELATIVE_RULE,
    STORED_ALPHA,
    Rule,
)
from perfguard.decision.options import DEFAULT_CONFIRM_GAP_S, DEFAULT_MAX_RERUNS, JudgeOptions
from perfguard.decision.resolution import DEFAULT_TIMING_GATE, TIMING_GATES
from perfguard.decision.tolerances import DEFAULT_PROFILE
from perfguard.device.inject import inject_from
from perfguard.errors import PerfguardError
from perfguard.measurement.launch import START_METHODS
from perfguard.measurement.options import SYNC_POLICIES, MeasureOptions, factory_from, parse_devices
from perfguard.measurement.relative import (
    DEFAULT_BUDGET_S,
    DEFAULT_MAX_BLOCKS,
    DEFAULT_MIN_BLOCKS,
    RelativeOptions,
)
from perfguard.metrics import TIMINGS
from perfguard.storage.cases import PLATFORM_NAMES, Selection
from perfguard.storage.refresh import RefreshOptions

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_CONFIRM_GAP_S",
    "DEFAULT_MAX_BLOCKS",
    "DEFAULT_MAX_RERUNS",
    "DEFAULT_MIN_BLOCKS",
    "DEFAULT_PROFILE",
    "DEFAULT_TIMING_GATE",
    "PLATFORM_NAMES",
    "RELATIVE_ALPHA",
    "RIGOROUS",
    "START_METHODS",
    "STORED_ALPHA",
    "SYNC_POLICIES",
    "TIMINGS",
    "TIMING_GATES",
    "JudgeOptions",
    "MeasureOptions",
    "RefreshOptions",
    "RelativeOptions",
    "Selection",
    "judge_options_from",
    "measure_options_from",
    "popped",
    "relative_judging",
    "relative_options_from",
    "rigorous_check",
    "rigorous_relative",
    "selection_from",
    "work_only_options",
]


def popped(flags: dict[str, Any], *names: str, **renamed: str) -> dict[str, Any]:
    """Pop the flags `names` out of `flags`, and each flag `renamed[field]` as `field`:
    the keyword arguments of the value they build."""
    out = {name: flags.pop(name) for name in names}
    return out | {field: flags.pop(flag) for field, flag in renamed.items()}


def selection_from(flags: dict[str, Any]) -> Selection:
    """Pop the selection group's raw flags out of `flags` into a `Selection`."""
    chosen = popped(flags, "cases_dir", "case_ids", "match", "tags")
    return Selection(**chosen, shard=flags.pop("shard_spec", None))


def measure_options_from(flags: dict[str, Any], *, inject: bool) -> MeasureOptions:
    """Pop the measurement group's raw flags out of `flags` into a `MeasureOptions`;
    `inject=False`: the command takes no fault injection."""
    devices = parse_devices(flags.pop("devices_spec", None))
    return MeasureOptions(
        **popped(flags, "repeats", "warmup", "timeout", "sync", "threads"),
        inject=inject_from(flags.pop("inject", None)) if inject else {},
        factory=factory_from(flags.pop("factory_spec")),
        devices=tuple(devices) if devices is not None else None,
        isolate=flags.pop("isolate", False),
        start_method=flags.pop("start_method", None),
        processes=flags.pop("processes", 1),
        max_repeats=flags.pop("max_repeats", None),
        progress=flags.pop("progress", None),
    )


def judge_options_from(flags: dict[str, Any]) -> JudgeOptions:
    """Pop the judging group's raw flags out of `flags` into a `JudgeOptions`; a flag the
    command does not take keeps its default."""
    alpha = flags.pop("alpha", None)
    return JudgeOptions(
        **popped(flags, "fail_on_missing", "advisory", "allow_output_change"),
        profile=flags.pop("profile", DEFAULT_PROFILE),
        max_reruns=flags.pop("max_reruns", DEFAULT_MAX_RERUNS),
        confirm_gap_s=flags.pop("confirm_gap_s", DEFAULT_CONFIRM_GAP_S),
        rule=DEFAULT_RULE if alpha is None else Rule(alpha),
        timing_gate=flags.pop("timing_gate", DEFAULT_TIMING_GATE),
    )


RELATIVE_FLAGS = ("budget_s", "min_blocks", "max_blocks", "order_seed", "write_baseline", "timing")
"""The relative group's flags that are `RelativeOptions` fields of the same name."""


def relative_options_from(flags: dict[str, Any]) -> RelativeOptions | None:
    """Pop the relative group's raw flags out of `flags`: a `RelativeOptions` with
    --against, else None. `--against` names a directory when one of that name exists
    or it is written as a path (`./base`, `/src/base`), else a revision of this
    repository."""
    against, subdir = flags.pop("against"), flags.pop("against_subdir")
    values = popped(flags, *RELATIVE_FLAGS)
    if against is None:
        return None
    path_like = os.path.isdir(against) or against.startswith((".", os.sep, "~"))
    directory, ref = (against, None) if path_like else (None, against)
    return RelativeOptions(directory, ref, subdir, **values)


def relative_judging(judging: JudgeOptions, given: Container[str]) -> JudgeOptions:
    """A relative check judges at the relative level (`RELATIVE_RULE`) unless `--alpha`
    was given."""
    return judging if "alpha" in given else judging.replace(rule=RELATIVE_RULE)


def work_only_options(options: MeasureOptions, storing: RefreshOptions) -> MeasureOptions:
    """`gen-baselines --work-only`: time nothing, one counted run in one process (counts
    are exact: one says it all); `--tighten`, which lowers timed figures, is refused."""
    if storing.tighten:
        raise PerfguardError("--tighten lowers timed figures: --work-only stores none")
    return options.replace(counters_only=True, processes=1)


RIGOROUS = {
    "check": "3 processes first, up to 16 fresh ones, 40 runs each",
    "compare": "a 3x budget, up to 96 blocks",
}
"""What `--rigorous` measures, per command, as its help says it."""


def rigorous_check(
    options: MeasureOptions, judging: JudgeOptions, given: Container[str]
) -> tuple[MeasureOptions, JudgeOptions]:
    """`--rigorous` for the stored check: 3 processes first, up to 16 confirmations and
    40 runs a process, where `given` (the knobs the command line set) does not say."""
    if "processes" not in given:
        options = options.replace(processes=3)
    if "max_repeats" not in given:
        options = options.replace(max_repeats=40)
    if "max_reruns" not in given:
        judging = judging.replace(max_reruns=16)
    return options, judging


def rigorous_relative(relative: RelativeOptions, given: Container[str]) -> RelativeOptions:
    """`--rigorous` for the relative check: a 3x budget and up to 96 blocks, where `given`
    (the knobs the command line set) does not say."""
    return dataclasses.replace(
        relative,
        budget_s=relative.budget_s if "budget_s" in given else relative.budget_s * 3,
        max_blocks=relative.max_blocks if "max_blocks" in given else 96,
    )
