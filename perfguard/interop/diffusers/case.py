"""`DiffusersCase`: a loaded diffusers pipeline driven with a case's arguments, its stages
observed through the seams of `perfguard.interop.diffusers.seams`, and the runner's
factory for `workload = "diffusers"`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from perfguard.device.platform import Platform
from perfguard.interop.diffusers.arguments import call_arguments, call_parameters
from perfguard.interop.diffusers.saved import load_pipeline
from perfguard.interop.diffusers.seams import (
    LEGACY_CALLBACK,
    SCHEDULER_STEP,
    STEP_END_CALLBACK,
    STEP_SEAMS,
    StageObserver,
    observe_components,
    scheduler_step_seam,
)
from perfguard.storage.cases import Case
from perfguard.workloads.components import component_info


class DiffusersCase:
    """A loaded pipeline driven with the case's arguments, its stages observed.

    Calling it runs the pipeline once and returns the image tensor (`output_type="pt"`;
    a video pipeline's `frames`, batch x frames x channels x height x width);
    `components` maps each role to its class and parameter count, `arguments` is what
    `__call__` gets, `counters()` gives what the last call did (denoiser calls, steps,
    component calls) and `observed` which step seam timed it (module docstring).
    """

    def __init__(self, case: Case, pipe: Any) -> None:
        self.case = case
        self.pipe = pipe
        self.kwargs = call_arguments(case, pipe)
        params = call_parameters(pipe)
        scheduler = getattr(pipe, "scheduler", None)
        available = {
            SCHEDULER_STEP: callable(getattr(scheduler, "step", None)),
            STEP_END_CALLBACK: STEP_END_CALLBACK in params,
            LEGACY_CALLBACK: LEGACY_CALLBACK in params,
        }
        self.seams = [seam for seam in STEP_SEAMS if available[seam]]
        """The step seams still to try, first the one the next call uses."""
        self.tried: list[str] = []
        self.last_seam: str | None = None
        self.frames: int | None = None
        self.observer = StageObserver(self._timesteps)
        modules = {
            role: comp
            for role, comp in sorted(pipe.components.items())
            if isinstance(comp, torch.nn.Module)
        }
        # The runner records each module's class and parameter count; the other parts
        # (tokenizer, scheduler, processor) by class with no parameters, since they shape
        # what runs too: the same record as the built-in pipelines give (`component_info`).
        self.components: dict[str, Any] = {
            role: comp if isinstance(comp, torch.nn.Module) else component_info(comp)
            for role, comp in sorted(pipe.components.items())
            if comp is not None
        }
        observe_components(modules, self.observer, lambda: bool(self.seams))

    @property
    def arguments(self) -> dict[str, Any]:
        """What `__call__` is given, by argument name: recorded in results and reports."""
        out: dict[str, Any] = {
            **self.kwargs,
            "generator": f"torch.Generator('cpu').manual_seed({self.case.seed})",
        }
        return {**out, **self._seam_arguments(describe=True)}

    @property
    def observed(self) -> dict[str, Any]:
        """Which seam timed the last call's steps (`step_seam`), or why it has none
        (`no_steps`), and the frames of a video output (`frames`)."""
        out: dict[str, Any] = {}
        if self.last_seam is not None:
            out["step_seam"] = self.last_seam
        else:
            out["no_steps"] = self._no_steps_reason()
        if self.frames is not None:
            out["frames"] = self.frames
        return out

    def _no_steps_reason(self) -> str:
        name = type(self.pipe).__name__
        if self.tried:
            return (
                f"{name}: no step seam closed a step ({', '.join(self.tried)} tried; "
                "the denoiser's calls alone do not say where a step ends)"
            )
        if not self.seams:
            return (
                f"{name}: no step seam (no scheduler with a step, no callback_on_step_end "
                "or callback argument; the denoiser's calls alone do not say where a step ends)"
            )
        return f"{name}: not run yet"

    def _seam_arguments(self, describe: bool = False) -> dict[str, Any]:
        """The callback the current seam passes to `__call__` (none for the scheduler's)."""
        seam = self.seams[0] if self.seams else None
        if seam == STEP_END_CALLBACK:
            return {STEP_END_CALLBACK: "perfguard's step timer" if describe else self._on_step_end}
        if seam == LEGACY_CALLBACK:
            out: dict[str, Any] = {
                LEGACY_CALLBACK: "perfguard's step timer" if describe else self._on_callback
            }
            if "callback_steps" in call_parameters(self.pipe):
                out["callback_steps"] = 1
            return out
        return {}

    def _on_step_end(self, pipe: Any, i: int, t: Any, callback_kwargs: dict[str, Any]) -> dict:
        self.observer.step_end(STEP_END_CALLBACK)
        return {}

    def _on_callback(self, i: int, t: Any, latents: Any) -> None:
        self.observer.step_end(LEGACY_CALLBACK)

    def _timesteps(self) -> int | None:
        """The loop's length as the pipeline says it (`num_timesteps`), once it is set."""
        try:
            n = getattr(self.pipe, "num_timesteps", None)
        except Exception:  # a property read before the loop set it
            return None
        return n if isinstance(n, int) and n > 0 else None

    def __call__(self) -> torch.Tensor:
        self.observer.reset()
        generator = torch.Generator("cpu").manual_seed(self.case.seed)
        seam = self.seams[0] if self.seams else None
        scheduler = getattr(self.pipe, "scheduler", None)
        seam_block = (
            scheduler_step_seam(scheduler, self.observer)
            if seam == SCHEDULER_STEP
            else contextlib.nullcontext()
        )
        try:
            with seam_block:
                out = self.pipe(**self.kwargs, generator=generator, **self._seam_arguments())
        finally:
            self.observer.close()
        self._learn(seam)
        video = getattr(out, "frames", None)
        images = video if video is not None else getattr(out, "images", None)
        if images is None:
            images = out[0]
        if not isinstance(images, torch.Tensor):
            images = torch.as_tensor(images)
        self.frames = int(images.shape[1]) if video is not None and images.dim() == 5 else None
        return images

    def _learn(self, seam: str | None) -> None:
        """After a call: the seam that closed its steps, or the next seam to try."""
        closed = self.observer.closed_by
        if seam is not None and closed.get(seam):
            self.last_seam = seam
        elif seam is not None and self.observer.calls.get("denoiser_calls"):
            self.tried.append(self.seams.pop(0))  # it saw no step end: try the next one
            self.last_seam = None

    def counters(self) -> dict[str, int]:
        return {**self.observer.calls, "denoise_steps": self.observer.steps}


def build_diffusers_pipeline(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
    """The runner's factory for `workload = "diffusers"` (device 0 of `platform`)."""
    return DiffusersCase(case, load_pipeline(case, platform.device(0)))
