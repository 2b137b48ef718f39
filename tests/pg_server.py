"""A real PostgreSQL server for the tests: `initdb` + `pg_ctl` on a temporary directory.

The server listens on 127.0.0.1 at a free port (and on a Unix socket inside its own
directory), with password (SCRAM) authentication for TCP, so a wrong password is a real
refusal. initdb and postgres refuse to run as root; when the tests run as root (CI does)
the server runs as `nobody` through `setpriv`, which owns the temporary directory.

The binaries are Debian's `postgresql` package (`/usr/lib/postgresql/<version>/bin`);
.ci/run installs it when missing. Without them the tests that need a server are skipped
with the reason, except under CI, where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

USER = "perfguard"
PASSWORD = "s3cret-pw"


def find_bindir() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """One running server; `url(db)` is a URL perfguard takes as `--db`."""

    bindir: Path
    root: Path
    port: int = field(default_factory=free_port)
    as_user: list[str] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def _run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.as_user, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
            cwd=self.root,
            env={**os.environ, "LC_ALL": "C"},
        )

    def init(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_user:
            os.chown(self.root, 65534, 65534)
            os.chown(pwfile, 65534, 65534)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-host=scram-sha-256",
            "--auth-local=trust",
            "--encoding=UTF8",
            "--no-sync",
        )

    def start(self) -> None:
        opts = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=60"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            opts,
            "-l",
            str(self.root / "log"),
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash: every backend is killed, no checkpoint (recovery on the
        next start replays the log, as after a power cut)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres", password: str = PASSWORD) -> str:
        return f"postgresql://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str, database: str = "postgres") -> list[tuple[object, ...]]:
        """Run one statement as the superuser (autocommit) and return its rows."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(statement)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """Start a server for the block and remove it after (raises if it cannot start)."""
    bindir = find_bindir()
    if bindir is None:
        raise FileNotFoundError("PostgreSQL's initdb is not installed")
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    root = Path(tempfile.mkdtemp(prefix="perfguard-pg-"))
    server = PostgresServer(bindir=bindir, root=root, as_user=as_user)
    try:
        server.init()
        server.start()
        deadline = time.monotonic() + 30
        while True:  # pg_ctl -w waits for the socket; be sure TCP answers too
            try:
                server.sql("SELECT 1")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
