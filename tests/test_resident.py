"""The resident server (`perfguard.measurement.resident`): commands forked with the
caller's stdio, environment and exit status; a new server when an imported file
changed; nothing left behind when the caller dies, and a command that outlives a dead
server; the idle exit.

Most tests give the server a small preload (a module written into the test's folder)
so that it starts in well under a second; one runs the real commands end to end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfguard.measurement import resident
from perfguard.measurement.launch import _forkserver_missing, import_root

pytestmark = pytest.mark.skipif(_forkserver_missing() is not None, reason="Linux only")

ROOT = import_root()

SLEEPER = """
import os, sys, time

def main(argv):
    with open(argv[0], "w") as fh:
        fh.write(str(os.getpid()))
    print("sleeper started", flush=True)
    deadline = time.monotonic() + 120
    while len(argv) > 1 and not os.path.exists(argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
    if len(argv) == 1:
        time.sleep(120)
    sys.exit(3)

if __name__ == "__main__":
    main(sys.argv[1:])
"""


PROBE = """
import json, os, sys

def main(argv):
    umask = os.umask(0)
    with open(argv[0], "w") as fh:
        json.dump({"affinity": sorted(os.sched_getaffinity(0)), "umask": umask,
                   "cwd": os.getcwd(), "marker": os.environ.get("PG_MARKER")}, fh)
    sys.exit(5)
"""


@pytest.fixture
def server_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A private server directory (short: a socket's path has ~100 characters at most),
    a module folder on the import path, and every server stopped at the end."""
    directory = tempfile.mkdtemp(prefix="pgs", dir="/tmp")
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "pg_sleeper.py").write_text(SLEEPER)
    (mods / "pg_marker.py").write_text("VALUE = 1\n")
    (mods / "pg_probe.py").write_text(PROBE)
    monkeypatch.setenv(resident.ENV_DIR, directory)
    monkeypatch.setenv(resident.ENV_IDLE, "60")
    monkeypatch.setenv("PYTHONPATH", f"{mods}{os.pathsep}{ROOT}")
    yield dict(os.environ)
    resident.stop_all()
    for manifest in Path(directory).glob("*.json"):
        try:
            pid = json.loads(manifest.read_text()).get("pid")
        except FileNotFoundError:  # the stopped server removed its manifest as it left
            continue
        if pid:
            _wait_gone(int(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is as good as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _wait_file(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def _client(code: str, env: dict[str, str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw,  # type: ignore[call-overload]
    )  # fmt: skip


def _serving(
    env: dict[str, str], argv: list[str], call: str, setup: str = "", **kw: object
) -> subprocess.Popen[str]:
    """A caller that runs `call(argv)` through `resident.serve`, after the `setup` line(s)."""
    code = "import os, sys\nfrom perfguard.measurement import resident\n" + textwrap.dedent(setup)
    code += f"\nsys.exit(resident.serve({argv!r}, ['pg_marker'], call={call!r}))\n"
    return _client(code, env, **kw)


def _server_pid(env: dict[str, str]) -> int:
    (info,) = resident.servers(env)
    return int(info["pid"])


def test_a_command_runs_in_a_fork_with_our_stdio_cwd_and_exit_status(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    forward = """
        import sys
        from perfguard.measurement import resident
        sys.exit(resident.serve(sys.argv[1:], ["perfguard.cli.app", "pg_marker"]))
    """
    repo = Path(ROOT)
    ok = _client(forward.replace("sys.argv[1:]", "['list-cases', '--json']"), server_env, cwd=repo)
    out, err = ok.communicate(timeout=120)
    assert ok.returncode == 0, err
    listed = {c["id"] for c in json.loads(out)}
    assert "qwen_image_t2i_smoke" in listed  # ./cases of the caller's directory
    first = _server_pid(server_env)

    bad = _client(
        forward.replace("sys.argv[1:]", "['list-cases', '--cases', 'nowhere']"), server_env,
        cwd=tmp_path,
    )  # fmt: skip
    out, err = bad.communicate(timeout=120)
    assert bad.returncode == 2 and "nowhere" in err and out == ""
    (info,) = resident.servers(server_env)
    assert info["pid"] == first and info["served"] == 2 and info["stale"] is None


def test_an_edited_file_starts_a_new_server_and_the_stale_one_leaves(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    preload = ["pg_marker"]
    sock, hello = resident.ensure(server_env, ROOT, preload, 60)
    sock.close()
    again, same = resident.ensure(server_env, ROOT, preload, 60)
    again.close()
    assert same["pid"] == hello["pid"]  # nothing changed: the same server

    busy, _ = resident.ensure(server_env, ROOT, preload, 60)  # a command still running there
    (tmp_path / "mods" / "pg_marker.py").write_text("VALUE = 22\n")
    fresh, new = resident.ensure(server_env, ROOT, preload, 60)
    fresh.close()
    assert new["pid"] != hello["pid"]
    time.sleep(0.5)
    assert _alive(int(hello["pid"]))  # the stale server finishes what it runs
    busy.close()
    assert _wait_gone(int(hello["pid"]))  # and then leaves
    assert [s["pid"] for s in resident.servers(server_env)] == [new["pid"]]


def test_an_idle_server_leaves_and_removes_its_files(server_env: dict[str, str]) -> None:
    sock, hello = resident.ensure(server_env, ROOT, ["pg_marker"], 0.5)
    time.sleep(1.0)
    assert _alive(int(hello["pid"]))  # a client is connected: not idle
    sock.close()
    assert _wait_gone(int(hello["pid"]))
    assert list(Path(server_env[resident.ENV_DIR]).glob("*.sock")) == []
    assert resident.servers(server_env) == []


def test_a_killed_caller_takes_what_it_started_with_it(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    pidfile = tmp_path / "worker.pid"
    client = _client(
        f"""
        import os, time
        from perfguard.measurement import resident
        from perfguard.measurement.launch import ResidentChannel, import_root
        sock, hello = resident.ensure(os.environ, import_root(), ["pg_marker"], 60)
        path = resident.Paths(resident.state_dir(), resident.server_key(os.environ, import_root()))
        channel = ResidentChannel(path.socket, "worker", dict(os.environ), None, hello["pid"])
        channel.fork("pg_sleeper", [{str(pidfile)!r}])
        time.sleep(120)
        """,
        server_env,
    )
    worker = int(_wait_file(pidfile))
    server = _server_pid(server_env)
    client.kill()
    client.wait(timeout=30)
    assert _wait_gone(worker)
    assert _alive(server)  # the server stays for the next command


def test_a_command_outlives_a_dead_server_and_its_status_still_arrives(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    pidfile, go = tmp_path / "command.pid", tmp_path / "go"
    client = _serving(server_env, [str(pidfile), str(go)], "pg_sleeper:main")
    command = int(_wait_file(pidfile))
    server = _server_pid(server_env)
    os.kill(server, signal.SIGKILL)
    assert _wait_gone(server)
    time.sleep(0.5)
    assert _alive(command)  # its lifeline is the caller, not the server
    go.write_text("")
    out, err = client.communicate(timeout=60)
    assert client.returncode == 3, err  # the command's own status
    assert "sleeper started" in out  # its stdout was ours


def test_a_killed_caller_kills_its_command(server_env: dict[str, str], tmp_path: Path) -> None:
    pidfile = tmp_path / "command.pid"
    client = _serving(server_env, [str(pidfile)], "pg_sleeper:main")
    command = int(_wait_file(pidfile))
    client.kill()
    client.wait(timeout=30)
    assert _wait_gone(command)
    assert _alive(_server_pid(server_env))


def test_which_command_lines_go_through_a_server(server_env: dict[str, str]) -> None:
    env = dict(server_env)
    assert resident.wanted(["check", "--tag", "smoke"], env)
    assert resident.wanted(["--debug", "gen-baselines"], env)
    assert not resident.wanted(["list-cases"], env)
    assert not resident.wanted(["check", "--help"], env)
    assert not resident.wanted(["check"], {**env, resident.ENV_IDLE: "0"})
    assert not resident.wanted(["check"], {**env, resident.ENV_SOCKET: "/x.sock"})
    # One server per environment, but not per PERFGUARD_* or visible-devices variable.
    key = resident.server_key(env, ROOT)
    assert resident.server_key({**env, "PERFGUARD_THREADS": "3"}, ROOT) == key
    assert resident.server_key({**env, "CUDA_VISIBLE_DEVICES": "1"}, ROOT) == key
    assert resident.server_key({**env, "OMP_NUM_THREADS": "3"}, ROOT) != key
    assert resident.server_key(env, "/elsewhere") != key


@pytest.mark.parametrize("value", ["abc", "-1", "inf"])
def test_a_bad_idle_value_is_a_usage_error_naming_the_variable(
    server_env: dict[str, str], value: str
) -> None:
    env = {**server_env, resident.ENV_IDLE: value}
    proc = subprocess.run(
        [sys.executable, "-m", "perfguard", "run", "--tag", "smoke"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert resident.ENV_IDLE in proc.stderr and proc.stderr.count("\n") == 1
    assert resident.servers(env) == []


def test_the_real_commands_and_their_workers_fork_from_one_server(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    """`gen-baselines` (workers: one per process) and then `run` go through one server
    with the real preload; the second command starts no server of its own."""
    env = {**server_env, "PERFGUARD_THREADS": "1"}
    baseline, results = tmp_path / "b.json", tmp_path / "r.json"
    case = ["--case", "glm_image_t2i_smoke", "--repeats", "2", "--no-progress"]
    gen = subprocess.run(
        [sys.executable, "-m", "perfguard", "gen-baselines", *case, "--processes", "2",
         "--baseline", str(baseline)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert gen.returncode == 0, gen.stderr
    (info,) = resident.servers(env)
    assert info["served"] == 3  # the command and its two baseline processes
    stored = json.loads(baseline.read_text())["scenarios"]["glm_image_t2i_smoke"]
    # Both processes' runs reached the baseline, less the runs its contention screen
    # dropped: with two runs a process, a noisy moment can drop a whole process, which
    # leaves one group and no per-process medians.
    groups = stored.get("groups") or [stored["repeats"]]
    assert sum(groups) + stored["dropped_runs"] == 4
    assert len(groups) == 2 or stored["dropped_runs"] >= 2
    assert len(stored["e2e"].get("processes", [0])) == len(groups)

    run = subprocess.run(
        [sys.executable, "-m", "perfguard", "run", *case, "--out", str(results)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(results.read_text())["cases"]["glm_image_t2i_smoke"]["repeats"] == 2
    (again,) = resident.servers(env)
    assert again["pid"] == info["pid"] and again["served"] == 4


def test_a_command_takes_the_callers_affinity_umask_cwd_and_environment(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "probe.json"
    setup = """
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
        os.umask(0o027)
        os.environ["PG_MARKER"] = "from-the-caller"
    """
    client = _serving(server_env, [str(out)], "pg_probe:main", setup, cwd=tmp_path)
    _, err = client.communicate(timeout=120)
    assert client.returncode == 5, err
    seen = json.loads(out.read_text())
    assert seen["affinity"] == [sorted(os.sched_getaffinity(0))[-1]]
    assert seen["umask"] == 0o027 and seen["cwd"] == str(tmp_path)
    assert seen["marker"] == "from-the-caller"


def test_a_garbled_request_is_refused_to_its_client_only(server_env: dict[str, str]) -> None:
    sock, hello = resident.ensure(server_env, ROOT, ["pg_marker"], 60)
    sock.send(b"{not json")
    assert "error" in json.loads(sock.recv(1 << 16))
    sock.close()
    again, same = resident.ensure(server_env, ROOT, ["pg_marker"], 60)
    assert same["pid"] == hello["pid"]  # the server lived through it
    again.close()

    # A command's workers fork only from the server the command came from.
    from perfguard.measurement.launch import ResidentChannel

    path = resident.Paths(resident.state_dir(), resident.server_key(server_env, ROOT)).socket
    with pytest.raises(OSError, match="not this command's resident server"):
        ResidentChannel(path, "worker", server_env, None, int(hello["pid"]) + 1)
    channel = ResidentChannel(path, "worker", server_env, None, int(hello["pid"]))
    assert channel.start(5) is None
    channel.close()
