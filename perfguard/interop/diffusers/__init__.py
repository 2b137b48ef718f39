"""Any diffusers pipeline under the gate: `workload = "diffusers"`.

A case names a directory written by `DiffusionPipeline.save_pretrained` (`model`), and
perfguard loads it offline (`DiffusionPipeline.from_pretrained(path, local_files_only=True)`)
and times its stages from outside, without editing diffusers. The parts, one concept each:

* `saved`: reading the saved pipeline (its `model_index.json`, its components and
  weights, the class this diffusers loads it with), checked before anything runs, and
  loading it;
* `arguments`: the case's fields and `options` as the `__call__` arguments, by name;
* `dit`: perfguard's DiT swapped in for the pipeline's transformer (`dit = "perfguard"`);
* `seams`: the stages and steps, timed through the pipeline's public seams (hooks on the
  components, the scheduler's `step`, the step-end callbacks);
* `case`: `DiffusersCase`, the loaded pipeline driven with the case's arguments, and the
  runner's factory `build_diffusers_pipeline`.

Errors: a `model` that is not a complete local diffusers pipeline, or an `options` name
its `__call__` does not take (or one that a field or perfguard sets), is a data error
naming the file, the case and the field (`preflight`, exit 2, before anything runs), and so
is a `model_index.json` naming a pipeline class that this diffusers cannot load (a custom
or newer pipeline whose code would have to be downloaded); a pipeline whose `__call__`
does not take the case's fields fails that case only (exit 3).
"""

from __future__ import annotations

from perfguard.interop.diffusers.arguments import check_options
from perfguard.interop.diffusers.case import DiffusersCase, build_diffusers_pipeline
from perfguard.interop.diffusers.dit import swap_dit
from perfguard.interop.diffusers.saved import component_roles, preflight_all, read_model_index

__all__ = [
    "DiffusersCase",
    "build_diffusers_pipeline",
    "check_options",
    "component_roles",
    "preflight_all",
    "read_model_index",
    "swap_dit",
]
