"""The resident server's loop (`serve-resident ROOT CONFIG_JSON`,
`perfguard.measurement.resident` starts it): the warm server's protocol
(`forkserver.py`) on a listening socket, to any number of clients at once, outliving them.

It greets each client with its ready message; a fork request may carry the `env` and
`cwd` the child takes and a third descriptor for the worker's output, and a command
request (`{"call": "module:function", "argv"}`) carries five: the caller's stdin, stdout
and stderr, a status pipe and a lifeline (`forkserver._run_command`). What a client
started is killed when it leaves; the server leaves when idle, when asked
(`{"stop": true}`) or when a newer server takes its socket's name.

Like `forkserver.py`, this file is run by path (`forkserver.serve_resident` loads it
beside itself) and imports only the standard library: the child set-up, the preload and the
reaping are `forkserver.py`'s, passed in as `fork`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Any

RESIDENT_PACKET = 1 << 22
"""The longest request the resident server takes (a command's carries its environment)."""


def _module_files() -> list[list[Any]]:
    """`[path, mtime_ns, size]` of every imported module's file: what a client compares
    with the files on disk before it trusts this server (`resident.stale`)."""
    out: list[list[Any]] = []
    seen: set[str] = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or path in seen:
            continue
        seen.add(path)
        with contextlib.suppress(OSError):
            st = os.stat(path)
            out.append([path, st.st_mtime_ns, st.st_size])
    # The import path's directories too: a package installed or removed there (one that
    # was optional at import, say) changes the directory's mtime.
    for entry in sys.path:
        if entry and entry not in seen and os.path.isdir(entry):
            seen.add(entry)
            with contextlib.suppress(OSError):
                st = os.stat(entry)
                out.append([entry, st.st_mtime_ns, st.st_size])
    return out


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


class _Resident:
    """The resident server's state: its listening socket, its clients, whose children."""

    def __init__(self, sock_path: str, manifest_path: str, fork: Any) -> None:
        self.sock_path, self.manifest_path, self.fork = sock_path, manifest_path, fork
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        tmp = f"{sock_path}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        self.listener.bind(tmp)
        self.listener.listen(64)
        self.inode = os.stat(tmp).st_ino
        self.tmp = tmp
        self.clients: list[socket.socket] = []
        self.owner: dict[int, socket.socket] = {}  # child pid -> the client that asked
        self.served = 0  # processes forked so far

    def publish(self, manifest: dict[str, Any]) -> None:
        """Write the manifest, then move the socket to its name: a client that connects
        finds a server that has imported everything and says which files."""
        _write_json(self.manifest_path, manifest)
        os.replace(self.tmp, self.sock_path)

    def ours(self) -> bool:
        """Whether the socket's name is still ours (a newer server replaces a stale one)."""
        try:
            return os.stat(self.sock_path).st_ino == self.inode
        except OSError:
            return False

    def reap(self) -> None:
        while self.owner:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            client = self.owner.pop(pid, None)
            if client is not None:
                code = self.fork._returncode(status)
                self.fork._send(client, {"exited": pid, "returncode": code})

    def drop(self, client: socket.socket) -> None:
        """A client left (or died): what it started dies with it."""
        with contextlib.suppress(ValueError):
            self.clients.remove(client)
        for pid, owner in list(self.owner.items()):
            if owner is client:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            client.close()

    def handle(self, client: socket.socket) -> bool:
        """One packet from `client`; False when a client asked the server to stop. A
        packet that cannot be served (garbled, too long, a fork that fails) is refused
        to that client only: the server and everyone else's commands go on."""
        try:
            data, fds, flags, _ = socket.recv_fds(client, RESIDENT_PACKET, 5)
        except OSError:
            data, fds, flags = b"", [], 0
        if not data:
            self.drop(client)
            return True
        pid = -1
        try:
            if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                raise ValueError(f"a request over {RESIDENT_PACKET} bytes")
            msg = json.loads(data)
            if msg.get("stop"):
                return False
            if len(fds) not in ((5,) if "call" in msg else (2, 3)):
                raise ValueError("wrong number of descriptors")
            pid = os.fork()
        except (ValueError, OSError) as exc:
            self.fork._send(client, {"forked": None, "error": f"{type(exc).__name__}: {exc}"[:400]})
            return True
        finally:
            if pid != 0:  # the child keeps its descriptors; here they are the client's
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        if pid == 0:
            self.fork._child([self.listener, *self.clients], msg, fds)
        self.owner[pid] = client
        self.served += 1
        self.fork._send(client, {"forked": msg.get("fork"), "pid": pid})
        return True

    def close(self) -> None:
        for pid in list(self.owner):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        for pid in list(self.owner):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        if self.ours():
            with contextlib.suppress(OSError):
                os.unlink(self.sock_path)
        with contextlib.suppress(OSError, ValueError):
            with open(self.manifest_path, encoding="utf-8") as fh:
                mine = json.load(fh).get("pid") == os.getpid()
            if mine:  # not a newer server's
                os.unlink(self.manifest_path)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
        self.listener.close()


def serve_resident(root: str, config: dict[str, Any], fork: Any) -> int:
    """The resident server (`perfguard.measurement.resident`): import `preload`, then
    listen on `socket` and fork what each client asks for (commands, workers) until it
    has been idle for `idle_s` seconds, a client asks it to stop, or a newer server
    takes its socket's name. Each client first reads the ready message, which names
    the manifest of imported files (`manifest`) that says whether the server is stale.
    `fork` is `forkserver.py`, whose root, preload, child and reaping this loop shares.
    """
    fork._set_root(root)
    sock_path, manifest_path = str(config["socket"]), str(config["manifest"])
    hello = fork._preload(list(config["preload"]))
    if not hello["ready"]:
        _write_json(manifest_path, {**config, **hello})
        return 1
    server = _Resident(sock_path, manifest_path, fork)
    hello = {**hello, "key": config["key"], "manifest": manifest_path}
    server.publish({**config, **hello, "started_at": time.time(), "files": _module_files()})
    idle_s, idle_since = float(config["idle_s"]), time.monotonic()
    wake = fork._exit_wakeup()
    try:
        while True:
            server.reap()
            now = time.monotonic()
            if server.clients or server.owner:
                idle_since = now
            elif now - idle_since >= idle_s or not server.ours():
                return 0
            ready, _, _ = select.select([server.listener, *server.clients, wake], [], [], 0.2)
            for sock in ready:
                if sock == wake:
                    fork._drain(wake)
                elif sock is server.listener:
                    client, _ = server.listener.accept()
                    server.clients.append(client)
                    fork._send(client, {**hello, "served": server.served})
                elif not server.handle(sock):
                    return 0
    finally:
        server.close()
