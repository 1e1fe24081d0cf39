"""The workloads on the simulated device: Python callables run as kernels by
:meth:`SimDriver.launch`, and ordinary memory standing in for pinned memory."""

from __future__ import annotations

import ctypes
import time
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .._driver import Driver
from .._driver._protocol import stream_handle
from ._common import _MISMATCH, SEEN, StreamArg, WeakDriver, check_progress, frame_words

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ("SimWorkloadDriver", "SimWorkloads")


class SimWorkloadDriver(Driver, Protocol):
    """What the workloads use of the simulated device: the :class:`~aiocudasem._driver.Driver`
    protocol, ``SimDriver.launch`` (a Python callable as a kernel), a kernel's store into host
    memory and its pinned memory."""

    def launch(self, stream: int, fn: Callable[[], None]) -> None: ...
    def kernel_store64(self, stream: int, address: int, value: int) -> None: ...
    def mem_host_alloc(self, nbytes: int) -> int: ...
    def mem_free_host(self, ptr: int) -> None: ...


class _Trap(Exception):
    """Raised by the simulated trap kernel: the simulator faults the context for it."""


class SimWorkloads(WeakDriver[SimWorkloadDriver]):
    """The workloads of one ``SimDriver``, through the methods of :class:`SimWorkloadDriver`
    only."""

    def __init__(self, driver: SimWorkloadDriver) -> None:
        super().__init__(driver)
        #: The pinned allocations made here, by address: their sizes. A simulated kernel
        #: writes host memory through ctypes, so it checks its span against them (a stray
        #: address would crash the process where a GPU faults the context).
        self._spans: dict[int, int] = {}

    def alloc_pinned(self, nbytes: int) -> int:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError("nbytes must be a positive int")
        ptr = self._driver.mem_host_alloc(nbytes)
        self._spans[ptr] = nbytes
        return ptr

    def free_pinned(self, ptr: int) -> None:
        self._driver.mem_free_host(ptr)
        self._spans.pop(ptr, None)

    def _allocated(self, address: int, nbytes: int) -> bool:
        """Whether ``nbytes`` at ``address`` lie in one pinned allocation of these
        workloads."""
        return any(
            start <= address and address + nbytes <= start + size
            for start, size in list(self._spans.items())
        )

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

    def launch_progress(
        self,
        stream: StreamArg,
        word: int,
        count: int,
        ns: int,
        *,
        start: int = 0,
        trap_at: int | None = None,
        stamps: int | None = None,
    ) -> None:
        stream = stream_handle("launch_progress()", stream, self._driver, _MISMATCH)
        trap = check_progress(word, count, ns, start, trap_at, stamps)
        drv = self._driver

        def progress() -> None:
            t0 = time.perf_counter()
            for i in range(1, count + 1):
                left = t0 + ns * i / count / 1e9 - time.perf_counter()
                if left > 0:
                    time.sleep(left)
                value = start + i
                if value == trap:
                    raise _Trap
                if stamps is not None:
                    if not self._allocated(stamps + 8 * (i - 1), 8):
                        # A GPU's store faults the context (an illegal address); so does this.
                        raise _Trap("stamps: not pinned memory of alloc_pinned()")
                    stamp = ctypes.c_uint64.from_address(stamps + 8 * (i - 1))
                    stamp.value = time.perf_counter_ns()
                # The page's registration is checked under the simulator's lock: a word
                # unmapped under the kernel faults the device, as on a GPU, and ends it.
                drv.kernel_store64(stream, word, value)

        drv.launch(stream, progress)
