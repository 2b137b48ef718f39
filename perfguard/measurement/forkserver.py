"""How a worker process starts: a fresh interpreter (`spawn`), or a fork of a warm server.

This file is run by path (`python -c "import runpy; runpy.run_path(<this file>)" MODE
...`: `perfguard.measurement.launch.BOOT`), never imported by the process it starts,
and imports only the standard library at module level, for two reasons:

- **The right perfguard, whatever the working directory holds.** `python -m MODULE`
  puts the working directory first on the import path, so a folder named `perfguard`
  there (the parent of a clone, say) shadowed the package the parent runs, and the
  worker died with an ImportError. `-c` puts `''` first too, and the code below puts
  the import root it is given ahead of it: the directory holding the parent's own
  `perfguard` (the head side), or the base revision's (the relative check's base).
  The base revision's worker module is then run with `runpy`, whatever its version.
- **Warm starts** (`--start-method forkserver`). A fresh interpreter spends seconds
  importing torch, transformers and diffusers before it measures anything; on the
  2-core runner that was most of what a gate waited for. The server imports them once
  (`preload`: the modules the selected cases need, and the worker module), then forks
  one worker per request. A fork costs milliseconds and the worker builds its case in
  a process that has exactly the state a fresh one would have after the same imports:
  nothing has been measured, no torch op has run, no thread pool or device runtime
  has started (the server never touches a device: `CUDA_VISIBLE_DEVICES` and the other
  variables are read when the runtime starts, in the worker). What a fork cannot
  renew is the address-space layout and the string-hash seed, which every worker of a
  server shares: `benchmarks/noise.py --start-methods spawn forkserver` measures
  whether that narrows the spread between processes (docs/verdicts.md has the
  figures). Python's and numpy's global generators are reseeded in each worker.

Protocol of the server (`serve-forks ROOT CONTROL_FD PRELOAD_JSON`): the control socket
is an `AF_UNIX` `SOCK_SEQPACKET` pair, one JSON object per packet. The server sends
`{"ready": true, "pid", "preloaded", "import_s"}` (or `{"ready": false, "error"}`);
the parent sends `{"fork": ID, "module", "argv"}` with two file descriptors attached
(the worker's stdin and its result pipe, `{result_fd}` in `argv` naming the latter; a
third, where its output goes, when the parent keeps it apart), `module` a module name or
a file's path (`run_module`),
and `env`, `cwd` and `root` when the worker takes others than the server's (a server
shared by both sides of a relative check imports no perfguard module: each side's
worker imports its own revision's, from its `root`);
the server answers `{"forked": ID, "pid"}` and, when a worker exits,
`{"exited": PID, "returncode"}` (negative: killed by that signal, as `subprocess`
says). Each worker starts a session of its own (its process group is killed as one)
and dies with the server (`PR_SET_PDEATHSIG`); when the parent closes the socket or
dies, the server kills its workers and exits.

The resident server (`serve-resident ROOT CONFIG_JSON`) speaks the same protocol to
any number of clients and outlives them; its loop is `resident_server.py`, beside this
file and run by path as this file is, with this file's child set-up (`_child`, which
also runs a resident server's commands: `_run_command`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

MAX_PACKET = 1 << 16


def _die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux), and leave if it already has."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


_ROOT: list[str] = []
"""The import root this process put first on `sys.path` (`_set_root`)."""


def _set_root(root: str) -> None:
    """Import from `root` first, ahead of the working directory (`''`) that `-c` puts
    first: perfguard comes from `root`, and a module of the working directory (a
    `--factory` module beside the caller, as `python -m` found it before) still imports.
    A fork asked for another root (`{"root"}`: a server both sides of a relative check
    share) takes it in place of the server's, so a module the base revision lacks is not
    found in the head's."""
    for old in _ROOT:
        with contextlib.suppress(ValueError):
            sys.path.remove(old)
    _ROOT[:] = [root]
    sys.path.insert(0, root)


_WAKE: list[int] = []
"""The self-pipe a server's SIGCHLD writes to (`_exit_wakeup`), closed in its children."""


def _exit_wakeup() -> int:
    """A descriptor that turns readable when a child of this process exits.

    A server learns that a worker ended by reaping it, and its client waits for that
    (`{"exited"}`) before it starts the next worker. Polled between `select` timeouts
    (0.1-0.2 s), the reap came on average half a timeout late, after every process.
    SIGCHLD now writes a byte to this pipe (`signal.set_wakeup_fd`), which the server's
    `select` watches beside its sockets: `gen-baselines --tag smoke` (20 processes) took
    16.8 s against 18.8 s (`benchmarks/gate_time.py`, docs/verdicts.md).
    """
    read_fd, write_fd = os.pipe()
    for fd in (read_fd, write_fd):
        os.set_blocking(fd, False)
    _WAKE[:] = [read_fd, write_fd]
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    return read_fd


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 4096):
            pass


def _result_fd(argv: list[str]) -> int | None:
    with contextlib.suppress(ValueError, IndexError):
        return int(argv[argv.index("--result-fd") + 1])
    return None


def _fatal(argv: list[str], exc: BaseException) -> None:
    """Tell the parent in one line why this worker cannot go on, on its result pipe."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:400]
    fd = _result_fd(argv)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, (json.dumps({"fatal": text}) + "\n").encode())
    if os.environ.get("PERFGUARD_DEBUG"):
        traceback.print_exc()


def run_module(module: str, argv: list[str]) -> int:
    """Run `module` as `python -m module argv...` would, or a file by its path (a name
    ending in `.py`: `launch.SIDE_WORKER`, which the import root may lack) as `python
    FILE argv...` would, without its directory on the path; its exit status."""
    sys.argv = [module, *argv]
    try:
        if module.endswith(".py"):
            runpy.run_path(module, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    except BaseException as exc:
        _fatal(argv, exc)
        return 70
    return 0


def boot(root: str, module: str, argv: list[str]) -> int:
    """`spawn`: a fresh interpreter that imports from `root` and runs `module`."""
    _set_root(root)
    return run_module(module, argv)


# ---- the warm server -------------------------------------------------------------------------


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(msg).encode())


def _returncode(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1


def _child(closing: list[socket.socket], msg: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: a session of its own, its pipes, then its code.

    A worker (`{"module", "argv"}`) gets two descriptors, its stdin and its result pipe,
    and a third where its output goes (else the server's stderr). A command of the
    resident server (`{"call": "module:function", "argv"}`) gets the caller's stdin,
    stdout and stderr. `env`, `cwd` and the import `root`, when sent, replace the server's.
    """
    code = 70
    try:
        for sock in closing:
            sock.close()
        if _WAKE:  # the server's exit wake-up is not this process's
            signal.set_wakeup_fd(-1)
            for fd in _WAKE:
                os.close(fd)
        os.setsid()
        if "call" not in msg:  # a command outlives a dead server (its lifeline is the caller)
            _die_with_parent()
        # The dispositions a fresh interpreter starts with: SIGPIPE and SIGXFSZ ignored
        # (a closed pipe is a BrokenPipeError), SIGINT a KeyboardInterrupt.
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if "env" in msg:
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in msg["env"].items()})
        if msg.get("cwd"):
            os.chdir(str(msg["cwd"]))
        if msg.get("root"):
            _set_root(str(msg["root"]))
        _take_process_state(msg.get("process") or {})
        # What a fresh interpreter would draw, not the server's state (numpy seeds its
        # global generator from the OS at import; torch's default seed is fixed anyway).
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        code = _run_command(msg, fds) if "call" in msg else _run_worker(msg, fds)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _take_process_state(state: dict[str, Any]) -> None:
    """The caller's CPU affinity (`taskset`), niceness and umask, as a process it started
    would have inherited them."""
    if state.get("affinity") and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, [int(c) for c in state["affinity"]])
    if "nice" in state:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, int(state["nice"]))
    if "umask" in state:
        os.umask(int(state["umask"]))


def _run_worker(msg: dict[str, Any], fds: list[int]) -> int:
    stdin_fd, result_fd = fds[0], fds[1]
    os.dup2(stdin_fd, 0)
    os.close(stdin_fd)
    if len(fds) > 2:  # where the caller wants the worker's output
        os.dup2(fds[2], 2)
        os.close(fds[2])
    os.dup2(2, 1)  # the worker's stdout goes where its stderr goes
    sys.stdin = os.fdopen(0, "r", encoding="utf-8", closefd=False)
    argv = [str(a).replace("{result_fd}", str(result_fd)) for a in msg["argv"]]
    return run_module(str(msg["module"]), argv)


def _run_command(msg: dict[str, Any], fds: list[int]) -> int:
    """A command line of the resident server: the caller's stdin, stdout and stderr,
    then `module:function` called with `argv`, as the console script would; its exit
    status, also written on the caller's status pipe (`fds[3]`).

    The command lives as long as its caller: the caller holds the write end of the
    lifeline (`fds[4]`), and when it is gone (the caller killed, its terminal closed)
    the command's process group is killed. A server that dies does not end the command:
    the workers it forked from the server fail their cases (exit 3), the caller still
    gets the status.
    """
    stdio, status_fd, lifeline = fds[:3], fds[3], fds[4]
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    for fd in (status_fd, lifeline):  # not for what the command starts
        os.set_inheritable(fd, False)
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    encoding = os.environ.get("PYTHONIOENCODING", "").partition(":")[0] or "utf-8"
    sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding=encoding, errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stdout.reconfigure(line_buffering=os.isatty(1))
    sys.stderr.reconfigure(line_buffering=True)
    argv = [str(a) for a in msg["argv"]]
    sys.argv = [str(msg.get("prog", "perfguard")), *argv]
    module, _, function = str(msg["call"]).partition(":")
    code: int = 70
    try:
        getattr(importlib.import_module(module), function)(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        atexit._run_exitfuncs()  # what an interpreter's exit would run (os._exit skips it)
        with contextlib.suppress(OSError):
            os.write(status_fd, f"{code}\n".encode())
            os.close(status_fd)
    return code


def _watch_lifeline(fd: int) -> None:
    """Kill this command's process group when its caller is gone (EOF on the lifeline)."""
    with contextlib.suppress(OSError):
        while os.read(fd, 1):
            pass
    os.killpg(os.getpid(), signal.SIGKILL)


def _preload(preload: list[str]) -> dict[str, Any]:
    """Import `preload` ("?module": where it exists); the server's ready message, or
    why it cannot serve (`{"ready": false, "error"}`)."""
    started = time.perf_counter()
    done: list[str] = []
    # The collector off while importing: imports make millions of objects and almost no
    # garbage, and the collections they trigger were ~1.3 s of ~6 s on the CPU runner.
    gc.disable()
    try:
        for name in preload:
            optional = name.startswith("?")
            name = name.lstrip("?")
            try:
                importlib.import_module(name)
            except BaseException as exc:  # a worker could not import it either: say so, once
                if optional and isinstance(exc, ImportError):
                    continue
                text = f"cannot import {name}: {type(exc).__name__}: {exc}".splitlines()[0]
                return {"ready": False, "error": text[:400]}
            done.append(name)
    finally:
        gc.enable()
    # Importing must not have started what a fork cannot copy: a device runtime. (The
    # parent sets PYTORCH_NVML_BASED_CUDA_CHECK, so that a library asking
    # `torch.cuda.is_available()` at import does not initialise the driver.)
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return {"ready": False, "error": "importing the modules initialised CUDA, which a "
                "forked worker cannot use: use --start-method spawn"}  # fmt: skip
    # What the imports made is never garbage: `gc.freeze` moves it out of the collector's
    # reach, so that a worker's `gc.collect()` (the runner's, after each case) scans what
    # the worker made (~1 ms), not every module object (~0.3 s on the CPU runner), and
    # does not write to, and so copy, the pages it shares with the server.
    gc.freeze()
    return {
        "ready": True,
        "pid": os.getpid(),
        "preloaded": done,
        "import_s": round(time.perf_counter() - started, 3),
    }


def serve_forks(root: str, control_fd: int, preload: list[str]) -> int:
    """The warm server: import `preload`, then fork a worker per request until EOF.

    It ends when the parent closes the socket or dies (the socket then reads EOF; the
    parent's pid is watched as well). Not `PR_SET_PDEATHSIG`: that fires when the parent
    *thread* that started the server exits, and a pool keeps one server for several
    calls made from threads that come and go.
    """
    parent = os.getppid()
    _set_root(root)
    sock = socket.socket(fileno=control_fd)
    hello = _preload(preload)
    _send(sock, hello)
    if not hello["ready"]:
        return 1
    children: set[int] = set()
    wake = _exit_wakeup()
    try:
        while True:
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                _send(sock, {"exited": pid, "returncode": _returncode(status)})
            ready, _, _ = select.select([sock, wake], [], [], 0.1)
            if os.getppid() != parent:
                return 1  # the parent died: the finally below ends the workers
            if wake in ready:
                _drain(wake)
            if sock not in ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, 3)
            if not data:
                return 0  # the parent closed the socket: the finally below ends the workers
            msg = json.loads(data)
            if len(fds) not in (2, 3):
                for fd in fds:
                    os.close(fd)
                _send(sock, {"forked": msg.get("fork"), "error": "expected two descriptors"})
                continue
            pid = os.fork()
            if pid == 0:
                _child([sock], msg, fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            _send(sock, {"forked": msg.get("fork"), "pid": pid})
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def serve_resident(root: str, config: dict[str, Any]) -> int:
    """The resident server (`resident_server.serve_resident`), loaded by path from beside
    this file and registered as a module, so that its file is among those a client
    compares with the disk before it trusts the server."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resident_server.py")
    spec = importlib.util.spec_from_file_location("_perfguard_resident_server", path)
    assert spec is not None and spec.loader is not None
    loop = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loop
    spec.loader.exec_module(loop)
    return int(loop.serve_resident(root, config, sys.modules[__name__]))


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "boot":
        return boot(rest[0], rest[1], rest[2:])
    if mode == "serve-forks":
        return serve_forks(rest[0], int(rest[1]), list(json.loads(rest[2])))
    if mode == "serve-resident":
        return serve_resident(rest[0], dict(json.loads(rest[1])))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
