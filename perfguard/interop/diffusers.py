"""Any diffusers pipeline under the gate: `workload = "diffusers"`.

A case names a directory written by `DiffusionPipeline.save_pretrained` (`model`), and
perfguard loads it offline (`DiffusionPipeline.from_pretrained(path, local_files_only=True)`)
and times its stages from outside, without editing diffusers:

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
frame beside `e2e`.

The case's fields go to the `__call__` arguments of the same name, and only those:
`prompt`, `negative_prompt`, `height`, `width`, `guidance_scale`, and `steps` as
`num_inference_steps`; `seed` makes the CPU `torch.Generator`, `dtype` is the load dtype.
A field the case does not set (`negative_prompt`, `guidance_scale`) is not passed, so the
pipeline's own default applies. Every other argument is the case's `options` table
(`options = { true_cfg_scale = 4.0, max_sequence_length = 256 }`), passed as written and
checked against the signature of the pipeline class's `__call__` before anything runs.
Why by name, not by meaning: pipelines disagree on what "the CFG scale" is (Qwen-Image's
`true_cfg_scale` runs a second denoiser pass per step; Flux's `guidance_scale` is a
distilled embedding, one pass), and guessing one mapped a Flux case's `guidance_scale`
onto true CFG, doubling the denoiser calls. What was passed is recorded per case
(`DiffusersCase.arguments`, the report's `arguments`).

With `dit = "perfguard"` the pipeline's transformer is replaced by perfguard's optimized
DiT of the same config with the same weights (Qwen-Image, GLM-Image), and the case's
toggles apply to it.

Errors: a `model` that is not a complete local diffusers pipeline, or an `options` name
its `__call__` does not take (or one that a field or perfguard sets), is a data error
naming the file, the case and the field (`preflight`, exit 2, before anything runs), and so
is a `model_index.json` naming a pipeline class that this diffusers cannot load (a custom
or newer pipeline whose code would have to be downloaded); a pipeline whose `__call__`
does not take the case's fields fails that case only (exit 3).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from perfguard.device.platform import Platform
from perfguard.device.timer import stage, step
from perfguard.errors import PerfguardError
from perfguard.storage.cases import DIFFUSERS, Case
from perfguard.workloads.components import component_info
from perfguard.workloads.pipeline import DTYPES

# Pipeline class (model_index.json `_class_name`) -> perfguard workload whose DiT can
# replace its transformer.
PERFGUARD_DITS = {"QwenImagePipeline": "qwen_image", "GlmImagePipeline": "glm_image"}

TEXT_ENCODING = "TextEncodingStage"
PRIOR = "PriorTokenGenerationStage"
DENOISING = "DenoisingStage"
DECODING = "DecodingStage"
DENOISER_ROLES = ("transformer", "unet")
PRIOR_ROLES = ("vision_language_encoder",)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".safetensors.index.json")

# Arguments every pipeline must take for a case to drive it.
REQUIRED_ARGUMENTS = (
    "prompt",
    "height",
    "width",
    "num_inference_steps",
    "generator",
    "output_type",
)
FIELD_ARGUMENTS = {
    "prompt": "prompt",
    "negative_prompt": "negative_prompt",
    "height": "height",
    "width": "width",
    "steps": "num_inference_steps",
    "guidance_scale": "guidance_scale",
}
"""Case field -> the `__call__` argument it is passed as (the same name but for steps)."""
SET_BY_PERFGUARD = (
    "generator",
    "output_type",
    "callback_on_step_end",
    "callback",
    "callback_steps",
    "return_dict",
)
"""Arguments perfguard passes itself to time the call: `options` may not name them."""
SCHEDULER_STEP = "scheduler.step"
STEP_END_CALLBACK = "callback_on_step_end"
LEGACY_CALLBACK = "callback"
STEP_SEAMS = (SCHEDULER_STEP, STEP_END_CALLBACK, LEGACY_CALLBACK)
"""The seams that end a denoising step, in the order they are tried (module docstring)."""


def model_path(case: Case) -> Path:
    """The case's `model` directory (`~` expanded; relative to the working directory)."""
    return Path(os.path.expanduser(case.model))


def _bad(case: Case, path: Path, why: str) -> PerfguardError:
    return PerfguardError(f"case {case.id!r}: model {str(path)!r}: {why}")


def read_model_index(case: Case) -> dict[str, Any]:
    """The pipeline's `model_index.json`, or a `PerfguardError` naming the case and path."""
    path = model_path(case)
    if not path.is_dir():
        raise _bad(
            case,
            path,
            "no such directory (a diffusers case loads a save_pretrained directory offline; "
            "download or save the pipeline there first)",
        )
    index = path / "model_index.json"
    if not index.is_file():
        raise _bad(case, path, "is not a diffusers pipeline (no model_index.json)")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _bad(case, path, f"model_index.json: unreadable: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("_class_name"), str):
        raise _bad(case, path, "model_index.json: _class_name: missing")
    return data


def component_roles(index: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """role -> (library, class) of the components `model_index.json` declares."""
    roles = {}
    for role, value in index.items():
        if role.startswith("_") or not isinstance(value, list) or len(value) != 2:
            continue
        library, cls = value
        if library is not None and cls is not None:
            roles[role] = (str(library), str(cls))
    return roles


def preflight(case: Case) -> None:
    """Check, before anything runs, that `case` can load offline; raise a `PerfguardError`.

    A missing component folder, or a model folder without weights, is what
    `from_pretrained` would try to download: offline it is an error here, not a hang or
    a network call in the middle of a gate.
    """
    if case.workload != DIFFUSERS:
        return
    path = model_path(case)
    index = read_model_index(case)
    for role in sorted(component_roles(index)):
        folder = path / role
        if not folder.is_dir():
            raise _bad(case, path, f"component {role!r}: no {role}/ folder (needs a download)")
        if (folder / "config.json").is_file() and not any(
            f.name.endswith(WEIGHT_SUFFIXES) for f in folder.iterdir()
        ):
            raise _bad(case, path, f"component {role!r}: no weights in {role}/ (needs a download)")
    check_options(case, loadable_class(case, index))
    if case.dit == "perfguard":
        cls = index["_class_name"]
        workload = PERFGUARD_DITS.get(cls)
        if workload is None:
            raise PerfguardError(
                f"case {case.id!r}: dit: 'perfguard' needs a {' or '.join(PERFGUARD_DITS)}, "
                f"not {cls} ({path})"
            )
        from perfguard.workloads.presets import TOGGLES

        for name in sorted(case.toggles):
            if TOGGLES.get(name) != workload:
                raise PerfguardError(
                    f"case {case.id!r}: toggles.{name}: does not apply to a {cls} "
                    f"({TOGGLES.get(name)} only)"
                )


def pipeline_class(index: dict[str, Any]) -> type | None:
    """The diffusers class `model_index.json` names, or None where diffusers has none."""
    import diffusers

    name = index.get("_class_name")
    try:
        cls = getattr(diffusers, str(name), None)
    except Exception:  # a lazy import that fails: `loadable_class` says why
        return None
    return cls if isinstance(cls, type) else None


def loadable_class(case: Case, index: dict[str, Any]) -> type:
    """The pipeline class of `model_index.json`, or a `PerfguardError` (exit 2).

    A class this diffusers does not have (a custom pipeline, or one of a newer release)
    would need its code from the Hub, which an offline load never fetches: it fails here,
    in one line, before anything runs, not as a case error in the middle of a gate.
    """
    import diffusers

    name = str(index.get("_class_name"))
    path = model_path(case)
    try:
        cls = getattr(diffusers, name, None)
    except Exception as exc:  # diffusers has it, but its imports fail here
        first = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:200]
        raise _bad(
            case, path, f"model_index.json: _class_name: {name} cannot be imported ({first})"
        ) from exc
    if not isinstance(cls, type):
        raise _bad(
            case,
            path,
            f"model_index.json: _class_name: diffusers {diffusers.__version__} has no {name} "
            "(a custom or newer pipeline's code cannot be loaded offline)",
        )
    return cls


def _call_parameters(pipe_or_cls: Any) -> Mapping[str, inspect.Parameter]:
    return inspect.signature(pipe_or_cls.__call__).parameters


def check_options(case: Case, pipe_or_cls: Any) -> None:
    """Every name in the case's `options` is a `__call__` argument that no field and not
    perfguard sets; else a `PerfguardError` naming the file, case and field (exit 2)."""
    if pipe_or_cls is None or not case.options:
        return
    params = _call_parameters(pipe_or_cls)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    name = pipe_or_cls.__name__ if isinstance(pipe_or_cls, type) else type(pipe_or_cls).__name__
    by_argument = {arg: field for field, arg in FIELD_ARGUMENTS.items()}
    where = f"{case.source}: case {case.id!r}" if case.source else f"case {case.id!r}"
    for key in sorted(case.options):
        if key in by_argument:
            raise PerfguardError(
                f"{where}: options.{key}: set it with the case's field "
                f"{by_argument[key]!r}, not in options"
            )
        if key in SET_BY_PERFGUARD:
            raise PerfguardError(
                f"{where}: options.{key}: perfguard sets it to time the call; leave it out"
            )
        if key == "self" or (key not in params and not takes_any):
            others = sorted(
                p
                for p in params
                if p not in ("self", *by_argument, *SET_BY_PERFGUARD)
                and params[p].kind is not inspect.Parameter.VAR_POSITIONAL
            )
            raise PerfguardError(
                f"{where}: options.{key}: {name}.__call__ takes no argument {key!r} "
                f"(it takes {', '.join(others)})"
            )


def preflight_all(cases: Iterable[Case]) -> None:
    for case in cases:
        preflight(case)


# ---- loading ---------------------------------------------------------------------------


def load_pipeline(case: Case, device: torch.device) -> Any:
    """`DiffusionPipeline.from_pretrained(model, local_files_only=True)` on `device`."""
    from diffusers import DiffusionPipeline

    preflight(case)
    with _quiet_loading():
        pipe = DiffusionPipeline.from_pretrained(
            str(model_path(case)), local_files_only=True, dtype=DTYPES[case.dtype]
        )
    if case.dit == "perfguard":
        swap_dit(pipe, case)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextlib.contextmanager
def _quiet_loading() -> Any:
    """No loading progress bars in a gate's log (restored afterwards)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    states = []
    for lib in (diffusers_logging, transformers_logging):
        states.append(lib.is_progress_bar_enabled())
        lib.disable_progress_bar()
    try:
        yield
    finally:
        for lib, enabled in zip((diffusers_logging, transformers_logging), states, strict=True):
            if enabled:
                lib.enable_progress_bar()


def swap_dit(pipe: Any, case: Case) -> torch.nn.Module:
    """Replace `pipe.transformer` by perfguard's DiT of the same config and weights.

    Built on the meta device and given the loaded tensors with `assign=True`: no second
    copy of the weights, and `strict=True` proves every parameter found its place.
    """
    from perfguard.workloads.presets import MODEL_CLASSES

    workload = PERFGUARD_DITS.get(type(pipe).__name__)
    if workload is None:
        raise ValueError(f"{case.id}: dit = 'perfguard' needs a {' or '.join(PERFGUARD_DITS)}")
    original = pipe.transformer
    cls = MODEL_CLASSES[workload]
    accepted = inspect.signature(cls.__init__).parameters
    config = {k: v for k, v in dict(original.config).items() if k in accepted}
    toggles = {name: case.toggles[name] for name in case.toggles if name in accepted}
    with torch.device("meta"):
        model = cls(**config, **toggles)
    model.load_state_dict(original.state_dict(), strict=True, assign=True)
    model.eval()
    # The pipeline's loop enters `transformer.cache_context(name)` (diffusers' cache hooks);
    # perfguard's DiT has no such cache, so the context does nothing.
    model.cache_context = lambda name: contextlib.nullcontext()
    pipe.transformer = model
    return model


# ---- timing ----------------------------------------------------------------------------


class _Observer:
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


def _wrap_method(owner: Any, name: str, observer: _Observer, stage_name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        observer.enter(stage_name)
        try:
            return original(*args, **kwargs)
        finally:
            observer.leave(stage_name)

    setattr(owner, name, timed)


def _hook_stage(module: torch.nn.Module, observer: _Observer, stage_name: str) -> None:
    module.register_forward_pre_hook(lambda mod, args: observer.enter(stage_name))
    module.register_forward_hook(lambda mod, args, out: observer.leave(stage_name))


@contextlib.contextmanager
def _scheduler_step_seam(scheduler: Any, observer: _Observer) -> Any:
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
        params = _call_parameters(pipe)
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
        self.observer = _Observer(self._timesteps)
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
        for role, module in modules.items():
            if role.startswith("text_encoder"):
                _hook_stage(module, self.observer, TEXT_ENCODING)
            elif role in PRIOR_ROLES:
                if callable(getattr(module, "generate", None)):
                    _wrap_method(module, "generate", self.observer, PRIOR)
                else:
                    _hook_stage(module, self.observer, PRIOR)
            elif role in DENOISER_ROLES:
                module.register_forward_pre_hook(
                    lambda mod, args: self.observer.denoiser_call(bool(self.seams))
                )
            elif role == "vae" and callable(getattr(module, "decode", None)):
                _wrap_method(module, "decode", self.observer, DECODING)

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
            if "callback_steps" in _call_parameters(self.pipe):
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
            _scheduler_step_seam(scheduler, self.observer)
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


def call_arguments(case: Case, pipe: Any) -> dict[str, Any]:
    """The case's fields and `options` as the pipeline's `__call__` arguments, by name
    (a `ValueError` naming the arguments it does not take; see the module docstring)."""
    params = _call_parameters(pipe)
    name = type(pipe).__name__
    values = {
        "prompt": case.prompt,
        "negative_prompt": case.negative_prompt,
        "height": case.height,
        "width": case.width,
        "steps": case.steps,
        "guidance_scale": case.guidance_scale,
    }
    kwargs: dict[str, Any] = {
        FIELD_ARGUMENTS[field]: value for field, value in values.items() if value is not None
    }
    missing = [p for p in (*kwargs, *REQUIRED_ARGUMENTS) if p not in params]
    if missing:
        raise ValueError(
            f"{case.id}: {name}.__call__ does not take {', '.join(dict.fromkeys(missing))}"
        )
    try:
        check_options(case, pipe)
    except PerfguardError as exc:
        raise ValueError(str(exc)) from exc
    kwargs.update(case.options)
    kwargs["output_type"] = "pt"
    return kwargs


def build_diffusers_pipeline(case: Case, platform: Platform) -> Callable[[], torch.Tensor]:
    """The runner's factory for `workload = "diffusers"` (device 0 of `platform`)."""
    return DiffusersCase(case, load_pipeline(case, platform.device(0)))
