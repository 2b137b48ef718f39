"""A saved diffusers pipeline: read, checked before anything runs, and loaded offline.

A case names a directory written by `DiffusionPipeline.save_pretrained` (`model`), and
perfguard loads it offline (`DiffusionPipeline.from_pretrained(path, local_files_only=True)`).
A `model` that is not a complete local pipeline (no `model_index.json`, a component folder
or its weights missing), an `options` name its `__call__` does not take, or a
`_class_name` this diffusers cannot load (a custom or newer pipeline whose code would have
to be downloaded) is a data error naming the case and the path (`preflight`, exit 2).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from perfguard.errors import PerfguardError
from perfguard.interop.diffusers.arguments import check_options
from perfguard.interop.diffusers.dit import PERFGUARD_DITS, swap_dit
from perfguard.storage.cases import DIFFUSERS, Case
from perfguard.workloads.pipeline import DTYPES

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".safetensors.index.json")


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


def preflight_all(cases: Iterable[Case]) -> None:
    """`preflight` each case, the first error raised."""
    for case in cases:
        preflight(case)


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
