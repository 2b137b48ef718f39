"""The stages and steps of a diffusers pipeline, timed through its public seams.

The stages are opened and closed from outside, without editing diffusers:

* `TextEncodingStage`: forward pre/post hooks on `text_encoder`, `text_encoder_2`, ...;
* `PriorTokenGenerationStage`: a wrapper around `vision_language_encoder.generate`
  (GLM-Image's autoregressive prior; forward hooks when it has no `generate`);
* `DenoisingStage`: opened by the denoiser's (`transformer` / `unet`) first forward
  pre-hook, closed at the end of the last step (the pipeline's `num_timesteps`), else
  when the next stage starts or the call ends;
* `step:<i>`: from the denoiser's first call in step `i` to the end of that step, as the
  step seam below sees it;
* `DecodingStage`: a wrapper around `vae.decode`.

Why hooks and wrappers: they are the pipeline's public seams, so the pipeline measured is
the user's own, line for line; a copy of its loop would drift from it. Why the ambient
`StageTimer`: each boundary records a device event and the run syncs once, as the
built-in pipelines do, so the figures are device time on CUDA/ROCm/NPU and comparable.
What no seam shows (input checks, latent and timestep preparation, post-processing) is
in `e2e` only.

**The step seam, in this order** (`STEP_SEAMS`; the first one not yet shown not to work):

1. `scheduler.step`: the scheduler instance's `step`, wrapped for the duration of the call
   (an instance attribute, removed afterwards; the class and other instances are
   untouched). Every diffusers denoising loop calls it once per iteration whatever its
   `__call__` takes (Stable Diffusion, PixArt, Sana, Wan, Flux, Qwen-Image, ...), so it
   needs nothing of the signature; it ends a step where the update of the latents ends,
   before callbacks and the progress bar; and nothing is passed to the pipeline, which
   runs with the case's arguments only. The wrapper is a method bound to the scheduler,
   so a pipeline that copies its scheduler (`copy.deepcopy`) times the copy's steps.
2. `callback_on_step_end`: for a loop that updates its latents without the scheduler's
   `step`; it is passed only to a `__call__` that takes it.
3. `callback` with `callback_steps=1`: the legacy callback, for an older or community
   pipeline that takes only that (called once per scheduler order).
4. The denoiser's forward calls open steps but cannot close them: with serial CFG a step
   is two calls, and nothing in the calls says which. So with no seam above, the run has
   no `step:<i>`, keeps its stage times, and the results say why in one line
   (`observed["no_steps"]`).

A seam "does not work" when a call ran the denoiser and the seam closed no step; the
next call then uses the next seam (a warm-up call finds out before anything is timed),
and that call's unfinished step is dropped, never recorded. Which seam timed the steps is
recorded per case (`DiffusersCase.observed`, the results' and report's `observed`:
`step_seam`, or `no_steps`), with, for a video pipeline (an output with `frames`), the
number of frames of the output (`frames`), from which the Markdown gives the time per
frame beside `e2e`."""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from perfguard.device.timer import stage, step

TEXT_ENCODING = "TextEncodingStage"
PRIOR = "PriorTokenGenerationStage"
DENOISING = "DenoisingStage"
DECODING = "DecodingStage"
DENOISER_ROLES = ("transformer", "unet")
PRIOR_ROLES = ("vision_language_encoder",)
SCHEDULER_STEP = "scheduler.step"
STEP_END_CALLBACK = "callback_on_step_end"
LEGACY_CALLBACK = "callback"
STEP_SEAMS = (SCHEDULER_STEP, STEP_END_CALLBACK, LEGACY_CALLBACK)
"""The seams that end a denoising step, in the order they are tried (module docstring)."""


class StageObserver:
    """Opens and closes the ambient timer's spans from hooks; reset at every call."""

    def __init__(self, timesteps: Callable[[], int | None] = lambda: None) -> None:
        self.timesteps_of = timesteps
        self.reset()

    def reset(self) -> None:
        self.open: list[Any] = []  # stage spans, innermost last
        self.depth: dict[str, int] = {}
        self.denoising: Any = None
        self.step: Any = None
        self.steps = 0
        self.calls: dict[str, int] = {}
        self.closed_by: dict[str, int] = {}  # seam -> steps it closed in this call
        self.timesteps: int | None = None  # the loop's length, where the pipeline says it

    def enter(self, name: str) -> None:
        depth = self.depth.get(name, 0)
        self.depth[name] = depth + 1
        if depth == 0:
            self.end_denoising()
            span = stage(name)
            span.__enter__()
            self.open.append(span)

    def leave(self, name: str) -> None:
        self.depth[name] -= 1
        if self.depth[name] == 0 and self.open:
            self.open.pop().__exit__(None, None, None)

    def denoiser_call(self, steps: bool) -> None:
        """The denoiser's forward pre-hook; `steps`: a seam may close the step it opens."""
        self.calls["denoiser_calls"] = self.calls.get("denoiser_calls", 0) + 1
        if self.denoising is None:
            self.denoising = stage(DENOISING)
            self.denoising.__enter__()
        if steps and self.step is None:
            self.step = step(self.steps)
            self.step.__enter__()

    def step_end(self, seam: str) -> None:
        """`seam` saw a step end: close the open step, and the stage after the last one."""
        if self.step is None:
            return
        self.step.__exit__(None, None, None)
        self.step = None
        self.steps += 1
        self.closed_by[seam] = self.closed_by.get(seam, 0) + 1
        if self.timesteps is None:
            self.timesteps = self.timesteps_of()
        if self.timesteps is not None and self.steps == self.timesteps:
            self.end_denoising()  # the loop is over: what follows is not denoising

    def end_denoising(self) -> None:
        self.drop_step()
        if self.denoising is not None:
            self.denoising.__exit__(None, None, None)
            self.denoising = None

    def drop_step(self) -> None:
        """A step no seam closed (the next stage began, or the call ended) is dropped:
        it would be the rest of the loop, not a step."""
        if self.step is not None:
            self.step.abandon()
            self.step = None

    def close(self) -> None:
        self.end_denoising()
        while self.open:
            self.open.pop().__exit__(None, None, None)


def _wrap_method(owner: Any, name: str, observer: StageObserver, stage_name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        observer.enter(stage_name)
        try:
            return original(*args, **kwargs)
        finally:
            observer.leave(stage_name)

    setattr(owner, name, timed)


def _hook_stage(module: torch.nn.Module, observer: StageObserver, stage_name: str) -> None:
    module.register_forward_pre_hook(lambda mod, args: observer.enter(stage_name))
    module.register_forward_hook(lambda mod, args, out: observer.leave(stage_name))


@contextlib.contextmanager
def scheduler_step_seam(scheduler: Any, observer: StageObserver) -> Any:
    """`scheduler.step` wrapped on this instance for the duration of the block.

    The wrapper is bound to the scheduler (`types.MethodType`) and calls the step of the
    instance it is bound to, so a copy of the scheduler made inside the call
    (`copy.deepcopy` binds the copy) steps itself, not the original. Afterwards the
    instance is as it was: its own `step` attribute back, or none.
    """
    own = scheduler.__dict__.get("step")

    def timed_step(sched: Any, *args: Any, **kwargs: Any) -> Any:
        inner = own if own is not None else type(sched).step.__get__(sched)
        try:
            return inner(*args, **kwargs)
        finally:
            observer.step_end(SCHEDULER_STEP)

    scheduler.step = types.MethodType(timed_step, scheduler)
    try:
        yield
    finally:
        if own is not None:
            scheduler.step = own
        else:
            del scheduler.step


def observe_components(
    modules: Mapping[str, torch.nn.Module], observer: StageObserver, steps: Callable[[], bool]
) -> None:
    """Hook each component's stage: text encoders, the prior's `generate`, the denoiser's
    forward (opening steps while `steps()` says a seam may close them), the VAE's `decode`."""
    for role, module in modules.items():
        if role.startswith("text_encoder"):
            _hook_stage(module, observer, TEXT_ENCODING)
        elif role in PRIOR_ROLES:
            if callable(getattr(module, "generate", None)):
                _wrap_method(module, "generate", observer, PRIOR)
            else:
                _hook_stage(module, observer, PRIOR)
        elif role in DENOISER_ROLES:
            module.register_forward_pre_hook(lambda mod, args: observer.denoiser_call(steps()))
        elif role == "vae" and callable(getattr(module, "decode", None)):
            _wrap_method(module, "decode", observer, DECODING)
