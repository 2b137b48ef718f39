"""The parent's handle on a worker process, and what starts it: `Worker` speaks the
protocol, `WorkerStarter` starts the workers of one environment, `WarmPool` keeps their
warm servers for a command.

Why processes: a device is pinned to a process by the platform's visible-devices
variable, read once when the runtime starts, so a worker is started with the variable
set to its device. A process is also the only unit that can be killed for sure: a
kernel that hangs on a device cannot be interrupted from inside the process (the
runner's SIGALRM deadline only reaches Python code), so the parent holds a hard deadline
and kills the worker's whole process tree. And a worker that dies (segfault, OOM killer,
NCCL abort) takes down only the case it was running: the case is reported with the
reason and a fresh worker takes the next one.

How a worker starts (`MeasureOptions.start_method`, `perfguard.measurement.launch`):
`forkserver` (the default on Linux) forks it from a warm server of its slot that
imported torch, transformers, diffusers and perfguard once (`WorkerStarter`; a dead
server's cases are errors and the next case gets a new server), `spawn` starts a fresh
interpreter. In a command forked by the resident server, a slot whose environment fits
that server's key forks its workers from it (`resident_channel`), with no server of
its own to start. Either way it imports the perfguard this process runs, never a folder of
that name in the working directory, and one that cannot start says why in one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfguard.errors import PerfguardError
from perfguard.measurement.launch import (
    EarlyServer,
    ForkChannel,
    ForkedProcess,
    LineReader,
    ResidentChannel,
    SharedFork,
    WarmServer,
    describe_exit,
    import_root,
    spawn_worker,
)
from perfguard.measurement.options import MeasureOptions
from perfguard.results import CaseResult
from perfguard.storage.cases import Case

WORKER_MODULE = "perfguard.measurement.worker"
"""The worker entry point, `python -m WORKER_MODULE serve|rank` (a base revision of the
relative check may name another: `perfguard.measurement.base_revision.Base.worker_module`)."""

STARTUP_TIMEOUT_S = 300.0
"""How long a worker may take to import torch and report ready (a cold start on a
loaded CI machine takes tens of seconds); a worker that does not is treated as dead."""

if TYPE_CHECKING:  # pragma: no cover
    from typing import Self  # Python 3.11


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


class Closing:
    """What holds worker processes or servers: `close` ends them, and so does leaving a
    `with` block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WarmPool(Closing):
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
