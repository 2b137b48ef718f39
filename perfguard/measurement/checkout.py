"""The base revision's checkout: a temporary `git worktree` of a ref, always removed.

A relative check (`perfguard.measurement.relative`) measures a base revision beside this
one. With `compare --against REF` the base is checked out here, in a temporary detached
worktree that is removed on every way out; with `--against DIR` it is a directory the
caller checked out. `base_exists` lets a command refuse a base that cannot be found
before it measures anything (`check --settle` runs a stored check first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from perfguard.errors import EXIT_TERMINATED, PerfguardError


def git(args: Sequence[str], cwd: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def commit_of(directory: Path) -> tuple[str | None, bool | None]:
    """DIR's commit and whether its tracked files differ from it (None: not a checkout)."""
    try:
        head = git(["rev-parse", "HEAD"], directory)
        if head.returncode != 0:
            return None, None
        status = git(["status", "--porcelain", "--untracked-files=no"], directory)
    except (OSError, subprocess.SubprocessError):
        return None, None
    return head.stdout.strip() or None, bool(status.stdout.strip())


def resolve_ref(ref: str, repo: str | os.PathLike[str] | None = None) -> tuple[Path, str]:
    """The top level of the repository `repo` (default: the working directory) is in,
    and the commit `ref` names there; one line and exit 2 (`PerfguardError`) if either
    is missing."""
    where = Path(repo) if repo is not None else Path.cwd()
    top = git(["rev-parse", "--show-toplevel"], where)
    if top.returncode != 0:
        raise PerfguardError(f"--against {ref}: {where} is not inside a git repository")
    toplevel = Path(top.stdout.strip())
    sha = git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], toplevel)
    if sha.returncode != 0 or not sha.stdout.strip():
        raise PerfguardError(f"--against {ref}: no such commit in {toplevel}")
    return toplevel, sha.stdout.strip()


def base_exists(directory: str | None, ref: str | None) -> None:
    """Refuse a base that cannot be found (one line, exit 2), before anything runs: DIR
    must be a directory and REF a commit of the working directory's repository. What
    the base's perfguard can run is learnt later (`base_revision.probe_base`)."""
    if ref is not None:
        resolve_ref(ref)
    elif directory is not None and not Path(directory).is_dir():
        raise PerfguardError(f"--against {directory}: no such directory")


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While a temporary worktree exists, SIGTERM unwinds (so it is removed) instead of
    killing the process where it stands; only in the main thread, and only where
    nobody else handles SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(EXIT_TERMINATED)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def temporary_worktree(ref: str, repo: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """A detached `git worktree` of `ref` in a temporary directory, always removed.

    The worktree is removed, its directory deleted and git's record of it pruned on
    every way out: success, an error, Ctrl-C and SIGTERM. (Only SIGKILL can leave the
    directory behind; the next run's prune then drops git's record of it.)
    """
    toplevel, sha = resolve_ref(ref, repo)
    git(["worktree", "prune"], toplevel)
    with _terminate_as_exit():
        tmp = Path(tempfile.mkdtemp(prefix="perfguard-base-"))
        path = tmp / "base"
        try:
            added = git(["worktree", "add", "--detach", str(path), sha], toplevel)
            if added.returncode != 0:
                last = [ln for ln in added.stderr.splitlines() if ln.strip()][-1:] or ["?"]
                raise PerfguardError(f"--against {ref}: git worktree add failed: {last[0]}")
            yield path
        finally:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                git(["worktree", "remove", "--force", str(path)], toplevel)
            shutil.rmtree(tmp, ignore_errors=True)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                git(["worktree", "prune"], toplevel)
