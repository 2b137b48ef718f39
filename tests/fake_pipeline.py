"""Fake pipelines on a virtual clock, and the `fake` fixture that installs them.

Each stage of a fake pipeline advances the clock the timer reads by a set number of
milliseconds, so figures are exact and a test does not depend on how busy the machine
is. `BEHAVIOUR` says what each case's pipeline does (slower stages, errors); tests edit
it and the fixture resets it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import perfguard.device.platform
import perfguard.measurement.runner
from perfguard.device.platform import Platform
from perfguard.device.timer import stage, step

REPO = Path(__file__).resolve().parents[1]
CASES = """
[[case]]
id = "alpha"
workload = "qwen_image"
preset = "tiny"
tags = ["smoke"]

[[case]]
id = "beta"
workload = "glm_image"
preset = "tiny"
tags = ["smoke"]
"""

# Virtual milliseconds per stage / step of the fake pipelines; tests change them. Each is
# large against the real time a stage also takes (`mark` adds the host clock): at 0.05
# ms a 0.13 ms preemption of the host made InputValidationStage read 3x its baseline.
FIGURES = {"InputValidationStage": 1.0, "TextEncodingStage": 3.0, "DecodingStage": 4.0}
STEP_MS, STEPS = 10.0, 4


class VirtualClockPlatform(Platform):
    """The CPU platform whose clock also moves when a fake pipeline says time passed."""

    offset_ns = 0

    def mark(self) -> int:
        return time.perf_counter_ns() + VirtualClockPlatform.offset_ns

    def host_ns(self) -> int:  # a reference workload that takes no time: no screening
        return VirtualClockPlatform.offset_ns

    def hardware_slug(self) -> str:
        return "test-cpu"


def advance(ms: float) -> None:
    VirtualClockPlatform.offset_ns += int(ms * 1e6)


class SteppedClock(Platform):
    """A platform whose clock only moves when the fake pipeline says so (`work(ms)`, with
    seeded relative jitter `noise`): the statistics are then tested on known samples,
    whatever else the machine is doing."""

    def __init__(self, noise: float = 0.03) -> None:
        super().__init__()
        self.now_ns = 0
        self.noise = noise
        self.rng = np.random.default_rng(0)

    def mark(self) -> int:
        return self.now_ns

    def host_ns(self) -> int:  # the reference workload sees the virtual clock too
        return self.now_ns

    def work(self, ms: float) -> None:
        self.now_ns += int(ms * 1e6 * (1 + self.noise * self.rng.standard_normal()))


class Behaviour:
    """What the fake pipeline of each case does; tests edit it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.slow: dict[str, float] = {}  # stage or "step" -> factor
        self.raises: set[str] = set()
        self.interrupt: set[str] = set()
        self.skip_stage: set[str] = set()


BEHAVIOUR = Behaviour()


def fake_factory(case: Any, platform: Platform) -> Callable[[], torch.Tensor]:
    if case.id in BEHAVIOUR.interrupt:
        raise KeyboardInterrupt
    slow = BEHAVIOUR.slow

    def run() -> torch.Tensor:
        if case.id in BEHAVIOUR.raises:
            raise RuntimeError("CUDA out of memory (fake)")
        for name in ("InputValidationStage", "TextEncodingStage"):
            with stage(name):
                advance(FIGURES[name] * slow.get(name, 1.0))
        with stage("DenoisingStage"):
            for i in range(STEPS):
                with step(i):
                    advance(STEP_MS * slow.get("step", 1.0))
            advance(1.0 * slow.get("DenoisingStage", 1.0))
        if "DecodingStage" not in BEHAVIOUR.skip_stage:
            with stage("DecodingStage"):
                advance(FIGURES["DecodingStage"] * slow.get("DecodingStage", 1.0))
        return torch.full((4,), float(case.seed))

    return run


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A working directory with a two-case registry, fake pipelines and a virtual clock."""
    BEHAVIOUR.reset()
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "common.toml").write_text(CASES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("PERFGUARD_FACTORY", raising=False)
    monkeypatch.setattr(perfguard.measurement.runner, "_default_factory", fake_factory)
    # The runner collects garbage after each case to free device memory; in a pytest
    # process that costs ~0.1 s a case, and the fake pipelines hold nothing.
    monkeypatch.setattr(perfguard.measurement.runner.gc, "collect", lambda *a: 0)
    monkeypatch.setattr(
        perfguard.device.platform, "probe", lambda name=None: VirtualClockPlatform()
    )
    yield tmp_path / "baselines" / "cpu" / "test-cpu.json"


GEN = ("gen-baselines", "--repeats", "3", "--warmup", "0", "--processes", "1")
# No confirmation: the fake pipelines keep virtual time only in this process, and a
# confirmation runs in a fresh one (tests/test_verdict_noise.py pins the confirmations).
CHECK = ("check", "--repeats", "3", "--warmup", "0", "--max-reruns", "0")
