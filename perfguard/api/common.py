"""What every command shares: the platform, the baseline's path, the selected cases,
and running them."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfguard.errors import PerfguardError
from perfguard.measurement.options import MeasureOptions
from perfguard.results import CaseResult, Results
from perfguard.storage.baseline import Baseline
from perfguard.storage.cases import Case, Selection, load_registry

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


Echo = Callable[[str], None]


def to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Outputs:
    """What a check writes besides its table: the JSON report, the Markdown report, the
    results of the cases it ran; and whether the table shows passing step metrics."""

    report: str | None = None
    markdown: str | None = None
    results: str | None = None
    all_metrics: bool = False

    def traces_dir(self) -> str | None:
        """Where the per-op attribution's Chrome traces go: `$PERFGUARD_TRACES_DIR` when
        set, else beside the JSON report (none without one)."""
        from perfguard.measurement.explain import ENV_TRACES_DIR

        if os.environ.get(ENV_TRACES_DIR):
            return os.environ[ENV_TRACES_DIR]
        return os.path.dirname(os.path.abspath(self.report)) if self.report else None


NO_OUTPUTS = Outputs()


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
    echo: Echo = to_stderr,
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
    cases: list[Case], spec: str | None, split_by: str | None, *, echo: Echo = to_stderr
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
    `warm` (a `worker_handle.WarmPool`) keeps warm servers for later calls. Server cases run
    here, their rounds being their processes (`perfguard.measurement.serving.case`)."""
    from perfguard.measurement.serving.case import with_server_cases
    from perfguard.measurement.workers import execute

    return with_server_cases(execute, cases, platform, options, on_case=on_case,
                             until_for=until_for, warm=warm)  # fmt: skip
