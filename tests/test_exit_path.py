"""The one exit path also covers a CLI that cannot be imported, a reader that closes the
pipe early, and an input that is not a regular file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PG

ROOT = Path(__file__).resolve().parents[1]


def _perfguard(*args: str, code: str | None = None, **kw: object) -> subprocess.Popen[bytes]:
    program = code or "from perfguard.cli import main; main()"
    return subprocess.Popen(
        [sys.executable, "-c", program, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[arg-type]
    )


def test_a_cli_that_cannot_be_imported_exits_70_with_one_line() -> None:
    # sys.modules[name] = None makes `import name` raise ImportError, as a damaged install does.
    code = (
        "import sys; sys.modules['perfguard.cli.app'] = None; "
        "from perfguard.cli import main; main(['--help'])"
    )
    proc = _perfguard(code=code)
    out, err = proc.communicate(timeout=60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 70, err.decode()
    assert len(lines) == 1, lines
    assert lines[0].startswith("perfguard: internal error (exit 70, not a verdict)")
    assert "ModuleNotFoundError: import of perfguard.cli.app halted" in lines[0]
    assert out == b""


def test_a_reader_that_closes_the_pipe_early_is_not_an_error() -> None:
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first line (`| head -0`)
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfguard", "--help"],
        cwd=ROOT,
        stdout=write,
        stderr=subprocess.PIPE,
    )
    os.close(write)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert err.decode() == ""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_fifo_given_as_an_input_is_refused_not_read(tmp_path: Path) -> None:
    fifo = tmp_path / "baseline.json"
    os.mkfifo(fifo)
    proc = _perfguard("baselines", "show", str(fifo))
    try:
        _, err = proc.communicate(timeout=60)  # a read of the FIFO would block here
    finally:
        proc.kill()
    assert proc.returncode == 2, err.decode()
    line = err.decode().strip()
    assert line == f"perfguard: error: {fifo}: not a regular file (a pipe or device?), " + (
        "expected a JSON file"
    )


def test_a_directory_given_as_an_input_still_says_so(pg: PG, tmp_path: Path) -> None:
    code, _, err = pg("baselines", "show", str(tmp_path))
    assert code == 2
    assert "is a directory" in err
    assert str(tmp_path) in err  # the path is named as given


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_history_add_refuses_a_fifo_too(tmp_path: Path) -> None:
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    proc = _perfguard("history", "add", str(fifo), "--db", str(tmp_path / "h.sqlite"))
    try:
        _, err = proc.communicate(timeout=60)  # the hash's read of the FIFO blocked here
    finally:
        proc.kill()
    assert proc.returncode == 2, err.decode()
    assert "not a regular file" in err.decode()
