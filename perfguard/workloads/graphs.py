"""Breakable CUDA-graph capture region flag.

sglang's multimodal_gen runtime captures the denoiser with a *breakable* CUDA graph: the
step is recorded as a chain of graph segments and the capture is split ("broken") only at
a few whitelisted points. Inside such a region the model must not issue work whose shape
or control flow depends on tensor *data*, because that work is recorded once and replayed
verbatim:

* ops that synchronise with the host to learn a size -- ``nonzero()``, ``.item()``,
  ``.tolist()``, boolean-mask indexing -- are illegal during stream capture;
* in-place index writes with a data-dependent shape (``x[mask] *= 0``) lower to
  ``nonzero`` + ``index_put_`` and therefore hit the same problem;
* python-side caches keyed on tensor identity (the Qwen modulation cache) are meaningless
  on replay, because replay never re-enters the python code.

Model code asks :func:`is_in_breakable_cuda_graph` at those lines and takes the
static-shape reference path instead. The flag is thread-local, so a capture on one thread
never changes what an eager forward on another thread does, and it nests (a counter, not
a bool).

The flag is only what sglang's runtime tells the model. A plain ``torch.cuda.graph`` capture
or a torch.compile trace (cudagraphs or not) sets no flag, so the model also asks torch
itself: :func:`is_stream_capturing` (``torch.cuda.is_current_stream_capturing()``, asked only
once CUDA is initialised, since no capture can run before) and
:func:`in_static_capture`, which adds ``torch.compiler.is_compiling()``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = [
    "breakable_cuda_graph",
    "in_static_capture",
    "is_in_breakable_cuda_graph",
    "is_stream_capturing",
]

_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


def is_in_breakable_cuda_graph() -> bool:
    """True while the current thread is inside a :func:`breakable_cuda_graph` region."""
    return _depth() > 0


def is_stream_capturing() -> bool:
    """True while the current CUDA stream is being captured into a graph (any capture).

    ``torch.cuda.is_initialized()`` is asked first: it is a cheap flag read, and it keeps
    this question from initialising CUDA (or failing) on a CPU-only build.
    """
    return bool(torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing())


def in_static_capture() -> bool:
    """True where the model must issue only static-shape work with no host sync.

    That is inside a breakable-graph region, under any CUDA stream capture, and while
    torch.compile traces (a boolean-index write there is a graph break at best, and under
    cudagraphs a ``nonzero`` that cannot be recorded).
    """
    return is_in_breakable_cuda_graph() or is_stream_capturing() or torch.compiler.is_compiling()


@contextmanager
def breakable_cuda_graph() -> Iterator[None]:
    """Mark the enclosed code as running under breakable CUDA-graph capture.

    This only sets the flag read by :func:`is_in_breakable_cuda_graph`; the actual
    capture is the serving runtime's business. Regions nest; the flag is cleared when the
    outermost region exits, also on exceptions.
    """
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth = _depth() - 1
