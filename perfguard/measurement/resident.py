"""The resident server: measuring commands that start warm, one import bill per machine.

A command that measures (`run`, `gen-baselines`, `check`, `calibrate`, `ab`) spends
most of a smoke gate importing torch, transformers and diffusers (~6 s on the 2-core
runner) before it measures for ~2 s. The console script (`perfguard.cli.main`) asks a
resident server instead: a process of the same interpreter and environment that has
imported those modules once and forks each command line, with the caller's stdin,
stdout, stderr, environment, working directory, CPU affinity, niceness and umask; the
command's workers (baseline processes, confirmations) are forked from it too. The
first command starts the server (and pays the imports once); later ones start in
milliseconds. The server ends after
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
import select
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
"""Set in a command the resident server forked, `SOCKET#PID`: the server its workers
fork from (that one only: a newer server under the same name imports newer code), and a
sign that the console script must not ask a server again."""

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
    """Which server may serve a process of `env` importing perfguard from `root` (and,
    where `$PYTHONPATH` names a relative directory, from this working directory)."""
    here = os.getcwd() if any(_relative(env.get("PYTHONPATH", ""))) else None
    text = json.dumps([sys.executable, root, here, sorted(_keyed(env).items())])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _relative(pythonpath: str) -> list[str]:
    return [p for p in pythonpath.split(os.pathsep) if p and not os.path.isabs(p)]


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


def connect(
    path: str, key: str, timeout: float = 10.0
) -> tuple[socket.socket, dict[str, Any]] | None:
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
        # Edited code: never measure what is no longer on disk. The new server takes the
        # socket's name, and the stale one leaves once the commands it runs are done.
        got[0].close()
        return None
    return got


def _start(
    paths: Paths, root: str, preload: Sequence[str], idle_s: float
) -> tuple[socket.socket, dict[str, Any]]:
    """Start this key's server, detached (its own session; its output in the log), and
    connect to it once it has imported everything."""
    from perfguard.measurement.launch import BOOT, child_environment

    config = {
        "key": paths.key, "socket": paths.socket, "manifest": paths.manifest,
        "preload": list(preload), "idle_s": idle_s, "root": root, "python": sys.executable,
    }  # fmt: skip
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.manifest)
    # `torch.cuda.is_available()` through NVML: never initialise a driver in a server that forks.
    env = child_environment(unset=(ENV_SOCKET,), update={"PYTORCH_NVML_BASED_CUDA_CHECK": "1"})
    with open(paths.log, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, "serve-resident", root, json.dumps(config)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
            # Where a relative $PYTHONPATH entry points (the key has this directory then).
            cwd=os.getcwd() if _relative(env.get("PYTHONPATH", "")) else "/",
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
            why = m.get("error") or f"it exited (code {proc.returncode}; see {paths.log})"
            raise Unavailable(why)
        time.sleep(0.02)
    proc.kill()
    raise Unavailable(f"it did not start within {START_TIMEOUT_S:g} s")


def ensure(
    env: Mapping[str, str], root: str, preload: Sequence[str], idle_s: float
) -> tuple[socket.socket, dict[str, Any]]:
    """A connection to a fresh server for `env` and `root`, started if none runs."""
    return _ensure(Paths(state_dir(env), server_key(env, root)), root, preload, idle_s)


def _ensure(
    paths: Paths, root: str, preload: Sequence[str], idle_s: float
) -> tuple[socket.socket, dict[str, Any]]:
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
    through = _serves(argv) if list(argv[:1]) == ["serve"] else wanted(argv, os.environ)
    if not through:
        return None
    try:
        return serve(argv, preload_modules())
    except Unavailable as exc:
        sys.stderr.write(f"perfguard: no resident server ({exc}); importing here\n")
        return None


def _serves(argv: Sequence[str]) -> bool:
    """Whether `perfguard serve ARGV` runs in a fork of the resident server, as a
    measuring command does.

    Why: a server case launches a fresh server for every round (docs/serving.md: the
    launch is the unit of replication), and a fresh interpreter spends seconds importing
    torch before it builds a pipeline that builds in well under a second. Unlike a
    measuring command, a server goes through the resident server even from inside a
    command that server forked (`$PERFGUARD_SERVER` set: a check launching its rounds'
    servers): the same environment keys the same server, so the fork comes from the
    process the check itself came from. The fork itself, whose parent is the server
    `$PERFGUARD_SERVER` names, serves where it is.
    """
    from perfguard.measurement.launch import _forkserver_missing

    forked_by = os.environ.get(ENV_SOCKET, "").rpartition("#")[2]
    if forked_by == str(os.getppid()) or {"--help", "-h"} & set(argv):
        return False
    return _forkserver_missing() is None and idle_seconds(os.environ) > 0


def serve(argv: Sequence[str], preload: Sequence[str], call: str = "perfguard.cli:main") -> int:
    """Call `call(argv)` in a fork of this environment's resident server (started, with
    `preload` imported, if none runs), with our stdio; its exit status. `Unavailable`
    when no server can be had."""
    from perfguard.measurement.launch import import_root

    _reserve_stdio()
    env, root = os.environ, import_root()
    paths = Paths(state_dir(env), server_key(env, root))
    sock, hello = _ensure(paths, root, preload, idle_seconds(env))
    return _forward(sock, argv, paths.socket, call, int(hello["pid"]))


def _reserve_stdio() -> None:
    """Put /dev/null on a closed stdin, stdout or stderr before any socket or pipe is
    opened, so that none of those takes descriptor 0, 1 or 2 and is handed over as the
    command's stdio."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def _process_state() -> dict[str, Any]:
    """What a process started here would inherit besides the environment (`taskset`,
    `nice`, the umask): the fork takes it on (`forkserver._take_process_state`)."""
    state: dict[str, Any] = {"nice": os.getpriority(os.PRIO_PROCESS, 0)}
    if hasattr(os, "sched_getaffinity"):
        state["affinity"] = sorted(os.sched_getaffinity(0))
    umask = os.umask(0)
    os.umask(umask)
    state["umask"] = umask
    return state


def _forward(sock: socket.socket, argv: Sequence[str], path: str, call: str, hello_pid: int) -> int:
    """Hand the command line to the server, pass signals on, return its exit status.

    The status comes back on a pipe of its own, so that it arrives even when the server
    dies meanwhile; our end of the lifeline pipe, held until we exit, is what keeps the
    command alive (`forkserver._run_command`).
    """
    try:
        msg = {
            "fork": 1, "call": call, "argv": list(argv), "prog": "perfguard",
            "env": {**os.environ, ENV_SOCKET: f"{path}#{hello_pid}"}, "cwd": os.getcwd(),
            "process": _process_state(),
        }  # fmt: skip
    except OSError as exc:  # a working directory that is gone, say
        raise Unavailable(f"cannot describe this process: {exc}") from None
    status_r, status_w = os.pipe()
    life_r, _life_w = os.pipe()  # our end stays open until we exit
    try:
        socket.send_fds(sock, [json.dumps(msg).encode()], [0, 1, 2, status_w, life_r])
    except OSError as exc:  # nothing started: this command may still run here
        os.close(status_r)
        raise Unavailable(f"the server did not take the command: {exc}") from None
    finally:
        os.close(status_w)
        os.close(life_r)
    pid: list[int] = []
    pending: list[int] = []  # signals that came before the command's pid

    def forward(signum: int, _frame: Any) -> None:
        if not pid:
            pending.append(signum)
        for p in pid:
            with contextlib.suppress(OSError):
                os.kill(p, signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    return _wait_status(sock, status_r, pid, pending)


def _wait_status(sock: socket.socket, status_fd: int, pid: list[int], pending: list[int]) -> int:
    """The command's exit status from its status pipe; how it died when the pipe ends
    without one (from the server's word, when the server is still there)."""
    status, exited = b"", None
    watch: list[Any] = [sock, status_fd]
    while True:
        ready, _, _ = select.select(watch, [], [])
        if sock in ready:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                watch.remove(sock)  # the server died: the command goes on, its status will come
            else:
                reply = json.loads(data)
                if "error" in reply:
                    sys.stderr.write(f"perfguard: internal error (exit 70): {reply['error']}\n")
                    return 70
                if "pid" in reply:
                    pid.append(int(reply["pid"]))
                    for signum in pending:
                        with contextlib.suppress(OSError):
                            os.kill(pid[0], signum)
                if "exited" in reply:
                    exited = int(reply["returncode"])
        if status_fd in ready:
            chunk = os.read(status_fd, 64)
            status += chunk
            if b"\n" in status:  # the whole status: whatever else holds the pipe open
                return int(status.split(b"\n", 1)[0])
            if chunk:
                continue
            if status.strip():
                return int(status.strip())
            # No status: the command was killed. Its server says by what, if it is there.
            deadline = time.monotonic() + 2.0
            while exited is None and sock in watch and time.monotonic() < deadline:
                if select.select([sock], [], [], 0.1)[0]:
                    data = sock.recv(1 << 16)
                    if not data:
                        break
                    exited = json.loads(data).get("returncode", exited)
            how = f"killed by signal {-exited}" if exited is not None and exited < 0 else "killed"
            sys.stderr.write(
                f"perfguard: internal error (exit 70, not a verdict): the command was {how}\n"
            )
            return 70


def _manifests(env: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The manifests of this user's servers that started (a failed start leaves one too)."""
    found = (read_manifest(str(m)) for m in sorted(state_dir(env).glob("server-*.json")))
    return [m for m in found if m is not None and m.get("ready")]


def servers(env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The resident servers of this user (`perfguard server status`): each manifest's
    key, pid, root, idle_s, import_s and start time, with `answers` (whether it takes
    connections), `served` (processes it forked) and `stale` (a changed file, or None)."""
    out = []
    for manifest in _manifests(env):
        got = connect(str(manifest.get("socket", "")), str(manifest.get("key", "")), timeout=2.0)
        if got is not None:
            got[0].close()
        info = {k: manifest.get(k) for k in ("key", "pid", "root", "python", "idle_s", "import_s")}
        info["started_at"] = manifest.get("started_at")
        info["answers"] = got is not None
        info["served"] = got[1].get("served") if got is not None else None
        info["stale"] = stale(manifest)
        out.append(info)
    return out


def stop_all(env: Mapping[str, str] | None = None) -> int:
    """Ask every resident server of this user to leave (what it is running is killed);
    how many were asked."""
    asked = 0
    for manifest in _manifests(env):
        got = connect(str(manifest.get("socket", "")), str(manifest.get("key", "")), timeout=2.0)
        if got is not None:
            stop(got[0])
            asked += 1
    return asked


def tree_root() -> int:
    """The process whose descendants are this command's: the resident server that forked
    it (its measuring processes are the server's children too), else this process."""
    _, _, pid = os.environ.get(ENV_SOCKET, "").rpartition("#")
    return int(pid) if pid.isdigit() and os.path.exists(f"/proc/{pid}") else os.getpid()
