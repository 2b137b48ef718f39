"""Measuring a relative check's block in worker processes: each side's workers, started
together, the sides alternating case by case (`ProcessBlocks`).

The base side's workers run with the base's import directory first on `PYTHONPATH` and
as their working directory (`python -m` puts the working directory ahead of
`PYTHONPATH`), so perfguard's workloads, a `--factory` module or a user's pipeline
package come from the base; the head side keeps the caller's environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfguard.decision.paired import BASE, HEAD, SIDES
from perfguard.device.threads import case_threads
from perfguard.errors import PerfguardError
from perfguard.measurement.base_revision import Base, case_for_base, options_for_base
from perfguard.measurement.launch import (
    Placement,
    SharedFork,
    WarmServer,
    child_environment,
    import_root,
)
from perfguard.measurement.options import COUNTED_PROCESSES, MeasureOptions
from perfguard.measurement.worker_handle import Closing, Worker, WorkerStarter, error_result
from perfguard.results import CaseResult
from perfguard.storage.cases import Case


@dataclass(frozen=True)
class Side:
    """How one side's worker processes are started and what they are sent."""

    env: dict[str, str]
    cwd: str | None
    options: MeasureOptions
    encode_case: Callable[[Case], dict[str, Any]]
    options_json: dict[str, Any]
    worker_module: str = "perfguard.measurement.worker"
    root: str | None = None
    """The directory the side's workers import perfguard from (None: this process's)."""
    later: tuple[MeasureOptions, dict[str, Any]] | None = None
    """The options of the blocks after the first `COUNTED_PROCESSES`: no counted run.
    The counts are exact, so the first blocks' counted runs are the comparison, and the
    ~130 ms each counted run costs a smoke case buys blocks instead. None: every block
    counts (a base whose worker cannot be told not to)."""

    def for_block(self, index: int) -> tuple[MeasureOptions, dict[str, Any]]:
        """The options, and their wire form, of this side's worker in block `index`."""
        if index < COUNTED_PROCESSES or self.later is None:
            return self.options, self.options_json
        return self.later


class ProcessBlocks(Closing):
    """A `MeasureBlock` that runs each block in new worker processes (`Worker`).

    Cases with the same thread count share a pair of processes, started together and
    closed after the cases ran; the sides alternate case by case in the block's order,
    mirrored on every other case. With `--start-method forkserver` both sides (of a
    thread count) fork their workers from one warm server for the whole check, started
    with the first block: a block then costs the builds and the runs, not two
    interpreters' imports, and the time saved buys more blocks while a verdict is open.
    It imports no perfguard module; each worker imports its side's (`launch.SharedFork`).
    One server, not one a side: forks of one server share an offset (docs/relative.md)
    that a server a side put between the sides of every block. `close` ends it.
    """

    def __init__(
        self, sides: Mapping[str, Side], platform: str, devices: Sequence[str] | None = None
    ) -> None:
        self.sides, self.platform, self.devices = sides, platform, devices
        self.starters: dict[tuple[str, int], WorkerStarter] = {}
        self.servers: dict[int, WarmServer] = {}

    def env_for(self, side: Side, threads: int) -> dict[str, str]:
        where = Placement(self.platform, self.devices, side.options.threads)
        env = child_environment(side.env, placement=where)
        # Two sides start together: one OpenMP thread per core each would make them fight.
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        return env

    def starter(self, s: str, threads: int, cases: Sequence[Case], index: int) -> WorkerStarter:
        side = self.sides[s]
        label = f"{SIDES[s]} worker"
        key = (s, threads)
        if side.options.start_method != "forkserver":
            label += f" (block {index + 1})"
        if key not in self.starters:  # forks come from `shared_server`: no preload of its own
            self.starters[key] = WorkerStarter(
                self.env_for(side, threads), label, side.options.start_method, [],
                cwd=side.cwd, module=side.worker_module, root=side.root,
            )  # fmt: skip
        starter = self.starters[key]
        if side.options.start_method == "forkserver":
            server = self.shared_server(threads, cases)
            if getattr(starter.server, "server", None) is not server:
                starter.server = SharedFork(server, starter.env, side.cwd, starter.root)
        return starter

    def shared_server(self, threads: int, cases: Sequence[Case]) -> WarmServer:
        """The warm server both sides fork from, one per thread count (a dead one's cases
        were errors: it is replaced)."""
        from perfguard.workloads.modules import preload_for, shared_preload

        old, head = self.servers.get(threads), self.sides[HEAD]
        if old is None or not old.alive:
            if old is not None:
                old.kill()
            factory = head.options.factory
            roots = [os.getcwd(), *(side.root for side in self.sides.values() if side.root)]
            names = shared_preload(preload_for(cases, factory), factory, roots)
            self.servers[threads] = WarmServer(
                self.env_for(head, threads), "warm server of both sides", preload=names,
                root=head.root or import_root(),
            )  # fmt: skip
        return self.servers[threads]

    def __call__(
        self, index: int, order: str, cases: Sequence[Case]
    ) -> dict[str, dict[str, CaseResult]]:
        sides, platform = self.sides, self.platform
        out: dict[str, dict[str, CaseResult]] = {BASE: {}, HEAD: {}}
        groups: dict[int, list[Case]] = {}
        for case in cases:
            threads = case_threads(case, platform, sides[HEAD].options.threads)
            groups.setdefault(threads, []).append(case)
        for threads, group in groups.items():
            starters = {s: self.starter(s, threads, group, index) for s in order}
            for s in order:  # both servers (or both spawned workers) start together
                starters[s].warm_up()
            workers: dict[str, Worker] = {}
            failed: dict[str, str] = {}
            try:
                for s in order:
                    worker, reason = starters[s].new()
                    if worker is None:
                        failed[s] = reason or "did not start"
                    else:
                        workers[s] = worker
                for i, case in enumerate(group):
                    for s in order if i % 2 == 0 else order[::-1]:
                        side = sides[s]
                        options, options_json = side.for_block(index)
                        if s in failed or not workers[s].alive:
                            why = failed.get(s, f"{SIDES[s]} worker died")
                            out[s][case.id] = error_result(case, why, options)
                            continue
                        out[s][case.id] = workers[s].run(
                            case,
                            options,
                            platform,
                            case_json=side.encode_case(case),
                            options_json=options_json,
                        )
            except BaseException:
                for worker in workers.values():
                    worker.kill()
                raise
            for worker in workers.values():
                worker.close()
        return out

    def close(self) -> None:
        for starter in self.starters.values():
            starter.close()
        self.starters.clear()
        for server in self.servers.values():
            server.close()
        self.servers.clear()


def process_blocks(
    sides: Mapping[str, Side],
    platform: str,
    devices: Sequence[str] | None = None,
) -> ProcessBlocks:
    """A `MeasureBlock` running each block in new worker processes (`ProcessBlocks`)."""
    return ProcessBlocks(sides, platform, devices)


def head_side(options: MeasureOptions, platform: str, env: Mapping[str, str] | None = None) -> Side:
    later = options.for_process(COUNTED_PROCESSES)
    return Side(
        env=dict(os.environ if env is None else env),
        cwd=None,
        options=options,
        encode_case=lambda c: c.to_json(),
        options_json=options.to_worker_json(platform),
        later=(later, later.to_worker_json(platform)),
    )


def base_side(
    options: MeasureOptions, base: Base, platform: str, env: Mapping[str, str] | None = None
) -> Side:
    base_options = options.replace(inject={})
    later_options = base_options.for_process(COUNTED_PROCESSES)
    try:
        later = (later_options, options_for_base(later_options, base, platform))
    except PerfguardError:  # a base without `count_work`: its workers count every block
        later = None
    return Side(
        env=child_environment(env, import_dir=base.import_dir),
        cwd=str(base.import_dir),
        options=base_options,
        encode_case=lambda c: case_for_base(c, base),
        options_json=options_for_base(base_options, base, platform),
        worker_module=base.worker_module,
        root=str(base.import_dir),
        later=later,
    )
