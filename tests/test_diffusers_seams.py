"""The step seam of a diffusers case, whatever the pipeline's signature.

Small pipelines of the diffusers shape (`components`, a denoiser module, a scheduler with
`step`, a `__call__` loop), each missing a different seam, run through the runner: the
steps are timed at the scheduler's `step` when the loop calls it, else at the callback
the pipeline takes, else not at all, with the one line that says why, and the stages are
timed in every case.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from perfguard.device.platform import probe
from perfguard.interop.diffusers import DiffusersCase
from perfguard.measurement.options import MeasureOptions
from perfguard.measurement.runner import run_case
from perfguard.storage.cases import parse_case
from tests.helpers import diffusers_fields

STEPS = 3


class Denoiser(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Scheduler:
    def __init__(self) -> None:
        self.calls = 0

    def step(self, noise: torch.Tensor, t: int, latents: torch.Tensor) -> tuple[torch.Tensor]:
        self.calls += 1
        return (latents - 0.1 * noise,)


class LoopPipeline:
    """Serial CFG: two denoiser calls per step. `scheduler_steps`: whether the loop
    updates its latents with `scheduler.step` (else by hand); `copy_scheduler`: the
    loop steps a deep copy of its scheduler."""

    def __init__(self, scheduler_steps: bool = True, copy_scheduler: bool = False) -> None:
        self.transformer = Denoiser()
        self.scheduler = Scheduler()
        self.scheduler_steps = scheduler_steps
        self.copy_scheduler = copy_scheduler
        self.components = {"transformer": self.transformer, "scheduler": self.scheduler}

    def loop(self, num_inference_steps: int, height: int, on_step: Any = None) -> Any:
        latents = torch.ones(1, 3, height, height)
        scheduler = getattr(self, "scheduler", None)
        if self.copy_scheduler:
            scheduler = copy.deepcopy(scheduler)
        self.stepped = scheduler
        with torch.no_grad():
            for i in range(num_inference_steps):
                noise = self.transformer(latents) - self.transformer(latents * 0.9)
                if self.scheduler_steps:
                    latents = scheduler.step(noise, i, latents)[0]
                else:
                    latents = latents - 0.1 * noise
                if on_step is not None:
                    on_step(i, latents)
        return SimpleNamespace(images=latents)


class LegacyPipeline(LoopPipeline):
    """Only the legacy `callback` / `callback_steps`, as PixArt's pipelines."""

    def __call__(self, prompt: str, height: int, width: int, num_inference_steps: int,
                 generator: Any, output_type: str, negative_prompt: str | None = None,
                 callback: Any = None, callback_steps: int = 1) -> Any:  # fmt: skip
        def on_step(i: int, latents: torch.Tensor) -> None:
            if callback is not None and i % callback_steps == 0:
                callback(i, i, latents)

        return self.loop(num_inference_steps, height, on_step)


class BarePipeline(LoopPipeline):
    """No callback of any kind."""

    def __call__(self, prompt: str, height: int, width: int, num_inference_steps: int,
                 generator: Any, output_type: str, negative_prompt: str | None = None,
                 ) -> Any:  # fmt: skip
        return self.loop(num_inference_steps, height)


def run(pipe: Any, warmup: int = 1, repeats: int = 2) -> Any:
    case = parse_case(diffusers_fields("seam", Path("unused"), STEPS), "test.toml")
    result = run_case(
        case,
        probe("cpu"),
        MeasureOptions(repeats=repeats, warmup=warmup),
        factory=lambda case, platform: DiffusersCase(case, pipe),
    )
    assert result.status == "ok", result.error
    return result


def steps_of(result: Any) -> list[str]:
    return sorted(k for k in result.samples if k.startswith("step:"))


def test_a_loop_that_calls_scheduler_step_is_timed_there_with_nothing_passed() -> None:
    pipe = LegacyPipeline()
    result = run(pipe)
    assert result.observed == {"step_seam": "scheduler.step"}
    assert steps_of(result) == [f"step:{i}" for i in range(STEPS)]
    assert "stage:DenoisingStage" in result.samples
    assert "callback" not in result.arguments and "callback_on_step_end" not in result.arguments
    assert result.counters == {"denoise_steps": [STEPS] * 2, "denoiser_calls": [2 * STEPS] * 2}
    # The wrapper lived on the instance for the call only; the class was never touched.
    assert "step" not in vars(pipe.scheduler)
    assert Scheduler.step.__qualname__ == "Scheduler.step"
    assert pipe.scheduler.calls == STEPS * (1 + 2 + 1)  # warm-up, 2 runs, the counted run


def test_a_scheduler_copied_inside_the_call_steps_itself_and_is_timed() -> None:
    pipe = LegacyPipeline(copy_scheduler=True)
    result = run(pipe, warmup=0, repeats=1)
    assert result.observed == {"step_seam": "scheduler.step"}
    assert steps_of(result) == [f"step:{i}" for i in range(STEPS)]
    assert pipe.scheduler.calls == 0 and pipe.stepped.calls == STEPS  # the copy stepped
    assert "step" not in vars(pipe.scheduler)


def test_a_loop_without_scheduler_step_falls_back_to_the_legacy_callback() -> None:
    pipe = LegacyPipeline(scheduler_steps=False)
    result = run(pipe, warmup=1)
    # The warm-up found that scheduler.step closes no step; the timed runs use the callback.
    assert result.observed == {"step_seam": "callback"}
    assert steps_of(result) == [f"step:{i}" for i in range(STEPS)]
    assert result.arguments["callback"] == "perfguard's step timer"
    assert result.arguments["callback_steps"] == 1
    for run_ in range(2):
        steps = sum(result.samples[f"step:{i}"][run_] for i in range(STEPS))
        assert steps <= result.samples["stage:DenoisingStage"][run_]


def test_a_pipeline_with_no_step_seam_keeps_its_stages_and_says_why_in_one_line() -> None:
    pipe = BarePipeline(scheduler_steps=False)
    # No warm-up: the first call (the counted run) is the one that finds the seam does
    # not work, and its unfinished step is dropped, not recorded.
    result = run(pipe, warmup=0, repeats=2)
    assert steps_of(result) == []
    (work,) = result.work
    assert work["steps"] == [] and "DenoisingStage" in work["stages"]
    assert len(result.samples["stage:DenoisingStage"]) == 2
    assert set(result.observed) == {"no_steps"}
    why = result.observed["no_steps"]
    assert why.startswith("BarePipeline: no step seam closed a step (scheduler.step tried")
    assert "\n" not in why
    assert result.counters["denoise_steps"] == [0, 0]


def test_a_pipeline_without_a_scheduler_or_callback_has_no_steps_from_the_start() -> None:
    pipe = BarePipeline(scheduler_steps=False)
    del pipe.scheduler
    pipe.components = {"transformer": pipe.transformer}
    result = run(pipe, warmup=0, repeats=1)
    assert steps_of(result) == [] and "stage:DenoisingStage" in result.samples
    assert result.observed["no_steps"].startswith("BarePipeline: no step seam (no scheduler")


@pytest.mark.parametrize("name", ["callback", "callback_steps", "callback_on_step_end"])
def test_options_may_not_name_the_callbacks_perfguard_passes(name: str) -> None:
    from perfguard.errors import PerfguardError
    from perfguard.interop.diffusers import check_options

    case = parse_case(
        diffusers_fields("seam", Path("unused"), STEPS, {"options": {name: 1}}), "test.toml"
    )
    with pytest.raises(PerfguardError, match=f"options.{name}: perfguard sets it"):
        check_options(case, LegacyPipeline)
