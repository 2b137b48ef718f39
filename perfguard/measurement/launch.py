"""The parent's side of starting worker processes: `spawn`, or forks of a warm server.

`perfguard.measurement.forkserver` is the code that runs in the new process (by path,
with `python -c`, so that the working directory cannot shadow perfguard); this module
starts it and keeps the handles: `spawn_worker` starts a fresh interpreter as before,
`WarmServer` starts one server per worker environment and forks workers from it, and
`ResidentChannel` forks them from the resident server a command runs in
(`perfguard.measurement.resident`); both speak through a `ForkChannel`. Every worker a
measurement starts is one of two programs speaking one protocol (a ready message,
JSON-line requests on stdin, replies on a result pipe): `perfguard.measurement.worker`
(measure a case) and `perfguard.measurement.side_worker` (profile or count with a side's
own perfguard, run by path: `SIDE_WORKER`). `child_environment` builds the environment
of every process started here.

Why a server of our own rather than `multiprocessing`'s forkserver: a worker is pinned by
its environment (the visible-devices variable, cores, threads), which must be in place
before torch is imported, so each worker environment gets its own server started with
it; the relative check's base side needs a server that imports the base revision's
perfguard, which `multiprocessing` (one server per interpreter, importing the parent's
modules) cannot give; and the workers keep speaking the JSON-lines protocol of
`perfguard.measurement.worker`, so a forked worker and a spawned one are the same
worker, measured the same way.

Pure standard library: the parent imports this without torch.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from perfguard.device.inject import ENV_INJECT
from perfguard.device.pinning import ENV_CPU_AFFINITY, visible_devices_env
from perfguard.device.threads import ENV_OVERRIDE as ENV_THREADS
from perfguard.errors import PerfguardError

START_METHODS = ("spawn", "forkserver")
"""`spawn`: every worker is a fresh interpreter (imports included); `forkserver`: workers
are forked from a server that imported torch, transformers, diffusers and perfguard."""

BOOT_PATH = Path(__file__).with_name("forkserver.py")
BOOT = f"import runpy; runpy.run_path({str(BOOT_PATH)!r}, run_name='__main__')"
"""What `python -c` runs: `forkserver.py` by path (its directory is not put on sys.path)."""

SIDE_WORKER = str(Path(__file__).with_name("side_worker.py"))
"""The worker that profiles (`explain`) and counts (`bisect`) a side with the side's own
perfguard: this revision's file, run by path, since an older side's perfguard lacks it."""

FORK_TIMEOUT_S = 30.0
"""How long a server may take to answer a fork request (it forks in milliseconds)."""


def default_start_method() -> str:
    """`forkserver` where it is available (Linux), else `spawn`."""
    return "forkserver" if _forkserver_missing() is None else "spawn"


def _forkserver_missing() -> str | None:
    """Why this platform cannot fork warm workers, or None."""
    if not sys.platform.startswith("linux"):
        return (
            f"forking a process that has imported torch is not safe on {sys.platform} "
            "(only Linux has it)"
        )
    if not hasattr(socket, "send_fds") or not hasattr(socket, "SOCK_SEQPACKET"):
        return "this Python lacks socket.send_fds / SOCK_SEQPACKET"
    return None


def resolve_start_method(name: str | None) -> str:
    """The start method asked for, checked; None: the platform's default.

    An unknown name, or `forkserver` where the platform lacks it, is a usage error
    (exit 2) naming the option. A parent that has initialised CUDA does not matter: the
    server is a fresh interpreter that never touches a device.
    """
    if name is None:
        return default_start_method()
    if name not in START_METHODS:
        raise PerfguardError(f"--start-method {name!r}: expected one of {', '.join(START_METHODS)}")
    if name == "forkserver":
        missing = _forkserver_missing()
        if missing is not None:
            raise PerfguardError(f"--start-method forkserver: {missing}; use spawn")
    return name


def import_root() -> str:
    """The directory holding the `perfguard` package this process runs: a worker of this
    revision imports from there, whatever its working directory holds."""
    import perfguard

    return str(Path(perfguard.__file__).resolve().parent.parent)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def log_fd() -> int | None:
    """Where a worker's stdout goes: our stderr, so that our stdout (JSON) stays clean."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def spawn_worker(
    module: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    root: str,
    pass_fds: Sequence[int],
    output: int | None = None,
) -> subprocess.Popen[bytes]:
    """A fresh interpreter running `module argv...`, importing from `root` first; its
    stdout and stderr go to `output` when given (else stdout to our stderr)."""
    return subprocess.Popen(
        [sys.executable, "-c", BOOT, "boot", root, module, *argv],
        stdin=subprocess.PIPE,
        stdout=log_fd() if output is None else output,
        stderr=output,
        env=dict(env),
        cwd=cwd,
        pass_fds=tuple(pass_fds),
        start_new_session=True,  # its own process group, killed as one
    )


class LineReader:
    """Reads newline-terminated JSON messages from a pipe, with a deadline."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def read(self, deadline: float | None) -> dict[str, Any] | None:
        """The next message; None at end of file; `TimeoutError` past `deadline`."""
        while b"\n" not in self.buffer:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], wait)
            if not ready:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]


class ForkedProcess:
    """A worker forked by a `WarmServer`: the part of `subprocess.Popen` a `Worker` uses.

    It is the server's child, not ours, so its exit status comes from the server; when
    the server itself is gone the worker died with it (`PR_SET_PDEATHSIG`).
    """

    def __init__(self, server: ForkChannel, pid: int, stdin: IO[bytes]) -> None:
        self.server = server
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin

    @property
    def returncode(self) -> int | None:
        return self.server.exits.get(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.server.cond:
            while self.pid not in self.server.exits and not self.server.dead:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
                self.server.cond.wait(left if left is None else min(left, 0.5))
        return self.returncode

    def describe(self) -> str:
        """How it ended, in the words of `describe_exit`, or that its server died."""
        if self.returncode is not None:
            return describe_exit(self.returncode)
        if self.server.dead:
            return f"its warm server died ({self.server.describe()})"
        return "still running"


class ForkChannel:
    """A control socket to a server that forks workers (`forkserver.serve_forks`, or the
    resident server's `serve_resident`): fork requests out, forks and exits back."""

    _ids = itertools.count(1)

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.label = label
        self.sock = sock
        self.cond = threading.Condition()
        self.exits: dict[int, int] = {}
        self.forked: dict[int, dict[str, Any]] = {}
        self.ready: dict[str, Any] | None = None
        self.dead = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.dead = True
                    self.cond.notify_all()
                    return
                msg = json.loads(data)
                if "ready" in msg:
                    self.ready = msg
                elif "forked" in msg:
                    self.forked[int(msg["forked"])] = msg
                elif "exited" in msg:
                    self.exits[int(msg["exited"])] = int(msg["returncode"])
                self.cond.notify_all()

    def describe(self) -> str:
        return "its socket closed"

    def _request(self) -> tuple[dict[str, Any], list[int]]:
        """What every fork request of this channel adds (`env`, ...) and extra descriptors."""
        return {}, []

    def fork(
        self,
        module: str,
        argv: Sequence[str],
        request: Mapping[str, Any] | None = None,
        output: int | None = None,
    ) -> tuple[ForkedProcess, int]:
        """A new worker running `module argv...` (`{result_fd}` names its result pipe):
        its process and the read end of its result pipe; `request` adds to the fork
        request (`SharedFork`: the side's `env`, `cwd` and `root`), `output` is where
        its stdout and stderr go. `OSError` when the server is gone."""
        stdin_r, stdin_w = os.pipe()
        result_r, result_w = os.pipe()
        ident = next(self._ids)
        extra, fds = self._request()
        if output is not None:
            fds = [output]
        try:
            msg = {"fork": ident, "module": module, "argv": list(argv), **extra, **(request or {})}
            msg = json.dumps(msg)
            socket.send_fds(self.sock, [msg.encode()], [stdin_r, result_w, *fds])
        except BaseException:
            for fd in (stdin_w, result_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(result_w)
        deadline = time.monotonic() + FORK_TIMEOUT_S
        with self.cond:
            while ident not in self.forked and not self.dead and time.monotonic() < deadline:
                self.cond.wait(0.5)
            reply = self.forked.pop(ident, None)
        if reply is None or "pid" not in reply:
            os.close(stdin_w)
            os.close(result_r)
            if self.dead:
                raise OSError(f"{self.label} died ({self.describe()})")
            why = reply.get("error") if reply else f"no answer within {FORK_TIMEOUT_S:g} s"
            raise OSError(f"{self.label} could not fork a worker: {why}")
        return ForkedProcess(self, int(reply["pid"]), os.fdopen(stdin_w, "wb")), result_r

    def start(self, timeout: float) -> str | None:
        """Wait until the server has imported its modules; the reason it did not, else None."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.ready is None and not self.dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 0.5))
            ready = self.ready
        if ready is None:
            if self.dead:
                why = f"{self.label} died while starting ({self.describe()})"
            else:
                why = f"{self.label} did not start within {timeout:g} s"
            self.kill()
            return why
        if not ready.get("ready"):
            self.kill()
            return f"{self.label} could not start: {ready.get('error')}"
        return None

    @property
    def alive(self) -> bool:
        return not self.dead

    def close(self) -> None:
        """End the connection: the server kills the workers it forked for it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    def kill(self) -> None:
        self.close()


class WarmServer(ForkChannel):
    """One warm server (`forkserver.serve_forks`) for workers of one environment, started
    by this process and ended with it."""

    def __init__(
        self,
        env: Mapping[str, str],
        label: str,
        *,
        preload: Sequence[str],
        root: str,
        cwd: str | None = None,
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", BOOT, "serve-forks", root, str(theirs.fileno()),
                 json.dumps(list(preload))],
                stdin=subprocess.DEVNULL,
                stdout=log_fd(),
                # `torch.cuda.is_available()` through NVML: it must not initialise the
                # driver in a process that forks workers which use the device.
                env=child_environment(env, update={"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}),
                cwd=cwd,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )  # fmt: skip
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        super().__init__(ours, label)

    def describe(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return describe_exit(self.proc.poll())

    @property
    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None

    def close(self) -> None:
        """End the server: closing the socket makes it kill its workers and exit."""
        super().close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL the server's process group; its workers die with it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(OSError):
            self.sock.close()


class SharedFork:
    """One side's forks of a warm server that several sides share (`WarmServer` with no
    perfguard module imported): each fork request carries the side's environment,
    working directory and import root, so a worker imports its own revision's perfguard
    (~0.06 s once torch, transformers and diffusers are in). The relative check forks
    its base and head workers from one server this way: forks of one server share an
    offset (docs/relative.md), and shared by both sides it cancels in their ratio.
    The server's owner ends it; `close` and `kill` here leave it alone."""

    def __init__(
        self, server: WarmServer, env: Mapping[str, str], cwd: str | None, root: str
    ) -> None:
        self.server = server
        self.label = server.label
        self.request = {"env": dict(env), "cwd": cwd or os.getcwd(), "root": root}

    @property
    def ready(self) -> dict[str, Any] | None:
        return self.server.ready

    @property
    def alive(self) -> bool:
        return self.server.alive

    def start(self, timeout: float) -> str | None:
        return self.server.start(timeout)

    def fork(
        self, module: str, argv: Sequence[str], output: int | None = None
    ) -> tuple[ForkedProcess, int]:
        return self.server.fork(module, argv, self.request, output)

    def describe(self) -> str:
        return self.server.describe()

    def close(self) -> None:
        """Nothing: the server's owner closes it."""

    def kill(self) -> None:
        """Nothing: the server's owner kills it."""


class ResidentChannel(ForkChannel):
    """Workers forked by the resident server this command runs in
    (`perfguard.measurement.resident`), in `env` and `cwd`, their output on our stderr."""

    def __init__(
        self, path: str, label: str, env: Mapping[str, str], cwd: str | None, pid: int | None
    ) -> None:
        """Connect to the server at `path`; `OSError` unless it is the one of `pid` (a
        newer server that took the name since imports newer code than this command)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.settimeout(10.0)
            sock.connect(path)
            hello = json.loads(sock.recv(1 << 16) or b"{}")
            sock.settimeout(None)
            if not hello.get("ready") or (pid is not None and hello.get("pid") != pid):
                raise OSError(f"{path} is another resident server now")
        except (OSError, ValueError):
            sock.close()
            raise OSError(f"{path}: not this command's resident server") from None
        self.env, self.cwd = dict(env), cwd or os.getcwd()
        super().__init__(sock, f"{label} (resident server)")
        self.ready = hello

    def _request(self) -> tuple[dict[str, Any], list[int]]:
        fd = log_fd()
        return {"env": self.env, "cwd": self.cwd}, [] if fd is None else [fd]

    def describe(self) -> str:
        return "the resident server closed the connection"


@dataclass(frozen=True)
class Placement:
    """Where a worker runs: the visible devices of `platform` narrowed to `devices`, its
    intra-op `threads` (`MeasureOptions.threads`), the `cores` a CPU worker is pinned to,
    and how many CPU workers (`slots`) run side by side. Built once per worker slot."""

    platform: str = ""
    devices: Sequence[str] | None = None
    threads: int | None = None
    cores: Sequence[int] | None = None
    slots: int = 1


def child_environment(
    base: Mapping[str, str] | None = None,
    *,
    update: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    import_dir: str | os.PathLike[str] | None = None,
    placement: Placement | None = None,
) -> dict[str, str]:
    """The environment of a process perfguard starts: `base` (default: ours) with
    `update` set and `unset` removed, then, each where given:

    - `import_dir` (another revision's side: a relative check's base, a profiled or
      counted side) first on `PYTHONPATH`, and no fault injection: `--inject` slows the
      head under test, and another side is measured as it is;
    - the worker's `placement`: the visible devices of its platform narrowed to its
      devices, its threads as `$PERFGUARD_THREADS` (the worker's `case_threads` reads
      it: the options on the wire leave threads out), a CPU worker's cores as
      `$PERFGUARD_CPU_AFFINITY` (applied before torch is imported) with as many OpenMP
      threads; without cores, parallel CPU workers (`slots`) share the cores' OpenMP
      threads, else each would start one per core and they would fight.
    """
    env = dict(os.environ if base is None else base)
    env.update(update or {})
    for name in unset:
        env.pop(name, None)
    if import_dir is not None:
        rest = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = os.pathsep.join([str(import_dir), *([rest] if rest else [])])
        env.pop(ENV_INJECT, None)
    if placement is not None:
        _place(env, placement)
    return env


def _place(env: dict[str, str], where: Placement) -> None:
    """Set `where`'s threads, visible devices and cores in `env` (`child_environment`)."""
    if where.threads is not None:
        env[ENV_THREADS] = str(where.threads)
    var = visible_devices_env(where.platform)
    if var and where.devices:
        env[var] = ",".join(where.devices)
    if where.cores:
        from perfguard.device.platform import cpu_list

        env[ENV_CPU_AFFINITY] = cpu_list(list(where.cores))
        env.setdefault("OMP_NUM_THREADS", str(len(where.cores)))
    elif where.platform == "cpu" and where.slots > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // where.slots))


EarlyServer = tuple[dict[str, str], str, str, list[str], WarmServer]
"""What `early_server` started: the environment, label, start method and modules of the
one-slot worker it serves, and the server (`worker_handle.WarmPool(early)` takes it over)."""


def early_server(options: Any, wanted: bool) -> EarlyServer | None:
    """Start the warm server of the default worker slot now, without waiting for it,
    when `wanted` (the command will start workers), `options` (`MeasureOptions`) fork
    them from a server and list no `--devices`; else None.

    Why: a command that measures in workers (`gen-baselines`, a check's confirmations)
    used to import torch itself to probe the platform and only then start the server,
    which imports torch, transformers and diffusers again: one import bill after the
    other. Started first, the server imports on another core while this process probes
    and reads its files. The one-slot environment does not depend on the platform (no
    device to narrow), so the server can start before the platform is known; it
    imports every workload's modules, since the cases are not known yet either
    (`perfguard.workloads.modules.everything`).
    """
    if not wanted or options.start_method != "forkserver" or options.devices:
        return None
    if os.environ.get("PERFGUARD_SERVER"):  # a resident server forks the workers
        return None
    from perfguard.workloads.modules import preload_for

    preload = preload_for(None, options.factory)
    env = child_environment(placement=Placement(threads=options.threads))
    label = "worker"
    server = WarmServer(env, f"warm server of the {label}", preload=preload, root=import_root())
    return env, label, options.start_method, preload, server
