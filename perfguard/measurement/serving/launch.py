"""A server perfguard starts for a case (`launch`), waits for, and always stops.

The argv's `{port}` becomes a free port of 127.0.0.1 and `{python}` this interpreter. The
server is ready when `GET /health` answers 200, or when its log shows the case's `ready`
line (sglang prints `Application startup complete.`). It runs in a session of its own,
with its output in a temporary log whose last lines an error quotes; it is stopped with
its whole process tree (SIGTERM, then SIGKILL) when the command ends, on Ctrl-C, on
SIGTERM (the CLI turns it into an exception that unwinds) and on a start that times out.

A server case launches one server per round (`perfguard.measurement.serving.case` says
why), so a check's confirmation, one more round, measures a fresh server as a pipeline
case's confirmation measures a fresh process. Every server still running when the
command ends is stopped (`stop_all`, at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from perfguard.errors import PerfguardError
from perfguard.measurement.launch import import_root
from perfguard.measurement.worker_handle import _descendants, kill_tree

TAIL_LINES = 20


class LaunchFailed(Exception):
    """The server exited or never got ready; the message ends with its last log lines."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


class Launched:
    """One started server: its URL, its process, its log."""

    def __init__(self, argv: Sequence[str], ready: str = "", timeout_s: float = 300.0):
        self.port = free_port()
        self.argv = [a.replace("{port}", str(self.port)).replace("{python}", sys.executable)
                     for a in argv]  # fmt: skip
        self.ready, self.timeout_s = ready, timeout_s
        self.url = f"http://127.0.0.1:{self.port}"
        fd, name = tempfile.mkstemp(prefix="perfguard-server-", suffix=".log")
        self.log = Path(name)
        self._out = os.fdopen(fd, "wb")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the server and wait until it is ready; its URL. `LaunchFailed` otherwise,
        with the server stopped."""
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> None:
        """Start the server's process (in a session of its own), without waiting."""
        if _is_perfguard_serve(self.argv):
            _resident_first()
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=self._out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise LaunchFailed(f"cannot start {' '.join(self.argv)}: {exc}") from exc
        _LIVE[id(self)] = self

    def wait_ready(self) -> str:
        """Wait until the spawned server is ready; its URL (`LaunchFailed`: stopped)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                why = self._why(f"exited with {code} before ready")
                self.stop()
                raise LaunchFailed(why)
            if self._is_ready():
                return self.url
            time.sleep(0.05)
        why = self._why(f"not ready after {self.timeout_s:g} s")
        self.stop()
        raise LaunchFailed(why)

    def _is_ready(self) -> bool:
        if self.ready:
            return self.ready in self.log.read_text(encoding="utf-8", errors="replace")
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def _why(self, what: str) -> str:
        last = tail(self.log)
        shown = f"; its last log lines:\n{last}" if last else " (its log is empty)"
        return f"launched server `{' '.join(self.argv)}` {what}{shown}"

    def stop(self) -> None:
        """SIGTERM the server's session, then SIGKILL whatever is left of its tree."""
        _LIVE.pop(id(self), None)
        proc, self.proc = self.proc, None
        if proc is not None:
            stray = _descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            kill_tree(proc)
            for pid in stray:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._out.close()
            self.log.unlink()


def _is_perfguard_serve(argv: Sequence[str]) -> bool:
    """`perfguard serve ...` or `python -m perfguard serve ...`: a server that starts
    warm from the resident server (`perfguard.cli`)."""
    for i, arg in enumerate(argv[:-1]):
        if os.path.basename(arg) == "perfguard" and argv[i + 1] == "serve":
            return True
    return False


def _resident_first() -> None:
    """Make sure the resident server runs before a `perfguard serve` is launched, started
    from here if need be: started by the launched command instead, it would be one of
    that command's descendants, stopped with it (`Launched.stop`), and every launch
    would pay the imports again. Nothing happens where no resident server is wanted
    (`$PERFGUARD_SERVER_IDLE_S=0`) or can run; the launch then imports by itself."""
    from perfguard.measurement import resident

    with contextlib.suppress(resident.Unavailable, PerfguardError):
        idle = resident.idle_seconds(os.environ)
        if idle > 0:
            sock, _ = resident.ensure(os.environ, import_root(), resident.preload_modules(), idle)
            sock.close()


_LIVE: dict[int, Launched] = {}
"""The servers started and not yet stopped, by id: what `stop_all` stops at exit."""


@atexit.register
def stop_all() -> None:
    """Stop every server this command started and has not stopped."""
    while _LIVE:
        _LIVE.popitem()[1].stop()
