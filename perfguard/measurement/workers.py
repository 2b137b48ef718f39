"""Run cases in worker processes: one per device (`--devices`), one per case (`--isolate`),
and through `torchrun` for cases that need more than one device.

`--devices 0,1` starts one worker per device, with the platform's visible-devices
variable (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, `ASCEND_RT_VISIBLE_DEVICES`) set
to that device; inside, the device is always index 0. Why processes, and how a worker
starts and is killed: `perfguard.measurement.worker_handle`; the multi-device cases:
`perfguard.measurement.distributed`.

`--isolate` retires the worker after every case, so each case starts with a fresh
interpreter, allocator and caches, as pyperf and asv do; without it a device's worker
runs its cases one after another, as a serving process would.

`--processes K` measures each case in K fresh worker processes (isolated, as above) and
pools their samples into one result whose `groups` say which runs came from which
process. On a shared runner a process's median drifts from the next one's by more than
its own samples spread (memory layout, frequency, neighbours: ~4 % between processes
against ~3 % IQR within one on the 2-core CPU runner), so the process, not the run, is
the unit that a baseline must average over and that the verdict must know the spread
of. The K measurements of a case are queued round-robin with the other cases' (all
cases' first process, then all second ones), so that a burst of load on the machine
lands on different cases rather than on every process of one case.

Pipelines come from `perfguard.workloads.registry.build_pipeline` unless a factory is
named as `module:function` (`--factory`, `$PERFGUARD_FACTORY`): a callable taking
`(case, platform)` and returning the zero-argument pipeline, so that your own pipeline
can run under perfguard, in process or in workers alike.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from perfguard.errors import PerfguardError
from perfguard.measurement.distributed import run_distributed
from perfguard.measurement.launch import Placement, child_environment
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.shard import expected_time_s
from perfguard.measurement.worker_handle import WarmPool, Worker, WorkerStarter, error_result
from perfguard.results import CaseResult, Results, pool
from perfguard.storage.cases import Case

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


def _cpu_list(cores: list[int]) -> str:
    from perfguard.device.platform import cpu_list

    return cpu_list(cores)


# ---- scheduling ------------------------------------------------------------------------------


def cpu_pins(slots: int, threads: int, devices: Sequence[str] | None = None) -> list[list[int]]:
    """Disjoint sets of `threads` cores for `slots` parallel CPU workers, in core order.

    Why pin: `--devices 0,1` on CPU starts two workers at once, and unpinned the
    scheduler moves their threads across the same cores, so each worker's figures
    depend on what the other is doing at that moment. With each worker on cores of its
    own the two measure side by side, as two GPUs do. The cores are the ones this
    process may run on (`os.sched_getaffinity`); fewer than `slots x threads` is a
    usage error (exit 2) rather than an oversubscribed, silently slower measurement.
    """
    from perfguard.device.platform import cpu_affinity

    cores = cpu_affinity() or list(range(os.cpu_count() or 1))
    need = slots * threads
    if len(cores) < need:
        asked = f"--devices {','.join(devices)}: " if devices else ""
        raise PerfguardError(
            f"{asked}{slots} CPU workers x {threads} thread(s) each need {need} cores, but "
            f"this process may run on {len(cores)} ({_cpu_list(cores)}): list fewer devices"
        )
    return [cores[i * threads : (i + 1) * threads] for i in range(slots)]


def threads_per_worker(cases: Sequence[Case], override: int | None = None) -> int:
    """Intra-op threads a CPU worker needs: the most any case measures with
    (`perfguard.device.threads.case_threads`: `$PERFGUARD_THREADS`, the case's
    `threads`, else 1)."""
    from perfguard.device.threads import case_threads

    return max([case_threads(c, "cpu", override) for c in cases] or [1])


def _env_for(
    platform: Platform,
    devices: Sequence[str] | None,
    slots: int,
    cores: Sequence[int] | None = None,
    threads: int | None = None,
) -> dict[str, str]:
    """A worker slot's environment (`launch.child_environment`)."""
    return child_environment(placement=Placement(platform.name, devices, threads, cores, slots))


def preload_modules(cases: Sequence[Case] | None, factory: str | None = None) -> list[str]:
    """What a warm server imports for `cases` (`perfguard.workloads.modules.preload_for`)."""
    from perfguard.workloads.modules import preload_for

    return preload_for(cases, factory)


def run_in_workers(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions | None = None,
    *,
    on_case: Callable[[CaseResult], None] | None = None,
    warm: WarmPool | None = None,
) -> Results:
    """Run `cases` in worker processes; a `Results` like `runner.run_in_process`'s.

    `options.devices` lists the devices to use, one worker each (None: one unpinned
    worker). Single-device cases go to whichever worker is free, longest first; then the
    multi-device cases run one at a time through torchrun on the first devices listed.
    With `options.processes` K > 1 every case is measured in K fresh processes and
    `on_case` sees the pooled result once all K are done. `warm` keeps the warm servers
    for later calls (else they end with this one).
    """
    from perfguard.device.platform import fingerprint
    from perfguard.measurement.runner import import_factory

    options = options or MeasureOptions()
    devices, processes = options.devices, options.processes
    if options.factory:
        import_factory(options.factory)  # a bad spec is a usage error now, not N case errors
    single = sorted(
        (c for c in cases if c.num_devices <= 1), key=lambda c: (-expected_time_s(c), c.id)
    )
    slots: list[Sequence[str] | None] = [[d] for d in devices] if devices else [None]
    pins: list[list[int]] | None = None
    if platform.name == "cpu" and len(slots) > 1 and single:
        pins = cpu_pins(len(slots), threads_per_worker(single, options.threads), devices)
    settings = options.settings("workers")
    if pins:
        settings["cpu_pins"] = [_cpu_list(p) for p in pins]
    results = Results(environment=fingerprint(platform), settings=settings)
    run = _SlotRun(platform, options, results, on_case, warm, len(slots))
    run.preload = preload_modules(single, options.factory)
    for k in range(processes):
        for case in single:
            run.todo.put((case, options.for_process(k)))
    threads = [
        threading.Thread(target=run.drive, args=(slot, pins[i] if pins else None), daemon=True)
        for i, slot in enumerate(slots)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if run.fatal:
        raise run.fatal[0]

    for k in range(processes):
        for case in (c for c in cases if c.num_devices > 1):
            run.record(_run_multi(case, platform, options.for_process(k)))
    return results


class _SlotRun:
    """One `run_in_workers` call: the queue of cases that each slot's worker takes from,
    and the results, pooled once every process of a case has reported."""

    def __init__(
        self,
        platform: Platform,
        options: MeasureOptions,
        results: Results,
        on_case: Callable[[CaseResult], None] | None,
        warm: WarmPool | None,
        slots: int,
    ) -> None:
        self.platform, self.options, self.results = platform, options, results
        self.on_case, self.warm, self.slots = on_case, warm, slots
        self.isolate = options.isolated
        self.preload: list[str] = []
        self.lock = threading.Lock()
        self.parts: dict[str, list[CaseResult]] = {}
        self.fatal: list[PerfguardError] = []  # a usage error from a worker ends the command
        self.todo: queue.SimpleQueue[tuple[Case, MeasureOptions]] = queue.SimpleQueue()

    def record(self, res: CaseResult) -> None:
        with self.lock:
            got = self.parts.setdefault(res.case_id, [])
            got.append(res)
            if len(got) < self.options.processes:
                return
            pooled = pool(got)
            self.results.cases[res.case_id] = pooled
            if self.on_case is not None:
                self.on_case(pooled)

    def starter(self, slot: Sequence[str] | None, cores: list[int] | None) -> WorkerStarter:
        options = self.options
        label = f"worker for device {slot[0]}" if slot else "worker"
        if cores:
            label += f" (cores {_cpu_list(cores)})"
        env = _env_for(self.platform, slot, self.slots, cores, options.threads)
        if self.warm is not None:
            return self.warm.starter(env, label, options.start_method, self.preload)
        return WorkerStarter(env, label, options.start_method, self.preload)

    def drive(self, slot: Sequence[str] | None, cores: list[int] | None) -> None:
        """One slot's thread: run cases from the queue in its worker until none is left."""
        options, todo = self.options, self.todo
        starter = self.starter(slot, cores)
        label = starter.label
        worker: Worker | None = None
        try:
            while True:
                try:
                    case, case_options = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    if worker is None:
                        worker, reason = starter.new()
                        if reason is not None:
                            self.record(error_result(case, reason, options))
                            continue
                    self.record(worker.run(case, case_options, self.platform.name))
                except PerfguardError as exc:
                    self.fatal.append(exc)
                    while not todo.empty():  # the other workers stop after their case
                        with contextlib.suppress(queue.Empty):
                            todo.get_nowait()
                    return
                except Exception as exc:  # cannot start a process, a garbled reply, ...
                    if worker is not None:
                        worker.kill()
                    self.record(
                        error_result(case, f"{label}: {type(exc).__name__}: {exc}", options)
                    )
                if worker is not None and (self.isolate or not worker.alive):
                    worker.close()
                    worker = None
        finally:
            if worker is not None:
                worker.close()
            if self.warm is None:
                starter.close()


def _run_multi(case: Case, platform: Platform, options: MeasureOptions) -> CaseResult:
    n, devices = case.num_devices, options.devices
    if devices is not None:
        if len(devices) < n:
            return error_result(
                case, f"needs {n} devices but --devices lists {len(devices)}", options
            )
        chosen: Sequence[str] | None = devices[:n]
    else:
        if platform.name != "cpu" and platform.device_count() < n:
            return error_result(
                case, f"needs {n} devices but {platform.device_count()} are visible", options
            )
        chosen = None
    label = f"devices {','.join(chosen)}" if chosen else f"{n} ranks"
    env = _env_for(platform, chosen, 1, threads=options.threads)
    return run_distributed(case, options, platform.name, env, label)


def execute(
    cases: Sequence[Case],
    platform: Platform,
    options: MeasureOptions | None = None,
    *,
    on_case: Callable[[CaseResult], None] | None = None,
    until_for: Callable[[Case], Callable[[CaseResult], bool] | None] | None = None,
    warm: WarmPool | None = None,
) -> Results:
    """Run `cases` in worker processes (`run_in_workers`) when the options ask for them
    or a case needs more than one device (`MeasureOptions.uses_workers`), else in this
    process (`perfguard.measurement.runner.run_in_process`).

    Adaptive sampling (`until_for`, `options.max_repeats`) needs the verdict after every
    run, which lives in this process: it applies to cases run here, and workers measure
    their `repeats` (the gate still re-runs borderline cases in fresh processes).
    """
    options = options or MeasureOptions()
    if options.uses_workers(cases):
        return run_in_workers(cases, platform, options, on_case=on_case, warm=warm)
    from perfguard.measurement.runner import run_in_process

    return run_in_process(cases, platform, options, on_case=on_case, until_for=until_for)
