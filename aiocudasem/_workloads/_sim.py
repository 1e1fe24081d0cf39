"""The workloads on the simulated device: Python callables run as kernels by
:meth:`SimDriver.launch`, and ordinary memory standing in for pinned memory."""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .._driver import Driver
from .._driver._protocol import stream_handle
from ._common import _MISMATCH, SEEN, StreamArg, WeakDriver, frame_words

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ("SimWorkloadDriver", "SimWorkloads")


class SimWorkloadDriver(Driver, Protocol):
    """What the workloads use of the simulated device: the :class:`~aiocudasem._driver.Driver`
    protocol, ``SimDriver.launch`` (a Python callable as a kernel) and its pinned memory."""

    def launch(self, stream: int, fn: Callable[[], None]) -> None: ...
    def mem_host_alloc(self, nbytes: int) -> int: ...
    def mem_free_host(self, ptr: int) -> None: ...


class _Trap(Exception):
    """Raised by the simulated trap kernel: the simulator faults the context for it."""


class SimWorkloads(WeakDriver[SimWorkloadDriver]):
    """The workloads of one ``SimDriver``, through the methods of :class:`SimWorkloadDriver`
    only."""

    def alloc_pinned(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        return self._driver.mem_host_alloc(nbytes)

    def free_pinned(self, ptr: int) -> None:
        self._driver.mem_free_host(ptr)

    def launch_spin(self, stream: StreamArg, ns: int) -> None:
        stream = stream_handle("launch_spin()", stream, self._driver, _MISMATCH)
        self._driver.launch(stream, lambda: time.sleep(ns / 1e9))

    def launch_check_frame(
        self, stream: StreamArg, src: int, words: int, frame: int, out: int
    ) -> None:
        stream = stream_handle("launch_check_frame()", stream, self._driver, _MISMATCH)
        if not 0 < words < SEEN:
            raise ValueError(f"words must be in [1, {SEEN}), got {words}")
        expected = frame_words(frame, words)

        def check() -> None:
            data = np.ctypeslib.as_array((ctypes.c_uint32 * words).from_address(src))
            slot = ctypes.c_uint32.from_address(out + 4 * frame)
            slot.value += int(np.count_nonzero(data != expected)) + SEEN

        self._driver.launch(stream, check)

    def launch_trap(self, stream: StreamArg) -> None:
        stream = stream_handle("launch_trap()", stream, self._driver, _MISMATCH)

        def trap() -> None:
            raise _Trap

        self._driver.launch(stream, trap)  # CUDA_ERROR_LAUNCH_FAILED, as a real trap
