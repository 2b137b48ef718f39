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
(the worker's stdin and its result pipe, `{result_fd}` in `argv` naming the latter);
the server answers `{"forked": ID, "pid"}` and, when a worker exits,
`{"exited": PID, "returncode"}` (negative: killed by that signal, as `subprocess`
says). Each worker starts a session of its own (its process group is killed as one)
and dies with the server (`PR_SET_PDEATHSIG`); when the parent closes the socket or
dies, the server kills its workers and exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import runpy
import select
import signal
import socket
import sys
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


def _set_root(root: str) -> None:
    """Import from `root` first, ahead of the working directory (`''`) that `-c` puts
    first: perfguard comes from `root`, and a module of the working directory (a
    `--factory` module beside the caller, as `python -m` found it before) still imports."""
    sys.path.insert(0, root)


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
    """Run `module` as `python -m module argv...` would; its exit status."""
    sys.argv = [module, *argv]
    try:
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


def _child(sock: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
    """In the forked worker: a session of its own, its pipes, then the worker module."""
    code = 70
    try:
        sock.close()
        os.setsid()
        _die_with_parent()
        stdin_fd, result_fd = fds
        os.dup2(stdin_fd, 0)
        os.close(stdin_fd)
        os.dup2(2, 1)  # the worker's stdout goes where the server's stderr goes
        sys.stdin = os.fdopen(0, "r", encoding="utf-8", closefd=False)
        for sig in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        # What a fresh interpreter would draw, not the server's state (numpy seeds its
        # global generator from the OS at import; torch's default seed is fixed anyway).
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        argv = [str(a).replace("{result_fd}", str(result_fd)) for a in msg["argv"]]
        code = run_module(str(msg["module"]), argv)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


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
    started = time.perf_counter()
    done: list[str] = []
    for name in preload:
        optional = name.startswith("?")  # "?module": import it where it exists
        name = name.lstrip("?")
        try:
            importlib.import_module(name)
        except BaseException as exc:  # a worker could not import it either: say so, once
            if optional and isinstance(exc, ImportError):
                continue
            text = f"cannot import {name}: {type(exc).__name__}: {exc}".splitlines()[0][:400]
            _send(sock, {"ready": False, "error": text})
            return 1
        done.append(name)
    # Importing must not have started what a fork cannot copy: a device runtime. (The
    # parent sets PYTORCH_NVML_BASED_CUDA_CHECK, so that a library asking
    # `torch.cuda.is_available()` at import does not initialise the driver.)
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        _send(sock, {"ready": False, "error": "importing the modules initialised CUDA, which "
                     "a forked worker cannot use: use --start-method spawn"})  # fmt: skip
        return 1
    _send(
        sock,
        {
            "ready": True,
            "pid": os.getpid(),
            "preloaded": done,
            "import_s": round(time.perf_counter() - started, 3),
        },
    )
    children: set[int] = set()
    try:
        while True:
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                _send(sock, {"exited": pid, "returncode": _returncode(status)})
            ready, _, _ = select.select([sock], [], [], 0.1)
            if os.getppid() != parent:
                return 1  # the parent died: the finally below ends the workers
            if not ready:
                continue
            data, fds, _, _ = socket.recv_fds(sock, MAX_PACKET, 2)
            if not data:
                return 0  # the parent closed the socket: the finally below ends the workers
            msg = json.loads(data)
            if len(fds) != 2:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"forked": msg.get("fork"), "error": "expected two descriptors"})
                continue
            pid = os.fork()
            if pid == 0:
                _child(sock, msg, fds)
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


def main(argv: list[str]) -> int:
    mode, rest = argv[0], argv[1:]
    if mode == "boot":
        return boot(rest[0], rest[1], rest[2:])
    if mode == "serve-forks":
        return serve_forks(rest[0], int(rest[1]), list(json.loads(rest[2])))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
