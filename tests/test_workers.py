"""Worker processes: one per device, one per case with `isolate`, torchrun for 2-rank cases.

The pipelines here are a factory module written into the test's directory and named with
`factory="module:function"`, the same hook users run their own pipelines with; the
2-rank case runs the real tiny Qwen-Image pipeline, CFG-parallel over gloo.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from perfguard.device.pinning import narrow_visible_devices as _narrow_visible_devices
from perfguard.device.pinning import visible_devices_env
from perfguard.device.platform import CudaPlatform, NpuPlatform, Platform, RocmPlatform, probe
from perfguard.errors import PerfguardError
from perfguard.measurement import workers
from perfguard.measurement.options import COUNTED_PROCESSES, MeasureOptions, parse_devices
from perfguard.measurement.runner import import_factory, run_case
from perfguard.measurement.worker_handle import WarmPool, WorkerStarter, kill_grace_s
from perfguard.results import CaseResult
from perfguard.storage.cases import Case

FAKE_PIPES = """
import os
import signal
import time

import torch

from perfguard.device.timer import stage, step


def _log(case, what):
    with open(os.environ["PG_FAKE_LOG"], "a") as fh:
        fh.write(f"{case.id} {what} {os.getpid()} {os.environ.get('OMP_NUM_THREADS')}\\n")


def pipeline(case, platform):
    behaviour = case.options.get("fake", "ok")
    _log(case, "build")
    cores = sorted(os.sched_getaffinity(0))
    with open(os.environ["PG_FAKE_LOG"], "a") as fh:
        fh.write(f"{case.id} cores {os.getpid()} {','.join(map(str, cores))}\\n")

    if behaviour == "kill_server":  # the warm server dies while this worker builds
        with open(os.environ["PG_FAKE_LOG"], "a") as fh:
            fh.write(f"{case.id} server {os.getppid()} -\\n{case.id} worker {os.getpid()} -\\n")
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(60)

    def run():
        if behaviour == "crash" or (behaviour == "crash_rank1" and os.environ.get("RANK") == "1"):
            os.kill(os.getpid(), signal.SIGKILL)
        if behaviour == "hang" or (behaviour == "hang_rank1" and os.environ.get("RANK") == "1"):
            _log(case, "hang")
            # Like a kernel stuck on a device: the runner's SIGALRM deadline cannot reach it.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
            time.sleep(3600)
        with stage("DenoisingStage"):
            for i in range(2):
                with step(i):
                    time.sleep(0.002)
        return torch.zeros(4)

    return run
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake pipeline module on the workers' import path; returns the log file."""
    (tmp_path / "pg_fake_pipes.py").write_text(FAKE_PIPES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    log = tmp_path / "log.txt"
    log.touch()
    monkeypatch.setenv("PG_FAKE_LOG", str(log))
    return log


def fake_case(cid: str, behaviour: str = "ok", devices: int = 1) -> Case:
    return Case(
        id=cid, workload="qwen_image", preset="tiny", num_devices=devices,
        options={"fake": behaviour},
    )  # fmt: skip


def log_lines(log: Path, what: str) -> list[tuple[str, int, str]]:
    out = []
    for line in log.read_text().splitlines():
        cid, kind, pid, threads = line.split()
        if kind == what:
            out.append((cid, int(pid), threads))
    return out


def gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its new parent to reap it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_gone(pids: Sequence[int], seconds: float) -> None:
    """Wait up to `seconds` for every process of `pids` to be gone."""
    deadline = time.monotonic() + seconds
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


CPU = Platform()
FACTORY = "pg_fake_pipes:pipeline"


# ---- options -----------------------------------------------------------------------------


def test_parse_devices() -> None:
    assert parse_devices("0,1") == ["0", "1"]
    assert parse_devices(" 3 , GPU-8f3a ") == ["3", "GPU-8f3a"]
    assert parse_devices(None) is None
    assert parse_devices("") is None
    for bad in ("0,,1", "0;1", "0,0"):
        with pytest.raises(PerfguardError, match="--devices"):
            parse_devices(bad)


def test_import_factory_names_what_is_wrong(fake: Path) -> None:
    assert callable(import_factory(FACTORY))
    for spec, why in [
        ("pg_fake_pipes", "module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        ("pg_fake_pipes:nope", "no attribute"),
        ("pg_fake_pipes:signal.SIGKILL", "not callable"),
    ]:
        with pytest.raises(PerfguardError, match=why):
            import_factory(spec)


@pytest.mark.parametrize(
    ("platform", "var"),
    [
        (CudaPlatform(), "CUDA_VISIBLE_DEVICES"),
        (RocmPlatform(), "HIP_VISIBLE_DEVICES"),
        (NpuPlatform(), "ASCEND_RT_VISIBLE_DEVICES"),
    ],
)
def test_each_worker_and_rank_is_pinned_with_the_platforms_variable(
    platform: Platform, var: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert visible_devices_env(platform.name) == var
    assert workers._env_for(platform, ["1"], 2)[var] == "1"
    assert workers._env_for(platform, ["2", "3"], 1)[var] == "2,3"
    # A rank keeps only its own device of those torchrun was given...
    monkeypatch.setenv(var, "2,3")
    _narrow_visible_devices(platform.name, 1)
    assert os.environ[var] == "3"
    # ...and with none given, the device of its local rank.
    monkeypatch.delenv(var)
    _narrow_visible_devices(platform.name, 1)
    assert os.environ[var] == "1"


def test_parallel_cpu_workers_split_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = int(workers._env_for(CPU, ["0"], 2)["OMP_NUM_THREADS"])
    assert threads == max(1, (os.cpu_count() or 1) // 2)
    assert "OMP_NUM_THREADS" not in workers._env_for(CPU, None, 1)
    pinned = workers._env_for(CPU, ["1"], 2, [2, 3])
    assert pinned["PERFGUARD_CPU_AFFINITY"] == "2-3" and pinned["OMP_NUM_THREADS"] == "2"


def test_cpu_workers_get_disjoint_cores_or_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 6, 7}, raising=False)
    assert workers.cpu_pins(2, 1) == [[0], [1]]
    assert workers.cpu_pins(3, 2) == [[0, 1], [2, 3], [6, 7]]
    with pytest.raises(PerfguardError) as err:
        workers.cpu_pins(4, 2, ["0", "1", "2", "3"])
    assert err.value.exit_code == 2
    assert str(err.value) == (
        "--devices 0,1,2,3: 4 CPU workers x 2 thread(s) each need 8 cores, but this "
        "process may run on 6 (0-3,6-7): list fewer devices"
    )
    threaded = Case(id="t", workload="qwen_image", preset="tiny", threads=3)
    assert workers.threads_per_worker([fake_case("a"), threaded]) == 3
    assert workers.threads_per_worker([fake_case("a")]) == 1


def test_more_cpu_workers_than_cores_is_refused_before_anything_starts(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    with pytest.raises(PerfguardError, match="2 CPU workers x 1 thread"):
        workers.run_in_workers(
            [fake_case("a")], CPU, MeasureOptions(devices=["0", "1"], factory=FACTORY)
        )
    assert log_lines(fake, "build") == []


# ---- worker processes ----------------------------------------------------------------------


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers need two cores")
def test_devices_run_one_worker_per_device_that_keeps_running_cases(fake: Path) -> None:
    cases = [fake_case(f"c{i}") for i in range(4)]
    seen = []
    results = workers.run_in_workers(
        cases,
        CPU,
        MeasureOptions(devices=["0", "1"], repeats=2, warmup=1, factory=FACTORY),
        on_case=seen.append,
    )
    assert sorted(results.cases) == ["c0", "c1", "c2", "c3"]
    assert all(r.status == "ok" and len(r.samples["e2e"]) == 2 for r in results.cases.values())
    assert sorted(r.case_id for r in seen) == sorted(results.cases)
    builds = log_lines(fake, "build")
    pids = {pid for _, pid, _ in builds}
    assert len(pids) == 2 and os.getpid() not in pids
    assert results.settings["devices"] == ["0", "1"]
    # Each worker ran on a core of its own: one core each (one thread), never shared.
    cores = {pid: c for _, pid, c in log_lines(fake, "cores")}
    assert sorted(cores.values()) == sorted(results.settings["cpu_pins"])
    assert len(set(cores.values())) == 2 and all("," not in c for c in cores.values())
    assert {t for _, _, t in builds} == {"1"}  # OMP_NUM_THREADS = the worker's cores


def test_only_the_first_processes_of_a_case_run_the_counted_run(fake: Path) -> None:
    # Counts are exact: an 8-process baseline needs them from a couple of builds, and
    # recounting in every process would cost about half of what a process measures.
    results = workers.run_in_workers(
        [fake_case("a")], CPU, MeasureOptions(processes=4, repeats=1, warmup=0, factory=FACTORY)
    )
    res = results.cases["a"]
    assert res.status == "ok", res.error
    assert res.groups == [1, 1, 1, 1] and len(log_lines(fake, "build")) == 4
    assert res.work is not None and len(res.work) == COUNTED_PROCESSES == 2
    none = MeasureOptions(processes=3, repeats=1, warmup=0, factory=FACTORY, count_work=False)
    assert workers.run_in_workers([fake_case("b")], CPU, none).cases["b"].work is None


def test_a_worker_that_dies_fails_only_its_case(fake: Path) -> None:
    cases = [fake_case("a_ok"), fake_case("b_crash", "crash"), fake_case("c_ok")]
    results = workers.run_in_workers(
        cases, CPU, MeasureOptions(repeats=1, warmup=0, factory=FACTORY)
    )
    crash = results.cases["b_crash"]
    assert crash.status == "error"
    assert "died while running this case (killed by SIGKILL)" in (crash.error or "")
    assert results.cases["a_ok"].status == "ok"
    assert results.cases["c_ok"].status == "ok"


def test_isolate_kills_a_case_that_hangs_and_runs_the_rest_in_fresh_processes(
    fake: Path,
) -> None:
    cases = [fake_case("a_hang", "hang"), fake_case("b_ok")]
    started = time.monotonic()
    results = workers.run_in_workers(
        cases, CPU, MeasureOptions(isolate=True, repeats=1, warmup=0, timeout=1.0, factory=FACTORY)
    )
    elapsed = time.monotonic() - started
    hang = results.cases["a_hang"]
    assert hang.status == "error"
    assert (hang.error or "").startswith("timeout: killed after")
    ((_, hung_pid, _),) = log_lines(fake, "hang")
    assert gone(hung_pid)
    assert results.cases["b_ok"].status == "ok"
    pids = [pid for _, pid, _ in log_lines(fake, "build")]
    assert len(set(pids)) == 2  # one process per case
    assert elapsed < 1.0 + kill_grace_s(1.0) + 30


def test_a_multi_device_case_needs_that_many_devices(fake: Path) -> None:
    results = workers.run_in_workers(
        [fake_case("two", devices=2)],
        CPU,
        MeasureOptions(devices=["0"], repeats=1, factory=FACTORY),
    )
    assert results.cases["two"].error == "needs 2 devices but --devices lists 1"


def test_a_bad_factory_is_a_usage_error_before_anything_runs(fake: Path) -> None:
    with pytest.raises(PerfguardError, match="cannot import"):
        workers.run_in_workers(
            [fake_case("a")], CPU, MeasureOptions(factory="no_such_module_xyz:f")
        )


def test_an_injection_that_matched_no_stage_ends_the_command_from_a_worker(fake: Path) -> None:
    cases = [fake_case("a"), fake_case("b")]
    with pytest.raises(PerfguardError, match="no stage named Denoising ran") as err:
        workers.run_in_workers(
            cases,
            CPU,
            MeasureOptions(
                isolate=True, repeats=1, warmup=0, inject={"Denoising": 0.1}, factory=FACTORY
            ),
        )
    assert err.value.exit_code == 2
    assert "stages that ran: DenoisingStage" in str(err.value)
    assert len(log_lines(fake, "build")) == 1  # the first case's error stops the queue


def test_an_injection_that_matched_no_stage_is_not_a_case_failure_in_process(fake: Path) -> None:
    from perfguard.device.inject import InjectionUnmatched

    with pytest.raises(InjectionUnmatched, match="no stage named Denoising ran"):
        run_case(
            fake_case("a"),
            CPU,
            MeasureOptions(repeats=1, warmup=0, inject={"Denoising": 0.1}),
            factory=import_factory(FACTORY),
        )


# ---- torchrun ------------------------------------------------------------------------------


def test_a_two_device_case_runs_on_two_gloo_ranks_cfg_parallel() -> None:
    """The real tiny Qwen-Image pipeline on 2 ranks: CFG-parallel over gloo, MAX-reduced."""
    single = Case(
        id="qwen_2rank", workload="qwen_image", preset="tiny", steps=2, batch=2,
        prompt_lengths=(24, 13), guidance_scale=4.0,
    )  # fmt: skip
    double = Case(**{**single.definition(), "num_devices": 2})
    results = workers.run_in_workers(
        [double], CPU, MeasureOptions(repeats=2, warmup=1, timeout=120)
    )
    res = results.cases["qwen_2rank"]
    assert res.status == "ok", res.error
    assert res.case["ranks"] == 2
    per_rank = res.case["rank_e2e_ms"]
    assert len(per_rank) == 2
    assert res.samples["e2e"] == [max(a, b) for a, b in zip(*per_rank, strict=True)]
    assert "stage:DenoisingStage" in res.samples
    # The same images as one process computing both CFG halves itself.
    reference = run_case(single, probe("cpu"), MeasureOptions(repeats=1, warmup=0))
    assert res.output_hash == reference.output_hash
    assert res.deterministic is True


def run_two_ranks(behaviour: str, timeout: float) -> CaseResult:
    """The fake case `ranks` on two ranks, `behaviour` as its pipeline: its result."""
    results = workers.run_in_workers(
        [fake_case("ranks", behaviour, devices=2)],
        CPU,
        MeasureOptions(repeats=1, warmup=0, timeout=timeout, factory=FACTORY),
    )
    return results.cases["ranks"]


def test_a_hung_rank_is_killed_with_every_rank(fake: Path) -> None:
    res = run_two_ranks("hang_rank1", timeout=1.0)
    assert res.status == "error" and (res.error or "").startswith("timeout: killed after")
    rank_pids = {pid for cid, pid, _ in log_lines(fake, "build") if cid == "ranks"}
    assert len(rank_pids) == 2
    wait_gone(list(rank_pids), 5)
    assert all(gone(pid) for pid in rank_pids)


def test_a_rank_that_dies_fails_the_case(fake: Path) -> None:
    res = run_two_ranks("crash_rank1", timeout=60)
    assert res.status == "error"
    assert "2 ranks" in (res.error or "") and "failed" in (res.error or "")


# ---- through the CLI ---------------------------------------------------------------------------


def write_registry(root: Path, *case_ids: str) -> None:
    """`root/registry/cpu.toml`: a tiny qwen_image case per id."""
    registry = root / "registry"
    registry.mkdir()
    (registry / "cpu.toml").write_text(
        "\n".join(
            f'[[case]]\nid = "{cid}"\nworkload = "qwen_image"\npreset = "tiny"\n'
            for cid in case_ids
        )
    )


def run_with_a_fake(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    factory: str,
    cases: tuple[str, str],
    fake: str,
    *options: str,
) -> int:
    """`perfguard run *options` in `root` over two tiny cases, the first given the fake
    pipeline `fake` and the second 'ok', into `root/results.json`: the exit code. A registry
    cannot name a fake (its options are closed): the factory module `factory` picks by id
    (a module name per test, as a module once imported stays in `sys.modules`)."""
    from perfguard.cli import main

    write_registry(root, *cases)
    (root / f"{factory}.py").write_text(
        "import dataclasses\nimport pg_fake_pipes\n\n"
        "def pipeline(case, platform):\n"
        f"    fake = {fake!r} if case.id == {cases[0]!r} else 'ok'\n"
        "    return pg_fake_pipes.pipeline(dataclasses.replace(case, options={'fake': fake}), "
        "platform)\n"
    )
    monkeypatch.chdir(root)
    with pytest.raises(SystemExit) as info:
        main(["run", "--platform", "cpu", "--cases", "registry", "--repeats", "1",
              "--warmup", "0", *options, "--factory", f"{factory}:pipeline",
              "--out", "results.json"])  # fmt: skip
    return info.value.code


def test_run_with_devices_and_isolate_from_the_command_line(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from perfguard.storage.reports import read_results

    code = run_with_a_fake(tmp_path, monkeypatch, "pg_cli_pipes", ("hangs", "fine"), "hang",
                           "--timeout", "1", "--devices", "0,1", "--isolate")  # fmt: skip
    assert code == 3  # a case failed to run, nothing else wrong
    results = read_results(tmp_path / "results.json")
    assert results.cases["fine"].status == "ok"
    assert (results.cases["hangs"].error or "").startswith("timeout: killed after")
    assert results.settings["devices"] == ["0", "1"] and results.settings["isolate"] is True


# ---- how workers start -------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_gen_baselines_from_a_directory_holding_a_perfguard_folder(
    method: str, fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: `python -m` put the working directory first on the workers' import path, so
    the clone's top folder (`perfguard/`, no `__init__`) shadowed the package and every
    worker died: "worker died while starting (killed by SIGKILL)", exit 3."""
    from perfguard.cli import main
    from perfguard.storage.baseline import load

    write_registry(tmp_path, "fine")
    (tmp_path / "perfguard" / "perfguard").mkdir(parents=True)  # a clone, seen from above
    (tmp_path / "perfguard" / "README.md").write_text("a clone\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["gen-baselines", "--platform", "cpu", "--cases", "registry", "--repeats", "2",
              "--warmup", "0", "--processes", "2", "--factory", FACTORY,
              "--baseline", "b.json", "--start-method", method, "--no-progress"])  # fmt: skip
    assert info.value.code == 0
    scenario = load(tmp_path / "b.json").scenarios["fine"]
    # Every run of the two processes is kept, or left out by the contention screen and
    # counted (a loaded CI host can push one run's reference over 1.3x).
    assert scenario.metrics["e2e"].n + (scenario.dropped_runs or 0) == 4
    pids = {pid for _, pid, _ in log_lines(fake, "build")}
    assert len(pids) == 2 and os.getpid() not in pids


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_that_cannot_import_perfguard_says_why_in_one_line(
    method: str, tmp_path: Path
) -> None:
    broken = tmp_path / "root" / "perfguard"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise ImportError("broken on purpose")\n')
    starter = WorkerStarter(
        dict(os.environ), "worker", method, ["perfguard.measurement.runner"],
        root=str(tmp_path / "root"),
    )  # fmt: skip
    try:
        worker, why = starter.new()
    finally:
        starter.close()
    assert worker is None and why is not None
    assert "could not start" in why and "ImportError: broken on purpose" in why
    assert "SIGKILL" not in why and "\n" not in why


def test_a_warm_server_that_dies_fails_the_case_it_was_running_and_leaves_no_process(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = run_with_a_fake(tmp_path, monkeypatch, "pg_die_pipes", ("a_dies", "b_fine"),
                           "kill_server", "--isolate", "--start-method", "forkserver")  # fmt: skip
    assert code == 3  # an error, never a pass or a regression
    from perfguard.storage.reports import read_results

    results = read_results(tmp_path / "results.json")
    dead = results.cases["a_dies"]
    assert dead.status == "error"
    assert "its warm server died (killed by SIGKILL)" in (dead.error or "")
    assert results.cases["b_fine"].status == "ok"  # a fresh server took the next case
    assert results.settings["start_method"] == "forkserver"
    lines = fake.read_text().splitlines()
    server = [int(ln.split()[2]) for ln in lines if ln.split()[1] == "server"]
    worker = [int(ln.split()[2]) for ln in lines if ln.split()[1] == "worker"]
    assert server and worker
    wait_gone(server + worker, 10)
    assert all(gone(p) for p in server + worker)


def test_an_unknown_start_method_or_one_the_platform_lacks_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from perfguard.measurement import launch

    with pytest.raises(PerfguardError, match=r"--start-method 'fork': expected one of spawn"):
        MeasureOptions(start_method="fork")
    monkeypatch.setattr(launch.sys, "platform", "darwin")
    with pytest.raises(PerfguardError, match=r"--start-method forkserver: .*darwin.*use spawn"):
        MeasureOptions(start_method="forkserver")
    assert MeasureOptions().start_method == "spawn"  # the default where forking is unsafe


def test_an_unknown_start_method_exits_2_naming_the_option(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from perfguard.cli import main

    with pytest.raises(SystemExit) as info:
        main(["run", "--platform", "cpu", "--start-method", "fork"])
    assert info.value.code == 2
    assert "--start-method" in capsys.readouterr().err


def test_forked_workers_start_in_a_fraction_of_a_spawned_start(fake: Path) -> None:
    """Not a timing target (benchmarks/noise.py prints those): the second and later
    workers of a warm server skip the imports, so they report ready sooner than a
    spawned worker, which imports torch first."""
    env = dict(os.environ)
    forks = WorkerStarter(env, "worker", "forkserver", ["perfguard.measurement.runner"])
    spawns = WorkerStarter(env, "worker", "spawn", [])
    try:
        assert forks.ready() is None
        took: dict[str, float] = {}
        for name, starter in (("fork", forks), ("spawn", spawns)):
            t0 = time.monotonic()
            worker, why = starter.new()
            assert worker is not None, why
            res = worker.run(
                fake_case("c"), MeasureOptions(repeats=1, warmup=0, factory=FACTORY), "cpu"
            )
            took[name] = time.monotonic() - t0
            worker.close()
            assert res.status == "ok"
    finally:
        forks.close()
    assert took["fork"] < took["spawn"]


def test_a_warm_pool_serves_several_calls_from_one_server(fake: Path, tmp_path: Path) -> None:
    """A check's confirmations run one at a time: each must not pay a server's imports."""
    (tmp_path / "pg_parent_pipes.py").write_text(
        "import os\nimport pg_fake_pipes\n\n"
        "def pipeline(case, platform):\n"
        "    with open(os.environ['PG_FAKE_LOG'], 'a') as fh:\n"
        "        fh.write(f'{case.id} parent {os.getppid()} -\\n')\n"
        "    return pg_fake_pipes.pipeline(case, platform)\n"
    )
    options = MeasureOptions(
        isolate=True, repeats=1, warmup=0, factory="pg_parent_pipes:pipeline",
        start_method="forkserver",
    )  # fmt: skip
    with WarmPool() as warm:
        for i in range(2):
            res = workers.run_in_workers([fake_case(f"c{i}")], CPU, options, warm=warm)
            assert res.cases[f"c{i}"].status == "ok", res.cases[f"c{i}"].error
        (server,) = {pid for _, pid, _ in log_lines(fake, "parent")}
        assert not gone(server) and server != os.getpid()
    wait_gone([server], 10)
    assert gone(server)  # closing the pool ended it


def test_a_parent_killed_outright_leaves_no_warm_server_nor_worker(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    script = (
        "import os, sys, time\n"
        "from perfguard.measurement.worker_handle import WorkerStarter\n"
        "s = WorkerStarter(dict(os.environ), 'worker', 'forkserver', ['json'])\n"
        "w, why = s.new()\n"
        "print(s.server.proc.pid, w.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    server, worker = (int(x) for x in proc.stdout.readline().split())
    assert not gone(server) and not gone(worker)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_gone([server, worker], 10)
    assert gone(server) and gone(worker)


def test_the_warm_server_starts_before_the_command_and_ends_when_it_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gen-baselines` / `check` start their server first (its imports beside the
    parent's); a command that then fails (a bad baseline) leaves no server behind."""
    from perfguard.measurement import launch
    from perfguard.measurement.warm import in_warm_pool

    started: list[launch.WarmServer] = []
    real = launch.early_server

    def spy(options: MeasureOptions, wanted: bool) -> launch.EarlyServer | None:
        early = real(options, wanted)
        started.extend([early[-1]] if early else [])
        return early

    monkeypatch.setattr(launch, "early_server", spy)
    monkeypatch.setattr("perfguard.workloads.modules.everything", lambda: ["json"])
    handed: list[object] = []

    @in_warm_pool(lambda options, kw: kw.get("wanted", True))
    def command(selection: object, options: MeasureOptions, **kw: object) -> None:
        pool = kw["warm"]
        assert isinstance(pool, WarmPool)
        handed.extend(s.server for s in pool.starters.values())
        raise PerfguardError("baselines/x.json: unreadable")

    with pytest.raises(PerfguardError):
        command(None, MeasureOptions(start_method="forkserver"))
    assert len(started) == 1 and handed == started
    assert started[0].proc.wait(timeout=30) is not None  # ended with the command

    started.clear()
    for options, wanted in [
        (MeasureOptions(start_method="spawn"), True),
        (MeasureOptions(start_method="forkserver", devices=("0", "1")), True),
        (MeasureOptions(start_method="forkserver"), False),
    ]:
        with pytest.raises(PerfguardError):
            command(None, options, wanted=wanted)
    assert started == []  # spawned workers, several slots or no workers: nothing early


TELL = """
import json, os, sys

import pgrev

try:
    import onlya  # noqa: F401  (only in the server's own root)
    have = True
except ImportError:
    have = False
msg = {"name": pgrev.NAME, "ppid": os.getppid(), "side": os.environ.get("PG_SIDE"),
       "cwd": os.getcwd(), "onlya": have}
os.write(int(sys.argv[1]), (json.dumps(msg) + "\\n").encode())
"""


def test_sides_sharing_a_server_import_their_own_revision_in_their_own_env(
    tmp_path: Path,
) -> None:
    """The relative check's base and head fork from one server (`SharedFork`): each fork
    takes its side's environment, working directory and import root, and a module only
    the server's root holds is not found from the other side."""
    import json

    from perfguard.measurement import launch

    for name in ("a", "b"):
        pkg = tmp_path / name / "pgrev"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(f"NAME = {name!r}\n")
        (pkg / "tell.py").write_text(TELL)
    (tmp_path / "a" / "onlya.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    server = launch.WarmServer(env, "shared server", preload=["json"], root=str(tmp_path / "a"))
    try:
        assert server.start(60) is None
        for name in ("a", "b"):
            where = str(tmp_path / name)
            side = launch.SharedFork(server, {**env, "PG_SIDE": name}, where, where)
            proc, fd = side.fork("pgrev.tell", ["{result_fd}"])
            with os.fdopen(fd) as fh:
                got = json.loads(fh.readline())
            assert proc.wait(timeout=10) == 0
            assert got == {
                "name": name, "ppid": server.proc.pid, "side": name, "cwd": where,
                "onlya": name == "a",
            }  # fmt: skip
            side.close()  # the owner's to close: the server stays
            assert server.alive
    finally:
        server.close()


def test_a_shared_server_imports_no_module_a_side_brings_itself(tmp_path: Path) -> None:
    """Not perfguard, not the factory's module, and not a package the base checkout
    holds (a diffusers checkout as the base: its workers import it from there)."""
    from perfguard.workloads.modules import everything, shared_preload

    names = [*everything(), "pg_my_pipes"]
    assert any(n.startswith("perfguard.") for n in names)
    got = shared_preload(names, "pg_my_pipes:build")
    assert got[0] == "torch" and all(n.startswith("?") for n in got[1:])
    assert not [n for n in got if n.lstrip("?").partition(".")[0] in ("perfguard", "pg_my_pipes")]
    assert any(n.startswith("?diffusers.") for n in got)
    (tmp_path / "diffusers").mkdir()
    (tmp_path / "pg_other.py").write_text("")
    without = shared_preload([*names, "pg_other"], None, [str(tmp_path)])
    assert not [n for n in without if n.startswith(("?diffusers", "?pg_other"))]
    assert any(n.startswith("?transformers.") for n in without)


def test_a_shared_servers_libraries_are_all_a_worker_imports_besides_perfguard() -> None:
    """`RUNNER_LIBRARIES` is whole: once the shared server's modules are in, a worker's
    perfguard (the worker, the runner, every workload) imports no other package."""
    import json
    import subprocess
    import sys

    script = (
        "import importlib, json, sys\n"
        "from perfguard.workloads import modules as M\n"
        "pre = [n.lstrip('?') for n in M.shared_preload(M.everything())]\n"
        "for k in [k for k in sys.modules if k.startswith('perfguard')]: del sys.modules[k]\n"
        "for n in pre: importlib.import_module(n)\n"
        "before = set(sys.modules)\n"
        "for n in ['perfguard.measurement.worker', *M.RUNNER, *M.everything()]:\n"
        "    importlib.import_module(n)\n"
        "new = {m.partition('.')[0] for m in set(sys.modules) - before}\n"
        "print(json.dumps(sorted(new - {'perfguard'} - set(sys.stdlib_module_names))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_a_server_wakes_when_a_child_exits_not_at_its_next_poll() -> None:
    """The servers watch a SIGCHLD self-pipe beside their sockets, so a worker's exit is
    reported when it happens (a client waits for it before it forks the next worker).
    In a separate interpreter: the wake-up installs a SIGCHLD handler."""
    import subprocess
    import sys

    script = (
        "import os, select, sys\n"
        "from perfguard.measurement import forkserver\n"
        "wake = forkserver._exit_wakeup()\n"
        "ready, _, _ = select.select([wake], [], [], 0.5)\n"
        "assert not ready, 'readable before any child exited'\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0)\n"
        "ready, _, _ = select.select([wake], [], [], 30)\n"
        "forkserver._drain(wake)\n"
        "print(bool(ready), os.waitpid(pid, os.WNOHANG)[0] == pid)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]
