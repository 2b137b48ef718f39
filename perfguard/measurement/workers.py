"""Run cases in worker processes: one per device (`--devices`), one per case (`--isolate`),
and through `torchrun` for cases that need more than one device.

Why processes: a device is pinned to a process by the platform's visible-devices
variable (`CUDA_VISIBLE_DEVICES`, `HIP_VISIBLE_DEVICES`, `ASCEND_RT_VISIBLE_DEVICES`),
read once when the runtime starts, so `--devices 0,1` starts one worker per device with
the variable set to that device; inside, the device is always index 0. A process is also
the only unit that can be killed for sure: a kernel that hangs on a device cannot be
interrupted from inside the process (the runner's SIGALRM deadline only reaches Python
code), so the parent holds a hard deadline and kills the worker's whole process tree.
And a worker that dies (segfault, OOM killer, NCCL abort) takes down only the case it was
running: the case is reported with the reason and a fresh worker takes the next one.

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

Cases with `num_devices = N > 1` are launched with `python -m torch.distributed.run
--standalone --nproc-per-node N -m perfguard.measurement.worker rank ...` on N devices of the list;
each rank narrows the visible-devices variable to its own device, initialises the process
group (NCCL on CUDA/ROCm, HCCL on NPU, gloo on CPU) and runs the case. The pipeline uses
the group where it has a parallel implementation (the Qwen-Image and GLM-Image pipelines
run CFG-parallel on two ranks); afterwards the ranks all-reduce their per-run timings
with MAX, because a step of a parallel pipeline ends when its slowest rank does, and rank
0 writes the result. These cases run one at a time, after the single-device ones, since
they share the interconnect and would disturb each other's figures. On CPU the ranks are
processes on the same cores, with torchrun's default of one thread each: the figures
show the launch, the collectives and the parallel pipeline working, not a speed-up.

How a worker starts (`MeasureOptions.start_method`, `perfguard.measurement.launch`):
`forkserver` (the default on Linux) forks it from a warm server of its slot that
imported torch, transformers, diffusers and perfguard once (`WorkerStarter`; a dead
server's cases are errors and the next case gets a new server), `spawn` starts a fresh
interpreter. In a command forked by the resident server, a slot whose environment fits
that server's key forks its workers from it (`resident_channel`), with no server of
its own to start. Either way it imports the perfguard this process runs, never a folder of
that name in the working directory, and one that cannot start says why in one line.

Pipelines come from `perfguard.workloads.registry.build_pipeline` unless a factory is
named as `module:function` (`--factory`, `$PERFGUARD_FACTORY`): a callable taking
`(case, platform)` and returning the zero-argument pipeline, so that your own pipeline
can run under perfguard, in process or in workers alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.device.pinning import ENV_CPU_AFFINITY, die_with_parent, visible_devices_env  # noqa: F401 (re-exported)
from perfguard.errors import PerfguardError
from perfguard.measurement.launch import (
    EarlyServer,
    ForkChannel,
    ForkedProcess,
    LineReader,
    Placement,
    ResidentChannel,
    SharedFork,
    WarmServer,
    child_environment,
    describe_exit,
    import_root,
    spawn_worker,
)
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.shard import expected_time_s
from perfguard.results import CaseResult, Results, pool
from perfguard.storage.cases import Case
from perfguard.storage.jsonio import read_json, write_json_atomic

if TYPE_CHECKING:
    from perfguard.device.platform import Platform


def _cpu_list(cores: list[int]) -> str:
    from perfguard.device.platform import cpu_list

    return cpu_list(cores)


WORKER_MODULE = "perfguard.measurement.worker"
"""The worker entry point, `python -m WORKER_MODULE serve|rank` (a base revision of the
relative check may name another: `perfguard.measurement.relative.Base.worker_module`)."""

STARTUP_TIMEOUT_S = 300.0
"""How long a worker may take to import torch and report ready (a cold start on a
loaded CI machine takes tens of seconds); a worker that does not is treated as dead."""


def kill_grace_s(timeout: float) -> float:
    """Extra time past `--timeout` before the parent kills a worker.

    The worker's own SIGALRM deadline fires at `timeout` and, for a case stuck in Python
    code, ends it cleanly with the runs measured so far; the kill is the backstop for a
    case stuck where a signal cannot reach (a device kernel, a collective, C code).
    """
    return 2.0 + 0.05 * timeout


# ---- requests -------------------------------------------------------------------------------


def case_from_json(data: dict[str, Any]) -> Case:
    """The inverse of `Case.to_json()` (the case was validated when its registry loaded)."""
    data = dict(data)
    data["prompt_lengths"] = tuple(data.get("prompt_lengths", ()))
    data["tags"] = tuple(data.get("tags", ()))
    return Case(**data)


def error_result(case: Case, message: str, options: MeasureOptions) -> CaseResult:
    return CaseResult(
        case_id=case.id,
        status="error",
        error=message,
        warmup=options.warmup,
        case=case.definition(),
    )


# ---- process plumbing ------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc (Linux); [] where /proc is not available."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Field 4 is the parent pid; the command name (field 2) may contain spaces.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(proc: subprocess.Popen[Any] | ForkedProcess) -> None:
    """SIGKILL `proc`, its process group and every descendant, then reap it.

    The group kill reaches what the worker started; the descendant walk reaches what
    left the group (torchrun starts each rank in a session of its own).
    """
    stray = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in stray:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class Worker:
    """One `perfguard.measurement.worker serve` process, pinned by the variables in `env`
    (or, `module=launch.SIDE_WORKER`, a side worker: the same protocol, other requests).

    Requests (a case and the options) go in on its stdin, one JSON line each; results
    come back on a pipe of their own, so whatever the pipeline prints cannot corrupt
    them. The worker's stdout and stderr go to our stderr, or to `output`. It is a fresh
    interpreter (`spawn_worker`), or a fork of `server` (`WarmServer`); either way it
    imports perfguard from `root` (default: the directory of the perfguard this process
    runs), never from the working directory.
    """

    def __init__(
        self,
        env: dict[str, str],
        label: str,
        cwd: str | None = None,
        module: str = WORKER_MODULE,
        *,
        root: str | None = None,
        server: ForkChannel | SharedFork | None = None,
        output: int | None = None,
    ) -> None:
        self.label = label
        self.proc: subprocess.Popen[bytes] | ForkedProcess
        if server is not None:
            argv = ["serve", "--result-fd", "{result_fd}"]
            self.proc, read_fd = server.fork(module, argv, output=output)
        else:
            read_fd, write_fd = os.pipe()
            try:
                self.proc = spawn_worker(
                    module,
                    ["serve", "--result-fd", str(write_fd)],
                    env=env,
                    cwd=cwd,
                    root=root or import_root(),
                    pass_fds=(write_fd,),
                    output=output,
                )
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
        self.reader = LineReader(read_fd)
        self.alive = True

    def how(self) -> str:
        """How the process ended, once it has (waits a few seconds for its status)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        if isinstance(self.proc, ForkedProcess):
            return self.proc.describe()
        return describe_exit(self.proc.poll())

    def start(self) -> str | None:
        """Wait for the worker to report ready; the reason it did not, else None."""
        try:
            msg = self.reader.read(time.monotonic() + STARTUP_TIMEOUT_S)
        except TimeoutError:
            self.kill()
            return f"{self.label} did not start within {STARTUP_TIMEOUT_S:g} s"
        except ValueError as exc:  # not JSON: something else wrote on the result pipe
            self.kill()
            return f"{self.label} sent a garbled start message ({exc})"
        if msg is not None and msg.get("fatal"):
            self.kill()
            return f"{self.label} could not start: {msg['fatal']}"
        if msg is None or not msg.get("ready"):
            # Its own exit status, not our SIGKILL, is what the message reports.
            why = f"{self.label} died while starting ({self.how()})"
            self.kill()
            return why
        return None

    def ask(self, request: dict[str, Any], deadline: float | None) -> dict[str, Any] | None:
        """Send one request and read its reply; None when the worker ended without one
        (its result pipe closed), `TimeoutError` past `deadline`, `OSError` when its
        stdin is closed."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()
        return self.reader.read(deadline)

    def run(
        self,
        case: Case,
        options: MeasureOptions,
        platform: str,
        *,
        case_json: dict[str, Any] | None = None,
        options_json: dict[str, Any] | None = None,
    ) -> CaseResult:
        """Run one case; a timeout or a death becomes that case's error.

        `case_json` / `options_json` replace the request's serialized case and options
        (a relative check sends the base revision's worker only the fields it knows).
        """
        request = {
            "case": case.to_json() if case_json is None else case_json,
            "options": options.to_worker_json(platform) if options_json is None else options_json,
        }
        started = time.monotonic()
        deadline = None
        if options.timeout:
            deadline = started + options.timeout + kill_grace_s(options.timeout)
        try:
            msg = self.ask(request, deadline)
        except TimeoutError:
            self.kill()
            return error_result(
                case,
                f"timeout: killed after {time.monotonic() - started:.1f} s "
                f"(--timeout {options.timeout:g} s; the case did not stop by itself)",
                options,
            )
        except (BrokenPipeError, OSError):
            msg = None
        if msg is None:
            # The result pipe closed: the worker is exiting. Let it finish so that its own
            # exit status (not our SIGKILL) is what the message reports.
            how = self.how()
            self.kill()
            return error_result(case, f"{self.label} died while running this case ({how})", options)
        if msg.get("fatal"):
            self.kill()
            return error_result(case, f"{self.label} failed: {msg['fatal']}", options)
        if "usage_error" in msg:  # e.g. an --inject that matched no stage: exit 2, not a case
            raise PerfguardError(str(msg["usage_error"]))
        return CaseResult.from_json(case.id, msg["result"])

    def close(self) -> None:
        """End the worker: EOF on its stdin, then a kill if it does not leave."""
        if not self.alive:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc)
        self._release()

    def kill(self) -> None:
        kill_tree(self.proc)
        self._release()

    def _release(self) -> None:
        self.alive = False
        with contextlib.suppress(OSError):
            os.close(self.reader.fd)
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def resident_channel(
    env: dict[str, str], label: str, root: str, cwd: str | None
) -> ResidentChannel | None:
    """Fork this slot's workers from the resident server this command runs in, when that
    server's key fits the workers' environment and import root (it differs in
    `PERFGUARD_*` and visible-devices variables at most); else None (a server of the
    slot's own is started)."""
    from perfguard.measurement import resident

    path, _, pid = os.environ.get(resident.ENV_SOCKET, "").partition("#")
    if not path or resident.server_key(env, root) != resident.server_key(os.environ, import_root()):
        return None
    try:
        return ResidentChannel(path, label, env, cwd, int(pid) if pid.isdigit() else None)
    except OSError:
        return None


class WorkerStarter:
    """Starts the workers of one slot (one environment): fresh interpreters (`spawn`), or
    forks of one warm server (`forkserver`), started on first use and replaced when it
    has died; a dead server's workers are errors of the cases they were running."""

    def __init__(
        self,
        env: dict[str, str],
        label: str,
        method: str,
        preload: Sequence[str],
        *,
        cwd: str | None = None,
        module: str = WORKER_MODULE,
        root: str | None = None,
    ) -> None:
        self.env, self.label, self.method = env, label, method
        self.preload, self.cwd, self.module = list(preload), cwd, module
        self.root = root or import_root()
        self.server: ForkChannel | None = None

    def warm_up(self) -> None:
        """Start the warm server now, without waiting for it (so that several start
        together); `ready` waits. A server that died is replaced."""
        if self.method != "forkserver" or (self.server is not None and self.server.alive):
            return
        if self.server is not None:
            self.server.kill()
        self.server = resident_channel(self.env, self.label, self.root, self.cwd)
        if self.server is None:
            self.server = WarmServer(
                self.env, f"warm server of the {self.label}", preload=self.preload,
                root=self.root, cwd=self.cwd,
            )  # fmt: skip

    def ready(self) -> str | None:
        """Wait for the server started by `warm_up`; the reason it could not start, or None."""
        if self.method != "forkserver":
            return None
        if self.server is None or not self.server.alive:
            self.warm_up()
        assert self.server is not None
        if self.server.ready is not None and self.server.ready.get("ready"):
            return None
        reason = self.server.start(STARTUP_TIMEOUT_S)
        if reason is not None:
            self.server = None
        return reason

    def new(self) -> tuple[Worker | None, str | None]:
        """A started worker, or None and the reason it could not start."""
        reason = self.ready()
        if reason is not None:
            return None, reason
        try:
            worker = Worker(
                self.env, self.label, self.cwd, self.module, root=self.root, server=self.server
            )
        except OSError as exc:  # cannot start a process, or the server died meanwhile
            return None, f"{self.label}: {exc}"
        reason = worker.start()
        return (None, reason) if reason is not None else (worker, None)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server = None


class WarmPool:
    """Warm servers kept across several `run_in_workers` calls of one command (a check's
    confirmations, one at a time): each worker environment's server is started once and
    ended by `close`, instead of once per call."""

    def __init__(self, early: EarlyServer | None = None) -> None:
        self.starters: dict[tuple[str, tuple[tuple[str, str], ...]], WorkerStarter] = {}
        self.lock = threading.Lock()
        if early is not None:  # a server started before the platform was known
            env, label, method, preload, server = early
            self.starter(env, label, method, preload).server = server

    def starter(
        self, env: dict[str, str], label: str, method: str, preload: Sequence[str]
    ) -> WorkerStarter:
        key = (method, tuple(sorted(env.items())))
        with self.lock:
            if key not in self.starters:
                self.starters[key] = WorkerStarter(env, label, method, preload)
            return self.starters[key]

    def close(self) -> None:
        with self.lock:
            for starter in self.starters.values():
                starter.close()
            self.starters.clear()

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- torchrun --------------------------------------------------------------------------------

TORCHRUN_STARTUP_S = 300.0
"""How long torchrun's rendezvous and the ranks' imports may take before the case starts.

`--timeout` counts from the moment every rank has joined the process group (rank 0 then
writes a marker file), so a slow start does not eat into the case's own time.
"""


def run_distributed(
    case: Case, options: MeasureOptions, platform: str, env: dict[str, str], label: str
) -> CaseResult:
    """Launch `case` on `case.num_devices` ranks through torchrun; rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="perfguard-dist-") as tmp:
        request, result, log = Path(tmp, "request.json"), Path(tmp, "result.json"), Path(tmp, "log")
        request_json = {"case": case.to_json(), "options": options.to_worker_json(platform)}
        write_json_atomic(request, request_json)
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--standalone",  # rendezvous on localhost with a free port
            "--nproc-per-node", str(case.num_devices),
            "-m", WORKER_MODULE, "rank",
            "--request", str(request), "--result", str(result),
        ]  # fmt: skip
        marker = Path(str(result) + ".started")
        started = time.monotonic()
        with log.open("wb") as log_fh:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip
            why = _wait_distributed(proc, marker, options.timeout)
        text = log.read_text(errors="replace")
        if text:
            print(text, end="" if text.endswith("\n") else "\n", file=sys.stderr, flush=True)
        if why is not None:
            return error_result(
                case, f"timeout: killed after {time.monotonic() - started:.1f} s ({why})", options
            )
        if result.is_file():
            data = read_json(result)
            if "usage_error" in data:
                raise PerfguardError(str(data["usage_error"]))
            return CaseResult.from_json(case.id, data)
        last = [ln.strip() for ln in text.splitlines() if ln.strip()][-1:] or [""]
        how = describe_exit(proc.returncode)
        message = f"{label} (torchrun, {case.num_devices} ranks) failed ({how})"
        return error_result(case, message + (f": {last[0][:300]}" if last[0] else ""), options)


def _wait_distributed(
    proc: subprocess.Popen[Any], marker: Path, timeout: float | None
) -> str | None:
    """Wait for torchrun; kill its tree past the deadline and say which one it was."""
    start_deadline = time.monotonic() + TORCHRUN_STARTUP_S
    case_deadline: float | None = None
    while True:
        try:
            proc.wait(timeout=0.2)
            return None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if case_deadline is None and marker.exists():
            if timeout is None:
                proc.wait()
                return None
            case_deadline = now + timeout + kill_grace_s(timeout)
        if case_deadline is None and now > start_deadline:
            kill_tree(proc)
            return f"the ranks did not all start within {TORCHRUN_STARTUP_S:g} s"
        if case_deadline is not None and now > case_deadline:
            kill_tree(proc)
            return f"--timeout {timeout:g} s; the case did not stop by itself"


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
