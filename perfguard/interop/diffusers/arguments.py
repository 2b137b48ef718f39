"""What a diffusers case passes to its pipeline's `__call__`: its fields and `options`.

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
(`DiffusersCase.arguments`, the report's `arguments`)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from perfguard.errors import PerfguardError
from perfguard.storage.cases import Case

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


def call_parameters(pipe_or_cls: Any) -> Mapping[str, inspect.Parameter]:
    """The parameters of a pipeline's (or pipeline class's) `__call__`, by name."""
    return inspect.signature(pipe_or_cls.__call__).parameters


def check_options(case: Case, pipe_or_cls: Any) -> None:
    """Every name in the case's `options` is a `__call__` argument that no field and not
    perfguard sets; else a `PerfguardError` naming the file, case and field (exit 2)."""
    if pipe_or_cls is None or not case.options:
        return
    params = call_parameters(pipe_or_cls)
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


def call_arguments(case: Case, pipe: Any) -> dict[str, Any]:
    """The case's fields and `options` as the pipeline's `__call__` arguments, by name
    (a `ValueError` naming the arguments it does not take; see the module docstring)."""
    params = call_parameters(pipe)
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
