"""Slow every DiT transformer block down, from outside perfguard (detection benchmark).

Put this directory on PYTHONPATH and set PERFGUARD_BENCH_SLOW_BLOCKS=0.10: every process
that starts then busy-waits, after each forward of a module whose class name ends in
`TransformerBlock`, for 10 % of the time that forward took. A regression made where a
real one would be (inside the model), unknown to perfguard's timer, and present in every
process the gate starts (its confirmations included).

PERFGUARD_BENCH_DOUBLE_LINEAR=1 instead makes every `torch.nn.Linear` do its work twice
(the README's own example of a slowdown the gate must catch).
"""

import os
import time

_FRACTION = float(os.environ.get("PERFGUARD_BENCH_SLOW_BLOCKS", "0") or 0)

if _FRACTION > 0:
    try:
        import torch
    except ImportError:  # pragma: no cover
        torch = None
    if torch is not None:
        _starts: dict[int, int] = {}

        def _pre(module, args):
            if type(module).__name__.endswith("TransformerBlock"):
                _starts[id(module)] = time.perf_counter_ns()

        def _post(module, args, output):
            t0 = _starts.pop(id(module), None)
            if t0 is not None:
                end = time.perf_counter_ns() + int((time.perf_counter_ns() - t0) * _FRACTION)
                while time.perf_counter_ns() < end:
                    pass

        torch.nn.modules.module.register_module_forward_pre_hook(_pre)
        torch.nn.modules.module.register_module_forward_hook(_post)

if os.environ.get("PERFGUARD_BENCH_DOUBLE_LINEAR") == "1":
    import torch

    _forward = torch.nn.Linear.forward

    def _twice(self, input):
        _forward(self, input)
        return _forward(self, input)

    torch.nn.Linear.forward = _twice

# PERFGUARD_BENCH_TOGGLE_OFF=glm_prior_drop_inplace[,name...] reverts optimizations the
# way a pull request would: every module that has the switch has it forced off before
# each forward, so the reference path runs although the case asks for the optimized one.
_OFF = [n for n in os.environ.get("PERFGUARD_BENCH_TOGGLE_OFF", "").split(",") if n]

if _OFF:
    import torch

    def _force_off(module, args):
        for name in _OFF:
            if getattr(module, name, None) is True:
                setattr(module, name, False)

    torch.nn.modules.module.register_module_forward_pre_hook(_force_off)

# PERFGUARD_BENCH_LOW_PRECISION=1 makes every DiT transformer block return its outputs
# rounded through bfloat16: a deliberate numeric change (the output-equivalence figure).
if os.environ.get("PERFGUARD_BENCH_LOW_PRECISION") == "1":
    import torch

    def _round(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(torch.bfloat16).to(value.dtype)
        if isinstance(value, tuple):
            return tuple(_round(v) for v in value)
        return value

    def _low_precision(module, args, output):
        if type(module).__name__.endswith("TransformerBlock"):
            return _round(output)
        return None

    torch.nn.modules.module.register_module_forward_hook(_low_precision)

# PERFGUARD_BENCH_EXTRA_MATMUL=N adds one extra N x N matrix product (float32, result
# discarded) after each forward of a DiT transformer block: the "one extra matmul per
# block" a per-op attribution must name first (docs/bisect.md). N = 256 costs ~0.3 ms
# a call on one core, a few percent of the tiny smoke DiT's denoising stage.
_EXTRA = int(os.environ.get("PERFGUARD_BENCH_EXTRA_MATMUL", "0") or 0)

if _EXTRA > 0:
    import torch

    _square = {}

    def _extra_matmul(module, args, output):
        if type(module).__name__.endswith("TransformerBlock"):
            if "m" not in _square:
                seeded = torch.Generator().manual_seed(0)
                _square["m"] = torch.randn(_EXTRA, _EXTRA, generator=seeded)
            torch.mm(_square["m"], _square["m"])
        return None

    torch.nn.modules.module.register_module_forward_hook(_extra_matmul)
