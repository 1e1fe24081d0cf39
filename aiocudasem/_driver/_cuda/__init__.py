"""The real driver: ``cuda.bindings._v2.driver`` (cuda-bindings 13.5.x).

This is the only module that imports the CUDA bindings. ``_v2`` is marked experimental
upstream, so the project pins ``cuda-bindings>=13.5,<13.6`` and keeps every use of it here.
CUDA's exceptions are translated to :mod:`aiocudasem._errors` on the way out, and nowhere else.

All objects live in each device's primary context, the one the CUDA runtime, PyTorch, CuPy and
cuda.core share, so foreign streams and our events can be mixed.

One module per concern, each class on the one before it: ``_core`` (the bindings, the
contexts and devices, the failure paths, the C calls of the wait path), ``_streams`` (streams
and events), ``_semaphores`` (external semaphores on streams and in graphs, and the first wait
of a device), ``_memory`` (interprocess events, host words, kernels and pinned memory); the C
structures and constants in ``_abi``.
"""

from __future__ import annotations

from .._protocol import track
from ._memory import _Memory

__all__ = ("CudaDriver",)


class CudaDriver(_Memory):
    """The CUDA driver API through ``cuda.bindings._v2.driver``."""

    name = "cuda"
    simulated = False

    def __init__(self) -> None:
        super().__init__()
        track(self)
