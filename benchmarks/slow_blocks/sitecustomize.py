"""Slow every DiT transformer block down, from outside perfguard (detection benchmark).

Put this directory on PYTHONPATH and set PERFGUARD_BENCH_SLOW_BLOCKS=0.10: every process
that starts then busy-waits, after each forward of a module whose class name ends in
`TransformerBlock`, for 10 % of the time that forward took. A regression made where a
real one would be (inside the model), unknown to perfguard's timer, and present in every
process the gate starts (its confirmations included).
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
