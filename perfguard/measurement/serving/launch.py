"""A server perfguard starts for a case (`launch`), waits for, and always stops.

The argv's `{port}` becomes a free port of 127.0.0.1 and `{python}` this interpreter. The
server is ready when `GET /health` answers 200, or when its log shows the case's `ready`
line (sglang prints `Application startup complete.`). It runs in a session of its own,
with its output in a temporary log whose last lines an error quotes; it is stopped with
its whole process tree (SIGTERM, then SIGKILL) when the command ends, on Ctrl-C, on
SIGTERM (the CLI turns it into an exception that unwinds) and on a start that times out.

One server per argv and command: a check's confirmations measure more rounds of the
server its first measurement started, as a confirmation measures one more process.
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

from perfguard.measurement.workers import _descendants, kill_tree

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
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=self._out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:
            raise LaunchFailed(f"cannot start {' '.join(self.argv)}: {exc}") from exc

    def wait_ready(self) -> str:
        """Wait until the spawned server is ready; its URL (`LaunchFailed`: stopped)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise LaunchFailed(self._why(f"exited with {self.proc.returncode} before ready"))
            if self._is_ready():
                return self.url
            time.sleep(0.2)
        self.stop()
        raise LaunchFailed(self._why(f"not ready after {self.timeout_s:g} s"))

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

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM the server's session, then SIGKILL whatever is left of its tree."""
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


_RUNNING: dict[tuple[str, ...], Launched] = {}


def server_for(argv: Sequence[str], ready: str, timeout_s: float) -> Launched:
    """The running server of `argv` in this command, started on first use."""
    key = tuple(argv)
    server = _RUNNING.get(key)
    if server is not None and server.alive():
        return server
    server = Launched(argv, ready, timeout_s)
    server.start()
    _RUNNING[key] = server
    return server


def forget(argv: Sequence[str]) -> None:
    """Stop `argv`'s server (after a failure: the next measurement starts a fresh one)."""
    server = _RUNNING.pop(tuple(argv), None)
    if server is not None:
        server.stop()


@atexit.register
def stop_all() -> None:
    """Stop every server this command started."""
    while _RUNNING:
        _RUNNING.popitem()[1].stop()
