"""Slow every DiT transformer block down, from outside perfguard (detection benchmark).

Put this directory on PYTHONPATH and set PERFGUARD_BENCH_SLOW_BLOCKS=0.10: every process
that starts then busy-waits, after each forward of a module whose class name ends in
`TransformerBlock` (its class's `forward`, wrapped as the class is defined), for 10 %
of the time that forward took. A regression made where a
real one would be (inside the model), unknown to perfguard's timer, and present in every
process the gate starts (its confirmations included).

PERFGUARD_BENCH_DOUBLE_LINEAR=1 instead makes every `torch.nn.Linear` do its work twice
(the README's own example of a slowdown the gate must catch).
"""

import functools
import os
import time


def _fraction() -> float:
    """Read at each call, not at import: a resident server imports this once, and its
    forks take each command's environment (the server's key leaves PERFGUARD_* out)."""
    return float(os.environ.get("PERFGUARD_BENCH_SLOW_BLOCKS", "0") or 0)


try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
if torch is not None:
    # Each block class's own `forward` is wrapped as the class is defined: global module
    # hooks would also tax every other module's call (they made the smoke models'
    # DenoisingStage 1.28x, not about 1.08x, at 12 %).

    def _slowed(forward):
        @functools.wraps(forward)
        def forward_then_wait(self, *args, **kwargs):
            fraction = _fraction()
            if fraction <= 0:
                return forward(self, *args, **kwargs)
            t0 = time.perf_counter_ns()
            out = forward(self, *args, **kwargs)
            end = time.perf_counter_ns() + int((time.perf_counter_ns() - t0) * fraction)
            while time.perf_counter_ns() < end:
                pass
            return out

        return forward_then_wait

    def _init_subclass(cls, **kwargs):
        super(torch.nn.Module, cls).__init_subclass__(**kwargs)
        if cls.__name__.endswith("TransformerBlock") and "forward" in cls.__dict__:
            cls.forward = _slowed(cls.__dict__["forward"])

    torch.nn.Module.__init_subclass__ = classmethod(_init_subclass)

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
