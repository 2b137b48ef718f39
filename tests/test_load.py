"""Another process's load, read from /proc: a core kept busy beside a baseline session is
seen, whatever the timings' spread, and the session is refused or marked busy."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import perfguard.decision.contention
from perfguard.decision.contention import FOREIGN_LOAD, ContentionPolicy
from perfguard.device.load import LoadMeter, busy_cpu_s, tree_cpu_s
from tests.fake_pipeline import GEN
from tests.helpers import PG

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux /proc")

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"


@pytest.fixture
def spinner() -> Iterator[int]:
    """A process outside this one's tree (its parent exits: it is re-parented) that keeps
    a core busy; yields its pid, killed afterwards."""
    out = subprocess.run(
        ["sh", "-c", f'{sys.executable} -c "{SPIN}" >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    time.sleep(0.2)
    try:
        yield pid
    finally:
        subprocess.run(["kill", str(pid)], check=False)


def test_the_kernel_counts_busy_time_and_this_tree_s_own() -> None:
    busy, own = busy_cpu_s(), tree_cpu_s(os.getpid())
    assert busy is not None and busy > 0 and own > 0


def test_a_core_kept_busy_outside_the_tree_reads_as_foreign_load(spinner: int) -> None:
    meter = LoadMeter().start()
    time.sleep(1.0)
    assert (meter.read() or 0.0) > FOREIGN_LOAD


def test_this_tree_s_own_work_is_not_foreign() -> None:
    """A child of this process spinning is perfguard's own measuring: not counted. (What
    the rest of the machine does is not under the test's control, so only the own part
    is asserted: the CPU time the kernel gives the reaped child is the tree's.)"""
    meter = LoadMeter().start()
    before, reaped = tree_cpu_s(meter.root), resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", SPIN.replace("30", "1")], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = (after.ru_utime - reaped.ru_utime) + (after.ru_stime - reaped.ru_stime)
    assert child > 0.2 and tree_cpu_s(meter.root) - before >= 0.9 * child - 0.05


def test_gen_baselines_beside_a_busy_core_is_refused_or_marked(
    fake: Path, pg: PG, monkeypatch: pytest.MonkeyPatch, spinner: int
) -> None:
    monkeypatch.setattr(perfguard.decision.contention, "DEFAULT_POLICY", ContentionPolicy(waits=0))
    monkeypatch.delenv("PERFGUARD_ALLOW_BUSY")
    code, out, _ = pg(*GEN, "--repeats", "20")
    assert code == 4 and "other processes used" in out and "not written" in out
    assert not fake.exists() or not json.loads(fake.read_text()).get("scenarios")
    code, out, _ = pg(*GEN, "--repeats", "20", "--allow-busy")
    assert code == 0 and "marked busy" in out
    stored = json.loads(fake.read_text())["scenarios"]
    assert all(s["busy"].startswith("other processes used") for s in stored.values())
