"""A pytest plugin: time stages in your own tests, gate them like `perfguard check`.

Installed with perfguard (entry point `pytest11`), so any test suite can use it::

    import pytest
    from perfguard.device.timer import stage

    @pytest.mark.perfguard(case="unet_512")
    def test_unet_speed(perfguard_timer):
        pipe = build_my_pipeline()
        perfguard_timer.measure(pipe, repeats=5, warmup=1)  # or: with perfguard_timer.run(): ...

Inside a measured run the timer is the ambient one, so `perfguard.device.timer.stage()` and
`step()` calls in the code under test are recorded, exactly as in `perfguard run`; the
run's wall time is `e2e`. Each test is one case (its id is the marker's `case`, else the
test's name); its samples become a results file (`--perfguard-results`), and with
`--perfguard-baseline` the session ends judged as `perfguard judge --results` judges
(`perfguard.decision.verdict`): per figure *same*, *slower* or *can't tell* with the
smallest slowdown it could have caught, the same table and JSON report
(`--perfguard-report`). A slower figure makes the session exit 1, as it makes
`perfguard check` exit 1; *can't tell* is shown in the summary and does not fail the
session (pytest has no "no verdict" status); a test that fails while measuring is
already a test failure, and its case is reported as an error.

What the plugin shares with `perfguard check`: `measure` makes one untimed counted run
after the warm-up (work per stage and step: aten ops, FLOPs, bytes, host syncs, judged
exactly; on CPU also the tensor memory), every run is bracketed by the reference
workload (`perfguard.device.reference`: the contention screen and the normalization),
and the output is compared (hash, then sketch). What it does not do: it runs in the
test's own process, so there are no confirmations in fresh processes and no
between-process spread beyond what the baseline holds (a figure with too few processes
answers can't tell, never same, against a multi-process baseline); a run by hand
(`perfguard_timer.run()`) has no counted run and no peak memory on CPU (its body cannot
be re-run); there is no per-op attribution. For those, make the pipeline a case and
gate it with `perfguard check` / `perfguard compare`.
`--perfguard-update-baseline` stores the measured cases in the baseline file instead, as
`perfguard gen-baselines` does (contended runs left out, a busy session marked busy),
which is how that file is made in the first place.

Why a judgement at session end rather than per test: a verdict is on the run as a whole
(the missing-baseline and advisory rules look at every case), and one report per session
is what CI uploads and `perfguard merge` combines.

With pytest-xdist each worker would judge its own share: run the perf tests without -n.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from perfguard.errors import EXIT_REGRESSION, PerfguardError

if TYPE_CHECKING:  # pragma: no cover
    from perfguard.device.platform import Platform
    from perfguard.device.reference import Reference
    from perfguard.device.timer import StageTimer
    from perfguard.results import CaseResult, Results

# perfguard's timer, runner and platform import torch; they are imported when a test first
# asks for the fixture, so that merely having perfguard installed (this plugin loads in
# every pytest run of the environment) costs nothing.

MARKER = "perfguard"
_STATE = pytest.StashKey["_Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perfguard", "perfguard stage timing and baseline gate")
    group.addoption(
        "--perfguard-baseline",
        default=None,
        help="Baseline file to check the measured cases against (as perfguard check).",
    )
    group.addoption(
        "--perfguard-profile",
        default=None,
        help="Tolerance profile of the baseline (default: pr_test).",
    )
    group.addoption(
        "--perfguard-report", default=None, help="Write the check report (JSON) to this file."
    )
    group.addoption(
        "--perfguard-results",
        default=None,
        help="Write the measured samples as a perfguard results file.",
    )
    group.addoption(
        "--perfguard-update-baseline",
        action="store_true",
        default=False,
        help="Store the measured cases in --perfguard-baseline instead of checking them "
        "(as perfguard gen-baselines; creates the file when missing).",
    )
    group.addoption(
        "--perfguard-platform",
        default=None,
        help="Platform to time on instead of the probed one (cpu, cuda, rocm, npu).",
    )
    group.addoption(
        "--perfguard-repeats", type=int, default=None, help="Default measured runs (5)."
    )
    group.addoption(
        "--perfguard-warmup", type=int, default=None, help="Default untimed runs first (1)."
    )
    parser.addini("perfguard_baseline", "Default for --perfguard-baseline.", default=None)
    parser.addini("perfguard_profile", "Default for --perfguard-profile.", default=None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(case=None, repeats=None, warmup=None, tolerance_overrides=None, "
        "output_may_change=False): "
        "the perfguard case this test measures with the perfguard_timer fixture",
    )
    config.stash[_STATE] = _Session(config)


class PerfguardTimer:
    """What the `perfguard_timer` fixture gives a test: measured runs of one case."""

    def __init__(self, session: _Session, result: CaseResult, repeats: int, warmup: int):
        self._session = session
        self.result = result
        self.repeats = repeats
        self.warmup = warmup
        self.platform = session.platform

    @property
    def case_id(self) -> str:
        return self.result.case_id

    @contextlib.contextmanager
    def run(self) -> Iterator[StageTimer]:
        """One measured run: the body's wall time is `e2e`, its `stage()`s its stages.

        On CPU a run by hand records no peak memory: the figure there comes from a
        tracked run of its own (`perfguard.measurement.memory`), which only `measure` can make.
        """
        from perfguard.device.timer import StageTimer

        yardstick = self._session.reference()
        before = yardstick.time_ms()
        track = not self.platform.separate_memory_run
        with StageTimer(self.platform, track_memory=track) as timer:
            yield timer
        # The yardstick right before and right after the run, as `perfguard run` reads it.
        self.result.reference.append(max(before, yardstick.time_ms()))
        self.result.add_run(timer.record())
        self.result.repeats += 1

    def measure(
        self, fn: Callable[[], Any], repeats: int | None = None, warmup: int | None = None
    ) -> Any:
        """Call `fn` `warmup` times untimed, then `repeats` times measured; the last output.

        The warm-up runs pay one-off costs (lazy initialisation, allocator growth, kernel
        selection) that a serving process pays once, as in `perfguard run`. Then `fn` is
        called once more, untimed and counted (`perfguard.measurement.work.counted_run`):
        its work per stage and step, and on CPU its tensor memory.
        """
        repeats = self.repeats if repeats is None else repeats
        warmup = self.warmup if warmup is None else warmup
        if repeats < 1 or warmup < 0:
            raise PerfguardError("perfguard_timer.measure: repeats must be >= 1, warmup >= 0")
        from perfguard.measurement.runner import output_sketch, tensor_hash

        for _ in range(warmup):
            fn()
        self.result.warmup += warmup
        self._count(fn)
        hashes: list[str] = []
        output = None
        for _ in range(repeats):
            with self.run():
                output = fn()
            if _is_tensor(output):
                hashes.append(tensor_hash(output))
                if self.result.output_sketch is None:  # as `perfguard run`: the first one's
                    self.result.output_sketch = output_sketch(output)
        if hashes:
            self.result.output_hash = hashes[0]
            self.result.deterministic = len(set(hashes)) == 1
        return output

    def _count(self, fn: Callable[[], Any]) -> None:
        """The counted run, as `perfguard run` makes it (`runner._count_work`): a
        pipeline the counting mode cannot run loses its counts, not its timings."""
        from perfguard.measurement.work import counted_run

        try:
            work, memory = counted_run(fn, self.platform)
        except Exception as exc:
            first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
            self.result.work_error = f"the pipeline failed under the counting mode ({first})"
            return
        self.result.work = [work.to_json()]
        if memory is not None:  # one counted run's figures, as `runner._count_work`
            for name, mb in memory.metrics().items():
                self.result.samples[name] = [mb]
            self.result.memory = memory.to_json()

    # The ambient helpers, for tests that do not import perfguard.device.timer themselves.
    @staticmethod
    def stage(name: str) -> Any:
        """`with perfguard_timer.stage("DenoisingStage"): ...` (see `timer.stage`)."""
        from perfguard.device.timer import stage

        return stage(name)

    @staticmethod
    def step(index: int) -> Any:
        """`with perfguard_timer.step(i): ...` (= `perfguard.device.timer.step`)."""
        from perfguard.device.timer import step

        return step(index)


def _is_tensor(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor)


class _Session:
    """The cases measured in this pytest session and, at its end, their judgement."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.results: dict[str, CaseResult] = {}
        self.nodes: dict[str, str] = {}
        self._platform: Platform | None = None
        self._reference: Reference | None = None
        self.report: Any = None
        self.updated: list[str] = []
        self.warnings: list[str] = []
        self.error: str | None = None

    def option(self, name: str) -> Any:
        value = self.config.getoption(f"--perfguard-{name}")
        if value is None and name in ("baseline", "profile"):
            value = self.config.getini(f"perfguard_{name}") or None
        return value

    def reference(self) -> Reference:
        """The reference workload of this session's platform, built on first use."""
        if self._reference is None:
            from perfguard.device.reference import Reference

            self._reference = Reference(self.platform)
        return self._reference

    @property
    def platform(self) -> Platform:
        if self._platform is None:
            from perfguard.device.platform import probe

            self._platform = probe(self.option("platform"))
        return self._platform

    def new_case(self, item: pytest.Item) -> PerfguardTimer:
        marker = item.get_closest_marker(MARKER)
        kwargs = dict(marker.kwargs) if marker else {}
        if marker and marker.args:
            kwargs.setdefault("case", marker.args[0])
        case_id = str(kwargs.get("case") or _case_id(item.name))
        if case_id in self.nodes:
            raise PerfguardError(
                f"perfguard case {case_id!r} is measured by both {self.nodes[case_id]} and "
                f"{item.nodeid}: give each test its own @pytest.mark.perfguard(case=...)"
            )
        self.nodes[case_id] = item.nodeid
        definition: dict[str, Any] = {"id": case_id, "source": item.nodeid}
        if kwargs.get("tolerance_overrides"):
            definition["tolerance_overrides"] = dict(kwargs["tolerance_overrides"])
        if kwargs.get("output_may_change"):
            definition["output_may_change"] = True
        from perfguard.results import CaseResult

        result = CaseResult(case_id=case_id, case=definition)
        self.results[case_id] = result
        repeats = kwargs.get("repeats") or self.option("repeats") or 5
        warmup = kwargs.get("warmup")
        warmup = warmup if warmup is not None else self.option("warmup")
        return PerfguardTimer(self, result, int(repeats), 1 if warmup is None else int(warmup))

    def fail_case(self, case_id: str, message: str) -> None:
        result = self.results[case_id]
        result.status = "error"
        lines = message.strip().splitlines()
        result.error = lines[0][:500] if lines else "the test failed"

    def _store(self, path: str, results: Results) -> None:
        """Store the measured cases as `perfguard gen-baselines` does (runs the reference
        saw contended left out; a busy session stored marked busy, and said)."""
        from perfguard.storage import baseline as store
        from perfguard.storage import refresh

        with store.lock(path):
            earlier = store.open_for_update(path, results.environment)
        for cid, result in self.results.items():
            if result.status != "ok":
                continue
            done = refresh.record_measured(
                path, result, results.environment, earlier.scenarios.get(cid), allow_busy=True
            )
            self.updated.append(cid)
            why = done.busy or done.contended
            if why:
                self.warnings.append(f"{cid}: the runner was busy ({why}); marked busy")

    def to_results(self) -> Results:
        from perfguard.device.platform import fingerprint
        from perfguard.results import Results

        return Results(
            environment=fingerprint(self.platform),
            settings={"runner": "pytest"},
            cases=dict(self.results),
        )

    def finish(self) -> int | None:
        """Write the results, judge them when a baseline is given; the exit code, if any."""
        measured = {cid: r for cid, r in self.results.items() if r.repeats or r.status != "ok"}
        if not measured:
            return None
        self.results = measured
        results = self.to_results()
        path = self.option("results")
        if path:
            from perfguard.storage.reports import write_results

            write_results(path, results)
        baseline_path = self.option("baseline")
        if not baseline_path:
            return None
        if self.option("update-baseline"):
            self._store(baseline_path, results)
            return None
        self.report = check(
            results, baseline_path, self.option("profile"), report_path=self.option("report")
        )
        return int(self.report.exit_code)


def check(
    results: Results,
    baseline_path: str | Path,
    profile: str | None = None,
    *,
    report_path: str | Path | None = None,
) -> Any:
    """Judge `results` against a baseline file as `perfguard judge --results` does
    (`perfguard.api.judge_results`); the Report, also written to `report_path`."""
    from perfguard import api
    from perfguard.decision.options import JudgeOptions
    from perfguard.decision.tolerances import DEFAULT_PROFILE

    report = api.judge_results(
        results,
        JudgeOptions(profile=profile or DEFAULT_PROFILE),
        baseline=str(baseline_path),
        source="this pytest session",
    )
    if report_path:
        api.write_report(report, str(report_path), step_summary=False)
    return report


def _case_id(name: str) -> str:
    """A test name as a case id: `test_unet[512-fp16]` -> `test_unet_512-fp16`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "case"


# ---- fixture and hooks -----------------------------------------------------------------------


@pytest.fixture
def perfguard_timer(request: pytest.FixtureRequest) -> PerfguardTimer:
    """Measured runs of this test's perfguard case (see `PerfguardTimer`)."""
    session = request.config.stash[_STATE]
    try:
        return session.new_case(request.node)
    except PerfguardError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    session = item.config.stash[_STATE]
    message = call.excinfo.exconly() if call.excinfo is not None else str(report.longrepr)
    for case_id, node in session.nodes.items():
        if node == item.nodeid:
            session.fail_case(case_id, message)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    try:
        code = state.finish()
    except PerfguardError as exc:
        state.error = str(exc)
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    if code == EXIT_REGRESSION and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    if state.error:
        terminalreporter.section("perfguard", red=True)
        terminalreporter.write_line(f"perfguard: error: {state.error}")
        return
    if state.updated:
        terminalreporter.section("perfguard")
        path = state.option("baseline")
        terminalreporter.write_line(f"perfguard: stored {len(state.updated)} case(s) in {path}")
        for line in state.warnings:
            terminalreporter.write_line(f"perfguard: warning: {line}")
    if state.report is None:
        return
    from rich.console import Console

    from perfguard.presentation.render import render_table

    terminalreporter.section("perfguard", red=state.report.exit_code != 0)
    buffer = io.StringIO()
    render_table(state.report, Console(file=buffer, highlight=False, soft_wrap=False, width=160))
    for line in buffer.getvalue().rstrip("\n").splitlines():
        terminalreporter.write_line(line)
    path = state.option("report")
    if path:
        terminalreporter.write_line(f"perfguard report: {path}")
