"""The resident server: measuring commands that start warm, one import bill per machine.

A command that measures (`run`, `gen-baselines`, `check`, `calibrate`, `ab`) spends
most of a smoke gate importing torch, transformers and diffusers (~6 s on the 2-core
runner) before it measures for ~2 s. The console script (`perfguard.cli.main`) asks a
resident server instead: a process of the same interpreter and environment that has
imported those modules once and forks each command line, with the caller's stdin,
stdout, stderr, environment and working directory; the command's workers (baseline
processes, confirmations) are forked from it too. The first command starts the server
(and pays the imports once); later ones start in milliseconds. The server ends after
`$PERFGUARD_SERVER_IDLE_S` seconds without a client (default 600; `0` turns it off:
every command imports its own modules, as before), or on `perfguard server stop`.

What keeps it honest:

- **Never stale.** The server writes the path, mtime and size of every module file it
  imported into a manifest; before a command uses it, the client compares them with
  the files on disk, and any difference (an edited perfguard, a reinstalled
  diffusers) stops that server and starts a new one. What the command imports after
  the fork is read from disk as usual.
- **One server per environment.** The server's key is the interpreter, the import root
  of perfguard and every environment variable except `PERFGUARD_*`, the
  visible-devices variables (read after the fork, when a device runtime starts) and a
  shell's bookkeeping (`PWD`, `SHLVL`, ...): a variable a library reads at import
  (`OMP_NUM_THREADS`, `HF_HUB_OFFLINE`) gives another server.
- **A fork is a fresh process** for measurement: nothing has run in the server, no
  thread pool or device runtime has started; what it shares with its siblings is the
  address-space layout and the string-hash seed (`benchmarks/noise.py` measures
  whether that narrows the spread between processes: docs/verdicts.md).
- **Nothing outlives its caller.** A command whose console script dies (killed, its
  terminal closed) is killed with what it started; the server itself leaves when idle.

Standard library only: the console script imports this before anything heavy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENV_IDLE = "PERFGUARD_SERVER_IDLE_S"
ENV_DIR = "PERFGUARD_SERVER_DIR"
ENV_SOCKET = "PERFGUARD_SERVER"
"""Set in a command the resident server forked: the socket its workers fork from (and
a sign that the console script must not ask a server again)."""

DEFAULT_IDLE_S = 600.0
START_TIMEOUT_S = 300.0
MEASURING = frozenset({"run", "gen-baselines", "check", "calibrate", "ab"})
"""The commands that import torch: the ones a resident server is started for."""

SHELL_VARIABLES = frozenset({"_", "PWD", "OLDPWD", "SHLVL", "PS1", "PS2", "COLUMNS", "LINES"})
LATE_VARIABLES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
     "ASCEND_RT_VISIBLE_DEVICES"}
)  # fmt: skip
"""Read when a device runtime starts, after the fork: they do not change the server."""


class Unavailable(Exception):
    """No resident server can serve this command (the reason is the message)."""


def idle_seconds(env: Mapping[str, str]) -> float:
    """`$PERFGUARD_SERVER_IDLE_S` as seconds (default 600, 0: no resident server);
    anything else is a usage error naming the variable."""
    text = env.get(ENV_IDLE, "").strip()
    if not text:
        return DEFAULT_IDLE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        from perfguard.errors import PerfguardError

        raise PerfguardError(
            f"${ENV_IDLE}={text!r}: expected the seconds a resident server waits for the "
            "next command (a number >= 0; 0 turns the server off)"
        )
    return value


def _keyed(env: Mapping[str, str]) -> dict[str, str]:
    return {
        k: v
        for k, v in env.items()
        if not k.startswith("PERFGUARD_") and k not in LATE_VARIABLES and k not in SHELL_VARIABLES
    }


def server_key(env: Mapping[str, str], root: str) -> str:
    """Which server may serve a process of `env` importing perfguard from `root`."""
    text = json.dumps([sys.executable, root, sorted(_keyed(env).items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the servers' sockets and manifests live: `$PERFGUARD_SERVER_DIR`, else
    `$XDG_RUNTIME_DIR/perfguard`, else `/tmp/perfguard-UID`; a directory only its owner
    may enter (a socket there forks code as that user)."""
    env = os.environ if env is None else env
    if env.get(ENV_DIR):
        path = Path(env[ENV_DIR])
    elif env.get("XDG_RUNTIME_DIR"):
        path = Path(env["XDG_RUNTIME_DIR"], "perfguard")
    else:
        path = Path("/tmp", f"perfguard-{os.getuid()}")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as exc:
        raise Unavailable(f"cannot use {path}: {exc.strerror or exc}") from None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise Unavailable(f"{path} is not private to this user (chmod 700 it)")
    return path


class Paths:
    def __init__(self, directory: Path, key: str) -> None:
        self.key = key
        self.socket = str(directory / f"server-{key}.sock")
        self.manifest = str(directory / f"server-{key}.json")
        self.lock = str(directory / f"server-{key}.lock")
        self.log = str(directory / f"server-{key}.log")


def stale(manifest: Mapping[str, Any]) -> str | None:
    """The first imported file that changed on disk since the server imported it, or None."""
    for path, mtime_ns, size in manifest.get("files", ()):
        try:
            st = os.stat(path)
        except OSError:
            return f"{path} is gone"
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return f"{path} changed"
    return None


def read_manifest(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def connect(path: str, key: str, timeout: float = 10.0) -> tuple[socket.socket, dict[str, Any]] | None:
    """A connection to the server at `path` and its ready message; None if none answers."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        data = sock.recv(1 << 16)
        sock.settimeout(None)
        hello = json.loads(data) if data else None
    except (OSError, ValueError):
        sock.close()
        return None
    if not isinstance(hello, dict) or not hello.get("ready") or hello.get("key") != key:
        sock.close()
        return None
    return sock, hello


def stop(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps({"stop": True}).encode())
    sock.close()


def _fresh(paths: Paths) -> tuple[socket.socket, dict[str, Any]] | None:
    """A connection to this key's server if one runs and none of its files changed."""
    got = connect(paths.socket, paths.key)
    if got is None:
        return None
    manifest = read_manifest(paths.manifest)
    if manifest is None or manifest.get("pid") != got[1].get("pid") or stale(manifest):
        stop(got[0])  # edited code: never measure what is no longer on disk
        return None
    return got


def _start(
    paths: Paths, root: str, preload: Sequence[str], idle_s: float
) -> tuple[socket.socket, dict[str, Any]]:
    """Start this key's server, detached (its own session; its output in the log), and
    connect to it once it has imported everything."""
    from perfguard.measurement.launch import BOOT

    config = {
        "key": paths.key, "socket": paths.socket, "manifest": paths.manifest,
        "preload": list(preload), "idle_s": idle_s, "root": root, "python": sys.executable,
    }  # fmt: skip
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.manifest)
    env = {k: v for k, v in os.environ.items() if k != ENV_SOCKET}
    # `torch.cuda.is_available()` through NVML: never initialise a driver in a server that forks.
    env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    with open(paths.log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, "serve-resident", root, json.dumps(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd="/",
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        m = read_manifest(paths.manifest)
        if m is not None and m.get("pid") == proc.pid and m.get("ready"):
            got = connect(paths.socket, paths.key)
            if got is not None and got[1].get("pid") == proc.pid:
                return got
            if got is not None:  # the stale server it replaces, still leaving
                got[0].close()
        if proc.poll() is not None:
            m = read_manifest(paths.manifest) or {}
            raise Unavailable(m.get("error") or f"it exited (code {proc.returncode}; see {paths.log})")
        time.sleep(0.02)
    proc.kill()
    raise Unavailable(f"it did not start within {START_TIMEOUT_S:g} s")


def ensure(
    env: Mapping[str, str], root: str, preload: Sequence[str], idle_s: float
) -> tuple[socket.socket, dict[str, Any]]:
    """A connection to a fresh server for `env` and `root`, started if none runs."""
    paths = Paths(state_dir(env), server_key(env, root))
    got = _fresh(paths)
    if got is not None:
        return got
    with open(paths.lock, "a") as lock:  # two commands at once start one server
        fcntl.flock(lock, fcntl.LOCK_EX)
        got = _fresh(paths)
        if got is None:
            got = _start(paths, root, preload, idle_s)
    return got


def wanted(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this command line goes through a resident server: a measuring command,
    not `--help`, on Linux, not inside one already, and the server not turned off."""
    from perfguard.measurement.launch import _forkserver_missing

    if env.get(ENV_SOCKET) or _forkserver_missing() is not None:
        return False
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in MEASURING or {"--help", "-h"} & set(argv):
        return False
    return idle_seconds(env) > 0


def preload_modules() -> list[str]:
    """What the server imports: every workload's modules and the command line."""
    from perfguard.workloads.modules import COMMANDS, everything

    return [*everything(), *COMMANDS]


def run_command(argv: Sequence[str]) -> int | None:
    """Run `perfguard ARGV` in a fork of the resident server; its exit status, or None
    when this command line does not go through one (run it here)."""
    env = os.environ
    if not wanted(argv, env):
        return None
    from perfguard.measurement.launch import import_root

    root = import_root()
    try:
        sock, _ = ensure(env, root, preload_modules(), idle_seconds(env))
    except Unavailable as exc:
        sys.stderr.write(f"perfguard: no resident server ({exc}); importing here\n")
        return None
    return _forward(sock, argv, Paths(state_dir(env), server_key(env, root)).socket)


def _stdio() -> list[int]:
    """Our stdin, stdout and stderr to hand over (/dev/null for one that is closed)."""
    out = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            out.append(os.open(os.devnull, os.O_RDWR))
    return out


def _forward(sock: socket.socket, argv: Sequence[str], path: str) -> int:
    """Hand the command line to the server, pass signals on, return its exit status."""
    msg = {
        "fork": 1, "call": "perfguard.cli:main", "argv": list(argv), "prog": "perfguard",
        "env": {**os.environ, ENV_SOCKET: path}, "cwd": os.getcwd(),
    }  # fmt: skip
    socket.send_fds(sock, [json.dumps(msg).encode()], _stdio())
    pid: list[int] = []

    def forward(signum: int, _frame: Any) -> None:
        for p in pid:
            with contextlib.suppress(OSError):
                os.kill(p, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            data = sock.recv(1 << 16)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            sys.stderr.write(
                "perfguard: internal error (exit 70, not a verdict): the resident server "
                "ended while the command ran; run it again, or with PERFGUARD_SERVER_IDLE_S=0\n"
            )
            return 70
        reply = json.loads(data)
        if "error" in reply:
            sys.stderr.write(f"perfguard: internal error (exit 70): {reply['error']}\n")
            return 70
        if "pid" in reply:
            pid.append(int(reply["pid"]))
        elif "exited" in reply:
            code = int(reply["returncode"])
            return code if code >= 0 else 128 - code
